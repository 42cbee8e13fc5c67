"""scrapekit.queue.PersistentQueue: the queue.Queue-like face of the LevelDB queue."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
from collections import Counter
from pathlib import Path

import plyvel
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, precondition, rule

from scrapekit import QueueError
from scrapekit.queue import Empty, Full, PersistentQueue

ROOT = Path(__file__).resolve().parents[1]


def test_put_get_ack_in_priority_order_with_any_json_and_bytes(tmp_path: Path) -> None:
    with PersistentQueue(tmp_path / "q") as q:
        q.put({"n": 1}, priority=10)
        q.put([b"\x00\xff", {"nested": b"raw"}], priority=5)
        q.put("text")
        first = q.get(timeout=1)
        assert first.item == [b"\x00\xff", {"nested": b"raw"}] and first.priority == 5
        q.ack(first)
        assert [q.get(timeout=1).item for _ in range(2)] == [{"n": 1}, "text"]
        assert len(q) == 2 and q.qsize("reserved") == 2 and q.qsize("ready") == 0


def test_unserialisable_item_is_a_type_error_at_put(tmp_path: Path) -> None:
    with PersistentQueue(tmp_path / "q") as q:
        with pytest.raises(TypeError, match="JSON values or bytes, not object"):
            q.put({"x": object()})
        with pytest.raises(TypeError):
            q.put(float("nan") if False else {1j})  # a set of a complex number
        assert len(q) == 0


def test_get_times_out_and_delayed_items_wait(tmp_path: Path) -> None:
    with PersistentQueue(tmp_path / "q") as q:
        with pytest.raises(Empty):
            q.get(timeout=0.05)
        with pytest.raises(Empty):
            q.get(block=False)
        q.put("later", delay=0.3)
        with pytest.raises(Empty):
            q.get(timeout=0.05)
        assert q.get(timeout=2).item == "later"


def test_nack_gives_the_item_back_with_one_more_attempt(tmp_path: Path) -> None:
    with PersistentQueue(tmp_path / "q") as q:
        q.put("job")
        handle = q.get(timeout=1)
        q.nack(handle)
        again = q.get(timeout=1)
        assert (again.item, again.attempt) == ("job", 1)


def test_bounded_put_blocks_or_says_full(tmp_path: Path) -> None:
    with PersistentQueue(tmp_path / "q", maxsize=2) as q:
        q.put(1)
        q.put(2)
        with pytest.raises(Full):
            q.put(3, block=False)
        with pytest.raises(Full):
            q.put(3, timeout=0.05)
        threading.Timer(0.1, lambda: q.ack(q.get(timeout=1))).start()
        q.put(3, timeout=5)  # blocks until the ack makes room
        assert sorted(q) == [2, 3]


def test_transaction_is_all_or_nothing(tmp_path: Path) -> None:
    with PersistentQueue(tmp_path / "q") as q:
        q.put("parent")
        handle = q.get(timeout=1)
        with pytest.raises(RuntimeError):
            with q.transaction() as tx:
                tx.ack(handle)
                tx.put("child")
                raise RuntimeError("crash in the middle")
        assert list(q) == ["parent"] and q.qsize("reserved") == 1
        with q.transaction() as tx:
            tx.ack(handle)
            tx.put("child-1")
            tx.put("child-2", priority=1)
        assert [q.get(timeout=1).item for _ in range(2)] == ["child-2", "child-1"]


def test_a_consumer_whose_thread_dies_gives_its_items_back(tmp_path: Path) -> None:
    with PersistentQueue(tmp_path / "q") as q:
        for n in range(4):
            q.put(n)

        def worker() -> None:
            consumer = q.connect()
            consumer.get(timeout=1)
            consumer.get(timeout=1)  # then the thread ends without acking

        thread = threading.Thread(target=worker)
        thread.start()
        thread.join()
        other = q.connect()
        got = sorted(other.get(timeout=1).item for _ in range(4))
        assert got == [0, 1, 2, 3]
        with pytest.raises(Empty):
            other.get(block=False)


def test_closing_a_consumer_gives_back_only_its_items(tmp_path: Path) -> None:
    with PersistentQueue(tmp_path / "q") as q:
        for n in range(3):
            q.put(n)
        a, b = q.connect(), q.connect()
        held_a = a.get(timeout=1)
        held_b = b.get(timeout=1)
        a.close()
        assert q.qsize("reserved") == 1
        b.ack(held_b)
        assert sorted([q.get(timeout=1).item, q.get(timeout=1).item]) == sorted([held_a.item, 2])


def test_unacked_items_come_back_after_reopen(tmp_path: Path) -> None:
    q = PersistentQueue(tmp_path / "q")
    for n in range(3):
        q.put(n)
    q.ack(q.get(timeout=1))
    q.get(timeout=1)
    q.close()
    with PersistentQueue(tmp_path / "q") as again:
        assert sorted(again) == [1, 2] and len(again) == 2


def test_a_second_process_is_told_who_holds_the_queue(tmp_path: Path) -> None:
    with PersistentQueue(tmp_path / "q"):
        code = f"from scrapekit.queue import PersistentQueue; PersistentQueue({str(tmp_path / 'q')!r})"
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 1
    assert f"QueueError: queue {tmp_path / 'q'} is held by another process (pid {os.getpid()})" in result.stderr


def test_a_corrupt_record_is_skipped_and_reported(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with PersistentQueue(tmp_path / "q") as q:
        for n in range(3):
            q.put(n)
    db = plyvel.DB(str(tmp_path / "q" / "db"))
    key = next(k for k, _ in db.iterator(prefix=b"q:j:"))
    db.put(key, b"\x00garbage{")
    db.close()
    with PersistentQueue(tmp_path / "q") as q:
        got = []
        while True:
            try:
                got.append(q.get(block=False).item)
            except Empty:
                break
        assert len(got) == 2 and set(got) < {0, 1, 2}
        assert q.qsize("buried") == 1
    assert any("does not decode" in r.getMessage() for r in caplog.records)


class QueueModel(RuleBasedStateMachine):
    """Random put/get/ack/nack/transaction/crash-and-reopen against a plain in-memory model."""

    handles = Bundle("handles")

    def __init__(self) -> None:
        super().__init__()
        import tempfile
        self.dir = Path(tempfile.mkdtemp(prefix="skq-"))
        self.q = PersistentQueue(self.dir / "q")
        self.waiting: Counter[int] = Counter()  # items ready to get
        self.held: dict[str, int] = {}  # handle id -> item
        self.next = 0

    @rule()
    def put(self) -> None:
        self.q.put(self.next)
        self.waiting[self.next] += 1
        self.next += 1

    @precondition(lambda self: sum(self.waiting.values()) > 0)
    @rule(target=handles)
    def get(self):  # type: ignore[no-untyped-def]
        handle = self.q.get(block=False)
        assert self.waiting[handle.item] > 0
        self.waiting[handle.item] -= 1
        self.held[handle.id] = handle.item
        return handle

    @rule(handle=handles)
    def ack(self, handle) -> None:  # type: ignore[no-untyped-def]
        if handle.id in self.held:
            self.q.ack(handle)
            del self.held[handle.id]

    @rule(handle=handles)
    def nack(self, handle) -> None:  # type: ignore[no-untyped-def]
        if handle.id in self.held:
            self.q.nack(handle)
            self.waiting[self.held.pop(handle.id)] += 1

    @rule(handle=handles, children=st.integers(min_value=0, max_value=3))
    def ack_with_children(self, handle, children: int) -> None:  # type: ignore[no-untyped-def]
        if handle.id in self.held:
            with self.q.transaction() as tx:
                tx.ack(handle)
                for _ in range(children):
                    tx.put(self.next)
                    self.waiting[self.next] += 1
                    self.next += 1
            del self.held[handle.id]

    @rule()
    def crash_and_reopen(self) -> None:
        self.q.close()  # nothing acked or nacked on the way out: like a kill
        self.q = PersistentQueue(self.dir / "q")
        for item in self.held.values():
            self.waiting[item] += 1
        self.held.clear()

    @invariant()
    def same_items(self) -> None:
        assert len(self.q) == sum(self.waiting.values()) + len(self.held)
        assert Counter(self.q) == self.waiting + Counter(self.held.values())

    def teardown(self) -> None:
        self.q.close()
        import shutil
        shutil.rmtree(self.dir, ignore_errors=True)


TestQueueModel = QueueModel.TestCase
TestQueueModel.settings = settings(max_examples=40, stateful_step_count=30, deadline=None)


def test_consumers_killed_with_sigkill_ack_every_item_exactly_once(tmp_path: Path) -> None:
    """Processes take turns on the queue (LevelDB has one owner at a time), each with 4 consumer
    threads that ack an item and put its result in one transaction; each is killed mid-way."""
    path = tmp_path / "q"
    with PersistentQueue(path) as q:
        for n in range(400):
            q.put({"task": n})
    worker = textwrap.dedent(f"""
        import threading
        from scrapekit.queue import Empty, PersistentQueue
        q = PersistentQueue({str(path)!r})
        def consume():
            c = q.connect()
            while True:
                try:
                    h = c.get(timeout=0.5)
                except Empty:
                    return
                if "task" in h.item:
                    with q.transaction() as tx:
                        tx.ack(h)
                        tx.put({{"result": h.item["task"]}}, priority=5000)
                else:
                    c.nack(h, delay=3600)  # results stay for the check
        threads = [threading.Thread(target=consume) for _ in range(4)]
        for t in threads: t.start()
        print("started", flush=True)
        for t in threads: t.join()
    """)
    rng = random.Random(7)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for _ in range(12):
        proc = subprocess.Popen([sys.executable, "-c", worker], env=env, stdout=subprocess.PIPE)
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"started"
        try:
            proc.wait(timeout=rng.uniform(0.01, 0.3))
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
    subprocess.run([sys.executable, "-c", worker], env=env, check=True, stdout=subprocess.DEVNULL, timeout=120)
    with PersistentQueue(path) as q:
        items = list(q)
    assert [i for i in items if "task" in i] == []
    results = Counter(i["result"] for i in items)
    assert set(results) == set(range(400)) and max(results.values()) == 1


def test_the_documented_example_runs_and_survives_a_kill(tmp_path: Path) -> None:
    example = [sys.executable, str(ROOT / "examples" / "queue_pipeline.py"), str(tmp_path / "q")]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    first = subprocess.Popen(example, env=env, stdout=subprocess.PIPE)
    try:
        first.wait(timeout=0.3)
    except subprocess.TimeoutExpired:
        first.send_signal(signal.SIGKILL)
        first.wait()
    second = subprocess.run(example, env=env, capture_output=True, text=True, timeout=60)
    assert second.stdout.strip() == "100 results, 0 jobs left"
