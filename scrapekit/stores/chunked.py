"""Chunked output files: TSV pages (``chunked_tsv``) and JSON-lines items (``jsonl``).

A chunk is ``out/<YYYYmmdd>/<name>+<YYYYmmddHHMMSS>-<host>-<pid>.<ext>``, written as ``.part``
and renamed when sealed; only sealed chunks are complete. Rows are escaped losslessly, and
``read_tsv`` gives back exactly the bytes written.
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Literal

from ..errors import StoreError
from ..model import Item, Response
from ..units import Bytes, Seconds

OnOpen = Callable[[dict[str, Any]], None]
_HOST = re.sub(r"[^A-Za-z0-9.-]", "_", socket.gethostname()) or "host"
_UNESCAPE = {b"\\": b"\\", b"t": b"\t", b"n": b"\n", b"r": b"\r"}
_ESCAPED = re.compile(rb"\\(.)", re.DOTALL)
_BUFFER = 1 << 20


def escape_field(value: bytes) -> bytes:
    """``\\``, tab, newline and carriage return as two-byte escapes (backslash first)."""
    return value.replace(b"\\", b"\\\\").replace(b"\t", b"\\t").replace(b"\n", b"\\n").replace(b"\r", b"\\r")


def unescape_field(value: bytes) -> bytes:
    """The exact inverse of ``escape_field``, in one left-to-right pass."""
    if b"\\" not in value:
        return value
    return _ESCAPED.sub(lambda m: _UNESCAPE.get(m.group(1), m.group(0)), value)


def timestamp(seconds: float) -> str:
    """YYYYmmddHHMMSS in UTC."""
    return time.strftime("%Y%m%d%H%M%S", time.gmtime(seconds))


def page_meta(response: Response) -> dict[str, Any]:
    """The meta column of a page record."""
    request = response.request
    meta: dict[str, Any] = {"key": request.key, "depth": request.depth, "attempt": request.attempt,
                            "elapsed": round(response.elapsed, 3), "length": len(response.body)}
    if response.url and response.url != request.url:
        meta["final_url"] = response.url
    if response.truncated:
        meta["truncated"] = True
    for header in ("content-type", "location"):
        if header in response.headers:
            meta[header.replace("-", "_")] = response.headers[header]
    if request.meta:
        meta["meta"] = dict(request.meta)
    return meta


def _reason(response: Response) -> str:
    return response.error or response.reason


class _ChunkWriter:
    """One open chunk at a time; rotation only after a commit (see stores.Checkpointed)."""

    def __init__(self, out_dir: Path, name: str, ext: str, rotate: float, size: int,
                 clock: Callable[[], float], on_open: OnOpen | None) -> None:
        self.out_dir = out_dir
        self.name = name
        self.ext = ext
        self.rotate = rotate
        self.size = size
        self.clock = clock
        self.on_open = on_open
        self._file: IO[bytes] | None = None
        self._part: Path | None = None
        self._opened_at = 0.0
        self._length = 0

    def write(self, data: bytes) -> None:
        if self._file is None:
            self._open()
        assert self._file is not None
        try:
            self._file.write(data)
        except OSError as exc:
            raise StoreError(f"cannot write {self._part}: {exc.strerror or exc}") from None
        self._length += len(data)

    def flush(self) -> None:
        if self._file is not None:
            try:
                self._file.flush()
            except OSError as exc:
                raise StoreError(f"cannot write {self._part}: {exc.strerror or exc}") from None

    def checkpoint(self) -> dict[str, Any]:
        part = None if self._part is None else self._part.relative_to(self.out_dir).as_posix()
        return {"part": part, "length": self._length if part else 0}

    def committed(self) -> None:
        if self._file is not None and (
            self._length >= self.size or self.clock() - self._opened_at >= self.rotate
        ):
            self.seal()

    def seal(self) -> None:
        """Close the current chunk and drop ``.part`` from its name (delete it if empty)."""
        if self._file is None or self._part is None:
            return
        try:
            self._file.close()
            if self._length == 0:
                self._part.unlink()
            else:
                os.replace(self._part, self._part.with_suffix(""))
        except OSError as exc:
            raise StoreError(f"cannot seal {self._part}: {exc.strerror or exc}") from None
        finally:
            self._file = None
            self._part = None
            self._length = 0

    def recover(self, checkpoint: dict[str, Any] | None) -> None:
        if not checkpoint or not checkpoint.get("part"):
            return
        relative = Path(str(checkpoint["part"]))
        part = (self.out_dir / relative).resolve()
        if relative.is_absolute() or ".." in relative.parts or not part.name.endswith(".part"):
            raise StoreError(f"refusing a checkpoint outside {self.out_dir}: {relative}")
        length = int(checkpoint.get("length", 0))
        try:
            if not part.exists():
                return  # sealed after its last commit
            if length == 0:
                part.unlink()
                return
            with open(part, "r+b") as handle:
                handle.truncate(length)
            os.replace(part, part.with_suffix(""))
        except OSError as exc:
            raise StoreError(f"cannot recover {part}: {exc.strerror or exc}") from None

    def _open(self) -> None:
        now = self.clock()
        stamp = timestamp(now)
        directory = self.out_dir / stamp[:8]
        base = f"{self.name}+{stamp}-{_HOST}-{os.getpid()}"
        try:
            directory.mkdir(parents=True, exist_ok=True)
            n = 1
            while True:
                stem = base if n == 1 else f"{base}-{n}"
                part = directory / f"{stem}.{self.ext}.part"
                if not part.exists() and not part.with_suffix("").exists():
                    break
                n += 1
            handle = open(part, "xb", buffering=_BUFFER)
        except OSError as exc:
            raise StoreError(f"cannot create a chunk in {directory}: {exc.strerror or exc}") from None
        self._file, self._part, self._opened_at, self._length = handle, part, now, 0
        if self.on_open is not None:
            self.on_open(self.checkpoint())  # recovery must know a chunk before its first row


class _ChunkedStore:
    """What the TSV and JSON-lines stores share: a chunk writer and the Checkpointed protocol."""

    ext = ""

    def __init__(self, out_dir: Path, name: str, records: Literal["pages", "items"], rotate: Seconds,
                 size: Bytes, clock: Callable[[], float], on_open: OnOpen | None) -> None:
        self.records = records
        self._chunks = _ChunkWriter(out_dir, name, self.ext, rotate, size, clock, on_open)

    def write(self, record: Response | Item) -> None:
        self._chunks.write(self.format(record))

    def format(self, record: Response | Item) -> bytes:
        raise NotImplementedError

    def flush(self) -> None:
        self._chunks.flush()

    def checkpoint(self) -> dict[str, Any]:
        return self._chunks.checkpoint()

    def committed(self) -> None:
        self._chunks.committed()

    def recover(self, checkpoint: dict[str, Any] | None) -> None:
        self._chunks.recover(checkpoint)

    def close(self) -> None:
        self._chunks.flush()
        self._chunks.seal()

    def __enter__(self) -> _ChunkedStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_FOUR_HOURS = Seconds(4 * 3600.0)
_256MB = Bytes(256_000_000)


class ChunkedTsvStore(_ChunkedStore):
    """One TSV row per record: kind, url, scraped_at, status, reason, meta (JSON), body."""

    ext = "tsv"

    def __init__(self, out_dir: Path, name: str, records: Literal["pages", "items"] = "pages",
                 rotate: Seconds = _FOUR_HOURS, size: Bytes = _256MB,
                 clock: Callable[[], float] = time.time, on_open: OnOpen | None = None) -> None:
        super().__init__(out_dir, name, records, rotate, size, clock, on_open)

    def format(self, record: Response | Item) -> bytes:
        if isinstance(record, Response):
            request = record.request
            fields = [request.kind.encode(), request.url.encode(), timestamp(record.fetched_at).encode(),
                      str(record.status).encode(), _reason(record).encode(),
                      _json(page_meta(record)).encode(), record.body]
        else:
            fields = [b"item", record.url.encode(), timestamp(record.scraped_at).encode(), b"200", b"OK",
                      _json(dict(record.fields)).encode(), b""]
        return b"\t".join(escape_field(f) for f in fields) + b"\n"


class JsonlStore(_ChunkedStore):
    """One JSON object per line: an item's fields plus _url, _key, _scraped_at (or a page summary)."""

    ext = "jsonl"

    def __init__(self, out_dir: Path, name: str, records: Literal["pages", "items"] = "items",
                 rotate: Seconds = _FOUR_HOURS, size: Bytes = _256MB,
                 clock: Callable[[], float] = time.time, on_open: OnOpen | None = None) -> None:
        super().__init__(out_dir, name, records, rotate, size, clock, on_open)

    def format(self, record: Response | Item) -> bytes:
        if isinstance(record, Response):
            request = record.request
            data: dict[str, Any] = {"_url": request.url, "_key": request.key,
                                    "_scraped_at": timestamp(record.fetched_at), "kind": request.kind,
                                    "status": record.status, "reason": _reason(record), "meta": page_meta(record)}
        else:
            data = {**record.fields, "_url": record.url, "_key": record.key,
                    "_scraped_at": timestamp(record.scraped_at)}
        return _json(data, sort=False).encode() + b"\n"


def _json(data: dict[str, Any], sort: bool = True) -> str:
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"), sort_keys=sort, default=str)


@dataclass(frozen=True, slots=True)
class TsvRow:
    """One row of a chunked TSV file, as written."""

    kind: str
    url: str
    scraped_at: str
    status: int
    reason: str
    meta: dict[str, Any]
    body: bytes


def read_tsv(path: Path) -> Iterator[TsvRow]:
    """Every row of a TSV chunk, unescaped exactly."""
    with open(path, "rb") as handle:
        for line in handle:
            fields = [unescape_field(f) for f in line.rstrip(b"\n").split(b"\t")]
            if len(fields) != 7:
                raise StoreError(f"{path}: a row with {len(fields)} fields, expected 7")
            kind, url, scraped_at, status, reason, meta, body = fields
            yield TsvRow(kind.decode(), url.decode(), scraped_at.decode(), int(status), reason.decode(),
                         dict(json.loads(meta)), body)


def read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    """Every object of a JSON-lines chunk."""
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            yield dict(json.loads(line))
