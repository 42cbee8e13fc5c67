"""The flat-file source: bare URLs, TSV with the URL first, or JSON lines, read lazily.

'#' lines and blank lines are skipped; a bad line is logged with its line number and skipped.
The position is "byte offset:line number", so a run resumes mid-file after kill -9.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote

from ..errors import ScrapekitError
from ..model import BadUrl, Request
from ..units import Seconds
from ..seed import BadLine, parse_line

log = logging.getLogger(__name__)

Kind = Literal["page", "resource", "timeline", "feed", "head"]


class FlatFileSource:
    """Requests from the lines of ``path``.

    A line is a bare URL, ``url<TAB>field...`` (extra TSV fields go to meta as ``fields``), a
    JSON object with at least ``url`` (and optionally key, kind, meta, priority), or a line of a
    queue dump (see scrapekit.seed). With ``template`` (``https://api.example.org/users/{id}.json``)
    a line gives an identifier instead of a URL: a bare line or the first TSV field is ``id``, a
    JSON object's keys fill the template by name; the identifier and fields go to meta.
    """

    def __init__(self, path: Path, kind: Kind = "page", template: str | None = None) -> None:
        if template is not None and "{id}" not in template:
            raise ValueError(f"template {template!r} has no {{id}}")
        self.path = path
        self.kind = kind
        self.template = template

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
                    request = self._request(raw)
                except BadLine as exc:
                    log.warning("%s:%d: skipped: %s", self.path, lineno, exc)
                    continue
                if request is not None:
                    yield self.stamp(request), f"{offset}:{lineno}"

    def _request(self, raw: bytes) -> Request | None:
        if self.template is None:
            line = parse_line(raw, self.kind)
            return None if line is None else line.request
        text = raw.decode("utf-8", "replace").strip()
        if not text or text.startswith("#"):
            return None
        fields: dict[str, Any]
        if text.startswith("{"):
            try:
                fields = dict(json.loads(text))
            except (ValueError, TypeError) as exc:
                raise BadLine(f"not a JSON object: {exc}") from None
            if fields.get("id") in (None, ""):
                raise BadLine("no id field")
            meta: dict[str, Any] = {"id": fields["id"], "fields": fields}
        else:
            first, *rest = text.split("\t")
            fields = {"id": first}
            meta = {"id": first, "fields": rest} if rest else {"id": first}
        try:
            url = self.template.format(**{k: quote(str(v), safe="") for k, v in fields.items()})
            return Request(url, kind=self.kind, meta=meta)
        except (KeyError, IndexError, ValueError, BadUrl) as exc:
            raise BadLine(f"template {self.template!r} cannot be filled: {exc}") from None

    def stamp(self, request: Request) -> Request:
        """The request as this source hands it over (PeriodicSource adds its interval)."""
        return request


class PeriodicSource(FlatFileSource):
    """A set of recurring jobs: the lines of ``path`` (as for flat_file), each visited again
    ``every`` after its last visit (a JSON line's ``meta.every``, e.g. "10m", wins), for ever.
    The run idles while nothing is due; ``scrapekit status`` shows the next due times. With a
    ``reschedule`` section, that decides instead."""

    def __init__(self, path: Path, every: Seconds = Seconds(3600.0), kind: Kind = "page",
                 template: str | None = None) -> None:
        if every <= 0:
            raise ValueError("every must be more than 0s")
        super().__init__(path, kind, template)
        self.every = every

    def stamp(self, request: Request) -> Request:
        if "every" in request.meta:
            return request
        return dataclasses.replace(request, meta={**request.meta, "every": float(self.every)})
