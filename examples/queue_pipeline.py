"""A two-stage pipeline on scrapekit's persistent queue: producers put URLs, four consumer threads
"fetch" them and put a parsed result in the same transaction as the ack. Kill it at any moment
and run it again: nothing is lost and no result is written twice.

    python examples/queue_pipeline.py [DIR]
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

from scrapekit.queue import Empty, PersistentQueue


def consume(queue: PersistentQueue) -> None:
    consumer = queue.connect()  # what this thread holds comes back if it dies
    while True:
        try:
            handle = consumer.get(timeout=0.5)
        except Empty:
            return
        if "url" not in handle.item:
            consumer.nack(handle, delay=3600)  # a result: leave it for the reader
            continue
        with queue.transaction() as tx:  # both or neither, also across kill -9
            tx.ack(handle)
            tx.put({"result": handle.item["url"].upper()}, priority=5000)


def main(directory: str) -> None:
    with PersistentQueue(Path(directory), maxsize=10_000) as queue:
        if len(queue) == 0:
            for n in range(100):
                queue.put({"url": f"http://example.org/{n}"}, priority=n % 3)
        threads = [threading.Thread(target=consume, args=(queue,)) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        results = [item["result"] for item in queue if "result" in item]
        print(f"{len(results)} results, {len(queue) - len(results)} jobs left")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "work/example-queue")
