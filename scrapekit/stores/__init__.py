"""Where output records go (Store), and how a store keeps its files in step with the acks
(Checkpointed). The built-in stores, chunked TSV and JSON lines, are in scrapekit.stores.chunked.
"""

from __future__ import annotations

import time
from typing import Any, Protocol, runtime_checkable

from ..model import Item, Response


def stamp(seconds: float) -> str:
    """A time as output records write it: ``YYYYmmddHHMMSS``, UTC."""
    return time.strftime("%Y%m%d%H%M%S", time.gmtime(seconds))


class Store(Protocol):
    """Takes the output records of finished requests.

    ``records`` says what the runner hands to ``write``: ``"pages"``, one ``Response`` per request
    on its final outcome (never per retry); ``"items"``, every ``Item`` parsed from it.

    The runner writes the records of a group of finished jobs, calls ``flush`` and only then acks
    the group; once ``flush`` returns, what was written survives the death of the process. A store
    that cannot write raises ``StoreError`` and the runner acks nothing of that group. ``close`` is
    called once at the end of a run, also after SIGTERM. A store that is not ``Checkpointed`` gives
    at-least-once output: a row flushed just before kill -9 is written again when its job is redone.
    """

    records: str

    def write(self, record: Response | Item) -> None:
        """Add one record; it may stay buffered until ``flush``."""
        ...

    def flush(self) -> None:
        """Hand everything written so far to the operating system (no fsync needed)."""
        ...

    def close(self) -> None:
        """Finish the output: after this the store's files are complete and the store unusable."""
        ...


@runtime_checkable
class Checkpointed(Protocol):
    """A store whose files agree exactly with the acks, even after kill -9 (exactly-once output).

    On every commit the runner calls ``flush()``, then ``checkpoint()``, saves the checkpoint in
    the SAME LevelDB batch as the acks, and calls ``committed()`` once that batch is written.
    At start-up, before any write, it calls ``recover()`` with the last checkpoint it saved.

    A store that opens a new file between two checkpoints must make that file known to recovery
    before writing a row to it. It does so through an ``on_open`` constructor parameter (a
    callable the runner passes, not a method here): the store calls it with the checkpoint of the
    new, still empty file, and the runner saves that checkpoint at once.
    """

    def checkpoint(self) -> dict[str, Any]:
        """A small JSON-able dict saying where the flushed output ends."""
        ...

    def committed(self) -> None:
        """The last checkpoint is durable. Only now may the store seal or rotate a file, so a
        sealed file only ever holds rows of acked jobs."""
        ...

    def recover(self, checkpoint: dict[str, Any] | None) -> None:
        """Make the files agree with ``checkpoint`` (None: nothing was ever committed): cut off
        rows written after it and finish what it names. Touches no file it does not name."""
        ...
