"""Median pages/s and peak RSS per label from measure.py records, and the ratio of two labels.

python bench/compare.py RESULTS.jsonl BASELINE_LABEL CANDIDATE_LABEL
"""

from __future__ import annotations

import json
import statistics
import sys


def main() -> None:
    path, baseline, candidate = sys.argv[1:4]
    runs: dict[str, list[dict[str, float]]] = {}
    with open(path) as handle:
        for line in handle:
            if line.strip():
                record = json.loads(line)
                runs.setdefault(record["label"], []).append(record)
    print("| run | repeats | pages | median pages/s | min | max | peak RSS MB (max) | client CPU s (median) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    medians = {}
    for label, records in runs.items():
        rates = [r["pages_per_s"] for r in records]
        medians[label] = (statistics.median(rates), max(r["peak_rss_mb"] for r in records))
        print(f"| {label} | {len(records)} | {int(statistics.median(r['pages'] for r in records))} | "
              f"{medians[label][0]:.0f} | {min(rates):.0f} | {max(rates):.0f} | {medians[label][1]:.0f} | "
              f"{statistics.median(r['client_cpu_s'] for r in records):.1f} |")
    (base_rate, base_rss), (cand_rate, cand_rss) = medians[baseline], medians[candidate]
    print(f"\n{candidate} / {baseline}: {cand_rate / base_rate:.2f}x pages/s, peak RSS {cand_rss:.0f} MB vs {base_rss:.0f} MB")


if __name__ == "__main__":
    main()
