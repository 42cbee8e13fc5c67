"""Link following (the recipe's ``follow`` section): links out of each page, canonicalised,
filtered (allow/deny, same registered domain, depth) and checked for traps, as follow-up
requests that the runner queues in the same batch as the page's ack."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Protocol

from .links import LinkExtractor, LinkFilter, TrapFilter
from .model import Request, Response


@dataclass(slots=True)
class FollowUps:
    """The links of one page that may be queued, and why the others were not."""

    requests: list[Request] = field(default_factory=list)
    rejected: Counter[str] = field(default_factory=Counter)


class Strategy(Protocol):
    """Turns a successful response into follow-up requests; called from fetch threads."""

    def follow_ups(self, response: Response) -> FollowUps: ...

    def admit(self, request: Request) -> str | None:
        """Called in the runner's thread for a follow-up never seen before: None to queue it,
        else the reason it is dropped."""
        ...


class FollowLinks:
    """Follows ``links`` (XPath, or ``css:`` selector) of every HTML page.

    A link is dropped when ``allow`` patterns are given and none matches, when a ``deny`` pattern
    matches, when ``same_domain`` is set and its registered domain differs from the page's, past
    ``max_depth`` (0: no limit), or when it looks like a trap: longer than ``max_url_length``, a
    path segment repeated more than ``max_segment_repeats`` times, a query key repeated, or more
    than ``max_per_pattern`` URLs of one path pattern on one host (calendars, growing queries).
    Whether a link was seen before is the queue's business: its keys are an exact on-disk set.
    """

    def __init__(
        self,
        links: str = "//a/@href",
        same_domain: bool = False,
        max_depth: int = 0,
        allow: list[str] | None = None,
        deny: list[str] | None = None,
        max_url_length: int = 2000,
        max_segment_repeats: int = 3,
        max_per_pattern: int = 100_000,
    ) -> None:
        self._extractor = LinkExtractor(links)
        self._filter = LinkFilter(allow=allow, deny=deny, same_domain=same_domain, max_depth=max_depth)
        self._traps = TrapFilter(max_url_length=max_url_length, max_segment_repeats=max_segment_repeats,
                                 max_per_pattern=max_per_pattern)

    def follow_ups(self, response: Response) -> FollowUps:
        """Follow-up requests from ``response``; called in fetch threads for successful pages."""
        out = FollowUps()
        parent = response.request
        for url in self._extractor.extract(response):
            reason = self._filter.check(url, parent) or self._traps.check(url)
            if reason is not None:
                out.rejected[reason] += 1
                continue
            meta = {"parent": parent.key} if parent.key else {}
            out.requests.append(Request(url, key=url, kind="page", depth=parent.depth + 1, meta=meta))
        return out

    def admit(self, request: Request) -> str | None:
        return self._traps.count(request.url)
