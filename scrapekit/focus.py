"""The ``focus`` parser: a site's feeds (``<link rel="alternate">`` RSS, Atom, JSON Feed) and its
accounts on social networks (links to a table of hosts), one item per site, kind and link."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from urllib.parse import urlsplit

from .links import LinkExtractor, canonicalize, url_domain
from .model import BadUrl, Item, Response
from .parsers import Parsed

DEFAULT_SOCIAL: Mapping[str, str] = {
    "twitter": "twitter.com", "x": "x.com", "facebook": "facebook.com", "instagram": "instagram.com",
    "linkedin": "linkedin.com", "youtube": "youtube.com", "github": "github.com",
    "mastodon": "mastodon.social", "tiktok": "tiktok.com", "pinterest": "pinterest.com",
}
"""Network name -> host, used when a recipe gives no ``social`` table of its own."""

FEED_TYPES: Mapping[str, str] = {
    "application/rss+xml": "rss",
    "application/atom+xml": "atom",
    "application/feed+json": "json",
}
"""Media type of a ``<link rel="alternate">`` -> the ``network`` of the feed item."""

HOST_PREFIXES = ("www.", "m.", "mobile.")
"""Subdomains that serve the same accounts as the host they prefix; other subdomains (help.,
developer., gist.) are different sites."""

NOT_ACCOUNTS = frozenset({
    "intent", "share", "share.php", "sharer", "sharer.php", "sharearticle", "sharing", "dialog", "plugins",
    "login", "signup", "home", "search", "hashtag", "explore", "i", "pin", "watch", "embed", "results",
    "playlist", "privacy", "legal", "terms", "policies", "about", "help", "settings",
})
"""First path segments (lower-case) that are the network's own pages: share buttons, log-in, search."""

TWO_SEGMENT_ACCOUNTS: Mapping[str, frozenset[str]] = {
    "linkedin.com": frozenset({"company", "in", "school", "showcase"}),
    "youtube.com": frozenset({"channel", "c", "user"}),
}
"""Host -> first path segments (lower-case) whose account takes two segments: ``company/acme``."""

_LOWER = "translate({}, 'ABCDEFGHIJKLMNOPQRSTUVWXYZ', 'abcdefghijklmnopqrstuvwxyz')"
_REL = _LOWER.format("normalize-space(@rel)")
_TYPE = _LOWER.format("normalize-space(substring-before(concat(@type, ';'), ';'))")  # parameters dropped


def _feed_links(media_type: str) -> str:
    """XPath of the hrefs of ``<link>`` elements whose rel holds ``alternate`` and whose type is
    ``media_type``, both in any case."""
    return f"//link[contains(concat(' ', {_REL}, ' '), ' alternate ')][{_TYPE} = '{media_type}']/@href"


def _bare(host: str) -> str:
    """``host`` without one of HOST_PREFIXES."""
    for prefix in HOST_PREFIXES:
        if host.startswith(prefix):
            return host[len(prefix):]
    return host


def _host(name: str, host: str) -> str:
    """A social table's host, lower-case and bare; ValueError unless it is a plain host name."""
    try:
        url = canonicalize(f"https://{host.strip()}/")
    except BadUrl:
        url = ""
    canonical = urlsplit(url).hostname or ""
    if url != f"https://{canonical}/":
        raise ValueError(f"social.{name}: expected a host like twitter.com, got {host!r}")
    return _bare(canonical)


def account_of(url: str, host: str) -> str | None:
    """The account a canonical ``url`` on the bare social ``host`` points to (its first path
    segment, two for TWO_SEGMENT_ACCOUNTS), or None for the host's own pages (NOT_ACCOUNTS, a
    bare host, ``/company/`` without a name)."""
    segments = [s for s in urlsplit(url).path.split("/") if s]
    if not segments or segments[0].lower() in NOT_ACCOUNTS:
        return None
    if segments[0].lower() in TWO_SEGMENT_ACCOUNTS.get(host, ()):
        return "/".join(segments[:2]) if len(segments) > 1 else None
    return segments[0]


class FocusParser:
    """Items for a site's feeds and social accounts; follows nothing itself (that is ``follow``).

    ``feeds``: collect ``<link rel="alternate">`` of the types in FEED_TYPES. ``social``: network
    name -> host, replacing DEFAULT_SOCIAL (``{}`` collects no accounts); an ``<a href>`` to a
    listed host, or to it under one of HOST_PREFIXES, is an account unless ``account_of`` finds
    one of the network's own pages. Raises ValueError for a table value that is not a host name.

    Each item has fields ``site`` (registered domain of the page's final URL), ``kind`` ("feed"
    or "social"), ``network`` (table name, or "rss", "atom", "json"), ``url`` (canonical), ``account``
    ("" for feeds) and ``found_on`` (the page's final URL), and the key ``"<site> <kind> <url>"``,
    given once per page, so that a store can keep one record per site and link.
    """

    def __init__(self, feeds: bool = True, social: dict[str, str] | None = None) -> None:
        table = DEFAULT_SOCIAL if social is None else social
        self._networks = {_host(name, host): name for name, host in table.items()}
        self._feeds = {network: LinkExtractor(_feed_links(media_type))
                       for media_type, network in FEED_TYPES.items()} if feeds else {}
        self._anchors = LinkExtractor("//a/@href") if self._networks else None

    def parse(self, response: Response) -> Parsed:
        """The page's feeds (by FEED_TYPES, each in document order), then its accounts in document
        order; nothing for non-HTML or empty bodies. Links that do not parse are skipped, never
        raised."""
        page = response.final_url
        site = url_domain(page)
        request = response.request
        items: dict[str, Item] = {}
        for kind, network, url, account in self._finds(response):
            key = f"{site} {kind} {url}"
            if key not in items:
                fields = {"site": site, "kind": kind, "network": network, "url": url, "account": account,
                          "found_on": page}
                items[key] = Item(fields, request.url, key, response.fetched_at)
        return list(items.values()), []

    def _finds(self, response: Response) -> Iterator[tuple[str, str, str, str]]:
        """(kind, network, canonical url, account) of every find, repeats included."""
        for network, extractor in self._feeds.items():
            for url in extractor.extract(response):
                yield "feed", network, url, ""
        for url in self._anchors.extract(response) if self._anchors else ():
            host = _bare(urlsplit(url).hostname or "")
            social = self._networks.get(host)
            account = None if social is None else account_of(url, host)
            if social is not None and account is not None:
                yield "social", social, url, account
