"""A persistent, thread-safe work queue for Python programs, without any recipe: the recipe's
LevelDB queue (scrapekit.sources.leveldb) under a ``queue.Queue``-like face.

    q = PersistentQueue("work/jobs", maxsize=10_000)
    q.put({"n": 1}, priority=10, delay=0)
    handle = q.get(timeout=5)
    with q.transaction() as tx:          # all or nothing, also across kill -9
        tx.ack(handle)
        tx.put({"n": 2})

An item got but not acked comes back: at once when its consumer is closed or its thread dies,
and at the next open after the process died. Items are JSON values; bytes are allowed anywhere
inside them.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import queue as stdqueue
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import AlreadyRunning, QueueError
from .model import DEFAULT_PRIORITY, Job, Request
from .sources.leveldb import LevelDbQueue, LevelDbTransaction
from .state import RunLock, StateDB

Empty = stdqueue.Empty
Full = stdqueue.Full
_POLL = 0.05  # longest sleep of a blocked get while a delayed item may come due


def _encode(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray)):
        return {"$bytes": base64.b64encode(value).decode()}
    raise TypeError(f"queue items must be JSON values or bytes, not {type(value).__name__}")


def _decode(data: dict[str, Any]) -> Any:
    if data.keys() == {"$bytes"}:
        return base64.b64decode(data["$bytes"])
    return data


def _pack(item: Any) -> Any:
    """The item as plain JSON (raises TypeError now, not at some later read)."""
    return json.loads(json.dumps(item, default=_encode))


def _unpack(packed: Any) -> Any:
    return json.loads(json.dumps(packed), object_hook=_decode)


@dataclass(frozen=True, slots=True)
class Handle:
    """An item got from the queue; pass it to ack or nack."""

    id: str
    item: Any
    priority: int
    attempt: int
    _job: Job = dataclasses.field(repr=False, compare=False)


class Transaction:
    """Acks, nacks and puts that become durable together when the ``with`` block ends."""

    def __init__(self, owner: PersistentQueue, tx: LevelDbTransaction) -> None:
        self._owner = owner
        self._tx = tx
        self.settled: list[str] = []
        self.added = 0

    def put(self, item: Any, priority: int = DEFAULT_PRIORITY, delay: float = 0.0) -> None:
        self._tx.put(self._owner._envelope(item, priority, delay))
        self.added += 1

    def ack(self, handle: Handle) -> None:
        self._tx.ack(handle._job)
        self.settled.append(handle.id)

    def nack(self, handle: Handle, delay: float = 0.0) -> None:
        request = handle._job.request
        self._tx.retry(handle._job, delay, dataclasses.replace(request, attempt=request.attempt + 1))
        self.settled.append(handle.id)


class Consumer:
    """One consumer's connection: what it holds comes back when it closes or its thread dies."""

    def __init__(self, owner: PersistentQueue) -> None:
        self._owner = owner
        self.thread = threading.current_thread()
        self.held: dict[str, Handle] = {}

    def get(self, block: bool = True, timeout: float | None = None) -> Handle:
        return self._owner._get(self, block, timeout)

    def ack(self, handle: Handle) -> None:
        with self._owner.transaction() as tx:
            tx.ack(handle)

    def nack(self, handle: Handle, delay: float = 0.0) -> None:
        with self._owner.transaction() as tx:
            tx.nack(handle, delay)

    def close(self) -> None:
        """Give back every item this consumer holds (ready again at once)."""
        self._owner._release(self)

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class PersistentQueue:
    """A durable priority queue of JSON items on LevelDB at ``path`` (one process at a time).

    ``maxsize`` > 0 bounds the items not yet acked: ``put`` then blocks (or raises Full).
    """

    def __init__(self, path: str | Path, maxsize: int = 0, sync: bool = False,
                 clock: Callable[[], float] = time.time) -> None:
        self.path = Path(path)
        self.maxsize = maxsize
        self._lock = RunLock(self.path / "queue.pid", str(self.path))
        try:
            self._lock.acquire()
        except AlreadyRunning as exc:
            raise QueueError(f"queue {self.path} is held by another process (pid {exc.pid})") from None
        self._state = StateDB(self.path / "db")
        self._queue = LevelDbQueue(self._state, sync=sync, remember_done=False, clock=clock)
        self._clock = clock
        self._changed = threading.Condition(threading.RLock())
        self._consumers: list[Consumer] = []
        self._default = self.connect()

    # -- the queue.Queue face ----------------------------------------------------------------

    def put(self, item: Any, priority: int = DEFAULT_PRIORITY, delay: float = 0.0,
            block: bool = True, timeout: float | None = None) -> None:
        """Add ``item`` (lower ``priority`` first, after ``delay`` seconds). TypeError at once
        for an item that is not JSON; Full when bounded and full past ``timeout``."""
        envelope = self._envelope(item, priority, delay)
        with self._changed:
            if self.maxsize > 0:
                self._wait(lambda: len(self) < self.maxsize, block, timeout, Full)
            with self._queue.transaction() as tx:
                tx.put(envelope)
            self._changed.notify_all()

    def get(self, block: bool = True, timeout: float | None = None) -> Handle:
        """The most urgent ready item, through the default consumer; Empty past ``timeout``."""
        return self._get(self._default, block, timeout)

    def ack(self, handle: Handle) -> None:
        with self.transaction() as tx:
            tx.ack(handle)

    def nack(self, handle: Handle, delay: float = 0.0) -> None:
        """Give ``handle`` back, ready again after ``delay`` seconds."""
        with self.transaction() as tx:
            tx.nack(handle, delay)

    @contextmanager
    def transaction(self) -> Iterator[Transaction]:
        """Acks, nacks and puts made on the yielded transaction: one atomic batch at the end."""
        with self._changed:
            with self._queue.transaction() as raw:
                tx = Transaction(self, raw)
                yield tx
            for consumer in self._consumers:
                for handle_id in tx.settled:
                    consumer.held.pop(handle_id, None)
            self._changed.notify_all()

    def connect(self) -> Consumer:
        """A new consumer for the calling thread."""
        consumer = Consumer(self)
        with self._changed:
            self._consumers.append(consumer)
        return consumer

    def __len__(self) -> int:
        """Items not acked yet (ready, reserved and delayed)."""
        counts = self._queue.counts()
        return counts["ready"] + counts["reserved"] + counts["delayed"]

    def qsize(self, state: str | None = None) -> int:
        """Items in ``state`` (ready, reserved, delayed or buried), or all not acked."""
        return len(self) if state is None else self._queue.counts()[state]

    def empty(self) -> bool:
        return len(self) == 0

    def __iter__(self) -> Iterator[Any]:
        """Every item not acked, for inspection (nothing is reserved or changed)."""
        for record in self._queue.dump():
            if record["state"] != "buried":
                yield _unpack(record["request"]["meta"]["item"])

    def close(self) -> None:
        """Close the database; items not acked come back at the next open."""
        self._queue.close()
        self._state.close()
        self._lock.release()

    def __enter__(self) -> PersistentQueue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals ---------------------------------------------------------------------------

    def _envelope(self, item: Any, priority: int, delay: float) -> Request:
        try:
            packed = _pack(item)
        except ValueError as exc:
            raise TypeError(f"queue items must be JSON values: {exc}") from None
        not_before = self._clock() + delay if delay > 0 else 0.0
        return Request(url="", key=uuid.uuid4().hex, meta={"item": packed}, priority=priority, not_before=not_before)

    def _get(self, consumer: Consumer, block: bool, timeout: float | None) -> Handle:
        found: list[Handle] = []

        def ready() -> bool:
            self._reap()
            job = self._queue.reserve()
            if job is None:
                return False
            request = job.request
            handle = Handle(job.id, _unpack(request.meta["item"]), request.priority, request.attempt, job)
            consumer.held[handle.id] = handle
            found.append(handle)
            return True

        with self._changed:
            self._wait(ready, block, timeout, Empty, poll=_POLL)
        return found[0]

    def _wait(self, done: Callable[[], bool], block: bool, timeout: float | None,
              error: type[Exception], poll: float | None = None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not done():
            left = None if deadline is None else deadline - time.monotonic()
            if not block or (left is not None and left <= 0):
                raise error
            wait = poll if left is None else (left if poll is None else min(left, poll))
            self._changed.wait(wait)

    def _release(self, consumer: Consumer) -> None:
        with self.transaction() as tx:
            for handle in list(consumer.held.values()):
                tx.nack(handle)
        with self._changed:
            if consumer in self._consumers and consumer is not self._default:
                self._consumers.remove(consumer)

    def _reap(self) -> None:
        """Give back what consumers whose threads died were holding."""
        for consumer in [c for c in self._consumers if c is not self._default and c.held and not c.thread.is_alive()]:
            self._release(consumer)
