"""A plugin package outside scrapekit, used by the tests: one source and one store."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from scrapekit import Item, Request, Response


class RangeSource:
    """Requests for ``template.format(n=n)`` with n from start to stop (exclusive)."""

    def __init__(self, template: str, start: int = 0, stop: int = 10) -> None:
        self.template = template
        self.start = start
        self.stop = stop

    def requests(self, position: str | None) -> Iterator[tuple[Request, str]]:
        first = int(position) + 1 if position is not None else self.start
        for n in range(first, self.stop):
            yield Request(self.template.format(n=n)), str(n)


class ListStore:
    """Appends one JSON line per record to ``out_dir/<name>.list`` (no chunks, no checkpoints)."""

    records = "pages"

    def __init__(self, out_dir: Path, name: str, label: str = "plain") -> None:
        out_dir.mkdir(parents=True, exist_ok=True)
        self.label = label
        self._file = open(out_dir / f"{name}.list", "a", encoding="utf-8")

    def write(self, record: Response | Item) -> None:
        assert isinstance(record, Response)
        self._file.write(json.dumps({"url": record.request.url, "status": record.status, "label": self.label}) + "\n")

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class BrokenParser:
    """A parser with a bug: it raises on pages whose URL contains ``boom``."""

    def parse(self, response: Response) -> tuple[list[Item], list[Request]]:
        if "boom" in response.request.url:
            raise ZeroDivisionError("a bug in a plugin")
        return [], []
