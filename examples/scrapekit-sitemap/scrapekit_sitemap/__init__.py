"""Example scrapekit plugins: ``sitemap``, a source reading the <loc> URLs of a sitemap file, and
``sqlite``, a store keeping one row per request in a SQLite table."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

from lxml import etree

from scrapekit import Item, Request, Response

_LOC = "{http://www.sitemaps.org/schemas/sitemap/0.9}loc"


class SitemapSource:
    """Requests for the ``<loc>`` URLs of a sitemap (or sitemap index) file.

    The position is the number of URLs read, so a run resumes after the last one queued.
    """

    def __init__(self, path: Path, kind: Literal["page", "feed"] = "page", priority: int = 1024) -> None:
        self.path = path
        self.kind = kind
        self.priority = priority

    def requests(self, position: str | None) -> Iterator[tuple[Request, str]]:
        skip = int(position or 0)
        # A hostile sitemap must not read local files or expand entities.
        parser_args = {"resolve_entities": False, "no_network": True, "huge_tree": False}
        for n, (_, element) in enumerate(etree.iterparse(str(self.path), tag=_LOC, **parser_args), 1):
            url = (element.text or "").strip()
            element.clear()
            if n > skip and url:
                yield Request(url, kind=self.kind, priority=self.priority), str(n)


class SqliteStore:
    """One row per request in ``table`` of the SQLite file ``path`` (default out/<name>.sqlite).

    Rows are keyed by the request key and written with INSERT OR REPLACE, so a request fetched
    again after a crash replaces its row: exactly one row per key without checkpoints.
    """

    def __init__(self, out_dir: Path, name: str, path: str = "", table: str = "pages",
                 records: Literal["pages"] = "pages") -> None:
        if not table.isidentifier():
            raise ValueError(f"table: {table!r} is not a plain SQL name")
        out_dir.mkdir(parents=True, exist_ok=True)
        self.records = records
        self.path = Path(path) if path else out_dir / f"{name}.sqlite"
        self._table = table
        self._db = sqlite3.connect(self.path)
        self._db.execute(f"CREATE TABLE IF NOT EXISTS {table} (key TEXT PRIMARY KEY, url TEXT, status INTEGER, "
                         "reason TEXT, fetched_at REAL, length INTEGER, body BLOB)")

    def write(self, record: Response | Item) -> None:
        if not isinstance(record, Response):
            raise TypeError("the sqlite store takes page records")
        request = record.request
        self._db.execute(f"INSERT OR REPLACE INTO {self._table} VALUES (?, ?, ?, ?, ?, ?, ?)",
                         (request.key, request.url, record.status, record.error or record.reason,
                          record.fetched_at, len(record.body), record.body))

    def flush(self) -> None:
        self._db.commit()

    def close(self) -> None:
        self._db.commit()
        self._db.close()
