"""The beanstalkd queue against a real beanstalkd: ordering, delays, dedupe, bury and kick,
redelivery of done jobs, dead workers, a restarted server, bad bodies."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import greenstalk
import pytest

from scrapekit import QueueError, Request
from scrapekit.sources.beanstalk import BeanstalkQueue
from scrapekit.state import StateDB

from .conftest import Beanstalkd

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def state(tmp_path: Path) -> Iterator[StateDB]:
    with StateDB(tmp_path / "state") as db:
        yield db


@pytest.fixture
def queue(state: StateDB, beanstalkd: Beanstalkd) -> Iterator[BeanstalkQueue]:
    q = BeanstalkQueue(state, beanstalkd.url, tube="t", ttr=5, sleep=lambda s: time.sleep(min(s, 0.05)))
    yield q
    q.close()


def drain(queue: BeanstalkQueue) -> list[str]:
    out = []
    while (job := queue.reserve()) is not None:
        out.append(job.request.url)
        queue.ack(job)
    return out


def test_priority_then_fifo_and_dedupe(queue: BeanstalkQueue) -> None:
    for url, pri in [("http://a.test/1", 10), ("http://a.test/2", 5), ("http://a.test/3", 10)]:
        assert queue.put(Request(url, priority=pri))
    assert not queue.put(Request("http://A.test:80/1"))
    assert queue.counts()["ready"] == 3
    assert drain(queue) == ["http://a.test/2", "http://a.test/1", "http://a.test/3"]
    assert not queue.put(Request("http://a.test/1"))  # done keys are never queued again
    assert queue.counts() == {"ready": 0, "reserved": 0, "delayed": 0, "buried": 0, "done": 3}


def test_ack_puts_follow_ups_and_writes_state(queue: BeanstalkQueue) -> None:
    queue.put(Request("http://a.test/p"))
    job = queue.reserve()
    assert job is not None
    with queue.transaction() as tx:
        tx.ack(job, [Request("http://a.test/c1"), Request("http://a.test/c2")])
        tx.set_state("cursor", {"n": 1})
    assert queue.get_state("cursor") == {"n": 1}
    assert sorted(drain(queue)) == ["http://a.test/c1", "http://a.test/c2"]


def test_retry_releases_with_delay_and_keeps_the_attempt(queue: BeanstalkQueue) -> None:
    queue.put(Request("http://a.test/r"))
    job = queue.reserve()
    assert job is not None
    queue.retry(job, 1.0, Request("http://a.test/r", attempt=1))
    assert queue.counts()["delayed"] == 1 and queue.reserve() is None
    time.sleep(1.1)
    again = queue.reserve()
    assert again is not None and again.request.attempt == 1


def test_bury_keeps_the_reason_and_kick_brings_it_back(queue: BeanstalkQueue) -> None:
    queue.put(Request("http://a.test/b"))
    job = queue.reserve()
    assert job is not None
    queue.bury(job, "part_error")
    assert queue.counts()["buried"] == 1 and queue.reserve() is None
    assert [b["reason"] for b in queue.buried()] == ["part_error"]
    assert queue.kick(10) == 1
    assert drain(queue) == ["http://a.test/b"]


def test_a_done_job_delivered_again_is_deleted_unseen(queue: BeanstalkQueue, beanstalkd: Beanstalkd) -> None:
    queue.put(Request("http://a.test/once"))
    job = queue.reserve()
    assert job is not None
    queue.ack(job)
    raw = greenstalk.Client(("127.0.0.1", beanstalkd.port), use="t")
    raw.put(Request("http://a.test/once").to_json())  # as after a crash between commit and delete
    assert queue.reserve() is None
    assert queue.counts()["ready"] == 0
    raw.close()


def test_undecodable_body_is_buried_with_its_reason(queue: BeanstalkQueue, beanstalkd: Beanstalkd) -> None:
    raw = greenstalk.Client(("127.0.0.1", beanstalkd.port), use="t")
    raw.put("{not json")
    raw.close()
    queue.put(Request("http://a.test/ok"))
    assert drain(queue) == ["http://a.test/ok"]
    assert queue.counts()["buried"] == 1
    assert any(b["reason"].startswith("undecodable") for b in queue.buried())


def test_jobs_of_a_worker_killed_with_sigkill_come_back(state: StateDB, beanstalkd: Beanstalkd, tmp_path: Path) -> None:
    queue = BeanstalkQueue(state, beanstalkd.url, tube="t", ttr=60)
    for n in range(3):
        queue.put(Request(f"http://a.test/{n}"))
    worker = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import greenstalk, time
        c = greenstalk.Client(("127.0.0.1", {beanstalkd.port}), watch="t")
        for _ in range(3):
            c.reserve()
        print("holding", flush=True)
        time.sleep(60)
    """)], stdout=subprocess.PIPE)
    assert worker.stdout is not None and worker.stdout.readline().strip() == b"holding"
    assert queue.reserve() is None  # all three are held by the worker
    worker.send_signal(signal.SIGKILL)
    worker.wait()
    deadline = time.monotonic() + 5
    while queue.counts()["ready"] < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sorted(drain(queue)) == [f"http://a.test/{n}" for n in range(3)]
    queue.close()


def test_survives_a_beanstalkd_restart(queue: BeanstalkQueue, beanstalkd: Beanstalkd) -> None:
    for n in range(5):
        queue.put(Request(f"http://a.test/{n}"))
    held = queue.reserve()
    assert held is not None
    beanstalkd.kill()
    restarter = threading.Timer(0.5, beanstalkd.start)
    restarter.start()
    queue.ack(held)  # the delete waits for beanstalkd to come back, then goes through or is moot
    restarter.join()
    assert queue.put(Request("http://a.test/after"))
    rest = drain(queue)
    assert sorted(rest) == sorted({f"http://a.test/{n}" for n in range(5)} - {held.request.url} | {"http://a.test/after"})


def test_unreachable_beanstalkd_is_a_clear_error(state: StateDB) -> None:
    from .conftest import free_port
    url = f"beanstalk://127.0.0.1:{free_port()}"
    with pytest.raises(QueueError, match=f"cannot reach beanstalkd at {url}"):
        BeanstalkQueue(state, url)


def test_touch_keeps_a_long_reservation(state: StateDB, beanstalkd: Beanstalkd) -> None:
    queue = BeanstalkQueue(state, beanstalkd.url, tube="t", ttr=2)
    queue.put(Request("http://a.test/long"))
    job = queue.reserve()
    assert job is not None
    for _ in range(3):
        time.sleep(1.0)
        queue.touch(job)
    other = greenstalk.Client(("127.0.0.1", beanstalkd.port), watch="t")
    with pytest.raises(greenstalk.TimedOutError):
        other.reserve(timeout=0)  # 3 s after a 2 s TTR, still ours
    other.close()
    queue.ack(job)
    queue.close()


def test_deeper_generations_come_later(state: StateDB, beanstalkd: Beanstalkd) -> None:
    queue = BeanstalkQueue(state, beanstalkd.url, tube="t", depth_priority=100)
    for depth in (2, 0, 1):
        queue.put(Request(f"http://a.test/{depth}", depth=depth))
    assert drain(queue) == ["http://a.test/0", "http://a.test/1", "http://a.test/2"]
    queue.close()


def test_pipelined_puts_releases_and_deletes_keep_each_reply_with_its_command(beanstalkd: Beanstalkd) -> None:
    from scrapekit.sources.beanstalk import _Client, parse_url

    with _Client(parse_url(beanstalkd.url), encoding=None, use="pipe", watch="pipe") as client:
        bodies = [f"job {i}".encode() for i in range(600)]  # more than one pipelined group
        ids = client.put_many([(body, 100, 0) for body in bodies], ttr=60)
        assert len(set(ids)) == 600 and client.stats_tube("pipe")["current-jobs-ready"] == 600
        assert client.peek(ids[599]).body == b"job 599"
        held = [client.reserve(timeout=0) for _ in range(3)]
        client.release_many([(job.id, 5, 0) for job in held] + [(ids[-1], 5, 0)])  # the last is not reserved
        assert client.stats_tube("pipe")["current-jobs-reserved"] == 0
        client.delete_many([ids[0], ids[0], *ids[1:300]])  # deleted twice: the second is NOT_FOUND, no error
        assert client.stats_tube("pipe")["current-jobs-ready"] == 300
        with pytest.raises(greenstalk.JobTooBigError):
            client.put_many([(b"x", 1, 0), (b"y" * 70_000, 1, 0), (b"z", 1, 0)], ttr=60)
        assert client.stats_tube("pipe")["current-jobs-ready"] == 302  # x and z went in; the stream is in step
        assert client.put_many([(b"after", 1, 0)], ttr=60)
