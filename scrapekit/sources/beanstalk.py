"""The durable queue on beanstalkd (greenstalk), with the done-set and per-job state in the
recipe's LevelDB so that acks stay exactly-once although beanstalkd delivers at least once.

An ack commits to LevelDB first (done key, follow-ups in an outbox, state) in one batch, then
deletes the job and puts the follow-ups on beanstalkd, then clears the outbox. A crash between
the two leaves work that is replayed at the next start: the outbox is put again, and a job
delivered again whose key is done is deleted unseen.

LevelDB layout beside the LevelDbQueue's (which a beanstalk recipe does not use):
    q:k:<key>          done keys
    q:q:<key>          queued keys: the request, its priority and beanstalkd id (for dump/dedupe)
    q:a:<key>          attempts so far (beanstalkd keeps a job body as it was put)
    q:b:<key>          bury reasons
    q:o:<seq:8>        outbox: follow-ups committed but not yet on beanstalkd
"""

from __future__ import annotations

import json
import logging
import struct
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlsplit

import greenstalk
import plyvel

from ..errors import QueueError
from ..model import Job, Request, loggable
from ..state import StateDB
from ..units import Seconds

log = logging.getLogger(__name__)

_DONE = b"q:k:"
_QUEUED = b"q:q:"
_ATTEMPTS = b"q:a:"
_BURIED = b"q:b:"
_OUTBOX = b"q:o:"
_STATE = b"s:"
_DONE_COUNT = b"q:m:bdone"
_MAX_BODY = 65_535
_BACKOFF = (0.2, 0.5, 1.0, 2.0, 5.0, 10.0)


def parse_url(url: str) -> tuple[str, int]:
    """``beanstalk://host:port`` as (host, port); ValueError otherwise."""
    try:
        parts = urlsplit(url)
        port = parts.port or 11300
    except ValueError:
        parts, port = urlsplit(""), 0
    if parts.scheme != "beanstalk" or not parts.hostname:
        raise ValueError(f"expected beanstalk://HOST:PORT, got {url!r}")
    return parts.hostname, port


class BeanstalkUrl(str):
    """A ``beanstalk://HOST:PORT`` option, checked when the recipe is read."""

    @classmethod
    def from_recipe(cls, value: object) -> BeanstalkUrl:
        if not isinstance(value, str):
            raise ValueError(f"expected beanstalk://HOST:PORT, got {value!r}")
        parse_url(value)
        return cls(value)


@dataclass(frozen=True, slots=True)
class _Outgoing:
    """A put committed to the outbox, to be sent to beanstalkd."""

    slot: bytes
    request: Request
    delay: float
    buried: bool


class BeanstalkTransaction:
    """Collects the changes of one commit (see sources.Transaction)."""

    def __init__(self, queue: BeanstalkQueue) -> None:
        self._queue = queue
        self.batch: dict[bytes, bytes | None] = {}
        self.new_keys: set[str] = set()
        self.outbox: list[_Outgoing] = []
        self.deletes: list[Job] = []
        self.releases: list[tuple[Job, float]] = []
        self.buries: list[Job] = []
        self.done = 0

    def put(self, request: Request, delay: float = 0.0, *, unseen: bool = False) -> bool:
        return self._put(request, delay, None, unseen)

    def put_buried(self, request: Request, reason: str) -> bool:
        """Queue ``request`` straight into the buried state (loading a dump)."""
        if not self._put(request, 0.0, reason):
            return False
        record = {"reason": reason, "at": self._queue.clock(), "request": request.to_dict()}
        self.batch[_BURIED + request.key.encode()] = json.dumps(record).encode()
        return True

    def _put(self, request: Request, delay: float, buried: str | None, unseen: bool = False) -> bool:
        key = request.key
        if key in self.new_keys or (not unseen and self._queue.known(key)):
            return False
        body = request.to_json().encode()
        if len(body) > _MAX_BODY:
            log.info("not queued: request of %d bytes is over beanstalkd's job limit: %s", len(body), loggable(request.url))
            return False
        self.new_keys.add(key)
        if self._queue.depth_priority and request.depth:
            request = replace(request, priority=request.priority + self._queue.depth_priority * request.depth)
        slot = _OUTBOX + struct.pack(">Q", self._queue.next_seq())
        delay = max(delay, request.not_before - self._queue.clock(), 0.0)
        self.batch[slot] = json.dumps({"r": request.to_dict(), "delay": delay, "buried": buried}).encode()
        self.batch[_QUEUED + key.encode()] = json.dumps({"r": request.to_dict(), "id": None}).encode()
        self.outbox.append(_Outgoing(slot, request, delay, buried is not None))
        return True

    def ack(self, job: Job, follow_ups: Iterable[Request] = ()) -> None:
        key = job.request.key.encode()
        self.batch[_DONE + key] = b""
        self.batch[_QUEUED + key] = None
        self.batch[_ATTEMPTS + key] = None
        self.batch[_BURIED + key] = None  # buried once, kicked, and done now
        self.deletes.append(job)
        self.done += 1
        for request in follow_ups:
            self.put(request)

    def retry(self, job: Job, delay: float, request: Request | None = None) -> None:
        attempt = (request or job.request).attempt
        self.batch[_ATTEMPTS + job.request.key.encode()] = str(attempt).encode()
        self.releases.append((job, delay))

    def bury(self, job: Job, reason: str) -> None:
        record = {"reason": reason, "at": self._queue.clock(), "request": job.request.to_dict()}
        self.batch[_BURIED + job.request.key.encode()] = json.dumps(record).encode()
        self.buries.append(job)

    def set_state(self, name: str, value: Mapping[str, Any] | None) -> None:
        self.batch[_STATE + name.encode()] = None if value is None else json.dumps(value).encode()


class BeanstalkQueue:
    """A tube on beanstalkd as the recipe's durable queue.

    A job reserved by a worker that dies comes back after ``ttr`` (at once when its connection
    closes). Lost connections are retried with backoff, logged, never fatal.
    """

    def __init__(self, state: StateDB, url: BeanstalkUrl = BeanstalkUrl("beanstalk://127.0.0.1:11300"), tube: str = "",
                 ttr: Seconds = Seconds(120.0), depth_priority: int = 0, name: str = "default",
                 clock: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep) -> None:
        self.url = url
        self.address = parse_url(url)
        self.tube = tube or name
        self.ttr = max(1, int(ttr))
        self.depth_priority = depth_priority
        self.clock = clock
        self._sleep = sleep
        self._db = state.db
        self._reserved: dict[str, greenstalk.Job[bytes]] = {}
        raw = self._db.get(_DONE_COUNT)
        self._done = int(raw) if raw else 0
        self._seq = 0
        self._client: greenstalk.Client[bytes] | None = None
        try:
            self._client = self._connect()
        except OSError as exc:
            raise QueueError(f"cannot reach beanstalkd at {url}: {exc.strerror or exc}") from None
        self._replay_outbox()

    # -- the runner's side -------------------------------------------------------------------

    def reserve(self) -> Job | None:
        """A ready job or None; a job whose key is already done is deleted unseen."""
        while True:
            try:
                raw = self._call(lambda c: c.reserve(timeout=0))
            except greenstalk.TimedOutError:
                return None
            except greenstalk.DeadlineSoonError:
                return None
            job = self._decode(raw)
            if job is None:
                continue
            if self.is_done(job.request.key):
                self._ignore(lambda c: c.delete(raw))  # delivered again after a crash: already done
                continue
            self._reserved[job.id] = raw
            return job

    @contextmanager
    def transaction(self) -> Iterator[BeanstalkTransaction]:
        tx = BeanstalkTransaction(self)
        yield tx
        self._commit(tx)

    def put(self, request: Request, delay: float = 0.0) -> bool:
        with self.transaction() as tx:
            return tx.put(request, delay)

    def ack(self, job: Job, follow_ups: Iterable[Request] = ()) -> None:
        with self.transaction() as tx:
            tx.ack(job, follow_ups)

    def retry(self, job: Job, delay: float, request: Request | None = None) -> None:
        with self.transaction() as tx:
            tx.retry(job, delay, request)

    def bury(self, job: Job, reason: str) -> None:
        with self.transaction() as tx:
            tx.bury(job, reason)

    def touch(self, job: Job) -> None:
        """Ask for another TTR on a long fetch."""
        raw = self._reserved.get(job.id)
        if raw is not None:
            self._ignore(lambda c: c.touch(raw))

    def kick(self, bound: int) -> int:
        """Move up to ``bound`` buried jobs back to ready; returns how many moved."""
        return int(self._call(lambda c: c.kick(bound)))

    def get_state(self, name: str) -> dict[str, Any] | None:
        raw = self._db.get(_STATE + name.encode())
        return None if raw is None else dict(json.loads(raw))

    def counts(self) -> dict[str, int]:
        try:
            stats = self._call(lambda c: c.stats_tube(self.tube))
        except greenstalk.NotFoundError:
            stats = {}
        return {
            "ready": int(stats.get("current-jobs-ready", 0)),
            "reserved": int(stats.get("current-jobs-reserved", 0)),
            "delayed": int(stats.get("current-jobs-delayed", 0)),
            "buried": int(stats.get("current-jobs-buried", 0)),
            "done": self._done,
        }

    def known(self, key: str) -> bool:
        k = key.encode()
        return self._db.get(_QUEUED + k) is not None or self._db.get(_DONE + k) is not None

    def is_done(self, key: str) -> bool:
        return self._db.get(_DONE + key.encode()) is not None

    def queued(self) -> Iterator[tuple[Request, int | None]]:
        """Every queued request (any state) with its beanstalkd job id when known."""
        for key, raw in self._db.iterator(prefix=_QUEUED):
            data = json.loads(raw)
            request = Request.from_dict(data["r"])
            attempts = self._db.get(_ATTEMPTS + key[len(_QUEUED):])
            if attempts is not None:
                request = replace(request, attempt=int(attempts))
            yield request, data.get("id")

    def job_stats(self, job_id: int) -> dict[str, Any] | None:
        try:
            return dict(self._call(lambda c: c.stats_job(job_id)))
        except greenstalk.NotFoundError:
            return None

    def buried(self) -> Iterator[dict[str, Any]]:
        for _, raw in self._db.iterator(prefix=_BURIED):
            yield dict(json.loads(raw))

    def dump(self) -> Iterator[dict[str, Any]]:
        """Every queued job as a dump record; beanstalkd is only asked, never disturbed."""
        for request, job_id in self.queued():
            stats = self.job_stats(job_id) if job_id is not None else None
            state = str(stats["state"]) if stats else "ready"
            record: dict[str, Any] = {"request": request.to_dict(), "state": state, "delay": 0.0}
            if stats:
                record["request"]["priority"] = int(stats["pri"])
                if state == "delayed":
                    record["delay"] = float(stats["time-left"])
            if state == "buried":
                raw = self._db.get(_BURIED + request.key.encode())
                record["reason"] = json.loads(raw)["reason"] if raw else ""
            yield record

    def close(self) -> None:
        """Close the connection; beanstalkd gives the jobs we still hold back at once."""
        if self._client is not None:
            self._client.close()
            self._client = None
        self._reserved.clear()

    # -- used by transactions ----------------------------------------------------------------

    def next_seq(self) -> int:
        if self._seq == 0:
            last = next(self._db.iterator(prefix=_OUTBOX, reverse=True, include_value=False), None)
            self._seq = struct.unpack(">Q", last[len(_OUTBOX):])[0] if last else 0
        self._seq += 1
        return int(self._seq)

    # -- internals ---------------------------------------------------------------------------

    def _commit(self, tx: BeanstalkTransaction) -> None:
        done = self._done + tx.done
        try:
            with self._db.write_batch() as batch:
                for key, value in tx.batch.items():
                    if value is None:
                        batch.delete(key)
                    else:
                        batch.put(key, value)
                if tx.done:
                    batch.put(_DONE_COUNT, str(done).encode())
        except (plyvel.Error, OSError) as exc:
            raise QueueError(f"cannot write the queue batch: {exc}") from None
        self._done = done
        # LevelDB holds the truth now; what follows is replayable after a crash.
        for job in tx.deletes:
            self._settle(job, lambda c, raw: c.delete(raw))
        for job, delay in tx.releases:
            self._settle(job, lambda c, raw: c.release(raw, job.request.priority, int(round(delay))))  # noqa: B023
        for job in tx.buries:
            self._settle(job, lambda c, raw: c.bury(raw, job.request.priority))  # noqa: B023
        if tx.outbox:
            self._send(tx.outbox)

    def _settle(self, job: Job, operation: Callable[[greenstalk.Client[bytes], greenstalk.Job[bytes]], Any]) -> None:
        """Apply ``operation`` to a job we hold; a job we no longer hold comes back by itself."""
        held = self._reserved.pop(job.id, None)
        if held is not None:
            raw: greenstalk.Job[bytes] = held
            self._ignore(lambda c: operation(c, raw))

    def _send(self, outbox: list[_Outgoing]) -> None:
        sent: dict[bytes, bytes | None] = {}
        for out in outbox:
            request = out.request
            body = request.to_json().encode()
            job_id = self._call(lambda c: c.put(body, priority=request.priority, delay=int(round(out.delay)),  # noqa: B023
                                                ttr=self.ttr))
            if out.buried:
                self._ignore(lambda c: c.bury(c.reserve_job(job_id), request.priority))  # noqa: B023
            sent[out.slot] = None
            sent[_QUEUED + request.key.encode()] = json.dumps({"r": request.to_dict(), "id": job_id}).encode()
        with self._db.write_batch() as batch:
            for key, value in sent.items():
                if value is None:
                    batch.delete(key)
                elif self._db.get(key) is not None:  # not acked meanwhile
                    batch.put(key, value)

    def _replay_outbox(self) -> None:
        pending = []
        for slot, raw in self._db.iterator(prefix=_OUTBOX):
            data = json.loads(raw)
            pending.append(_Outgoing(slot, Request.from_dict(data["r"]), float(data.get("delay", 0.0)),
                                     data.get("buried") is not None))
        if pending:
            log.info("putting %d follow-ups committed before the last stop on beanstalkd", len(pending))
            self._send(pending)

    def _decode(self, raw: greenstalk.Job[bytes]) -> Job | None:
        try:
            request = Request.from_json(raw.body)
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("burying beanstalkd job %d: its body does not decode: %s", raw.id, exc)
            reason = {"reason": f"undecodable: {exc}", "at": self.clock(), "body": repr(raw.body[:200])}
            self._db.put(_BURIED + f"#{raw.id}".encode(), json.dumps(reason).encode())
            self._ignore(lambda c: c.bury(raw))
            return None
        attempts = self._db.get(_ATTEMPTS + request.key.encode())
        if attempts is not None:
            request = replace(request, attempt=int(attempts))
        return Job(str(raw.id), request)

    def _connect(self) -> greenstalk.Client[bytes]:
        client = greenstalk.Client(self.address, encoding=None, use=self.tube, watch=self.tube)
        return client

    def _call(self, operation: Callable[[greenstalk.Client[bytes]], Any]) -> Any:
        """Run ``operation``, reconnecting with backoff while beanstalkd is unreachable."""
        for attempt in range(10**9):
            try:
                if self._client is None:
                    self._client = self._connect()
                    log.warning("reconnected to beanstalkd at %s", self.url)
                return operation(self._client)
            except (OSError, greenstalk.UnknownResponseError) as exc:
                if self._client is not None:
                    self._client.close()
                self._client = None
                self._reserved.clear()  # beanstalkd gave our reserved jobs back when we lost the link
                wait = _BACKOFF[min(attempt, len(_BACKOFF) - 1)]
                log.warning("beanstalkd at %s unreachable (%s); retrying in %.1fs", self.url, exc, wait)
                self._sleep(wait)
        raise AssertionError("unreachable")

    def _ignore(self, operation: Callable[[greenstalk.Client[bytes]], Any]) -> None:
        """Like _call, where NotFound only means the job was already handed back."""
        try:
            self._call(operation)
        except greenstalk.NotFoundError:
            pass
