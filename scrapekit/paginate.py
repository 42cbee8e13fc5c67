"""Pagination: one visit of a resource fetches page after page in its fetch thread until a stop
rule says enough. ``page`` (page numbers), ``max_id`` (ids below the lowest seen), ``next_link``
(a Link header or a JSON path) and ``cursor`` (an opaque token from the body).

A visit is one job: its pages are fetched one after the other by the same thread, every page
gets its page record, and the job is acked (or rescheduled) once, with the resource's state, when
the visit ends. So a crash mid-visit repeats the visit; it never leaves half a visit acked.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import parse_qsl, urlencode, urljoin, urlsplit, urlunsplit

from .jsonparser import decode_json, json_values
from .model import Request, Response
from .reschedule import ResourceState

log = logging.getLogger(__name__)

_LINK_NEXT = re.compile(r'<([^>]*)>\s*;[^,]*\brel="?next"?', re.IGNORECASE)


def with_param(url: str, name: str, value: str) -> str:
    """``url`` with query parameter ``name`` set to ``value`` (replacing any)."""
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != name]
    query.append((name, value))
    return urlunsplit(parts._replace(query=urlencode(query)))


@dataclass
class Visit:
    """What one visit has seen so far."""

    state: ResourceState
    now: float
    page: int = 1
    ids: list[int] = field(default_factory=list)  # of every page so far
    stop: str = ""  # why the visit ended


class Paginator(Protocol):
    """``visit(request, fetch, state, now)`` fetches the pages of one visit and gives their responses."""

    def visit(self, request: Request, fetch: Callable[[Request], Response], state: ResourceState,
              now: float) -> tuple[list[Response], Visit]: ...


class _Paginator:
    """The loop shared by every pagination type; subclasses give ``next_url``."""

    def __init__(self, param: str, items_path: str, id_path: str | None, per_page: int, max_pages: int,
                 stop_on_duplicate: bool) -> None:
        if per_page < 0 or max_pages < 1:
            raise ValueError("per_page must be 0 (unknown) or more and max_pages 1 or more")
        self.param = param
        self.items = json_values(items_path, "items_path")
        self.id_path = json_values(id_path, "id_path") if id_path else None
        self.per_page = per_page
        self.max_pages = max_pages
        self.stop_on_duplicate = stop_on_duplicate

    def wanted_pages(self, state: ResourceState, now: float) -> int:
        """Pages to ask for this visit: from the rate seen so far, the expected new items since the
        last visit (plus one page), at most max_pages; max_pages when nothing is known yet."""
        if state.visits == 0 or state.rate <= 0 or now <= state.last_visit or not self.per_page:
            return self.max_pages
        expected = state.rate * (now - state.last_visit)
        return max(1, min(self.max_pages, math.ceil(expected / self.per_page) + 1))

    def visit(self, request: Request, fetch: Callable[[Request], Response], state: ResourceState,
              now: float) -> tuple[list[Response], Visit]:
        visit = Visit(state, now)
        wanted = self.wanted_pages(state, now)
        responses = [fetch(request)]
        while True:
            response = responses[-1]
            if response.error is not None:
                visit.stop = f"error {response.error}"
                break
            body = decode_json(response)
            count = len(self.items(body)) if body is not None else 0
            ids = self._ids(body)
            old = [i for i in ids if state.high is not None and i <= state.high]
            visit.ids.extend(ids)
            if self.stop_on_duplicate and ids and len(old) == len(ids):
                visit.stop = "duplicate"
                break
            if old:
                visit.stop = "overlap"  # reached what the last visit already saw
                break
            if count < self.per_page or (self.per_page == 0 and count == 0):
                visit.stop = "partial page" if count else "empty page"
                break
            if visit.page >= wanted:
                visit.stop = "max_pages" if wanted == self.max_pages else "velocity"
                break
            url = self.next_url(response, body, visit)
            if url is None:
                visit.stop = "last page"
                break
            visit.page += 1
            responses.append(fetch(Request(url, kind=request.kind, meta={**request.meta, "page": visit.page},
                                           depth=request.depth)))
        return responses, visit

    def _ids(self, body: Any) -> list[int]:
        if self.id_path is None or body is None:
            return []
        ids = []
        for value in self.id_path(body):
            try:
                ids.append(int(value))
            except (TypeError, ValueError):
                continue
        return ids

    def next_url(self, response: Response, body: Any, visit: Visit) -> str | None:
        raise NotImplementedError


class PagePaginator(_Paginator):
    """``?page=N``: pages 1, 2, 3 ... until a partial page, ``max_pages``, or the total items
    given at ``total_path`` in the response."""

    def __init__(self, param: str = "page", per_page: int = 100, max_pages: int = 15,
                 items_path: str = "$.items[*]", id_path: str | None = None, total_path: str | None = None,
                 stop_on_duplicate: bool = False) -> None:
        super().__init__(param, items_path, id_path, per_page, max_pages, stop_on_duplicate)
        self.total = json_values(total_path, "total_path") if total_path else None

    def next_url(self, response: Response, body: Any, visit: Visit) -> str | None:
        if self.total is not None and body is not None:
            found = self.total(body)
            try:
                if found and visit.page * self.per_page >= int(found[0]):
                    return None
            except (TypeError, ValueError):
                pass
        return with_param(response.request.url, self.param, str(visit.page + 1))


class MaxIdPaginator(_Paginator):
    """``?max_id=X``: the next page asks for ids below the lowest seen. Stops on a partial page,
    after ``max_pages``, or on overlap with the highest id seen by the last visit."""

    def __init__(self, param: str = "max_id", id_path: str = "$.items[*].id", per_page: int = 100,
                 max_pages: int = 15, items_path: str = "$.items[*]", stop_on_duplicate: bool = False) -> None:
        super().__init__(param, items_path, id_path, per_page, max_pages, stop_on_duplicate)

    def next_url(self, response: Response, body: Any, visit: Visit) -> str | None:
        if not visit.ids:
            return None
        return with_param(response.request.url, self.param, str(min(visit.ids)))


class NextLinkPaginator(_Paginator):
    """The next page's URL from a ``Link: <...>; rel="next"`` header, else from ``link_path``."""

    def __init__(self, link_path: str | None = None, per_page: int = 0, max_pages: int = 15,
                 items_path: str = "$.items[*]", id_path: str | None = None,
                 stop_on_duplicate: bool = False) -> None:
        super().__init__("", items_path, id_path, per_page, max_pages, stop_on_duplicate)
        self.link = json_values(link_path, "link_path") if link_path else None

    def next_url(self, response: Response, body: Any, visit: Visit) -> str | None:
        match = _LINK_NEXT.search(response.headers.get("link", ""))
        if match:
            return urljoin(response.final_url, str(match.group(1)))
        if self.link is not None and body is not None:
            found = self.link(body)
            if found and isinstance(found[0], str) and found[0]:
                return urljoin(response.final_url, found[0])
        return None


class CursorPaginator(_Paginator):
    """An opaque token at ``cursor_path`` in the body, sent back as ``?cursor=TOKEN``; the last
    page has none."""

    def __init__(self, cursor_path: str = "$.next_cursor", param: str = "cursor", per_page: int = 0,
                 max_pages: int = 15, items_path: str = "$.items[*]", id_path: str | None = None,
                 stop_on_duplicate: bool = False) -> None:
        super().__init__(param, items_path, id_path, per_page, max_pages, stop_on_duplicate)
        self.cursor = json_values(cursor_path, "cursor_path")

    def next_url(self, response: Response, body: Any, visit: Visit) -> str | None:
        found = self.cursor(body) if body is not None else []
        token = found[0] if found else None
        if token is None or token == "":
            return None
        return with_param(response.request.url, self.param, str(token))
