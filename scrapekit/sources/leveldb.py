"""The embedded durable queue on LevelDB: priorities, delays, buried jobs and a done-set, keyed
by request key, with every change of one transaction written as a single WriteBatch.

Layout (all in the recipe's one state DB):
    q:j:<key>                  the job (request JSON and where its index entry is)
    q:r:<pri:4><seq:8>         ready index, lowest priority number first, then FIFO
    q:d:<due_ms:8><seq:8>      delayed index, by due time
    q:b:<key>                  buried: reason and time
    q:k:<key>                  done keys (a key done once is never queued again)
    q:m:counts, q:m:seq        counters, written in every batch so they agree with the data
    s:<name>                   state records of other parts (source positions, store checkpoints)

Reservations are kept in memory only: a reserved job keeps its ready-index entry until it is
acked, retried or buried, so a process that dies holding jobs gives them all back at restart.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import plyvel

from ..errors import QueueError
from ..model import Job, Request
from ..state import StateDB

_JOB = b"q:j:"
_READY = b"q:r:"
_DELAYED = b"q:d:"
_BURIED = b"q:b:"
_DONE = b"q:k:"
_COUNTS = b"q:m:counts"
_SEQ = b"q:m:seq"
_STATE = b"s:"
log = logging.getLogger(__name__)
_COUNT_NAMES = ("ready", "delayed", "buried", "done")
_FILL = 512  # ready-index entries read per scan; bounds memory, amortises iterator cost


def _ready_key(priority: int, seq: int) -> bytes:
    return _READY + struct.pack(">IQ", max(0, min(priority, 0xFFFFFFFF)), seq)


def _delayed_key(due: float, seq: int) -> bytes:
    return _DELAYED + struct.pack(">QQ", int(due * 1000), seq)


def _due_of(delayed_key: bytes) -> float:
    return float(struct.unpack(">Q", delayed_key[len(_DELAYED) : len(_DELAYED) + 8])[0]) / 1000.0


class LevelDbTransaction:
    """Collects queue and state changes; the queue writes them as one batch (see Transaction)."""

    def __init__(self, queue: LevelDbQueue) -> None:
        self._queue = queue
        self._batch: dict[bytes, bytes | None] = {}
        self._new_keys: set[str] = set()
        self._settled: list[str] = []
        self._delta = dict.fromkeys(_COUNT_NAMES, 0)
        self._earliest_due: float | None = None
        self._lowest_ready: bytes | None = None

    def put(self, request: Request, *, unseen: bool = False) -> bool:
        key = request.key
        if key in self._new_keys or (not unseen and self._queue.known(key)):
            return False
        self._new_keys.add(key)
        request = self._queue.prioritised(request)
        self._index(key, request, request.not_before)
        return True

    def ack(self, job: Job, follow_ups: Iterable[Request] = ()) -> None:
        self._settle(job)
        if self._queue.remember_done:
            self._batch[_DONE + job.id.encode()] = b""
        self._delta["done"] += 1
        for request in follow_ups:
            self.put(request)

    def retry(self, job: Job, delay: float, request: Request | None = None) -> None:
        self._settle(job)
        request = request or job.request
        self._index(job.id, request, self._queue.clock() + max(0.0, delay))

    def bury(self, job: Job, reason: str) -> None:
        self._settle(job)
        self._bury(job.id, job.request, reason)

    def put_buried(self, request: Request, reason: str) -> bool:
        """Queue ``request`` straight into the buried state (loading a dump)."""
        if request.key in self._new_keys or self._queue.known(request.key):
            return False
        self._new_keys.add(request.key)
        self._bury(request.key, request, reason)
        return True

    def kick(self, key: str) -> None:
        """Move the buried job ``key`` back to ready."""
        raw = self._queue.buried_record(key)
        if raw is None or "request" not in raw:
            return  # a corrupt record stays buried: there is nothing to run
        self._batch[_BURIED + key.encode()] = None
        self._delta["buried"] -= 1
        self._index(key, Request.from_dict(raw["request"]), 0.0)

    def _bury(self, key: str, request: Request, reason: str) -> None:
        record = {"reason": reason, "at": self._queue.clock(), "request": request.to_dict()}
        self._batch[_JOB + key.encode()] = json.dumps({"r": request.to_dict(), "i": None}).encode()
        self._batch[_BURIED + key.encode()] = json.dumps(record).encode()
        self._delta["buried"] += 1

    def set_state(self, name: str, value: Mapping[str, Any] | None) -> None:
        self._batch[_STATE + name.encode()] = None if value is None else json.dumps(value).encode()

    def _settle(self, job: Job) -> None:
        index = self._queue.reserved_index(job)
        self._batch[index] = None
        self._batch[_JOB + job.id.encode()] = None
        self._delta["ready"] -= 1
        self._settled.append(job.id)

    def _index(self, key: str, request: Request, due: float) -> None:
        seq = self._queue.next_seq()
        if due > self._queue.clock():
            index = _delayed_key(due, seq)
            self._delta["delayed"] += 1
            self._earliest_due = due if self._earliest_due is None else min(due, self._earliest_due)
        else:
            index = _ready_key(request.priority, seq)
            self._delta["ready"] += 1
            if self._lowest_ready is None or index < self._lowest_ready:
                self._lowest_ready = index
        self._batch[_JOB + key.encode()] = json.dumps({"r": request.to_dict(), "i": index.hex()}).encode()
        self._batch[index] = key.encode()


class LevelDbQueue:
    """The embedded durable queue (see the module docstring for its layout and guarantees).

    ``sync=True`` fsyncs every batch: needed only to survive an OS crash or power loss, since
    a batch is all-or-nothing under kill -9 either way. ``remember_done=False`` forgets acked
    keys (a plain work queue, see scrapekit.queue) instead of refusing them ever after.
    ``depth_priority`` adds that much to the priority number of each generation of follow-ups.
    """

    ttr = float("inf")  # reservations last until the process ends

    def __init__(self, state: StateDB, sync: bool = False, depth_priority: int = 0, remember_done: bool = True,
                 clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.depth_priority = depth_priority
        self.remember_done = remember_done
        self._db = state.db
        self._sync = sync
        self._lock = threading.RLock()
        self._reserved: dict[str, bytes] = {}
        self._buffer: deque[tuple[bytes, str]] = deque()
        self._cursor: bytes | None = None
        counts = self._db.get(_COUNTS)
        self._counts: dict[str, int] = dict.fromkeys(_COUNT_NAMES, 0)
        if counts:
            self._counts.update(json.loads(counts))
        seq = self._db.get(_SEQ)
        self._seq = int(seq) if seq else 0
        self._next_due = self._scan_next_due()

    # -- the runner's side -------------------------------------------------------------------

    def reserve(self) -> Job | None:
        """The most urgent ready job, or None. Due delayed jobs become ready first."""
        with self._lock:
            if self._next_due is not None and self._next_due <= self.clock():
                self._promote_due()
            while True:
                if not self._buffer and not self._fill():
                    return None
                index, key = self._buffer.popleft()
                if key in self._reserved:
                    continue
                raw = self._db.get(_JOB + key.encode())
                if raw is None:
                    continue
                try:
                    data = json.loads(raw)
                    if data["i"] != index.hex():
                        continue  # moved since the scan (retried, buried or re-indexed)
                    request = Request.from_dict(data["r"])
                except (ValueError, KeyError, TypeError) as exc:
                    self._set_aside(key, index, raw, exc)
                    continue
                self._reserved[key] = index
                return Job(key, request)

    @contextmanager
    def transaction(self) -> Iterator[LevelDbTransaction]:
        """All changes made on the yielded transaction are written as one batch at the end."""
        with self._lock:
            tx = LevelDbTransaction(self)
            yield tx
            self._commit(tx)

    def put(self, request: Request) -> bool:
        with self.transaction() as tx:
            return tx.put(request)

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
        """Nothing to renew: a reservation lasts as long as this process."""

    def get_state(self, name: str) -> dict[str, Any] | None:
        raw = self._db.get(_STATE + name.encode())
        return None if raw is None else dict(json.loads(raw))

    def counts(self) -> dict[str, int]:
        """Jobs ready (not reserved), reserved, delayed, buried, and done."""
        with self._lock:
            reserved = len(self._reserved)
            return {**self._counts, "ready": self._counts["ready"] - reserved, "reserved": reserved}

    def known(self, key: str) -> bool:
        """True when ``key`` is queued (in any state) or done."""
        k = key.encode()
        return self._db.get(_JOB + k) is not None or self._db.get(_DONE + k) is not None

    def is_done(self, key: str) -> bool:
        return self._db.get(_DONE + key.encode()) is not None

    def buried(self) -> Iterator[dict[str, Any]]:
        """Buried jobs with their reasons, for inspection."""
        for _, raw in self._db.iterator(prefix=_BURIED):
            yield dict(json.loads(raw))

    def buried_record(self, key: str) -> dict[str, Any] | None:
        raw = self._db.get(_BURIED + key.encode())
        return None if raw is None else dict(json.loads(raw))

    def kick(self, bound: int) -> int:
        """Move up to ``bound`` buried jobs back to ready; returns how many moved."""
        keys = [k[len(_BURIED):].decode() for k in self._db.iterator(prefix=_BURIED, include_value=False)][:bound]
        with self.transaction() as tx:
            for key in keys:
                tx.kick(key)
        return len(keys)

    def dump(self) -> Iterator[dict[str, Any]]:
        """Every job (ready, reserved, delayed, buried) as a dump record, from one snapshot."""
        now = self.clock()
        with self._lock:
            reserved = set(self._reserved)
        snapshot = self._db.snapshot()
        try:
            for key, raw in snapshot.iterator(prefix=_JOB):
                name = key[len(_JOB):].decode()
                data = json.loads(raw)
                record: dict[str, Any] = {"request": data["r"], "state": "ready", "delay": 0.0}
                if data["i"] is None:
                    buried = snapshot.get(_BURIED + key[len(_JOB):])
                    record["state"] = "buried"
                    record["reason"] = json.loads(buried)["reason"] if buried else ""
                elif bytes.fromhex(data["i"]).startswith(_DELAYED):
                    record["state"] = "delayed"
                    record["delay"] = round(max(0.0, _due_of(bytes.fromhex(data["i"])) - now), 3)
                elif name in reserved:
                    record["state"] = "reserved"
                yield record
        finally:
            snapshot.close()

    def close(self) -> None:
        """Forget reservations; the jobs stay queued on disk and come back at the next open."""
        with self._lock:
            self._reserved.clear()
            self._buffer.clear()

    # -- used by transactions ----------------------------------------------------------------

    def prioritised(self, request: Request) -> Request:
        """Deeper generations later: priority grows by ``depth_priority`` per link followed."""
        if not self.depth_priority or not request.depth:
            return request
        return dataclasses.replace(request, priority=request.priority + self.depth_priority * request.depth)

    def reserved_index(self, job: Job) -> bytes:
        try:
            return self._reserved[job.id]
        except KeyError:
            raise QueueError(f"job {job.id!r} is not reserved by this queue") from None

    def next_seq(self) -> int:
        self._seq += 1
        return self._seq

    # -- internals ---------------------------------------------------------------------------

    def _commit(self, tx: LevelDbTransaction) -> None:
        counts = {name: self._counts[name] + tx._delta[name] for name in _COUNT_NAMES}
        try:
            with self._db.write_batch(sync=self._sync) as batch:
                for key, value in tx._batch.items():
                    if value is None:
                        batch.delete(key)
                    else:
                        batch.put(key, value)
                batch.put(_COUNTS, json.dumps(counts).encode())
                batch.put(_SEQ, str(self._seq).encode())
        except (plyvel.Error, OSError) as exc:
            raise QueueError(f"cannot write the queue batch: {exc}") from None
        self._counts = counts
        for job_id in tx._settled:
            self._reserved.pop(job_id, None)
        if tx._earliest_due is not None and (self._next_due is None or tx._earliest_due < self._next_due):
            self._next_due = tx._earliest_due
        if tx._lowest_ready is not None and self._cursor is not None and tx._lowest_ready <= self._cursor:
            self._cursor = None  # a more urgent job landed behind the scan position
            self._buffer.clear()

    def _fill(self) -> bool:
        start = self._cursor + b"\x00" if self._cursor is not None else _READY
        taken = 0
        for index, key in self._db.iterator(start=start, stop=_READY + b"\xff" * 12):
            self._cursor = index
            name = key.decode()
            if name in self._reserved:
                continue
            self._buffer.append((index, name))
            taken += 1
            if taken >= _FILL:
                break
        if not taken:
            self._cursor = None  # wrap: entries behind the cursor may have been freed by retries
            for index, key in self._db.iterator(start=_READY, stop=_READY + b"\xff" * 12):
                name = key.decode()
                if name not in self._reserved:
                    self._buffer.append((index, name))
                    self._cursor = index
                    taken += 1
                    if taken >= _FILL:
                        break
        return taken > 0

    def _set_aside(self, key: str, index: bytes, raw: bytes, exc: Exception, state: str = "ready") -> None:
        """Bury a record that does not decode, so the rest of the queue stays readable."""
        log.error("queue record %r does not decode (%s); buried as corrupt", key, exc)
        record = {"reason": f"corrupt record: {exc}", "at": self.clock(), "raw": raw[:500].decode("utf-8", "replace")}
        tx = LevelDbTransaction(self)
        tx._batch[index] = None
        tx._batch[_JOB + key.encode()] = None
        tx._batch[_BURIED + key.encode()] = json.dumps(record).encode()
        tx._delta[state] -= 1
        tx._delta["buried"] += 1
        self._commit(tx)

    def _promote_due(self) -> None:
        now = self.clock()
        moves: list[tuple[bytes, str]] = []
        for index, key in self._db.iterator(start=_DELAYED, stop=_delayed_key(now, 0xFFFFFFFFFFFFFFFF)):
            moves.append((index, key.decode()))
            if len(moves) >= 10_000:
                break
        if moves:
            tx = LevelDbTransaction(self)
            corrupt: list[tuple[str, bytes, bytes, Exception]] = []
            for index, key in moves:
                raw = self._db.get(_JOB + key.encode())
                if raw is None:
                    tx._batch[index] = None
                    tx._delta["delayed"] -= 1
                    continue
                try:
                    request = Request.from_dict(json.loads(raw)["r"])
                except (ValueError, KeyError, TypeError) as exc:
                    corrupt.append((key, index, raw, exc))
                    continue
                tx._batch[index] = None
                tx._delta["delayed"] -= 1
                tx._index(key, request, 0.0)
            self._commit(tx)
            for bad_key, bad_index, bad_raw, error in corrupt:
                self._set_aside(bad_key, bad_index, bad_raw, error, "delayed")
        self._next_due = self._scan_next_due()

    def _scan_next_due(self) -> float | None:
        for index in self._db.iterator(prefix=_DELAYED, include_value=False):
            return _due_of(index)
        return None
