"""The embedded LevelDB queue: ordering, delays, dedupe, atomic transactions, crash recovery."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from scrapekit import AlreadyRunning, QueueError, Request
from scrapekit.sources.leveldb import LevelDbQueue
from scrapekit.state import RunLock, StateDB

from .conftest import FakeClock


@pytest.fixture
def state(tmp_path: Path) -> Iterator[StateDB]:
    with StateDB(tmp_path / "state") as db:
        yield db


@pytest.fixture
def queue(state: StateDB, clock: FakeClock) -> LevelDbQueue:
    return LevelDbQueue(state, clock=clock)


def drain(queue: LevelDbQueue) -> list[str]:
    out = []
    while (job := queue.reserve()) is not None:
        out.append(job.request.url)
        queue.ack(job)
    return out


def test_priority_then_fifo(queue: LevelDbQueue) -> None:
    for url, pri in [("http://a.test/1", 10), ("http://a.test/2", 5), ("http://a.test/3", 10), ("http://a.test/4", 5)]:
        queue.put(Request(url, priority=pri))
    assert drain(queue) == ["http://a.test/2", "http://a.test/4", "http://a.test/1", "http://a.test/3"]


def test_a_key_queued_or_done_is_not_queued_again(queue: LevelDbQueue) -> None:
    assert queue.put(Request("http://a.test/x"))
    assert not queue.put(Request("HTTP://A.TEST:80/x#frag"))  # same canonical key
    job = queue.reserve()
    assert job is not None
    queue.ack(job)
    assert not queue.put(Request("http://a.test/x"))
    assert queue.counts()["done"] == 1
    assert queue.reserve() is None


def test_delayed_job_becomes_ready_when_due(queue: LevelDbQueue, clock: FakeClock) -> None:
    queue.put(Request("http://a.test/later", not_before=clock.now + 30))
    queue.put(Request("http://a.test/now"))
    assert drain(queue) == ["http://a.test/now"]
    assert queue.counts()["delayed"] == 1
    clock.now += 31
    assert drain(queue) == ["http://a.test/later"]
    assert queue.counts() == {"ready": 0, "delayed": 0, "buried": 0, "done": 2, "reserved": 0}


def test_retry_gives_the_job_back_after_its_delay(queue: LevelDbQueue, clock: FakeClock) -> None:
    queue.put(Request("http://a.test/r"))
    job = queue.reserve()
    assert job is not None
    queue.retry(job, 5.0, Request("http://a.test/r", attempt=1))
    assert queue.reserve() is None
    clock.now += 5
    again = queue.reserve()
    assert again is not None and again.request.attempt == 1


def test_bury_keeps_the_job_with_its_reason(queue: LevelDbQueue) -> None:
    queue.put(Request("http://a.test/b"))
    job = queue.reserve()
    assert job is not None
    queue.bury(job, "part_error")
    assert queue.reserve() is None
    assert [b["reason"] for b in queue.buried()] == ["part_error"]
    assert queue.counts()["buried"] == 1
    assert not queue.put(Request("http://a.test/b"))


def test_ack_enqueues_follow_ups_and_state_in_one_batch(queue: LevelDbQueue) -> None:
    queue.put(Request("http://a.test/parent"))
    job = queue.reserve()
    assert job is not None
    with queue.transaction() as tx:
        tx.ack(job, [Request("http://a.test/child1"), Request("http://a.test/child2"), Request("http://a.test/parent")])
        tx.set_state("cursor", {"position": 7})
    assert queue.get_state("cursor") == {"position": 7}
    assert sorted(drain(queue)) == ["http://a.test/child1", "http://a.test/child2"]


def test_failed_transaction_changes_nothing(queue: LevelDbQueue) -> None:
    queue.put(Request("http://a.test/p"))
    job = queue.reserve()
    assert job is not None
    with pytest.raises(RuntimeError):
        with queue.transaction() as tx:
            tx.ack(job, [Request("http://a.test/c")])
            tx.set_state("cursor", {"position": 1})
            raise RuntimeError("boom")
    assert queue.get_state("cursor") is None
    assert queue.counts()["done"] == 0
    queue.retry(job, 0)  # still reserved by us, so it can be given back
    assert drain(queue) == ["http://a.test/p"]


def test_acking_a_job_not_reserved_is_an_error(queue: LevelDbQueue) -> None:
    queue.put(Request("http://a.test/p"))
    job = queue.reserve()
    assert job is not None
    queue.ack(job)
    with pytest.raises(QueueError):
        queue.ack(job)


def test_reserved_jobs_come_back_after_reopen(tmp_path: Path, clock: FakeClock) -> None:
    with StateDB(tmp_path / "s") as state:
        queue = LevelDbQueue(state, clock=clock)
        for i in range(5):
            queue.put(Request(f"http://a.test/{i}"))
        first = queue.reserve()
        assert first is not None
        queue.ack(first)
        held = [queue.reserve() for _ in range(3)]
        assert all(held)
    with StateDB(tmp_path / "s") as state:
        queue = LevelDbQueue(state, clock=clock)
        assert sorted(drain(queue)) == [f"http://a.test/{i}" for i in range(1, 5)]


def test_a_more_urgent_put_is_seen_before_the_scan_continues(queue: LevelDbQueue) -> None:
    for i in range(600):  # more than one scan buffer
        queue.put(Request(f"http://a.test/{i}", priority=100))
    first = queue.reserve()
    assert first is not None
    queue.ack(first, [Request("http://a.test/urgent", priority=1)])
    nxt = queue.reserve()
    assert nxt is not None and nxt.request.url == "http://a.test/urgent"


def test_every_put_survives_sigkill_of_the_writer(tmp_path: Path) -> None:
    """A writer killed mid-stream leaves whole batches only: counts agree with the data."""
    script = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        from scrapekit.model import Request
        from scrapekit.sources.leveldb import LevelDbQueue
        from scrapekit.state import StateDB
        q = LevelDbQueue(StateDB(Path({str(tmp_path / 'k')!r})))
        i = 0
        while True:
            with q.transaction() as tx:
                for _ in range(50):
                    tx.put(Request(f"http://a.test/{{i}}"))
                    i += 1
                tx.set_state("written", {{"n": i}})
            if i == 5000:
                print("ready", flush=True)
    """)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, env=env)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == b"ready"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    with StateDB(tmp_path / "k") as state:
        queue = LevelDbQueue(state)
        written = queue.get_state("written")
        assert written is not None and written["n"] >= 5000
        assert queue.counts()["ready"] == written["n"]
        assert len(drain(queue)) == written["n"]


def test_second_opener_gets_a_clear_already_running_error(tmp_path: Path) -> None:
    with RunLock(tmp_path / "run.pid", "books"):
        with pytest.raises(AlreadyRunning, match=rf"already running \(pid {os.getpid()}\)"):
            RunLock(tmp_path / "run.pid", "books").acquire()
    RunLock(tmp_path / "run.pid", "books").acquire().release()  # free again once released


def test_deeper_generations_come_later(state: StateDB, clock: FakeClock) -> None:
    queue = LevelDbQueue(state, depth_priority=100, clock=clock)
    for depth in (2, 0, 1):
        queue.put(Request(f"http://a.test/{depth}", depth=depth, priority=50))
    assert drain(queue) == ["http://a.test/0", "http://a.test/1", "http://a.test/2"]
