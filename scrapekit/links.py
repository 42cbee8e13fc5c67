"""Links: canonical URLs, registered domains (bundled public suffix list, offline), links out of
an HTML page, and the filters that decide which of them to follow (allow/deny, domain, depth,
traps)."""

from __future__ import annotations

import functools
import ipaddress
import re
import string
from collections.abc import MutableMapping
from urllib.parse import quote, urljoin, urlsplit, urlunsplit

import tldextract
from lxml import etree

from .model import BadUrl, Request, Response
from .parsers import html_root

SESSION_PARAMS = frozenset({"jsessionid", "phpsessid", "sid", "sessionid", "aspsessionid", "cfid", "cftoken"})
"""Query keys (any case) that name a session, not a page: dropped from canonical URLs."""

_DEFAULT_PORTS = {"http": 80, "https": 443}
_PATH_PARAMS = re.compile(r";(?:jsessionid|phpsessid|sessionid)=[^/?#]*", re.IGNORECASE)
_SAFE_PATH = "/:@!$&'()*+,;=-._~%"
_SAFE_QUERY = "/:@!$'()*+,;-._~%?"
_BAD_CHARS = re.compile(r"[\x00-\x20\x7f]")
_DIGITS = re.compile(r"\d+")
_ESCAPE = re.compile(r"%([0-9A-Fa-f]{2})")
_UNRESERVED = frozenset(string.ascii_letters + string.digits + "-._~")
_BASE_HREF = etree.XPath("//base/@href")


def _unescape_unreserved(match: re.Match[str]) -> str:
    char = chr(int(match.group(1), 16))
    return char if char in _UNRESERVED else "%" + match.group(1).upper()


def _normalise_escapes(text: str, safe: str) -> str:
    """Escapes of unreserved characters decoded, other escapes upper-cased (``%2f`` stays an
    escaped slash), non-ASCII characters escaped as UTF-8; a broken ``%zz`` is left as it is."""
    if "%" in text:
        text = _ESCAPE.sub(_unescape_unreserved, text)
    if not text.isascii():
        text = quote(text, safe=safe + "%")
    return text


def _remove_dot_segments(path: str) -> str:
    if "." not in path:
        return path
    out: list[str] = []
    for segment in path.split("/"):
        if segment == "..":
            if len(out) > 1:
                out.pop()
        elif segment != ".":
            out.append(segment)
    if path.endswith(("/.", "/..")):
        out.append("")
    return "/".join(out) or "/"


def canonicalize(url: str, base: str | None = None) -> str:
    """``url`` (resolved against ``base``) in one canonical form; BadUrl unless absolute http(s)."""
    url = url.strip()
    if base:
        url = urljoin(base, url)
    if _BAD_CHARS.search(url):
        raise BadUrl(f"URL contains whitespace or control characters: {url!r}")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise BadUrl(f"unparseable URL {url!r}: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS:
        raise BadUrl(f"not an http(s) URL: {url!r}")
    host = (parts.hostname or "").rstrip(".")
    if not host:
        raise BadUrl(f"URL has no host: {url!r}")
    if not host.isascii():
        try:
            host = host.encode("idna").decode("ascii")
        except UnicodeError as exc:
            raise BadUrl(f"bad international host in {url!r}: {exc}") from None
    host = host.lower()
    if ":" in host:
        host = f"[{host}]"
    netloc = host if port in (None, _DEFAULT_PORTS[scheme]) else f"{host}:{port}"
    path = _PATH_PARAMS.sub("", parts.path) or "/"
    path = _remove_dot_segments(_normalise_escapes(path, _SAFE_PATH))
    query = parts.query
    if query:
        pairs = [p for p in query.split("&") if p]
        pairs = [p for p in pairs if p.partition("=")[0].lower() not in SESSION_PARAMS]
        query = "&".join(sorted((_normalise_escapes(p, _SAFE_QUERY + "=") for p in pairs),
                                key=lambda p: p.partition("=")[0]))
    return urlunsplit((scheme, netloc, path, query, ""))


_extractor: tldextract.TLDExtract | None = None


@functools.lru_cache(maxsize=100_000)
def registered_domain(host: str) -> str:
    """The registered domain (eTLD+1) of ``host``; the host itself for IPs and bare names."""
    global _extractor
    host = host.strip("[]").lower()
    try:
        ipaddress.ip_address(host)
        return host
    except ValueError:
        pass
    if _extractor is None:
        # the bundled suffix list only: no network, no cache files
        _extractor = tldextract.TLDExtract(suffix_list_urls=(), cache_dir=None)
    domain: str = _extractor(host).top_domain_under_public_suffix
    return domain or host


class LinkExtractor:
    """Canonical absolute links of an HTML page, by XPath (or ``css:`` selector of elements whose
    ``href`` is taken); ``<base href>`` honoured, odd schemes and broken URLs dropped."""

    def __init__(self, links: str = "//a/@href") -> None:
        self._css = links.startswith("css:")
        try:
            if self._css:
                from lxml.cssselect import CSSSelector

                self._select: etree.XPath = CSSSelector(links[4:].strip())
            else:
                self._select = etree.XPath(links)
        except (etree.XPathSyntaxError, ImportError, ValueError, SyntaxError) as exc:
            raise ValueError(f"links: bad {'CSS' if self._css else 'XPath'} {links!r}: {exc}") from None

    def extract(self, response: Response) -> list[str]:
        root = html_root(response)
        if root is None:
            return []
        base = response.final_url
        declared = _BASE_HREF(root)
        if isinstance(declared, list) and declared:
            base = urljoin(base, str(declared[0]))
        found = self._select(root)
        out: dict[str, None] = {}
        for value in found if isinstance(found, list) else []:
            href = value.get("href") if isinstance(value, etree._Element) else value
            if not isinstance(href, str) or not href.strip():
                continue
            try:
                out.setdefault(canonicalize(href, base))
            except BadUrl:
                continue
        return list(out)


LINK_REASONS = ("denied", "not_allowed", "other_domain", "too_deep")


class LinkFilter:
    """Which links may be followed: ``allow``/``deny`` regexes (searched in the URL), the parent's
    registered domain when ``same_domain``, and ``max_depth`` (0: no limit)."""

    def __init__(self, allow: list[str] | None = None, deny: list[str] | None = None,
                 same_domain: bool = False, max_depth: int = 0) -> None:
        try:
            self._allow = [re.compile(p) for p in allow or []]
            self._deny = [re.compile(p) for p in deny or []]
        except re.error as exc:
            raise ValueError(f"allow/deny: bad pattern: {exc}") from None
        self._same_domain = same_domain
        self._max_depth = max_depth

    def check(self, url: str, parent: Request) -> str | None:
        """None when ``url`` may be followed from ``parent``, else a reason from LINK_REASONS."""
        if self._max_depth and parent.depth + 1 > self._max_depth:
            return "too_deep"
        if any(p.search(url) for p in self._deny):
            return "denied"
        if self._allow and not any(p.search(url) for p in self._allow):
            return "not_allowed"
        if self._same_domain and _domain(url) != _domain(parent.url):
            return "other_domain"
        return None


def _domain(url: str) -> str:
    return registered_domain(urlsplit(url).hostname or "")


TRAP_REASONS = ("too_long", "repeated_segment", "repeated_param", "pattern_cap")


class TrapFilter:
    """Loops and traps: over-long URLs, a path segment repeated more than ``max_segment_repeats``
    times, a query key given twice, and more than ``max_per_pattern`` URLs of one host and path
    pattern (digits as N, query keys only), which stops calendars and ever-growing queries."""

    def __init__(self, max_url_length: int = 2000, max_segment_repeats: int = 3, max_per_pattern: int = 100_000,
                 counts: MutableMapping[str, int] | None = None) -> None:
        self.max_url_length = max_url_length
        self.max_segment_repeats = max_segment_repeats
        self.max_per_pattern = max_per_pattern
        self.counts: MutableMapping[str, int] = {} if counts is None else counts

    def check(self, url: str) -> str | None:
        """None for a URL that looks fine, else a reason from TRAP_REASONS (all but pattern_cap)."""
        if len(url) > self.max_url_length:
            return "too_long"
        parts = urlsplit(url)
        segments = [s for s in parts.path.split("/") if s]
        if segments and max(segments.count(s) for s in set(segments)) > self.max_segment_repeats:
            return "repeated_segment"
        keys = [p.partition("=")[0] for p in parts.query.split("&") if p]
        if len(keys) != len(set(keys)):
            return "repeated_param"
        return None

    def count(self, url: str) -> str | None:
        """Count a URL never seen before against its pattern: "pattern_cap" once the pattern is
        full, else None. Call it only for new URLs, so links seen again do not fill the cap."""
        parts = urlsplit(url)
        keys = sorted(p.partition("=")[0] for p in parts.query.split("&") if p)
        pattern = f"{parts.netloc}{_DIGITS.sub('N', parts.path)}?{'&'.join(keys)}"
        seen = self.counts.get(pattern, 0)
        if seen >= self.max_per_pattern:
            return "pattern_cap"
        self.counts[pattern] = seen + 1
        return None
