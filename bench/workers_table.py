"""Records and table of bench/workers.sh.

  python bench/workers_table.py annotate MEASURED.jsonl RESULTS.jsonl --mode bulk --workers 2
        [--beanstalkd-pid PID] [--before STATS.json --after STATS.json]
        [--cpu-before STAT --cpu-after STAT]
      Appends measure.py's records from MEASURED.jsonl to RESULTS.jsonl with the mode, the
      number of workers, beanstalkd's CPU seconds and peak RSS (read from /proc while it still
      runs; it is started fresh for every run), the pages each site host served in the run, and
      the CPU the whole machine used meanwhile (the "cpu" line of /proc/stat before and after):
      other_cpu_s is what neither scrapekit, the sites nor beanstalkd used (the machine is
      shared; measure.py's own 20 Hz sampling is in it too, well under a second a run).

  python bench/workers_table.py table RESULTS.jsonl
      Per mode and number of workers: medians, min/max, the ratio to 1 worker, RSS and where the
      CPU went (client = scrapekit and its workers, server = every site.py, beanstalkd).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path
from typing import Any


def proc_cpu_rss(pid: int) -> tuple[float | None, float | None]:
    """CPU seconds (user+sys) and peak RSS (MB) of a running process, from /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        hwm = next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("VmHWM:"))
        return round(cpu, 2), round(int(hwm.split()[1]) / 1024, 1)
    except (OSError, StopIteration, ValueError, IndexError):
        return None, None


def machine_busy_s(before: str, after: str) -> float | None:
    """CPU seconds all cores spent busy (user, nice, system, irq, softirq, steal) between two
    copies of /proc/stat's first line."""
    try:
        a, b = ([int(x) for x in Path(path).read_text().split()[1:9]] for path in (before, after))
    except (OSError, ValueError):
        return None
    busy = (0, 1, 2, 5, 6, 7)
    return round(sum(b[i] - a[i] for i in busy) / os.sysconf("SC_CLK_TCK"), 2)


def annotate(args: argparse.Namespace) -> None:
    bcpu, brss = proc_cpu_rss(args.beanstalkd_pid) if args.beanstalkd_pid else (None, None)
    host_pages = None
    if args.before and args.after:
        try:
            before = json.loads(Path(args.before).read_text())["hosts"]
            after = json.loads(Path(args.after).read_text())["hosts"]
            host_pages = {h: after[h] - before[h] for h in after}
        except (OSError, ValueError, KeyError, TypeError):
            host_pages = None
    machine = machine_busy_s(args.cpu_before, args.cpu_after) if args.cpu_before and args.cpu_after else None
    with open(args.measured) as src, open(args.results, "a") as out:
        for line in src:
            if line.strip():
                record = json.loads(line)
                other = None
                if machine is not None:
                    other = round(machine - sum(record.get(k) or 0 for k in ("client_cpu_s", "server_cpu_s"))
                                  - (bcpu or 0), 2)
                record.update(mode=args.mode, workers=args.workers, beanstalkd_cpu_s=bcpu,
                              beanstalkd_rss_mb=brss, host_pages=host_pages, cpus=os.cpu_count(),
                              machine_cpu_s=machine, other_cpu_s=other)
                out.write(json.dumps(record) + "\n")


def _median(records: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in records if r.get(key) is not None]
    return statistics.median(values) if values else None


def _num(value: float | None, digits: int = 0) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"


def table(args: argparse.Namespace) -> None:
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {}
    with open(args.results) as handle:
        for line in handle:
            if line.strip():
                record = json.loads(line)
                runs.setdefault((record["mode"], record["workers"]), []).append(record)
    print("| run | workers | repeats | pages | median pages/s | min | max | × 1 worker | largest process RSS MB "
          "| tree RSS MB | client CPU s | server CPU s | beanstalkd CPU s | CPU ms/page | other CPU s | rc |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for (mode, workers), records in sorted(runs.items(), key=lambda kv: (kv[0][0], kv[0][1] or 99)):
        rate = _median(records, "pages_per_s")
        base = _median(runs.get((mode, 1), []), "pages_per_s")
        ratio = f"{rate / base:.2f}×" if base and rate else "n/a"
        pages = _median(records, "pages")
        cpu = [(_median(records, k) or 0) for k in ("client_cpu_s", "server_cpu_s", "beanstalkd_cpu_s")]
        per_page = sum(cpu) / pages * 1000 if pages else None
        rates = [r["pages_per_s"] for r in records]
        print(f"| {records[0]['label']} | {workers if workers else 'no --workers'} | {len(records)} | {_num(pages)} "
              f"| {_num(rate)} | {_num(min(rates))} | {_num(max(rates))} | {ratio} "
              f"| {_num(max(r['peak_rss_mb'] for r in records))} | {_num(max(r['tree_rss_mb'] for r in records))} "
              f"| {_num(cpu[0], 1)} | {_num(_median(records, 'server_cpu_s'), 1)} "
              f"| {_num(_median(records, 'beanstalkd_cpu_s'), 1)} | {_num(per_page, 2)} "
              f"| {_num(_median(records, 'other_cpu_s'), 1)} | {','.join(str(r['rc']) for r in records)} |")
    print("\nmedians; RSS columns are the max over repeats; CPU ms/page = (client + server + beanstalkd) / pages;\n"
          "other CPU s = what the rest of the machine used during the run (busy CPU of all cores minus those three)")


def main() -> None:
    ap = argparse.ArgumentParser(usage=__doc__)
    sub = ap.add_subparsers(dest="command", required=True)
    note = sub.add_parser("annotate")
    note.add_argument("measured")
    note.add_argument("results")
    note.add_argument("--mode", required=True)
    note.add_argument("--workers", type=int, required=True)
    note.add_argument("--beanstalkd-pid", type=int, default=0)
    note.add_argument("--before")
    note.add_argument("--after")
    note.add_argument("--cpu-before")
    note.add_argument("--cpu-after")
    show = sub.add_parser("table")
    show.add_argument("results")
    args = ap.parse_args()
    annotate(args) if args.command == "annotate" else table(args)


if __name__ == "__main__":
    main()
