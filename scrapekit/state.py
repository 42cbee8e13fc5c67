"""The per-recipe state: one LevelDB under work/<name>/state/, guarded by a pid lock file.

Every piece of durable state (queue, source read positions, store checkpoints, counters) lives
in this one database, so a single WriteBatch can make them agree after kill -9.
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path
from types import TracebackType
from typing import IO

import plyvel

from .errors import AlreadyRunning, QueueError, ScrapekitError


class RunLock:
    """An exclusive ``flock`` on ``run.pid`` that holds the pid of the process owning the state.

    The kernel drops the lock when its holder dies, so a stale file never blocks a restart.
    """

    def __init__(self, path: Path, name: str) -> None:
        self.path = path
        self.name = name
        self._file: IO[str] | None = None

    def acquire(self) -> RunLock:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            handle = open(self.path, "a+")
        except OSError as exc:
            raise ScrapekitError(f"cannot write the pid file {self.path}: {exc.strerror or exc}") from None
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            handle.close()
            if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise AlreadyRunning(self.name, read_pid(self.path)) from None
            raise
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        self._file = handle
        return self

    def release(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def read_pid(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def running_pid(path: Path) -> int | None:
    """The pid holding the run lock at ``path``, or None when no live process holds it."""
    if not path.exists():
        return None
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return read_pid(path) or -1
        fcntl.flock(handle, fcntl.LOCK_UN)
    return None


class StateDB:
    """The recipe's LevelDB. Open it only while holding the RunLock of the same directory."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            path.mkdir(parents=True, exist_ok=True)
            self.db = plyvel.DB(str(path), create_if_missing=True, bloom_filter_bits=10)
        except (plyvel.Error, OSError) as exc:
            raise QueueError(f"cannot open state database {path}: {exc}") from None

    def prefixed(self, prefix: bytes) -> plyvel.DB:
        return self.db.prefixed_db(prefix)

    def close(self) -> None:
        if not self.db.closed:
            self.db.close()

    def __enter__(self) -> StateDB:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
