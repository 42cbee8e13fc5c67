"""The flat-file source: bare URLs, TSV with the URL first, or JSON lines, read lazily.

'#' lines and blank lines are skipped; a bad line is logged with its line number and skipped.
The position is "byte offset:line number", so a run resumes mid-file after kill -9.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

from ..errors import ScrapekitError
from ..model import Request
from ..seed import BadLine, parse_line

log = logging.getLogger(__name__)

Kind = Literal["page", "resource", "timeline", "feed", "head"]


class FlatFileSource:
    """Requests from the lines of ``path``.

    A line is a bare URL, ``url<TAB>field...`` (extra TSV fields go to meta as ``fields``), a
    JSON object with at least ``url`` (and optionally key, kind, meta, priority), or a line of a
    queue dump (see scrapekit.seed).
    """

    def __init__(self, path: Path, kind: Kind = "page") -> None:
        self.path = path
        self.kind = kind

    def requests(self, position: str | None) -> Iterator[tuple[Request, str]]:
        offset, lineno = (int(part) for part in (position or "0:0").split(":"))
        try:
            handle = open(self.path, "rb")
        except OSError as exc:
            raise ScrapekitError(f"cannot read seed file {self.path}: {exc.strerror}") from None
        with handle:
            handle.seek(offset)
            for raw in handle:
                offset += len(raw)
                lineno += 1
                try:
                    line = parse_line(raw, self.kind)
                except BadLine as exc:
                    log.warning("%s:%d: skipped: %s", self.path, lineno, exc)
                    continue
                if line is not None:
                    yield line.request, f"{offset}:{lineno}"
