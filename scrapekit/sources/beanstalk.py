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
    q:f:<key>          keys sent to another worker's shard (one of many workers, see scrapekit.shards)

One of many workers owns a shard: its tube is ``<tube>.<i>`` and requests for other shards go
to their owners' inbox tubes ``<tube>.<j>.in`` (through the outbox, so a crash loses none). An
owner takes its inbox in with ``intake``: the requests are queued like its own (duplicates of
keys it has queued or done are dropped) and only then deleted from the inbox.

Puts go to beanstalkd before the acked job is deleted, so while any job of a run is in a tube
(ready, reserved or delayed) the run is not over: the test for "all workers are done".
"""

from __future__ import annotations

import json
import logging
import struct
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlsplit

import greenstalk
import plyvel

from ..errors import QueueError
from ..model import Job, Request, loggable
from ..shards import Shard, inbox_tube, shard_of, work_tube
from ..state import StateDB
from ..units import Seconds

log = logging.getLogger(__name__)

_DONE = b"q:k:"
_QUEUED = b"q:q:"
_ATTEMPTS = b"q:a:"
_BURIED = b"q:b:"
_OUTBOX = b"q:o:"
_SENT = b"q:f:"
_STATE = b"s:"
_DONE_COUNT = b"q:m:bdone"
_MAX_BODY = 65_535 - 512  # beanstalkd's default job limit, less room for an inbox job's wrapping
_PIPELINE = 256  # commands sent in one write before their replies are read (replies stay small)
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


def tube_counts(client: greenstalk.Client[bytes], tube: str) -> dict[str, int]:
    """Jobs ready, reserved, delayed and buried in ``tube`` (all 0 for a tube never used)."""
    try:
        stats: Mapping[str, Any] = client.stats_tube(tube)
    except greenstalk.NotFoundError:
        stats = {}
    return {name: int(stats.get(f"current-jobs-{name}", 0)) for name in ("ready", "reserved", "delayed", "buried")}


class _Client(greenstalk.Client[bytes]):
    """greenstalk's client plus pipelined puts, releases and deletes: many commands in one write, then
    their replies in order, instead of one round trip each (a crawl puts ~20 links a page)."""

    def put_many(self, jobs: Sequence[tuple[bytes, int, int]], ttr: int) -> list[int]:
        """Put ``(body, priority, delay)`` jobs on the used tube; their ids in order."""
        ids: list[int] = []
        for start in range(0, len(jobs), _PIPELINE):
            group = jobs[start:start + _PIPELINE]
            replies = self._pipeline([b"put %d %d %d %d\r\n%s" % (priority, delay, ttr, len(body), body)
                                      for body, priority, delay in group])
            ids += (int(greenstalk._parse_response(line, b"INSERTED")[0]) for line in replies)
        return ids

    def release_many(self, jobs: Sequence[tuple[int, int, int]]) -> None:
        """Release reserved ``(id, priority, delay)`` jobs; one no longer reserved is no error."""
        for start in range(0, len(jobs), _PIPELINE):
            group = jobs[start:start + _PIPELINE]
            for line in self._pipeline([b"release %d %d %d" % job for job in group]):
                if not line.startswith(b"NOT_FOUND"):
                    greenstalk._parse_response(line, b"RELEASED")

    def delete_many(self, job_ids: Sequence[int]) -> None:
        """Delete jobs by id; one gone already (given back, deleted) is no error."""
        for start in range(0, len(job_ids), _PIPELINE):
            for line in self._pipeline([b"delete %d" % job_id for job_id in job_ids[start:start + _PIPELINE]]):
                if not line.startswith(b"NOT_FOUND"):
                    greenstalk._parse_response(line, b"DELETED")

    def _pipeline(self, commands: list[bytes]) -> list[bytes]:
        """Send ``commands`` at once and read every reply line before any is judged, so an error
        reply never leaves the others unread on the connection."""
        self._sock.sendall(b"".join(command + b"\r\n" for command in commands))
        replies = [self._reader.readline() for _ in commands]
        if not all(replies):
            raise ConnectionError("beanstalkd closed the connection")
        return replies


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
    buried: str | None
    tube: str | None = None  # another shard's inbox; None: our own tube


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
        if self._queue.owner(request) is not None:
            return True  # its owner buries it when it takes it in
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
        slot = _OUTBOX + struct.pack(">Q", self._queue.next_seq())
        owner = self._queue.owner(request)
        if owner is not None:  # its owner decides on priority and delay when it takes it in
            self.batch[slot] = json.dumps({"r": request.to_dict(), "delay": delay, "buried": buried,
                                           "tube": owner}).encode()
            self.batch[_SENT + key.encode()] = b""
            self.outbox.append(_Outgoing(slot, request, delay, buried, owner))
            return True
        if self._queue.depth_priority and request.depth:
            request = replace(request, priority=request.priority + self._queue.depth_priority * request.depth)
        delay = max(delay, request.not_before - self._queue.clock(), 0.0)
        self.batch[slot] = json.dumps({"r": request.to_dict(), "delay": delay, "buried": buried}).encode()
        self.batch[_QUEUED + key.encode()] = json.dumps({"r": request.to_dict(), "id": None}).encode()
        self.outbox.append(_Outgoing(slot, request, delay, buried))
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
    """A tube on beanstalkd as the recipe's durable queue; with ``shard``, one worker's shard.

    A job reserved by a worker that dies comes back after ``ttr`` (at once when its connection
    closes). Lost connections are retried with backoff, logged, never fatal.
    """

    def __init__(self, state: StateDB, url: BeanstalkUrl = BeanstalkUrl("beanstalk://127.0.0.1:11300"), tube: str = "",
                 ttr: Seconds = Seconds(120.0), depth_priority: int = 0, name: str = "default",
                 clock: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep,
                 shard: Shard | None = None) -> None:
        self.url = url
        self.address = parse_url(url)
        self.base_tube = tube or name
        self.shard = shard
        self.tube = self.base_tube if shard is None else work_tube(self.base_tube, shard.index)
        self.inbox = None if shard is None else inbox_tube(self.base_tube, shard.index)
        self._inbox_client: _Client | None = None
        self.ttr = max(1, int(ttr))
        self.depth_priority = depth_priority
        self.clock = clock
        self._sleep = sleep
        self._db = state.db
        self._reserved: dict[str, greenstalk.Job[bytes]] = {}
        raw = self._db.get(_DONE_COUNT)
        self._done = int(raw) if raw else 0
        self._seq = 0
        self._client: _Client | None = None
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
        stats = self.tube_counts(self.tube)
        counts = {name: stats[name] for name in ("ready", "reserved", "delayed", "buried")}
        counts["done"] = self._done
        if self.inbox is not None:
            counts["inbox"] = sum(self.tube_counts(self.inbox).values())
        return counts

    def tube_counts(self, tube: str) -> dict[str, int]:
        return dict(self._call(lambda c: tube_counts(c, tube)))

    def owner(self, request: Request) -> str | None:
        """The inbox of the shard that owns ``request``, or None when it is ours."""
        if self.shard is None or self.shard.owns(request.url):
            return None
        return inbox_tube(self.base_tube, shard_of(request.url, self.shard.count))

    def intake(self, limit: int = 1000) -> int:
        """Move up to ``limit`` requests from our inbox into our queue; how many were taken in."""
        if self.inbox is None:
            return 0
        taken: list[greenstalk.Job[bytes]] = []
        with self.transaction() as tx:
            while len(taken) < limit:
                try:
                    raw = self._call(lambda c: c.reserve(timeout=0), inbox=True)
                except (greenstalk.TimedOutError, greenstalk.DeadlineSoonError):
                    break
                taken.append(raw)
                self._take_in(tx, raw)
        if taken:  # queued (or found a duplicate): the inbox copies can go
            self._call(lambda c: c.delete_many([raw.id for raw in taken]), inbox=True)
        return len(taken)

    def _take_in(self, tx: BeanstalkTransaction, raw: greenstalk.Job[bytes]) -> None:
        try:
            data = json.loads(raw.body)
            request = Request.from_dict(data["r"])
            delay = float(data.get("delay") or 0.0)
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("dropping inbox job %d of %s: its body does not decode: %s", raw.id, self.inbox, exc)
            return
        if data.get("buried"):
            tx.put_buried(request, str(data["buried"]))
        else:
            tx.put(request, delay)

    def known(self, key: str) -> bool:
        k = key.encode()
        return (self._db.get(_QUEUED + k) is not None or self._db.get(_DONE + k) is not None
                or (self.shard is not None and self._db.get(_SENT + k) is not None))

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
        """Every queued job as a dump record; beanstalkd is only asked, never disturbed, but for
        a worker's inbox, which is taken in first so its jobs are in the dump too."""
        while self.intake():
            pass
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

    def clear(self) -> int:
        """Delete every job of our tube and inbox from beanstalkd and forget them (done keys stay):
        the last step of moving a queue elsewhere (resharding), with no worker running."""
        deleted = 0
        for inbox in (False, True) if self.inbox is not None else (False,):
            for peek in ("peek_ready", "peek_delayed", "peek_buried"):
                while True:
                    try:
                        job = self._call(lambda c: getattr(c, peek)(), inbox)  # noqa: B023
                    except greenstalk.NotFoundError:
                        break
                    self._ignore(lambda c: c.delete(job), inbox)  # noqa: B023
                    deleted += 1
        with self._db.write_batch() as batch:
            for prefix in (_QUEUED, _ATTEMPTS, _BURIED, _OUTBOX, _SENT):
                for key in self._db.iterator(prefix=prefix, include_value=False):
                    batch.delete(key)
        return deleted

    def close(self) -> None:
        """Close the connection; beanstalkd gives the jobs we still hold back at once."""
        for client in (self._client, self._inbox_client):
            if client is not None:
                client.close()
        self._client = self._inbox_client = None
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
        # LevelDB holds the truth now; what follows is replayable after a crash. The puts come
        # first: a run is not over while any of its jobs is in a tube.
        if tx.outbox:
            self._send(tx.outbox)
        held = [raw.id for job in tx.deletes if (raw := self._reserved.pop(job.id, None)) is not None]
        if held:  # a job we no longer hold comes back by itself and is found done
            self._call(lambda c: c.delete_many(held))
        releases = [(raw.id, job.request.priority, int(round(delay))) for job, delay in tx.releases
                    if (raw := self._reserved.pop(job.id, None)) is not None]
        if releases:
            self._call(lambda c: c.release_many(releases))
        for job in tx.buries:
            self._settle(job, lambda c, raw: c.bury(raw, job.request.priority))  # noqa: B023

    def _settle(self, job: Job, operation: Callable[[greenstalk.Client[bytes], greenstalk.Job[bytes]], Any]) -> None:
        """Apply ``operation`` to a job we hold; a job we no longer hold comes back by itself."""
        held = self._reserved.pop(job.id, None)
        if held is not None:
            raw: greenstalk.Job[bytes] = held
            self._ignore(lambda c: operation(c, raw))

    def _send(self, outbox: list[_Outgoing]) -> None:
        sent: dict[bytes, bytes | None] = {}
        foreign = [out for out in outbox if out.tube is not None]
        if foreign:
            self._send_elsewhere(foreign)
            sent.update((out.slot, None) for out in foreign)
        own = [out for out in outbox if out.tube is None]
        jobs = [(out.request.to_json().encode(), out.request.priority, int(round(out.delay))) for out in own]
        job_ids: list[int] = self._call(lambda c: c.put_many(jobs, self.ttr)) if jobs else []
        for out, job_id in zip(own, job_ids):
            request = out.request
            if out.buried is not None:
                self._ignore(lambda c: c.bury(c.reserve_job(job_id), request.priority))  # noqa: B023
            sent[out.slot] = None
            sent[_QUEUED + request.key.encode()] = json.dumps({"r": request.to_dict(), "id": job_id}).encode()
        with self._db.write_batch() as batch:
            for key, value in sent.items():
                if value is None:
                    batch.delete(key)
                elif self._db.get(key) is not None:  # not acked meanwhile
                    batch.put(key, value)

    def _send_elsewhere(self, outbox: list[_Outgoing]) -> None:
        """Put requests of other shards into their owners' inboxes. One operation per inbox: if
        the link drops, the whole group is put again (the owner drops the duplicates)."""
        groups: dict[str, list[tuple[bytes, int, int]]] = {}
        for out in outbox:
            body = json.dumps({"r": out.request.to_dict(), "delay": out.delay, "buried": out.buried}).encode()
            groups.setdefault(str(out.tube), []).append((body, out.request.priority, 0))

        def put_group(client: _Client, tube: str, jobs: list[tuple[bytes, int, int]]) -> None:
            client.use(tube)
            try:
                client.put_many(jobs, self.ttr)
            finally:
                client.use(self.tube)

        for tube, jobs in groups.items():
            self._call(lambda c: put_group(c, tube, jobs))  # noqa: B023

    def _replay_outbox(self) -> None:
        pending = []
        for slot, raw in self._db.iterator(prefix=_OUTBOX):
            data = json.loads(raw)
            pending.append(_Outgoing(slot, Request.from_dict(data["r"]), float(data.get("delay", 0.0)),
                                     data.get("buried"), data.get("tube")))
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

    def _connect(self, tube: str | None = None) -> _Client:
        tube = tube or self.tube
        return _Client(self.address, encoding=None, use=tube, watch=tube)

    def _call(self, operation: Callable[[_Client], Any], inbox: bool = False) -> Any:
        """Run ``operation`` (on the inbox connection if ``inbox``), reconnecting with backoff
        while beanstalkd is unreachable."""
        for attempt in range(10**9):
            try:
                if inbox:
                    if self._inbox_client is None:
                        self._inbox_client = self._connect(self.inbox)
                    return operation(self._inbox_client)
                if self._client is None:
                    self._client = self._connect()
                    log.warning("reconnected to beanstalkd at %s", self.url)
                return operation(self._client)
            except (OSError, greenstalk.UnknownResponseError) as exc:
                for client in (self._client, self._inbox_client):
                    if client is not None:
                        client.close()
                self._client = self._inbox_client = None
                self._reserved.clear()  # beanstalkd gave our reserved jobs back when we lost the link
                wait = _BACKOFF[min(attempt, len(_BACKOFF) - 1)]
                log.warning("beanstalkd at %s unreachable (%s); retrying in %.1fs", self.url, exc, wait)
                self._sleep(wait)
        raise AssertionError("unreachable")

    def _ignore(self, operation: Callable[[_Client], Any], inbox: bool = False) -> None:
        """Like _call, where NotFound only means the job was already handed back."""
        try:
            self._call(operation, inbox)
        except greenstalk.NotFoundError:
            pass
