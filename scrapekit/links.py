"""Links: canonical URLs, registered domains (bundled public suffix list, offline), links out of
an HTML page, and the filters that decide which of them to follow (allow/deny, domain, depth,
traps)."""

from __future__ import annotations

import functools
import ipaddress
import re
from collections import Counter
from collections.abc import MutableMapping
from urllib.parse import urljoin, urlsplit

import lxml.html
import tldextract
from lxml import etree

from .model import BadUrl, Request, Response, canonical_url
from .parsers import compile_expression, html_root

canonicalize = canonical_url
"""One canonical form for every URL: the same function that makes request keys."""

_extractor: tldextract.TLDExtract | None = None


@functools.lru_cache(maxsize=100_000)
def registered_domain(host: str) -> str:
    """The registered domain (eTLD+1) of ``host``, lower-case: ``www.bbc.co.uk`` → ``bbc.co.uk``.

    IP addresses (``[::1]`` brackets dropped) and hosts under no public suffix (``localhost``)
    give the host itself. Offline: the public suffix list bundled with tldextract, no files.
    """
    global _extractor
    host = host.strip("[]").rstrip(".").lower()
    try:
        return ipaddress.ip_address(host).compressed
    except ValueError:
        pass
    if _extractor is None:
        # Built on first use, not at import; two threads racing here build two equal extractors.
        _extractor = tldextract.TLDExtract(suffix_list_urls=(), cache_dir=None)
    domain: str = _extractor(host).top_domain_under_public_suffix
    return domain or host


_BASE_HREF = etree.XPath("//base/@href")
_HTML_TYPES = frozenset({"", "text/html", "application/xhtml+xml"})
"""Media types whose links are followed ("": no content-type header, the body decides)."""

# A browser drops tabs and newlines anywhere in an href (attributes wrapped over lines).
_HREF_CLEANUP = str.maketrans({"\t": None, "\n": None, "\r": None})
# Unknown functions and variables fail only when evaluated on a node they apply to: the
# constructor evaluates each expression once on this page rather than fail on the first real one.
_SAMPLE_PAGE = '<html><head><base href="/"></head><body><a href="/">a</a></body></html>'


class LinkExtractor:
    """Canonical absolute links of an HTML page, by XPath (or ``css:`` selector of elements whose
    ``href`` is taken); ``<base href>`` honoured, odd schemes and broken URLs dropped."""

    def __init__(self, links: str = "//a/@href") -> None:
        """Raises ValueError naming the expression when it does not compile or evaluate."""
        self._select = compile_expression(links, "links")
        try:
            self._select(lxml.html.document_fromstring(_SAMPLE_PAGE))
        except (etree.XPathError, ValueError) as exc:
            kind = "CSS" if links.startswith("css:") else "XPath"
            raise ValueError(f"links: bad {kind} {links!r}: {exc}") from None

    def extract(self, response: Response) -> list[str]:
        """The page's links as canonical absolute URLs, each once, in document order.

        Links that are not http(s) or do not parse are dropped; empty, malformed and non-HTML
        bodies give []. Never raises for what a page contains.
        """
        media_type = response.headers.get("content-type", "").partition(";")[0].strip().lower()
        if media_type not in _HTML_TYPES:
            return []
        root = html_root(response)
        if root is None:
            return []
        found = self._select(root)
        declared = _BASE_HREF(root)
        base = response.final_url
        if isinstance(declared, list) and declared:
            base = _join_base(base, str(declared[0]))
        out: dict[str, None] = {}
        for value in found if isinstance(found, list) else []:
            href = value.get("href") if isinstance(value, etree._Element) else value
            if not isinstance(href, str):
                continue
            href = href.strip().translate(_HREF_CLEANUP)
            if not href:
                continue
            try:
                out.setdefault(canonicalize(href, base))
            except BadUrl:
                continue
        return list(out)


def _join_base(page_url: str, declared: str) -> str:
    """The page's base URL: its ``<base href>`` resolved against it, unless that is unusable."""
    try:
        base = urljoin(page_url, declared.strip())
    except ValueError:
        return page_url
    return base if base.lower().startswith(("http://", "https://")) else page_url


LINK_REASONS = ("denied", "not_allowed", "other_domain", "too_deep")
"""Why LinkFilter.check refuses a link."""


class LinkFilter:
    """Which links may be followed: ``allow``/``deny`` regexes (searched in the URL), the parent's
    registered domain when ``same_domain``, and ``max_depth`` (0: no limit)."""

    def __init__(self, allow: list[str] | None = None, deny: list[str] | None = None,
                 same_domain: bool = False, max_depth: int = 0) -> None:
        """Raises ValueError for a pattern that does not compile."""
        try:
            self._allow = [re.compile(p) for p in allow or []]
            self._deny = [re.compile(p) for p in deny or []]
        except re.error as exc:
            raise ValueError(f"allow/deny: bad pattern: {exc}") from None
        self._same_domain = same_domain
        self._max_depth = max_depth

    def check(self, url: str, parent: Request) -> str | None:
        """None when ``url`` may be followed from ``parent``, else a reason from LINK_REASONS
        (the first that applies, cheapest first)."""
        if self._max_depth and parent.depth + 1 > self._max_depth:
            return "too_deep"
        if any(p.search(url) for p in self._deny):
            return "denied"
        if self._allow and not any(p.search(url) for p in self._allow):
            return "not_allowed"
        if self._same_domain and url_domain(url) != url_domain(parent.url):
            return "other_domain"
        return None


def _split_canonical(url: str) -> tuple[str, str, str]:
    """Netloc, path and query of a canonical URL (scheme://netloc/path?query, no fragment),
    without urlsplit's general parsing."""
    netloc, _, rest = url.partition("://")[2].partition("/")
    path, _, query = rest.partition("?")
    return netloc, "/" + path, query


def url_domain(url: str) -> str:
    """The registered domain of ``url``'s host (see registered_domain); "" for a URL that does
    not parse."""
    try:
        return registered_domain(urlsplit(url).hostname or "")
    except ValueError:
        return ""


TRAP_REASONS = ("too_long", "repeated_segment", "repeated_param", "pattern_cap")
"""Why TrapFilter refuses a link: ``check`` gives the first three, ``count`` the last."""

_DIGITS = re.compile(r"\d+")


class TrapFilter:
    """Loops and traps: over-long URLs, a path segment repeated more than ``max_segment_repeats``
    times, a query key given twice, and more than ``max_per_pattern`` URLs of one host and path
    pattern (digits as N, query keys only), which stops calendars and ever-growing queries.

    ``check`` is pure and may run in any thread; ``count`` writes to ``counts``, a mapping the
    caller may back with something persistent, and belongs to one thread.
    """

    def __init__(self, max_url_length: int = 2000, max_segment_repeats: int = 3, max_per_pattern: int = 100_000,
                 counts: MutableMapping[str, int] | None = None) -> None:
        self.max_url_length = max_url_length
        self.max_segment_repeats = max_segment_repeats
        self.max_per_pattern = max_per_pattern
        self.counts: MutableMapping[str, int] = {} if counts is None else counts

    def check(self, url: str) -> str | None:
        """None for a canonical URL that looks fine, else "too_long", "repeated_segment" or
        "repeated_param" (TRAP_REASONS, in that order). Counts nothing."""
        if len(url) > self.max_url_length:
            return "too_long"
        _, path, query = _split_canonical(url)
        segments = [s for s in path.split("/") if s]
        if len(segments) > self.max_segment_repeats and max(Counter(segments).values()) > self.max_segment_repeats:
            return "repeated_segment"
        if query:
            keys = [p.partition("=")[0] for p in query.split("&") if p]
            if len(keys) != len(set(keys)):
                return "repeated_param"
        return None

    def count(self, url: str) -> str | None:
        """Count ``url`` against its host and path pattern: "pattern_cap" once the pattern has
        ``max_per_pattern`` URLs (the URL is then not counted), else None.

        Call it only for URLs that passed ``check`` and were never seen before, so a link seen
        again, or refused for another reason, does not fill the cap.
        """
        netloc, path, query = _split_canonical(url)
        keys = sorted(p.partition("=")[0] for p in query.split("&") if p) if query else ()
        pattern = f"{netloc}{_DIGITS.sub('N', path)}?{'&'.join(keys)}"
        seen = self.counts.get(pattern, 0)
        if seen >= self.max_per_pattern:
            return "pattern_cap"
        self.counts[pattern] = seen + 1
        return None
