"""The key store (``leveldb``): one JSON value per record key, kept in the recipe's state DB.

Layout, under ``<prefix>:`` in the state DB (prefix ``kv`` by default):
    r:<key>    the record's JSON value
    n          how many keys the store holds, in decimal, written in every batch with the records
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator, Mapping
from http import HTTPStatus
from types import TracebackType
from typing import Any, Literal, Self

import plyvel

from ..errors import StoreError
from ..model import Item, Request, Response
from ..state import StateDB
from . import stamp

PAGE_HEADERS = ("content-type", "content-length", "location", "last-modified", "etag")
"""The response headers a page record keeps (names lower-case); the rest are dropped."""

TAKEN_PREFIXES: Mapping[str, str] = {"q": "the queue", "s": "the state records", "r": "the robots cache"}
"""Key spaces of the state DB that other parts own: a store prefix may not be one of them."""

_RECORD = b"r:"
_COUNT = b"n"
_PREFIX_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")
_PHRASES = {status.value: status.phrase for status in HTTPStatus}


def _key(key: str) -> bytes:
    # surrogatepass: any str a parser makes a key of is stored, and items() gives it back as it was.
    return _RECORD + key.encode("utf-8", "surrogatepass")


def item_value(item: Item) -> dict[str, Any]:
    """What the store keeps of an Item: its fields plus ``_url`` and ``_scraped_at`` (YYYYmmddHHMMSS, UTC)."""
    return {**item.fields, "_url": item.url, "_scraped_at": stamp(item.scraped_at)}


def page_value(response: Response) -> dict[str, Any]:
    """What the store keeps of a page record: url, status, reason (the error kind of a failed
    request), the PAGE_HEADERS it has, ``truncated`` when it is, fetched_at (YYYYmmddHHMMSS,
    UTC), and the exact body bytes: as ``body`` when they are UTF-8, else as ``body_base64``."""
    headers = {name.lower(): value for name, value in response.headers.items()}
    value: dict[str, Any] = {
        "url": response.request.url,
        "status": response.status,
        "reason": response.error or response.reason or _PHRASES.get(response.status, ""),
        "headers": {name: headers[name] for name in PAGE_HEADERS if name in headers},
        "fetched_at": stamp(response.fetched_at),
    }
    if response.truncated:
        value["truncated"] = True
    try:
        value["body"] = response.body.decode("utf-8")
    except UnicodeDecodeError:
        value["body_base64"] = base64.b64encode(response.body).decode("ascii")
    return value


class LevelDbStore:
    """A key -> record map in the recipe's state DB: an Item under ``item.key``, a page record
    (a Response) under its request's key, each as one JSON object (``item_value``, ``page_value``).

    Writing a key again replaces its record: items that share a key (the html parser gives every
    item of a page its page's key) leave the last one written. A value JSON cannot encode is
    kept as its ``str``, as in the jsonl store.

    ``write`` only buffers; ``flush`` writes the buffered records and the new key count in one
    LevelDB WriteBatch. The runner flushes a group's records BEFORE the batch that acks the
    group (the queue owns that batch), so a kill -9 in between leaves records of jobs that are
    not acked: those jobs are done again and write their records again under the same keys, an
    idempotent overwrite. So the store holds a record of every acked job, and after a crash
    perhaps also of a job that was in flight; it needs no checkpoint. Reads (``get``, ``in``,
    ``len``, ``items``) see what was flushed. ``prefix`` keeps two stores of one recipe apart.

    ``mode``: ``store`` only stores. ``cache`` (with ``records: pages``) is a read-through cache:
    the runner fetches a request only when the store has no page for its key and otherwise parses
    the stored page (``cached``), counting hits and misses. ``conditional`` skips requests whose
    key the store holds already (no fetch, no record). Either way a key counts only once its
    record was flushed, before its job's ack: a crash can make a request be done again, never
    lose its data.
    """

    def __init__(self, state: StateDB, name: str, records: Literal["pages", "items"] = "items",
                 prefix: str = "kv", mode: Literal["store", "cache", "conditional"] = "store") -> None:
        if records not in ("pages", "items"):
            raise ValueError(f"records must be pages or items, got {records!r}")
        if mode == "cache" and records != "pages":
            raise ValueError("mode cache keeps pages: set records: pages")
        if not prefix or not set(prefix) <= _PREFIX_CHARS:
            raise ValueError(f"prefix must be letters, digits, '_', '.' or '-', got {prefix!r}")
        if prefix in TAKEN_PREFIXES:
            raise ValueError(f"prefix {prefix!r} is taken by {TAKEN_PREFIXES[prefix]}; choose another")
        self.records: str = records
        self.mode = mode
        self.name = name
        self.prefix = prefix
        self._db = state.prefixed(f"{prefix}:".encode())
        self._pending: dict[bytes, bytes] = {}
        self._closed = False
        try:
            self._count = int(self._db.get(_COUNT, b"0"))
        except plyvel.Error as exc:
            raise StoreError(f"cannot read the {self._label} store: {exc}") from None

    @property
    def _label(self) -> str:
        return f"{self.name} {self.prefix!r} key"

    def write(self, record: Response | Item) -> None:
        """Buffer ``record`` under its key until the next ``flush``; StoreError once closed."""
        if self._closed:
            raise StoreError(f"the {self._label} store is closed")
        if isinstance(record, Item):
            key, value = record.key, item_value(record)
        else:
            key, value = record.request.key, page_value(record)
        # ASCII JSON: a lone surrogate from a badly decoded page is kept as a \u escape.
        self._pending[_key(key)] = json.dumps(value, separators=(",", ":"), default=str).encode("ascii")

    def flush(self) -> None:
        """Write every buffered record and the key count in one WriteBatch; StoreError if it fails."""
        if not self._pending:
            return
        try:
            count = self._count + sum(self._db.get(key) is None for key in self._pending)
            with self._db.write_batch() as batch:
                for key, value in self._pending.items():
                    batch.put(key, value)
                batch.put(_COUNT, str(count).encode())
        except (plyvel.Error, RuntimeError) as exc:  # RuntimeError: the state DB was closed under us
            raise StoreError(f"cannot write the {self._label} store: {exc}") from None
        self._count = count
        self._pending.clear()

    def get(self, key: str) -> dict[str, Any] | None:
        """The record flushed under ``key``, or None."""
        raw = self._db.get(_key(key))
        return None if raw is None else _object(raw)

    def cached(self, request: Request, now: float) -> Response | None:
        """The stored page of ``request`` as a Response (the kept headers, the exact body), or None."""
        value = self.get(request.key)
        if value is None or "status" not in value:
            return None
        body = (base64.b64decode(value["body_base64"]) if "body_base64" in value
                else str(value.get("body", "")).encode("utf-8", "surrogatepass"))
        return Response(request, int(value["status"]), "cached", dict(value.get("headers") or {}), body,
                        truncated=bool(value.get("truncated")), url=str(value.get("url") or request.url),
                        fetched_at=now)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self._db.get(_key(key)) is not None

    def __len__(self) -> int:
        """How many keys hold a flushed record (a counter, not a scan)."""
        return self._count

    def items(self, prefix: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
        """``(key, record)`` of every flushed key starting with ``prefix``, in key (UTF-8) order."""
        start = len(_RECORD)
        for raw_key, raw in self._db.iterator(prefix=_key(prefix)):
            yield raw_key[start:].decode("utf-8", "surrogatepass"), _object(raw)

    def close(self) -> None:
        """Flush what is buffered; after this the store takes no more writes. The state DB stays
        open: it belongs to the runner."""
        if not self._closed:
            self.flush()
            self._closed = True

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()


def _object(raw: bytes) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise StoreError(f"not a JSON object in the key store: {raw[:80]!r}")
    return value
