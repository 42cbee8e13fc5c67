"""items/s of put -> get -> ack for scrapekit's PersistentQueue, a plain queue.Queue (the
ceiling: no persistence) and persist-queue's SQLiteAckQueue (the package people reach for), with
1, 4 and 16 threads, all in one run.

    .venv/bin/python bench/pyqueue.py [--items 20000] [--repeat 3]

persist-queue is installed on first use into a folder of its own (PQ_TARGET, default
/tmp/sk-bench-persistqueue), not into the project's venv.
"""

from __future__ import annotations

import argparse
import os
import queue
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from scrapekit.queue import PersistentQueue

TARGET = Path(os.environ.get("PQ_TARGET", "/tmp/sk-bench-persistqueue"))


def persistqueue_module() -> Any:
    if not (TARGET / "persistqueue").is_dir():
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--target", str(TARGET), "persist-queue"],
                       check=True)
    sys.path.insert(0, str(TARGET))
    import persistqueue
    return persistqueue


def run(threads: int, items: int, make: Callable[[], tuple[Callable[[], Any], Callable[[], None]]]) -> float:
    """items/s with ``threads`` threads each doing put -> get -> ack in a loop."""
    per_thread = items // threads
    workers, closers = [], []
    for _ in range(threads):
        step, close = make()
        closers.append(close)
        workers.append(threading.Thread(target=lambda step=step: [step() for _ in range(per_thread)]))
    started = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    elapsed = time.perf_counter() - started
    for close in closers:
        close()
    return per_thread * threads / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--items", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    persistqueue = persistqueue_module()
    results: dict[tuple[str, int], list[float]] = {}
    for _ in range(args.repeat):
        for threads in (1, 4, 16):
            work = Path(tempfile.mkdtemp(prefix="sk-pyqueue-"))
            plain: queue.Queue[Any] = queue.Queue()

            def plain_step() -> tuple[Callable[[], Any], Callable[[], None]]:
                def step() -> None:
                    plain.put({"n": 1})
                    plain.get()
                    plain.task_done()
                return step, lambda: None

            pq = PersistentQueue(work / "scrapekit")

            def scrapekit_step() -> tuple[Callable[[], Any], Callable[[], None]]:
                consumer = pq.connect()

                def step() -> None:
                    pq.put({"n": 1})
                    consumer.ack(consumer.get())
                return step, consumer.close

            sq = persistqueue.SQLiteAckQueue(str(work / "sqlite"), multithreading=True, auto_commit=True)

            def sqlite_step() -> tuple[Callable[[], Any], Callable[[], None]]:
                def step() -> None:
                    sq.put({"n": 1})
                    sq.ack(sq.get())
                return step, lambda: None

            for name, make in (("queue.Queue (memory)", plain_step), ("scrapekit PersistentQueue", scrapekit_step),
                               ("persist-queue SQLiteAckQueue", sqlite_step)):
                results.setdefault((name, threads), []).append(run(threads, args.items, make))
            pq.close()
            shutil.rmtree(work, ignore_errors=True)
    print("| queue | threads | median items/s | min | max |\n|---|---:|---:|---:|---:|")
    for (name, threads), rates in results.items():
        print(f"| {name} | {threads} | {statistics.median(rates):,.0f} | {min(rates):,.0f} | {max(rates):,.0f} |")


if __name__ == "__main__":
    main()
