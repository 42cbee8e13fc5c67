"""The flat-file source: bare URLs, TSV with the URL first, or JSON lines, read lazily.

'#' lines and blank lines are skipped; a bad line is logged with its line number and skipped.
The position is "byte offset:line number", so a run resumes mid-file after kill -9.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

from ..errors import ScrapekitError
from ..model import BadUrl, Request

log = logging.getLogger(__name__)

Kind = Literal["page", "resource", "timeline", "feed", "head"]


class FlatFileSource:
    """Requests from the lines of ``path``.

    A line is a bare URL, ``url<TAB>field...`` (extra TSV fields go to meta as ``fields``), or a
    JSON object with at least ``url`` (and optionally key, kind, meta, priority).
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
                request = self._parse(raw, lineno)
                if request is not None:
                    yield request, f"{offset}:{lineno}"

    def _parse(self, raw: bytes, lineno: int) -> Request | None:
        try:
            line = raw.decode("utf-8").strip()
        except UnicodeDecodeError:
            log.info("%s:%d: skipped: not UTF-8", self.path, lineno)
            return None
        if not line or line.startswith("#"):
            return None
        try:
            if line.startswith("{"):
                data = json.loads(line)
                if not isinstance(data, dict) or not isinstance(data.get("url"), str):
                    raise ValueError("a JSON line needs a string 'url'")
                data.setdefault("kind", self.kind)
                return Request.from_dict(data)
            url, _, rest = line.partition("\t")
            meta = {"fields": rest.split("\t")} if rest else {}
            return Request(url=url.strip(), kind=self.kind, meta=meta)
        except (BadUrl, ValueError, TypeError, KeyError) as exc:
            log.info("%s:%d: skipped: %s", self.path, lineno, exc)
            return None
