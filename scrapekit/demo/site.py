"""The bundled local site: a bookshop for the demo recipe, growing timelines with a JSON API and
feeds, plus the hostile routes the tests need (slow, huge, gzip bomb, redirect loop, error
statuses with Retry-After, wrong charset, broken JSON, HTML served as RSS).
Loopback only; ``python -m scrapekit.demo.site --port 8765`` serves it until stopped."""

from __future__ import annotations

import argparse
import base64
import json
import math
import re
import signal
import socket
import struct
import sys
import threading
import time
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from email.utils import format_datetime
from html import escape
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from ipaddress import IPv4Address, ip_address
from types import FrameType
from typing import Any
from urllib.parse import parse_qsl, quote, urlsplit

CATALOGUE_PAGES = 50
BOOKS_PER_PAGE = 20
BOOKS = CATALOGUE_PAGES * BOOKS_PER_PAGE
HITS_PATH = "/__hits"
"""Serves the hit counts as JSON; not counted itself, so reading the counts leaves them as they were."""

_WORDS = ("river stone cloud engine harbor paper signal orbit garden silver copper window forest "
          "valley summit bridge quiet rapid golden hidden").split()
_AUTHORS = ("Ada Byron", "Alan Turing", "Grace Hopper", "Edsger Dijkstra", "Barbara Liskov", "Donald Knuth")
_PAGE_LINK_STEPS = (1, 2, 3, 17, 1000)
_HUGE_DEFAULT = 50_000_000
_HUGE_BLOCK = b"x" * 65536
_BOMB_SIZE = 1 << 30
_BOMB_SEGMENT = 1 << 20
_bomb: bytes | None = None
_bomb_lock = threading.Lock()


def gzip_bomb() -> bytes:
    """A gzip body (about 1 MB) that inflates to 1 GiB of zero bytes; built once, then cached.

    Deflating 1 GiB takes seconds, so one raw deflate segment of 1 MiB of zeros is compressed and
    ended with a full flush (byte-aligned, no back references across it), which makes the segment
    valid when repeated; the gzip header, CRC and size are written around the repeats. Building it
    never holds more than the 1 MiB of zeros and the result.
    """
    global _bomb
    with _bomb_lock:
        if _bomb is None:
            zeros = bytes(_BOMB_SEGMENT)
            deflater = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
            segment = deflater.compress(zeros) + deflater.flush(zlib.Z_FULL_FLUSH)
            repeats = _BOMB_SIZE // _BOMB_SEGMENT
            crc = 0
            for _ in range(repeats):
                crc = zlib.crc32(zeros, crc)
            header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"  # gzip, deflate, no name, no mtime
            final_block = b"\x03\x00"  # an empty fixed-Huffman block marked last
            trailer = struct.pack("<II", crc, _BOMB_SIZE & 0xFFFFFFFF)
            _bomb = header + segment * repeats + final_block + trailer
        return _bomb


# -- replies -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Call:
    """What a route sees of a request: the path segments after the route name and the query."""

    args: tuple[str, ...]
    query: Mapping[str, str]
    headers: Mapping[str, str]
    site: DemoSite


@dataclass(frozen=True, slots=True)
class _Reply:
    """A response to send: ``length`` is the Content-Length, ``chunks`` are written only for GET."""

    status: int
    chunks: Iterable[bytes]
    length: int
    headers: Mapping[str, str] = field(default_factory=dict)


Route = Callable[[_Call], _Reply]

_HTML = {"Content-Type": "text/html; charset=utf-8"}
_TEXT = {"Content-Type": "text/plain; charset=utf-8"}
_JSON = {"Content-Type": "application/json"}
_NO_BODY_STATUSES = frozenset({204, 304})  # a body after these would desync a keep-alive client


def _reply(status: int, body: bytes, headers: Mapping[str, str]) -> _Reply:
    return _Reply(status, (body,), len(body), headers)


def _html(title: str, body: str, status: int = 200) -> _Reply:
    page = (f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>{title}</title></head>'
            f"<body><h1>{title}</h1>\n{body}\n</body></html>\n")
    return _reply(status, page.encode(), _HTML)


def _not_found(call: _Call | None = None) -> _Reply:
    return _html("Not found", "<p>No such page.</p>", 404)


def _redirect(status: int, location: str) -> _Reply:
    return _reply(status, b"", {"Location": _header_value(location)})


def _header_value(text: str) -> str:
    """``text`` if it is safe as a header value; ValueError (a 400) if it would split the header."""
    if "\r" in text or "\n" in text:
        raise ValueError("header value contains CR or LF")
    return text


def _number(text: str) -> int | None:
    """An integer path segment (``-3``, ``12``), None for anything else (a 404, not a 400)."""
    digits = text.removeprefix("-")
    return int(text) if digits.isdigit() and digits.isascii() else None


def _title(book: int) -> str:
    return f"The {_WORDS[book % len(_WORDS)].title()} of {_WORDS[book * 7 % len(_WORDS)].title()} {book}"


def _price(book: int) -> str:
    return f"£{5 + book * 37 % 5000 / 100:.2f}"


def _author(book: int) -> str:
    return _AUTHORS[book % len(_AUTHORS)]


# -- the bookshop ------------------------------------------------------------------------------


def _index(call: _Call) -> _Reply:
    links = "".join(f'<li><a href="/catalogue/page-{n}.html">Page {n}</a></li>'
                    for n in range(1, CATALOGUE_PAGES + 1))
    return _html("Bookshop", f"<ul>{links}</ul>")


def _catalogue(call: _Call) -> _Reply:
    stem = call.args[0].removeprefix("page-").removesuffix(".html")
    n = _number(stem) if call.args[0] == f"page-{stem}.html" else None
    if n is None or not 1 <= n <= CATALOGUE_PAGES:
        return _not_found()
    parts = []
    for book in range((n - 1) * BOOKS_PER_PAGE + 1, n * BOOKS_PER_PAGE + 1):
        parts.append(f'<article class="book"><h2><a href="/book/{book}.html">{_title(book)}</a></h2>'
                     f'<p class="price">{_price(book)}</p><p class="author">{_author(book)}</p></article>')
    if n < CATALOGUE_PAGES:
        parts.append(f'<a class="next" href="/catalogue/page-{n + 1}.html">next</a>')
    return _html(f"Catalogue page {n}", "\n".join(parts))


def _book(call: _Call) -> _Reply:
    stem = call.args[0].removesuffix(".html")
    book = _number(stem) if call.args[0] == f"{stem}.html" else None
    if book is None or not 1 <= book <= BOOKS:
        return _not_found()
    page = (book - 1) // BOOKS_PER_PAGE + 1
    description = " ".join(_WORDS[(book + i) % len(_WORDS)] for i in range(60))
    return _html(_title(book), f'<p class="price">{_price(book)}</p><p class="author">{_author(book)}</p>'
                               f'<p class="description">{description}</p>'
                               f'<a class="back" href="/catalogue/page-{page}.html">back to the catalogue</a>')


def _robots(call: _Call) -> _Reply:
    return _reply(200, b"User-agent: *\nDisallow:\n", _TEXT)


def _numbered(call: _Call) -> _Reply:
    n = _number(call.args[0])
    if n is None:
        return _not_found()
    links = " ".join(f'<a href="/page/{n + step}">page {n + step}</a>' for step in _PAGE_LINK_STEPS)
    text = " ".join(_WORDS[(n + i) % len(_WORDS)] for i in range(250))
    return _html(f"Page {n}", f"<p>{text}</p>\n<p>{links}</p>")


# -- the blog (feeds and social accounts, for the focus parser) --------------------------------

BLOG_POSTS = 5
BLOG_SOCIAL = ("https://twitter.com/demoblog", "https://www.facebook.com/demoblog", "https://github.com/demoblog",
               "https://www.linkedin.com/company/demoblog")
"""The blog's accounts, linked from every blog page's footer next to share buttons that are not."""

_RSS = {"Content-Type": "application/rss+xml; charset=utf-8"}
_ATOM = {"Content-Type": "application/atom+xml; charset=utf-8"}


def _origin(call: _Call) -> str:
    """``http://host:port`` as the client addressed it (feeds and share links want absolute URLs)."""
    host = next((value for name, value in call.headers.items() if name.lower() == "host"), "127.0.0.1")
    return f"http://{host}"


def _post_title(n: int) -> str:
    return f"Notes on {_WORDS[n * 3 % len(_WORDS)].title()}"


def _blog_page(call: _Call, title: str, path: str, body: str, atom: bool) -> _Reply:
    feeds = '<link rel="alternate" type="application/rss+xml" title="Demo blog" href="/blog/feed.xml">'
    if atom:
        feeds += '<link rel="alternate" type="application/atom+xml" title="Demo blog" href="/blog/atom.xml">'
    posts = "".join(f'<li><a href="/blog/post/{n}">{_post_title(n)}</a></li>' for n in range(1, BLOG_POSTS + 1))
    accounts = " ".join(f'<a href="{url}">{urlsplit(url).hostname}</a>' for url in BLOG_SOCIAL)
    page = quote(_origin(call) + path, safe="")
    shares = (f'<a href="https://twitter.com/intent/tweet?url={page}">tweet this</a> '
              f'<a href="https://www.facebook.com/sharer/sharer.php?u={page}">share this</a>')
    html = (f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>{title}</title>{feeds}</head>'
            f'<body><h1>{title}</h1>\n{body}\n<nav><a href="/blog/">Demo blog</a><ul>{posts}</ul></nav>\n'
            f"<footer><p>{accounts}</p><p>{shares}</p></footer>\n</body></html>\n")
    return _reply(200, html.encode(), _HTML)


def _blog_index(call: _Call) -> _Reply:
    body = '<p>A small blog with feeds. <a href="/blog/feed.xml">Subscribe</a>.</p>'
    return _blog_page(call, "Demo blog", "/blog/", body, atom=True)


def _blog_post(call: _Call) -> _Reply:
    n = _number(call.args[1]) if call.args[0] == "post" else None
    if n is None or not 1 <= n <= BLOG_POSTS:
        return _not_found()
    text = " ".join(_WORDS[(n + i) % len(_WORDS)] for i in range(80))
    return _blog_page(call, _post_title(n), f"/blog/post/{n}", f"<p>{text}</p>", atom=False)


def _blog_feed(call: _Call) -> _Reply:
    """``/blog/feed.xml`` (RSS 2.0) and ``/blog/atom.xml`` (Atom), listing every post."""
    origin = escape(_origin(call))
    posts = range(1, BLOG_POSTS + 1)
    if call.args[0] == "feed.xml":
        entries = "".join(f"<item><title>{_post_title(n)}</title><link>{origin}/blog/post/{n}</link></item>"
                          for n in posts)
        xml = (f'<?xml version="1.0" encoding="utf-8"?>\n<rss version="2.0"><channel><title>Demo blog</title>'
               f"<link>{origin}/blog/</link><description>The demo blog</description>{entries}</channel></rss>\n")
        return _reply(200, xml.encode(), _RSS)
    if call.args[0] == "atom.xml":
        entries = "".join(f'<entry><title>{_post_title(n)}</title><id>{origin}/blog/post/{n}</id>'
                          f'<link href="{origin}/blog/post/{n}"/><updated>2024-01-{n:02d}T00:00:00Z</updated></entry>'
                          for n in posts)
        xml = (f'<?xml version="1.0" encoding="utf-8"?>\n<feed xmlns="http://www.w3.org/2005/Atom">'
               f"<title>Demo blog</title><id>{origin}/blog/</id><updated>2024-01-05T00:00:00Z</updated>"
               f'<link href="{origin}/blog/"/>{entries}</feed>\n')
        return _reply(200, xml.encode(), _ATOM)
    return _not_found()


# -- growing timelines: a JSON API, its paged listings and its feeds (algorithmic scraping) -----
#
# Every answer is a function of the path, the query and ``site.now()``, so a test that sets
# ``site.now`` to a fake clock sees the timelines grow exactly as it moves the clock.

TIMELINE_EPOCH = 1_800_000_000
"""Post ``k`` of a user (k = 1, 2, ...) appears at ``TIMELINE_EPOCH + k * rate``. The epoch is
2027-01-15T08:00:00Z: on the real clock every timeline is empty until then."""
TIMELINE_RATES: Mapping[str, int] = {"fast": 1, "slow": 60, "rare": 3600}
"""User name -> seconds between two posts; any other name posts every TIMELINE_DEFAULT_RATE."""
TIMELINE_DEFAULT_RATE = 10
TIMELINE_COUNT = 20
TIMELINE_MAX_COUNT = 200
FEED_ENTRIES = 20
LISTING_TOTAL = 95
LISTING_PER_PAGE = 10
LISTING_MAX_PER_PAGE = 100
BASE62 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
"""The digits of short codes, in order of value."""
_MAX_CODE = 64
_USER = re.compile(r"[A-Za-z0-9_-]{1,40}")


def timeline_rate(user: str) -> int:
    """Seconds between two posts of ``user``."""
    return TIMELINE_RATES.get(user, TIMELINE_DEFAULT_RATE)


def newest_post(user: str, now: float) -> int:
    """The id of ``user``'s newest post at ``now``; 0 before the first."""
    return max(0, math.floor((now - TIMELINE_EPOCH) / timeline_rate(user)))


def _posted_at(user: str, post: int) -> datetime:
    return datetime.fromtimestamp(TIMELINE_EPOCH + post * timeline_rate(user), timezone.utc)


def _post_text(user: str, post: int) -> str:
    return f"{user} #{post}: " + " ".join(_WORDS[(post * 3 + i) % len(_WORDS)] for i in range(8))


def _post(user: str, post: int) -> dict[str, Any]:
    created = _posted_at(user, post).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"id": post, "text": _post_text(user, post), "user": user, "created_at": created,
            "url": f"/post/{user}/{post}"}


def _query_int(call: _Call, name: str, default: int) -> int:
    """The whole number ``name`` of the query, ``default`` when absent; ValueError (a 400) if malformed."""
    text = call.query.get(name)
    if text is None:
        return default
    value = _number(text)
    if value is None:
        raise ValueError(f"{name} must be a whole number")
    return value


def _json_reply(data: Any, headers: Mapping[str, str] = _JSON, status: int = 200) -> _Reply:
    return _reply(status, json.dumps(data).encode(), headers)


def _user_of(name: str, suffix: str) -> str | None:
    """The user of ``<user><suffix>``, None for any other name (a 404)."""
    user = name.removesuffix(suffix)
    return user if name == user + suffix and _USER.fullmatch(user) else None


def _timeline(call: _Call) -> _Reply:
    """``/api/timeline/<user>.json?max_id=X&since_id=Y&count=N``: the user's posts with
    since_id < id < max_id, newest first, at most count (default 20, at most 200), and
    ``next_max_id`` (the lowest id given) when older ones remain. A post is
    ``{"id", "text", "user", "created_at", "url"}``, its url relative (``/post/<user>/<id>``)."""
    user = _user_of(call.args[1], ".json") if call.args[0] == "timeline" else None
    if user is None:
        return _not_found()
    count = _query_int(call, "count", TIMELINE_COUNT)
    if count < 1:
        raise ValueError("count must be 1 or more")
    since_id = max(_query_int(call, "since_id", 0), 0)
    newest = newest_post(user, call.site.now())
    if "max_id" in call.query:
        newest = min(newest, _query_int(call, "max_id", 0) - 1)
    posts = range(newest, max(newest - min(count, TIMELINE_MAX_COUNT), since_id), -1)
    data: dict[str, Any] = {"items": [_post(user, post) for post in posts]}
    if posts and posts[-1] > since_id + 1:
        data["next_max_id"] = posts[-1]
    return _json_reply(data)


def _listing_item(n: int) -> dict[str, Any]:
    return {"id": n, "title": _title(n)}


def _page_size(call: _Call) -> int:
    per_page = _query_int(call, "per_page", LISTING_PER_PAGE)
    if not 1 <= per_page <= LISTING_MAX_PER_PAGE:
        raise ValueError(f"per_page must be 1 to {LISTING_MAX_PER_PAGE}")
    return per_page


def _api_list(call: _Call) -> _Reply:
    """``/api/list?page=N&per_page=K``: page N (from 1) of LISTING_TOTAL items, a ``Link`` header
    to the next page when there is one; pages past the end are empty."""
    page, per_page = _query_int(call, "page", 1), _page_size(call)
    if page < 1:
        raise ValueError("page must be 1 or more")
    start = (page - 1) * per_page
    items = [_listing_item(n) for n in range(start + 1, min(start + per_page, LISTING_TOTAL) + 1)]
    headers = dict(_JSON)
    if start + per_page < LISTING_TOTAL:
        next_page = f"{_origin(call)}/api/list?page={page + 1}&per_page={per_page}"
        headers["Link"] = _header_value(f'<{next_page}>; rel="next"')
    return _json_reply({"items": items, "page": page, "per_page": per_page, "total": LISTING_TOTAL}, headers)


def cursor_token(offset: int) -> str:
    """The opaque ``cursor`` of ``/api/cursor`` that starts at item ``offset`` (from 0)."""
    return base64.urlsafe_b64encode(f"offset:{offset}".encode()).decode().rstrip("=")


def _cursor_offset(token: str) -> int:
    """The offset in ``token``; ValueError (a 400) for a token cursor_token did not make
    (binascii.Error and UnicodeDecodeError are ValueErrors too)."""
    text = base64.b64decode(token + "=" * (-len(token) % 4), altchars=b"-_", validate=True).decode()
    offset = _number(text.removeprefix("offset:")) if text.startswith("offset:") else None
    if offset is None or offset < 0:
        raise ValueError("bad cursor")
    return offset


def _api_cursor(call: _Call) -> _Reply:
    """``/api/cursor?cursor=TOKEN&per_page=K``: the same items as ``/api/list``, paged by an opaque
    cursor; ``next_cursor`` is absent on the last page."""
    token = call.query.get("cursor")
    start, per_page = 0 if token is None else _cursor_offset(token), _page_size(call)
    end = min(start + per_page, LISTING_TOTAL)
    data: dict[str, Any] = {"items": [_listing_item(n) for n in range(start + 1, end + 1)]}
    if end < LISTING_TOTAL:
        data["next_cursor"] = cursor_token(end)
    return _json_reply(data)


def _api_broken(call: _Call) -> _Reply:
    return _reply(200, b'{"items": [{"id": 1, "text": "one"}, {"id": 2, "te', _JSON)


def _api_missing_id(call: _Call) -> _Reply:
    items = [{"text": "no id here"}, {"text": "a null id", "id": None}, {"text": "an id in a list", "id": [3]}]
    return _json_reply({"items": items})


def _api_retry_after(call: _Call) -> _Reply:
    """503 with ``Retry-After`` set to the ``value`` of the query as given (a 400 without one)."""
    if "value" not in call.query:
        raise ValueError("value is required")
    headers = {**_TEXT, "Retry-After": _header_value(call.query["value"])}
    return _reply(503, b"retry later\n", headers)


_API_ROUTES: dict[str, Route] = {
    "list": _api_list,
    "cursor": _api_cursor,
    "broken.json": _api_broken,
    "missing-id.json": _api_missing_id,
    "retry-after": _api_retry_after,
}


def _api(call: _Call) -> _Reply:
    return _API_ROUTES.get(call.args[0], _not_found)(call)


def _post_guid(user: str, post: int) -> str:
    return f"urn:scrapekit-demo:{user}:{post}"


def _feed_xml(call: _Call, user: str, atom: bool) -> _Reply:
    """RSS 2.0 or Atom of ``user``'s FEED_ENTRIES newest posts, newest first."""
    origin = escape(_origin(call))
    newest = newest_post(user, call.site.now())
    posts = range(newest, max(newest - FEED_ENTRIES, 0), -1)
    updated = _posted_at(user, newest)
    if atom:
        entries = "".join(
            f"<entry><id>{_post_guid(user, n)}</id><title>{user} #{n}</title>"
            f'<link href="{origin}/post/{user}/{n}"/><published>{_posted_at(user, n).isoformat()}</published>'
            f"<updated>{_posted_at(user, n).isoformat()}</updated><summary>{_post_text(user, n)}</summary></entry>"
            for n in posts)
        xml = (f'<?xml version="1.0" encoding="utf-8"?>\n<feed xmlns="http://www.w3.org/2005/Atom">'
               f"<id>urn:scrapekit-demo:{user}</id><title>Posts of {user}</title><updated>{updated.isoformat()}</updated>"
               f'<link rel="self" href="{origin}/feed/{user}.atom"/>{entries}</feed>\n')
        return _reply(200, xml.encode(), _ATOM)
    items = "".join(
        f"<item><title>{user} #{n}</title><link>{origin}/post/{user}/{n}</link>"
        f'<guid isPermaLink="false">{_post_guid(user, n)}</guid>'
        f"<pubDate>{format_datetime(_posted_at(user, n), usegmt=True)}</pubDate>"
        f"<description>{_post_text(user, n)}</description></item>"
        for n in posts)
    xml = (f'<?xml version="1.0" encoding="utf-8"?>\n<rss version="2.0"><channel><title>Posts of {user}</title>'
           f"<link>{origin}/api/timeline/{user}.json</link><description>The demo timeline of {user}</description>"
           f"<lastBuildDate>{format_datetime(updated, usegmt=True)}</lastBuildDate>{items}</channel></rss>\n")
    return _reply(200, xml.encode(), _RSS)


def _feed(call: _Call) -> _Reply:
    """``/feed/<user>.xml`` (RSS 2.0), ``/feed/<user>.atom`` (Atom), and ``/feed/not-xml.xml``: an
    HTML page served as RSS."""
    name = call.args[0]
    if name == "not-xml.xml":
        return _reply(200, b"<!DOCTYPE html>\n<html><head><title>Not a feed</title></head>"
                           b"<body><p>An HTML page <b>served as RSS</p></body></html>\n", _RSS)
    user = _user_of(name, ".atom")
    if user is not None:
        return _feed_xml(call, user, atom=True)
    user = _user_of(name, ".xml")
    return _not_found() if user is None else _feed_xml(call, user, atom=False)


def _timeline_post(call: _Call) -> _Reply:
    """``/post/<user>/<id>``: one post that exists by now."""
    user, post = call.args[0], _number(call.args[1])
    if not _USER.fullmatch(user) or post is None or not 1 <= post <= newest_post(user, call.site.now()):
        return _not_found()
    return _html(f"{user} #{post}", f"<p>{escape(_post_text(user, post))}</p>")


def short_code_value(code: str) -> int | None:
    """The integer a base-62 short code (BASE62 digits, at most 64) stands for; None for others."""
    if not 1 <= len(code) <= _MAX_CODE or not all(char in BASE62 for char in code):
        return None
    value = 0
    for char in code:
        value = value * 62 + BASE62.index(char)
    return value


def _short_link(call: _Call) -> _Reply:
    """``/s/<code>``: 301 to ``https://example.org/target/<code>`` when the code's value is
    divisible by 3, else 404."""
    value = short_code_value(call.args[0])
    if value is None or value % 3:
        return _not_found()
    return _redirect(301, f"https://example.org/target/{call.args[0]}")


# -- hostile and test routes -------------------------------------------------------------------


def _slow(call: _Call) -> _Reply:
    time.sleep(float(call.query.get("seconds", "1")))
    return _html("Slow", "<p>finally</p>")


def _huge(call: _Call) -> _Reply:
    size = int(call.query.get("bytes", str(_HUGE_DEFAULT)))
    if size < 0:
        raise ValueError("bytes must be 0 or more")
    return _Reply(200, _repeat_block(size), size, {"Content-Type": "application/octet-stream"})


def _repeat_block(size: int) -> Iterator[bytes]:
    """``size`` bytes of ``x``, one 64 KiB block at a time, made only as the client reads them."""
    for start in range(0, size, len(_HUGE_BLOCK)):
        yield _HUGE_BLOCK[:size - start]


def _bomb_route(call: _Call) -> _Reply:
    return _reply(200, gzip_bomb(), {"Content-Type": "text/html", "Content-Encoding": "gzip"})


def _redirect_loop(call: _Call) -> _Reply:
    n = _number(call.args[0])
    return _redirect(302, f"/redirect-loop/{n + 1}") if n is not None else _not_found()


def _redirect_to(call: _Call) -> _Reply:
    return _redirect(302, call.query.get("to", "/"))


def _head_redirect(call: _Call) -> _Reply:
    return _redirect(301, "/page/1")


def _status(call: _Call) -> _Reply:
    code = _number(call.args[0])
    if code is None or not 200 <= code <= 599:
        return _not_found()
    headers = dict(_TEXT)
    if "retry_after" in call.query:
        headers["Retry-After"] = _header_value(call.query["retry_after"])
    return _reply(code, b"" if code in _NO_BODY_STATUSES else f"status {code}\n".encode(), headers)


def _bad_encoding(call: _Call) -> _Reply:
    page = ('<html><head><meta charset="iso-8859-1"><title>caf\xe9</title></head>'
            "<body><p>caf\xe9 cr\xe8me br\xfbl\xe9e</p></body></html>")
    return _reply(200, page.encode("latin-1"), _HTML)  # the header's utf-8 is the lie under test


def _echo_headers(call: _Call) -> _Reply:
    return _reply(200, json.dumps(dict(call.headers)).encode(), _JSON)


def _hits(call: _Call) -> _Reply:
    return _reply(200, json.dumps(call.site.hits_snapshot()).encode(), _JSON)


ROUTES: dict[tuple[str, int], Route] = {
    ("", 0): _index,
    ("catalogue", 1): _catalogue,
    ("book", 1): _book,
    ("robots.txt", 0): _robots,
    ("page", 1): _numbered,
    ("blog", 0): _blog_index,
    ("blog", 1): _blog_feed,
    ("blog", 2): _blog_post,
    ("slow", 0): _slow,
    ("huge", 0): _huge,
    ("gzip-bomb", 0): _bomb_route,
    ("redirect-loop", 1): _redirect_loop,
    ("redirect", 0): _redirect_to,
    ("head-redirect", 0): _head_redirect,
    ("status", 1): _status,
    ("bad-encoding", 0): _bad_encoding,
    ("echo-headers", 0): _echo_headers,
    (HITS_PATH.strip("/"), 0): _hits,
    ("api", 1): _api,
    ("api", 2): _timeline,
    ("feed", 1): _feed,
    ("post", 2): _timeline_post,
    ("s", 1): _short_link,
}
"""(first path segment, number of segments after it) -> route; anything else is a 404.
A malformed number in the query (``/slow?seconds=x``) is a 400."""


# -- the server --------------------------------------------------------------------------------


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive; every reply carries a Content-Length
    disable_nagle_algorithm = True  # headers and body go out as two writes: no 40 ms delayed-ACK stall
    server: _Server

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: the site counts hits instead of logging each request."""

    def setup(self) -> None:
        super().setup()
        self.server.site._track(self.connection, True)

    def finish(self) -> None:
        self.server.site._track(self.connection, False)
        super().finish()

    def do_GET(self) -> None:
        self._serve(send_body=True)

    def do_HEAD(self) -> None:
        self._serve(send_body=False)

    def _serve(self, send_body: bool) -> None:
        target = urlsplit(self.path)
        headers = dict(self.headers.items())
        site = self.server.site
        site._record(self.command, self.path, target.path, headers, self.client_address[1])
        name, *args = [s for s in target.path.split("/") if s] or [""]
        route = ROUTES.get((name, len(args)), _not_found)
        try:
            reply = route(_Call(tuple(args), dict(parse_qsl(target.query)), headers, site))
        except ValueError as exc:
            reply = _reply(400, f"bad request: {exc}\n".encode(), _TEXT)
        try:
            self.send_response(reply.status)
            for header, value in reply.headers.items():
                self.send_header(header, value)
            self.send_header("Content-Length", str(reply.length))
            self.end_headers()
            if send_body:
                for chunk in reply.chunks:
                    self.wfile.write(chunk)
        except ConnectionError:
            self.close_connection = True  # the client hung up: a fetch capped at max_bytes does it on purpose


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # 32 fetch threads connecting at once must not overflow the backlog
    site: DemoSite

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Quiet about clients that hang up between requests; loud about anything else."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class DemoSite:
    """The site on ``host:port`` (port 0 = a free one) served from a background thread.

    The port is bound on construction, so ``url`` and ``port`` are known before ``start()``.
    ``close()`` stops the server and hangs up on open keep-alive connections. ``hits`` counts
    requests by path (query dropped); ``requests_log`` holds (method, path with query, headers,
    client port) of every request, in order, unless ``log_requests`` is False. ``now`` is the
    clock of the timeline routes (API, feeds, posts); a test sets it to a fake clock's ``time``.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, log_requests: bool = True) -> None:
        if not _is_ipv4_loopback(host):
            raise ValueError(f"the demo site serves loopback only (an address like 127.0.0.1), not {host!r}")
        self.host = host
        self.hits: Counter[str] = Counter()
        self.requests_log: list[tuple[str, str, dict[str, str], int]] = []
        self._lock = threading.Lock()
        self._connections: set[socket.socket] = set()
        self._server = _Server((host, port), _Handler)
        self._server.site = self
        self.port: int = self._server.server_address[1]
        self.url = f"http://{host}:{self.port}"
        self._thread: threading.Thread | None = None
        self._closed = False
        self._log_requests = log_requests
        # The API routes' clock. Left alone, it starts at TIMELINE_EPOCH + 1 h when the site
        # starts (fast has 3600 posts, slow 60, rare 1) and runs in real time; tests set a fake one.
        started = time.time()
        self.now: Callable[[], float] = lambda: TIMELINE_EPOCH + 3600.0 + (time.time() - started)

    def hits_snapshot(self) -> dict[str, int]:
        """A copy of the hit counts, consistent at one instant."""
        with self._lock:
            return dict(self.hits)

    def start(self) -> DemoSite:
        # a short poll interval so close() returns in ~0.05 s, not the default 0.5 s
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,),
                                        name=f"demo-site-{self.port}", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving and release the port; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        if self._thread is not None:
            self._server.shutdown()
        self._server.server_close()
        with self._lock:
            open_connections = list(self._connections)
        for connection in open_connections:
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed by the client or its handler

    def __enter__(self) -> DemoSite:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _record(self, method: str, path_with_query: str, path: str, headers: dict[str, str], port: int) -> None:
        with self._lock:
            if path != HITS_PATH:
                self.hits[path] += 1
            if self._log_requests:
                self.requests_log.append((method, path_with_query, headers, port))

    def _track(self, connection: socket.socket, is_open: bool) -> None:
        with self._lock:
            if is_open:
                self._connections.add(connection)
            else:
                self._connections.discard(connection)


def _is_ipv4_loopback(host: str) -> bool:
    try:
        address = ip_address(host)
    except ValueError:
        return False
    return isinstance(address, IPv4Address) and address.is_loopback


def main(argv: list[str] | None = None) -> None:
    """Serve the site until SIGINT or SIGTERM."""
    parser = argparse.ArgumentParser(prog="python -m scrapekit.demo.site",
                                     description="Serve the scrapekit demo site on loopback.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    args = parser.parse_args(argv)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    # nobody outside this process can read requests_log, and a long benchmark would grow it without end
    with DemoSite(args.host, args.port, log_requests=False) as site:
        print(f"demo site at {site.url}", flush=True)
        stop.wait()


if __name__ == "__main__":
    main()
