"""Queue benchmarks: put+reserve+ack per second for the LevelDB and beanstalkd queues, and the
time to reopen a LevelDB queue holding 1 million jobs and reserve its first job.

    .venv/bin/python bench/queues.py [--jobs 20000] [--big 1000000] [--repeat 3]

Starts its own beanstalkd on 127.0.0.1 (a free port, binlog in a temp dir). Prints a markdown
table of medians.
"""

from __future__ import annotations

import argparse
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from scrapekit.model import Request
from scrapekit.sources.beanstalk import BeanstalkQueue
from scrapekit.sources.leveldb import LevelDbQueue
from scrapekit.state import StateDB


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cycle(queue: Any, jobs: int, batch: int) -> float:
    """put ``jobs`` jobs, then reserve and ack them ``batch`` per transaction; jobs per second."""
    started = time.perf_counter()
    for start in range(0, jobs, batch):
        with queue.transaction() as tx:
            for n in range(start, min(start + batch, jobs)):
                tx.put(Request(f"http://bench.test/{n}"))
    while True:
        held = []
        while len(held) < batch and (job := queue.reserve()) is not None:
            held.append(job)
        if not held:
            break
        with queue.transaction() as tx:
            for job in held:
                tx.ack(job)
    return jobs / (time.perf_counter() - started)


def reopen(path: Path, jobs: int) -> tuple[float, float]:
    """Seconds to fill a queue with ``jobs`` (once), and to reopen it and reserve a job."""
    started = time.perf_counter()
    with StateDB(path) as state:
        queue = LevelDbQueue(state)
        for start in range(0, jobs, 10_000):
            with queue.transaction() as tx:
                for n in range(start, min(start + 10_000, jobs)):
                    tx.put(Request(f"http://bench.test/item/{n}"))
    filled = time.perf_counter() - started
    started = time.perf_counter()
    with StateDB(path) as state:
        queue = LevelDbQueue(state)
        job = queue.reserve()
        assert job is not None and queue.counts()["ready"] == jobs - 1
    return filled, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--big", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="sk-bench-queues-"))
    beanstalkd_exe = shutil.which("beanstalkd") or "/usr/bin/beanstalkd"
    port = free_port()
    (work / "binlog").mkdir()
    server = subprocess.Popen([beanstalkd_exe, "-l", "127.0.0.1", "-p", str(port), "-b", str(work / "binlog")])
    time.sleep(0.3)
    rates: dict[str, list[float]] = {}
    try:
        for rep in range(args.repeat):
            for batch in (1, 100):
                with StateDB(work / f"l-{rep}-{batch}") as state:
                    rates.setdefault(f"leveldb, ack {batch}/batch", []).append(cycle(LevelDbQueue(state), args.jobs, batch))
                with StateDB(work / f"b-{rep}-{batch}") as state:
                    queue = BeanstalkQueue(state, f"beanstalk://127.0.0.1:{port}", tube=f"t{rep}{batch}")
                    rates.setdefault(f"beanstalkd, ack {batch}/batch", []).append(cycle(queue, args.jobs, batch))
                    queue.close()
        filled, reopened = reopen(work / "big", args.big)
        reopens = [reopened] + [reopen_only(work / "big", args.big) for _ in range(args.repeat - 1)]
    finally:
        server.terminate()
        server.wait()
        shutil.rmtree(work, ignore_errors=True)
    print(f"| queue | jobs | median put+reserve+ack /s | min | max |\n|---|---:|---:|---:|---:|")
    for name, values in rates.items():
        print(f"| {name} | {args.jobs} | {statistics.median(values):,.0f} | {min(values):,.0f} | {max(values):,.0f} |")
    print(f"\nLevelDB queue of {args.big:,} jobs: filled in {filled:.1f} s; reopen + first reserve "
          f"median {statistics.median(reopens):.3f} s (max {max(reopens):.3f} s, bar 2 s)")


def reopen_only(path: Path, jobs: int) -> float:
    started = time.perf_counter()
    with StateDB(path) as state:
        queue = LevelDbQueue(state)
        assert queue.reserve() is not None and queue.counts()["ready"] == jobs - 1
    return time.perf_counter() - started


if __name__ == "__main__":
    main()
