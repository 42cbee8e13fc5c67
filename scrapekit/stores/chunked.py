"""Chunked output files: TSV rows (``chunked_tsv``) and JSON lines (``jsonl``), their readers,
and the lossless TSV field escaping. A chunk is written as ``*.part`` and renamed when sealed.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path, PurePosixPath
from types import TracebackType
from typing import Any, BinaryIO, Literal, Self

from ..errors import StoreError
from ..model import Item, Response
from ..units import Bytes, Seconds
from . import stamp

log = logging.getLogger(__name__)

RECORDS = ("pages", "items")
"""What a store can be handed: page records (``Response``) or parsed ``Item``s."""

_BUFFER = 1 << 20
_PART = ".part"
_FOUR_HOURS = Seconds(4 * 3600.0)
_256MB = Bytes(256_000_000)
_TSV_FIELDS = 7
_UNSAFE_HOST = re.compile(r"[^A-Za-z0-9.-]")
_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9._-]")
_ESCAPED = re.compile(rb"\\(.)", re.DOTALL)
_UNESCAPES = {b"\\": b"\\", b"t": b"\t", b"n": b"\n", b"r": b"\r"}
_PHRASES = {status.value: status.phrase for status in HTTPStatus}

OnOpen = Callable[[dict[str, Any]], None]
"""The hook a chunked store calls with the checkpoint of each new, empty chunk."""


# -- TSV fields -----------------------------------------------------------------------------

def escape_field(value: bytes) -> bytes:
    """``value`` with ``\\``, tab, newline and CR as two-byte escapes; safe inside a TSV row."""
    # Backslash first, so the backslashes the other escapes add are not doubled.
    return value.replace(b"\\", b"\\\\").replace(b"\t", b"\\t").replace(b"\n", b"\\n").replace(b"\r", b"\\r")


def unescape_field(value: bytes) -> bytes:
    """The exact inverse of ``escape_field`` for any bytes (an unknown escape is kept as is)."""
    if b"\\" not in value:
        return value
    # One left-to-right pass: chained replaces would read the escaped ``\\`` + ``n`` as a newline.
    return _ESCAPED.sub(lambda match: _UNESCAPES.get(match.group(1), match.group(0)), value)


@dataclass(frozen=True, slots=True)
class TsvRow:
    """One row of a chunked TSV file, as ``read_tsv`` gives it back."""

    kind: str
    url: str
    scraped_at: str
    status: int
    reason: str
    meta: dict[str, Any]
    body: bytes


def read_tsv(path: Path | str) -> Iterator[TsvRow]:
    """Every row of a TSV chunk, each field unescaped to exactly the bytes written.

    Raises StoreError naming ``path:line`` for a row that is not a complete 7-field row
    (a ``.part`` file may end in one).
    """
    with open(path, "rb") as handle:
        for number, line in enumerate(handle, 1):
            fields = line.removesuffix(b"\n").split(b"\t")
            if not line.endswith(b"\n") or len(fields) != _TSV_FIELDS:
                raise StoreError(f"{path}:{number}: not a complete row of {_TSV_FIELDS} tab-separated fields")
            kind, url, scraped_at, status, reason, meta, body = (unescape_field(field) for field in fields)
            try:
                row = TsvRow(kind.decode(), url.decode(), scraped_at.decode(), int(status), reason.decode(),
                             _json_object(meta), body)
            except ValueError as exc:  # also UnicodeDecodeError and json's errors
                raise StoreError(f"{path}:{number}: bad row: {exc}") from None
            yield row


def read_jsonl(path: Path | str) -> Iterator[dict[str, Any]]:
    """Every object of a JSON-lines chunk; StoreError naming ``path:line`` for a bad line."""
    with open(path, "rb") as handle:
        for number, line in enumerate(handle, 1):
            try:
                value = _json_object(line)
            except ValueError as exc:
                raise StoreError(f"{path}:{number}: bad line: {exc}") from None
            yield value


def _json_object(data: bytes) -> dict[str, Any]:
    value = json.loads(data)
    if isinstance(value, dict):
        return value
    raise ValueError(f"expected a JSON object, got {type(value).__name__}")


# -- records --------------------------------------------------------------------------------

def _json(value: Any, sort_keys: bool = False) -> bytes:
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=sort_keys, default=str)
    try:
        return text.encode()
    except UnicodeEncodeError:
        # A lone surrogate has no UTF-8 form; \u escapes keep the line valid JSON and lossless.
        return json.dumps(value, separators=(",", ":"), sort_keys=sort_keys, default=str).encode()


def _reason(response: Response) -> str:
    return response.error or response.reason or _PHRASES.get(response.status, "")


def page_meta(response: Response) -> dict[str, Any]:
    """The meta of a page record: key, depth, attempt, elapsed, length, and when they apply
    final_url, truncated, content_type, location and the request's own meta."""
    request = response.request
    headers = {name.lower(): value for name, value in response.headers.items()}
    meta: dict[str, Any] = {
        "key": request.key,
        "depth": request.depth,
        "attempt": request.attempt,
        "elapsed": round(response.elapsed, 3),
        "length": len(response.body),
    }
    optional: dict[str, Any] = {
        "final_url": response.final_url if response.final_url != request.url else None,
        "truncated": response.truncated or None,
        "content_type": headers.get("content-type"),
        "location": headers.get("location"),
        "meta": dict(request.meta) or None,
    }
    meta.update((key, value) for key, value in optional.items() if value)
    return meta


def _tsv_line(record: Response | Item) -> bytes:
    if isinstance(record, Item):
        fields = (b"item", record.url.encode(), stamp(record.scraped_at).encode(), b"200", b"OK",
                  _json(dict(record.fields)), b"")
    else:
        request = record.request
        fields = (request.kind.encode(), request.url.encode(), stamp(record.fetched_at).encode(),
                  str(record.status).encode(), _reason(record).encode(),
                  _json(page_meta(record), sort_keys=True), record.body)
    return b"\t".join(escape_field(field) for field in fields) + b"\n"


def _jsonl_line(record: Response | Item) -> bytes:
    if isinstance(record, Item):
        data = {**record.fields, "_url": record.url, "_key": record.key, "_scraped_at": stamp(record.scraped_at)}
    else:
        request = record.request
        data = {
            "_url": request.url, "_key": request.key, "_scraped_at": stamp(record.fetched_at),
            "kind": request.kind, "status": record.status, "reason": _reason(record),
            "meta": page_meta(record), "length": len(record.body),
        }
    return _json(data) + b"\n"


# -- chunk files ----------------------------------------------------------------------------

@contextmanager
def _translated(action: str, path: Path) -> Iterator[None]:
    """OSError (disk full, read-only, permission) as a one-line StoreError naming ``path``."""
    try:
        yield
    except OSError as exc:
        raise StoreError(f"cannot {action} {path}: {exc.strerror or exc}") from exc


def _finish(part: Path, length: int) -> None:
    """Seal ``part`` by dropping ``.part`` from its name, or delete it when it holds nothing."""
    with _translated("seal", part):
        if length == 0:
            part.unlink()
        else:
            part.rename(part.with_name(part.name.removesuffix(_PART)))


@dataclass(slots=True)
class _Chunk:
    """The open chunk and how far it has got."""

    path: Path
    file: BinaryIO
    opened_at: float
    written: int = 0
    flushed: int = 0
    offered: int | None = None  # the length in this chunk's last checkpoint()
    durable: int = 0  # the length the runner has committed


class _ChunkWriter:
    """Writes one chunk file at a time, ``out_dir/<YYYYmmdd>/<name>+<YYYYmmddHHMMSS>-<host>-<pid>.<ext>``.

    A chunk is opened on the first write after the previous one was sealed and is written as
    ``.part``. It is sealed (renamed) by ``close``, or by ``committed`` once it is ``rotate``
    seconds old or ``size`` bytes long (0 turns either trigger off), so it holds only committed
    rows; a chunk of zero bytes is deleted instead.
    """

    def __init__(self, out_dir: Path, name: str, ext: str, rotate: float, size: int,
                 clock: Callable[[], float], on_open: OnOpen | None) -> None:
        self._out_dir = out_dir
        self._name = _UNSAFE_NAME.sub("_", name) or "out"
        self._ext = ext
        self._rotate = rotate
        self._size = size
        self._clock = clock
        self._on_open = on_open
        self._host = _UNSAFE_HOST.sub("-", socket.gethostname()) or "localhost"
        self._chunk: _Chunk | None = None
        self._checkpointing = False

    def write(self, data: bytes) -> None:
        chunk = self._chunk or self._open()
        with _translated("write", chunk.path):
            chunk.file.write(data)
        chunk.written += len(data)

    def flush(self) -> None:
        chunk = self._chunk
        if chunk is None:
            return
        with _translated("write", chunk.path):
            chunk.file.flush()
        chunk.flushed = chunk.written

    def checkpoint(self) -> dict[str, Any]:
        self._checkpointing = True
        chunk = self._chunk
        if chunk is None:
            return {"part": None, "length": 0}
        chunk.offered = chunk.flushed
        return {"part": self._relative(chunk.path), "length": chunk.flushed}

    def committed(self) -> None:
        chunk = self._chunk
        if chunk is None or chunk.offered is None:
            return
        chunk.durable = chunk.offered
        # Rows written after the checkpoint are not committed yet: never seal them in.
        if chunk.written == chunk.durable and self._due(chunk):
            self._seal(chunk, chunk.durable)

    def close(self) -> None:
        chunk = self._chunk
        if chunk is None:
            return
        # Once checkpoints are taken, rows past the committed length belong to jobs that will be
        # redone on restart: sealing them in would write those rows twice.
        self._seal(chunk, chunk.durable if self._checkpointing else chunk.written)

    def recover(self, checkpoint: Mapping[str, Any] | None) -> None:
        if checkpoint is None or checkpoint.get("part") is None:
            return
        part = self._inside(checkpoint["part"])
        length = checkpoint.get("length")
        if isinstance(length, bool) or not isinstance(length, int) or length < 0:
            raise StoreError(f"cannot recover {part}: checkpoint length {length!r} is not a byte count")
        with _translated("recover", part):
            if not part.exists():
                return  # sealed or deleted after that commit: nothing is left to repair
            size = part.stat().st_size
            if size < length:
                raise StoreError(f"cannot recover {part}: it holds {size} bytes, fewer than the {length} "
                                 "committed (cut by an OS crash?); rename it by hand to keep what it has")
            os.truncate(part, length)
        log.info("recovered %s: kept %d committed bytes, dropped %d", part, length, size - length)
        _finish(part, length)

    def _due(self, chunk: _Chunk) -> bool:
        too_old = self._rotate > 0 and self._clock() - chunk.opened_at >= self._rotate
        too_big = self._size > 0 and chunk.written >= self._size
        return too_old or too_big

    def _seal(self, chunk: _Chunk, keep: int) -> None:
        """Close ``chunk`` keeping its first ``keep`` bytes, then seal or delete it."""
        self._chunk = None
        with _translated("seal", chunk.path):
            if keep == chunk.written:
                chunk.file.close()
            else:
                # The bytes past ``keep`` are cut off next, so a failed flush of them is moot;
                # the first ``keep`` bytes were flushed when they were checkpointed.
                with suppress(OSError):
                    chunk.file.close()
                os.truncate(chunk.path, keep)
        _finish(chunk.path, keep)

    def _open(self) -> _Chunk:
        now = self._clock()
        folder = self._out_dir / time.strftime("%Y%m%d", time.gmtime(now))
        stem = f"{self._name}+{stamp(now)}-{self._host}-{os.getpid()}"
        with _translated("create a chunk in", folder):
            folder.mkdir(parents=True, exist_ok=True)
            path = self._free_name(folder, stem)
            if self._on_open is not None:
                # Recovery must know a chunk before the file exists (the runner saves this at
                # once), or a kill right after creating it would leave an orphan behind.
                self._on_open({"part": self._relative(path), "length": 0})
            file = open(path, "xb", buffering=_BUFFER)
        self._chunk = chunk = _Chunk(path, file, now)
        return chunk

    def _free_name(self, folder: Path, stem: str) -> Path:
        """A ``.part`` path under a name no chunk has, sealed or not (``-2``, ``-3``… if taken)."""
        number = 1
        while True:
            name = f"{stem}.{self._ext}" if number == 1 else f"{stem}-{number}.{self._ext}"
            part = folder / (name + _PART)
            if not (folder / name).exists() and not part.exists():
                return part
            number += 1

    def _relative(self, path: Path) -> str:
        return path.relative_to(self._out_dir).as_posix()

    def _inside(self, part: object) -> Path:
        """The ``.part`` file a checkpoint names; StoreError unless it lies inside out_dir."""
        refusal = StoreError(f"refusing checkpoint part {part!r}: not a .part file inside {self._out_dir}")
        if not isinstance(part, str):
            raise refusal
        relative = PurePosixPath(part)
        path = self._out_dir / relative
        # resolve() as well as the ".." test: a symlinked folder must not lead outside either.
        if (relative.is_absolute() or ".." in relative.parts or not relative.name.endswith(_PART)
                or not path.resolve().is_relative_to(self._out_dir.resolve())):
            raise refusal
        return path


# -- the stores -----------------------------------------------------------------------------

class _ChunkedStore:
    """What both chunked stores share: records, the chunk writer, the Checkpointed calls."""

    def __init__(self, chunks: _ChunkWriter, records: str) -> None:
        if records not in RECORDS:
            raise ValueError(f"records must be one of {', '.join(RECORDS)}, got {records!r}")
        self.records: str = records
        self._chunks = chunks

    def flush(self) -> None:
        """Hand the rows written so far to the OS: a process crash loses none of them."""
        self._chunks.flush()

    def checkpoint(self) -> dict[str, Any]:
        """``{"part": <current .part relative to out_dir, or None>, "length": <bytes flushed>}``."""
        return self._chunks.checkpoint()

    def committed(self) -> None:
        """The last checkpoint is durable; seal the chunk now if it is due for rotation."""
        self._chunks.committed()

    def recover(self, checkpoint: dict[str, Any] | None) -> None:
        """Cut the chunk ``checkpoint`` names back to its committed length and seal it (delete it
        if that is 0); nothing to do if it is already sealed. StoreError for a path outside out_dir."""
        self._chunks.recover(checkpoint)

    def close(self) -> None:
        """Seal the current chunk. Once checkpoints are taken, only its committed rows are kept."""
        self._chunks.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()


class ChunkedTsvStore(_ChunkedStore):
    """One TSV row per record in ``.tsv`` chunks: kind, url, scraped_at, status, reason, meta, body.

    Fields are escaped with ``escape_field``; ``read_tsv`` reads them back exactly. A page record
    (a Response) gives its request's kind and url, the fetch time (YYYYmmddHHMMSS, UTC), status,
    the error kind or reason phrase, ``page_meta`` as sorted compact JSON, and the raw body. An
    Item gives kind ``item``, status 200, reason OK, its fields as JSON and an empty body.
    """

    def __init__(self, out_dir: Path, name: str, records: Literal["pages", "items"] = "pages",
                 rotate: Seconds = _FOUR_HOURS, size: Bytes = _256MB,
                 clock: Callable[[], float] = time.time, on_open: OnOpen | None = None) -> None:
        super().__init__(_ChunkWriter(out_dir, name, "tsv", rotate, size, clock, on_open), records)

    def write(self, record: Response | Item) -> None:
        """Add one row; StoreError if it cannot be written."""
        self._chunks.write(_tsv_line(record))


class JsonlStore(_ChunkedStore):
    """One JSON object per line in ``.jsonl`` chunks.

    An Item gives its fields plus ``_url``, ``_key`` and ``_scraped_at``; a page record gives
    ``_url``, ``_key``, ``_scraped_at``, kind, status, reason, meta and length (no body). A value
    JSON cannot encode is written as its ``str``. With ``unique`` the runner hands over only
    items whose key this store never took before (the keys are kept in the recipe's state and
    marked in the batch that acks their job).
    """

    def __init__(self, out_dir: Path, name: str, records: Literal["pages", "items"] = "items",
                 rotate: Seconds = _FOUR_HOURS, size: Bytes = _256MB, unique: bool = False,
                 clock: Callable[[], float] = time.time, on_open: OnOpen | None = None) -> None:
        super().__init__(_ChunkWriter(out_dir, name, "jsonl", rotate, size, clock, on_open), records)
        self.unique = unique

    def write(self, record: Response | Item) -> None:
        """Add one line; StoreError if it cannot be written."""
        self._chunks.write(_jsonl_line(record))
