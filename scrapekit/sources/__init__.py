"""Where requests come from (Source) and the durable queue that holds them until done (Queue).

A Source reads requests lazily from a resumable position; the runner moves them into the Queue
in the same batch that saves the new position. The Queue hands jobs to the runner and takes
them back, done or not, atomically with their follow-ups.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import AbstractContextManager
from typing import Any, Protocol, runtime_checkable

from ..model import Job, Request


@runtime_checkable
class Source(Protocol):
    """Feeds requests to the queue.

    ``requests(position)`` yields ``(request, position_after_it)`` from a position the runner
    saved earlier (None at the very start). The runner stores the position in the same batch
    as the queued requests, so after kill -9 it resumes exactly after the last queued one.
    A finite source simply stops yielding.
    """

    def requests(self, position: str | None) -> Iterator[tuple[Request, str]]: ...


class Transaction(Protocol):
    """Operations that become durable together, or not at all, when the transaction commits."""

    def put(self, request: Request, *, unseen: bool = False) -> bool:
        """Queue ``request`` unless its key is already queued or done; True when queued.
        ``unseen``: the caller has just found ``Queue.known(key)`` false, so the queue need not
        look it up again (a key put earlier in this transaction is still refused)."""
        ...

    def ack(self, job: Job, follow_ups: Iterable[Request] = ()) -> None:
        """Remove ``job`` as done and queue its follow-ups (duplicates by key are skipped)."""
        ...

    def retry(self, job: Job, delay: float, request: Request | None = None) -> None:
        """Give ``job`` back, ready again after ``delay`` seconds, as ``request`` if given."""
        ...

    def bury(self, job: Job, reason: str) -> None:
        """Set ``job`` aside with ``reason``; it stays in the queue for inspection and kick."""
        ...

    def set_state(self, name: str, value: Mapping[str, Any] | None) -> None:
        """Save (or with None delete) a small JSON state record in the same batch."""
        ...


class Queue(Protocol):
    """The durable queue as the runner uses it.

    ``reserve`` gives a job or None when none is ready. Every reserved job ends in exactly one
    of ack, retry or bury; a job reserved by a process that died comes back. All changes made
    inside ``with queue.transaction() as tx:`` are written as one atomic batch on exit.
    """

    ttr: float
    """Seconds a reservation lasts unless touched (infinite for a queue whose leases never expire)."""

    def reserve(self) -> Job | None: ...

    def touch(self, job: Job) -> None:
        """Renew the reservation of ``job`` (a long fetch)."""
        ...

    def transaction(self) -> AbstractContextManager[Transaction]: ...

    def get_state(self, name: str) -> dict[str, Any] | None:
        """A state record saved with ``Transaction.set_state``, or None."""
        ...

    def is_done(self, key: str) -> bool:
        """True once a job with this key was acked."""
        ...

    def known(self, key: str) -> bool:
        """True when a job with this key is queued (in any state) or done."""
        ...

    def counts(self) -> dict[str, int]:
        """Jobs ready (not reserved), reserved, delayed, buried, and done."""
        ...

    def close(self) -> None: ...
