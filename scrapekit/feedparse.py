"""The ``feed`` parser: RSS 2.0, RSS 1.0 and Atom entries read by feedparser, one item per entry
keyed by GUID. feedparser gets the body as a stream (a byte string it would open as a file name
when one exists), screened first so that no entity a feed declares can expand."""

# feedparser ships no type information; its values are read into plain types right here.

from __future__ import annotations

import hashlib
import io
import logging
import re
import time
import warnings
from collections.abc import Mapping
from typing import Any

import feedparser
from feedparser.encodings import convert_to_utf8

from .model import BadUrl, Item, Request, Response, canonical_url, loggable
from .parsers import Parsed
from .units import Bytes

log = logging.getLogger(__name__)

MAX_FEED_BYTES = Bytes(2_000_000)
"""Default ``max_bytes``. feedparser's lenient parser, which takes over from the XML parser on any
malformed document, needs about 4 s and 200 MB per MB of hostile markup (a million nested tags);
well-formed feeds take about 0.3 s per MB."""

_DOCTYPE_HEAD = re.compile(rb"""<!DOCTYPE[ \t\r\n]+(?:"[^"]*"|'[^']*'|[^"'\[>])*""")
"""``<!DOCTYPE`` with its name and external id, up to the internal subset's ``[`` or the ``>``."""
_SUBSET_TEXT = re.compile(rb"""<|[^"'\]<]+""")
_SPACE = re.compile(rb"[ \t\r\n]*")
_ROOT = re.compile(rb"<[A-Za-z_:\x80-\xff]")
_ENTITY = b"<!ENTITY"
_FEEDPARSER_ERRORS = (ValueError, TypeError, IndexError, KeyError, AttributeError, RecursionError)
"""What feedparser's lenient parser lets out on odd markup, e.g. ValueError from ``&#99999999;``
(found by fuzzing; its XML parser's errors are caught inside it)."""


def _skip_space(data: bytes, pos: int) -> int:
    match = _SPACE.match(data, pos)
    return match.end() if match else pos


def _end_of_markup(data: bytes, pos: int) -> int:
    """The end of the comment or processing instruction starting at ``pos``; -1 if unterminated."""
    close = b"?>" if data.startswith(b"<?", pos) else b"-->"
    end = data.find(close, pos + 2)
    return -1 if end < 0 else end + len(close)


def _end_of_subset(data: bytes, pos: int) -> int:
    """The position after the ``]`` that closes an internal DTD subset whose content starts at
    ``pos``, skipping quoted literals, comments and processing instructions; -1 if there is none."""
    while 0 <= pos < len(data):
        if data.startswith(b"]", pos):
            return pos + 1
        if data.startswith((b"<?", b"<!--"), pos):
            pos = _end_of_markup(data, pos)
        elif data.startswith((b'"', b"'"), pos):
            end = data.find(data[pos:pos + 1], pos + 1)
            pos = -1 if end < 0 else end + 1
        else:
            match = _SUBSET_TEXT.match(data, pos)
            pos = match.end() if match else -1
    return -1


def _prolog(data: bytes) -> tuple[int, tuple[int, int] | None] | None:
    """Where the root element starts and the span of the DOCTYPE's internal subset (``[...]``),
    read as XML defines the prolog (declaration, comments, processing instructions, one DOCTYPE);
    None when the prolog is not well-formed."""
    pos, subset, doctype = 0, None, False
    while True:
        pos = _skip_space(data, pos)
        if data.startswith((b"<?", b"<!--"), pos):
            pos = _end_of_markup(data, pos)
            if pos < 0:
                return None
        elif data.startswith(b"<!DOCTYPE", pos) and not doctype:
            doctype = True
            head = _DOCTYPE_HEAD.match(data, pos)
            pos = head.end() if head else len(data)
            if data.startswith(b"[", pos):
                end = _end_of_subset(data, pos + 1)
                if end < 0:
                    return None
                subset, pos = (pos, end), end
                pos = _skip_space(data, pos)
            if not data.startswith(b">", pos):
                return None
            pos += 1
        else:
            return (pos, subset) if _ROOT.match(data, pos) else None


def without_entity_declarations(data: bytes) -> bytes | None:
    """An XML document (UTF-8) with its DOCTYPE's internal subset cut out, so that nothing it
    declares can expand; the DOCTYPE's name and external id stay (nothing fetches them). None
    when an entity declaration could still be read: ``<!ENTITY`` left in the prolog (feedparser
    lifts declarations even out of comments), or anywhere in a document whose prolog is not
    well-formed."""
    prolog = _prolog(data)
    if prolog is None:
        return None if _ENTITY in data else data
    root, subset = prolog
    if subset is not None:
        start, end = subset
        data, root = data[:start] + data[end:], root - (end - start)
    return None if _ENTITY in data[:root] else data


def _text(value: Any) -> str | None:
    return value.strip() or None if isinstance(value, str) else None


def _iso(value: Any) -> str | None:
    """A feedparser date (a UTC struct_time) as ISO 8601, e.g. ``2027-01-15T07:00:00Z``."""
    if not isinstance(value, time.struct_time):
        return None
    return (f"{value.tm_year:04d}-{value.tm_mon:02d}-{value.tm_mday:02d}"
            f"T{value.tm_hour:02d}:{value.tm_min:02d}:{value.tm_sec:02d}Z")


def _absolute(link: str | None, base: str) -> str | None:
    if link is None:
        return None
    try:
        return canonical_url(link, base)
    except BadUrl:
        return None


def _digest(title: str | None, summary: str | None) -> str:
    text = f"{title or ''}\n{summary or ''}"
    return "sha256:" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def entry_fields(entry: Mapping[str, Any], base: str) -> dict[str, Any]:
    """An entry's item fields: ``guid`` (the entry's id, else its link, else ``sha256:`` and 32 hex
    digits of its title and summary; feedparser resolves an RSS ``<guid>`` that is a permalink, the
    default, like a link), ``title``, ``link`` (canonical, absolute against ``base``;
    None unless http(s)), ``published`` (published, else updated, as ISO 8601 UTC; None when
    absent or unreadable) and ``summary`` (feedparser's sanitised HTML)."""
    title, summary = _text(entry.get("title")), _text(entry.get("summary"))
    link = _absolute(_text(entry.get("link")), base)
    with warnings.catch_warnings():  # feedparser warns of its own updated -> published fallback
        warnings.simplefilter("ignore", DeprecationWarning)
        published = entry.get("published_parsed") or entry.get("updated_parsed")
    return {
        "guid": _text(entry.get("id")) or link or _digest(title, summary),
        "title": title,
        "link": link,
        "published": _iso(published),
        "summary": summary,
    }


def read_feed(response: Response, max_bytes: int = MAX_FEED_BYTES) -> tuple[list[dict[str, Any]], str | None]:
    """The entries of the feed in ``response`` as ``entry_fields`` dicts (each GUID once, in feed
    order), and why the body is not a clean feed (None when it is). Entries of a malformed feed
    that feedparser still reads are kept; a document feedparser knows no feed version of (no
    ``<rss>``, ``<rdf:RDF>`` or ``<feed>``) gives none. Never raises for what the body holds.

    Only the body is given to feedparser, never a URL or file name; the character encoding is
    decided as feedparser would (Content-Type, BOM, XML declaration), then the DOCTYPE's internal
    subset is cut (``without_entity_declarations``); external entities and DTDs are not fetched.
    """
    body = response.body
    if not body.strip():
        return [], "empty body"
    if len(body) > max_bytes:
        return [], f"{len(body)} bytes, more than max_bytes {max_bytes}"
    content_type = response.headers.get("content-type")
    decoded: dict[str, Any] = {}
    data = convert_to_utf8({"content-type": content_type} if content_type else {}, body, decoded)
    if not decoded.get("encoding"):
        return [], "unknown character encoding"
    screened = without_entity_declarations(data)
    if screened is None:
        return [], "entity declarations refused"
    headers = {"content-type": "application/xml; charset=utf-8", "content-location": response.final_url}
    try:
        result = feedparser.parse(io.BytesIO(screened), response_headers=headers)
    except _FEEDPARSER_ERRORS as exc:
        return [], f"feedparser failed: {type(exc).__name__}: {exc}"
    problem = decoded.get("bozo_exception") or result.get("bozo_exception")
    reason = None if problem is None else f"{type(problem).__name__}: {problem}"
    if not result.get("version"):  # no <rss>, <rdf:RDF> or <feed>: what looks like entries is not
        return [], f"not a feed ({reason})" if reason else "not a feed"
    entries: dict[str, dict[str, Any]] = {}
    for entry in result.get("entries", []):
        fields = entry_fields(entry, response.final_url)
        entries.setdefault(fields["guid"], fields)
    return list(entries.values()), reason


class FeedParser:
    """One item per feed entry (RSS 2.0, RSS 1.0, Atom), with the fields of ``entry_fields`` and the
    key ``<request key>#<guid>``; with ``links: true`` also each entry's link as a page request one
    level deeper. Bodies over ``max_bytes`` are not parsed (see MAX_FEED_BYTES). A body that is no
    feed gives nothing; a malformed one gives what feedparser reads of it; either is logged at
    info level, once per response."""

    def __init__(self, links: bool = False, max_bytes: Bytes = MAX_FEED_BYTES) -> None:
        if max_bytes < 1:
            raise ValueError("max_bytes: expected a size of 1 byte or more")
        self.links = links
        self.max_bytes = max_bytes

    def parse(self, response: Response) -> Parsed:
        entries, problem = read_feed(response, self.max_bytes)
        url = loggable(response.final_url)
        if problem is not None and entries:
            log.info("feed %s is malformed (%s); %d entries read anyway", url, loggable(problem), len(entries))
        elif problem is not None:
            log.info("no feed entries in %s: %s", url, loggable(problem))
        request = response.request
        items = [Item(fields, request.url, f"{request.key}#{fields['guid']}", response.fetched_at)
                 for fields in entries]
        if not self.links:
            return items, []
        meta = {"parent": request.key}
        links = dict.fromkeys(fields["link"] for fields in entries if fields["link"])
        return items, [Request(url, key=url, kind="page", depth=request.depth + 1, meta=meta) for url in links]
