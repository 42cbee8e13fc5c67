"""The values that flow between parts: Request, Response, Item and Job.

Small frozen dataclasses with one-JSON-line (de)serialisation; follow-ups are made with
``dataclasses.replace``.
"""

from __future__ import annotations

import functools
import ipaddress
import json
import re
import string
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import SplitResult, urljoin, urlsplit

KINDS = ("page", "resource", "timeline", "feed", "head")
DEFAULT_PRIORITY = 1024


class BadUrl(ValueError):
    """A URL scrapekit will not fetch (not http(s), no host, unparseable)."""


_DEFAULT_PORTS = {"http": 80, "https": 443}
"""The schemes scrapekit fetches, each with the port its canonical URLs leave out."""

_ANY_VALUE = re.compile(r".*", re.DOTALL)
SESSION_PARAMS: Mapping[str, re.Pattern[str]] = {
    "jsessionid": _ANY_VALUE, "phpsessid": _ANY_VALUE, "sid": _ANY_VALUE, "sessionid": _ANY_VALUE,
    "aspsessionid": _ANY_VALUE, "cfid": _ANY_VALUE, "cftoken": _ANY_VALUE,
    # vBulletin's session hash; any other ?s= belongs to the page (WordPress: the search words)
    "s": re.compile(r"[0-9A-Fa-f]{32}"),
}
"""Query keys and ``;key=value`` path parameters (key in any case) that name a session, not a
page, with the values that do: dropped from canonical URLs."""

_BAD_CHARS = re.compile(r"[\x00-\x20\x7f-\x9f\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]")
_ABSOLUTE = re.compile(r"https?://", re.IGNORECASE)
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")
_HOST = re.compile(r"[a-z0-9_-]{1,63}(?:\.[a-z0-9_-]{1,63})*")
# What a path or query may hold as it is (RFC 3986); any other character is escaped as UTF-8.
_PATH_DIRTY = re.compile(r"[^A-Za-z0-9\-._~!$&'()*+,;=:@/]")
_QUERY_DIRTY = re.compile(r"[^A-Za-z0-9\-._~!$&'()*+,;=:@/?]")
_PATH_ESCAPES = re.compile(r"%[0-9A-Fa-f]{2}|[^A-Za-z0-9\-._~!$&'()*+,;=:@/%]+|%")
_QUERY_ESCAPES = re.compile(r"%[0-9A-Fa-f]{2}|[^A-Za-z0-9\-._~!$&'()*+,;=:@/?%]+|%")
_PATH_PARAM = re.compile(r";([^/;=]*)=([^/;]*)")
_UNRESERVED = frozenset(string.ascii_letters + string.digits + "-._~")


_USERINFO = re.compile(r"(?<=://)[^/?#@\s]*@")
_MAX_LOGGED = 300


def loggable(text: str) -> str:
    """``text`` (a URL, or a message holding URLs) fit for a log line: credentials in URLs
    masked, control and other invisible characters escaped, at most 300 characters."""
    text = _USERINFO.sub("***@", text)
    if not text.isprintable():
        text = text.encode("unicode_escape").decode("ascii")
    return text if len(text) <= _MAX_LOGGED else text[:_MAX_LOGGED] + "..."


def canonical_url(url: str, base: str | None = None) -> str:
    """``url``, resolved against ``base`` when relative, in the one form scrapekit keys it by.

    Scheme and host lower-case, international hosts in punycode, IPv6 hosts compressed, the
    default port, the fragment and session ids (SESSION_PARAMS) dropped, an empty path made
    "/", dot segments removed, escapes normalised (unreserved characters decoded, hex digits
    upper-case, a ``%`` that starts no escape written ``%25``, other characters a URL may not
    hold escaped as UTF-8), query parameters sorted by key (equal keys keep their order).
    The result is its own canonical form. Raises BadUrl unless the result is an http(s) URL
    with a valid host, and for whitespace or control characters anywhere in ``url``.
    """
    url = url.strip()
    if base is not None and url[:1] == "/" and _SIMPLE_PATH.fullmatch(url):
        origin = _canonical_origin(base)  # the common link, "/a/b.html", is canonical already
        if origin is not None:
            return origin + url
    if _BAD_CHARS.search(url):
        raise BadUrl(f"URL contains whitespace or control characters: {url!r}")
    if base is not None and not _ABSOLUTE.match(url):
        url = _join(base, url)
        if _BAD_CHARS.search(url):
            raise BadUrl(f"URL contains whitespace or control characters: {url!r}")
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise BadUrl(f"unparseable URL {url!r}: {exc}") from None
    scheme = parts.scheme
    default_port = _DEFAULT_PORTS.get(scheme)
    if default_port is None:
        raise BadUrl(f"not an http(s) URL: {url!r}")
    netloc = parts.netloc.lower()
    if not _HOST.fullmatch(netloc):  # a port, user, IP literal, international or broken host
        netloc = _netloc(parts, url, default_port)
    path = parts.path
    if ";" in path:
        path = _PATH_PARAM.sub(_path_param, path)
    if not path:
        path = "/"
    elif _PATH_DIRTY.search(path):
        path = _PATH_ESCAPES.sub(_escape, path)
    if "/." in path:  # after unescaping, so %2E%2E is a dot segment too (RFC 3986 6.2.2)
        path = _remove_dot_segments(path)
    query = parts.query
    if query:
        if _QUERY_DIRTY.search(query):
            query = _QUERY_ESCAPES.sub(_escape, query)
        pairs = [pair for pair in query.split("&") if _kept(pair)]
        if pairs:
            pairs.sort(key=_param_key)
            return f"{scheme}://{netloc}{path}?{'&'.join(pairs)}"
    return f"{scheme}://{netloc}{path}"


def _netloc(parts: SplitResult, url: str, default_port: int) -> str:
    try:
        port = parts.port
    except ValueError as exc:
        raise BadUrl(f"bad port in {url!r}: {exc}") from None
    host = parts.hostname or ""
    if "[" in parts.netloc:
        try:
            host = f"[{ipaddress.IPv6Address(host).compressed}]"
        except ValueError as exc:
            raise BadUrl(f"bad IPv6 host in {url!r}: {exc}") from None
    else:
        host = host.rstrip(".")
        if not host.isascii():
            try:
                host = host.encode("idna").decode("ascii").lower()
            except UnicodeError as exc:
                raise BadUrl(f"bad international host in {url!r}: {exc}") from None
        if not _HOST.fullmatch(host):
            raise BadUrl(f"bad or missing host in {url!r}")
    if port is not None and port != default_port:
        host = f"{host}:{port}"
    userinfo = parts.netloc.rpartition("@")[0]
    return f"{userinfo}@{host}" if userinfo else host


_SIMPLE_PATH = re.compile(r"/(?:[A-Za-z0-9_~-][A-Za-z0-9._~-]*/?)*")
"""A root-relative path already in canonical form: unreserved characters only, no empty, dot
or dot-dot segments, no query or fragment (a segment may not start with a dot)."""


@functools.lru_cache(maxsize=256)
def _canonical_origin(base: str) -> str | None:
    """``scheme://host[:port]`` of ``base`` in canonical form, None when base is no http(s) URL."""
    try:
        known = _base_parts(base)
        return None if known is None else canonical_url(known[1] + "/")[:-1]
    except (BadUrl, ValueError):
        return None


@functools.lru_cache(maxsize=256)
def _base_parts(base: str) -> tuple[str, str, str, str, str] | None:
    """What relative links need of an http(s) base URL: its scheme, its origin, itself without
    query, itself without fragment, and its directory; None for any other base."""
    parts = urlsplit(base)
    if parts.scheme not in _DEFAULT_PORTS or not parts.netloc:
        return None
    origin = f"{parts.scheme}://{parts.netloc}"
    path = origin + (parts.path or "/")
    whole = f"{path}?{parts.query}" if parts.query else path
    return parts.scheme, origin, path, whole, path[: path.rfind("/") + 1]


def _join(base: str, url: str) -> str:
    """``url`` resolved against ``base`` as urljoin does, dot segments left in, without parsing
    the base again for every link of a page (urljoin took half the time of canonical_url)."""
    try:
        known = _base_parts(base)
        if known is None or _SCHEME.match(url):
            return urljoin(base, url)
    except ValueError as exc:
        raise BadUrl(f"cannot resolve {url!r} against {base!r}: {exc}") from None
    scheme, origin, path, whole, directory = known
    if not url or url[0] == "#":
        return whole
    if url[0] == "/":
        return f"{scheme}:{url}" if url.startswith("//") else origin + url
    if url[0] == "?":
        return path + url
    return directory + url


def _escape(match: re.Match[str]) -> str:
    """One normalised escape: ``%7e`` → ``~``, ``%2f`` → ``%2F``, a lone ``%`` → ``%25``, and
    characters a URL may not hold → their UTF-8 bytes escaped."""
    text = match[0]
    if text == "%":
        return "%25"
    if text[0] == "%":
        char = chr(int(text[1:], 16))
        return char if char in _UNRESERVED else text.upper()
    try:
        return "".join(f"%{byte:02X}" for byte in text.encode("utf-8"))
    except UnicodeEncodeError:  # a lone surrogate, from a page that decoded badly
        raise BadUrl(f"URL holds characters that are not text: {text!r}") from None


def _session(key: str, value: str) -> bool:
    pattern = SESSION_PARAMS.get(key.lower())
    return pattern is not None and pattern.fullmatch(value) is not None


def _path_param(match: re.Match[str]) -> str:
    return "" if _session(match[1], match[2]) else match[0]


def _kept(pair: str) -> bool:
    key, _, value = pair.partition("=")
    return bool(pair) and not _session(key, value)


def _param_key(pair: str) -> str:
    return pair.partition("=")[0]


def _remove_dot_segments(path: str) -> str:
    out: list[str] = []
    for segment in path.split("/"):
        if segment == "..":
            if len(out) > 1:  # never above the root
                out.pop()
        elif segment != ".":
            out.append(segment)
    if path.endswith(("/.", "/..")):
        out.append("")
    return "/".join(out) or "/"


@dataclass(frozen=True, slots=True)
class Request:
    """One thing to fetch. ``key`` is its identity in queues and seen-sets (default: canonical URL)."""

    url: str
    key: str = ""
    kind: str = "page"
    meta: Mapping[str, Any] = field(default_factory=dict)
    depth: int = 0
    attempt: int = 0
    priority: int = DEFAULT_PRIORITY
    not_before: float = 0.0

    def __post_init__(self) -> None:
        if not self.key:
            object.__setattr__(self, "key", canonical_url(self.url))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"url": self.url, "key": self.key, "kind": self.kind}
        if self.meta:
            out["meta"] = dict(self.meta)
        for name, default in (("depth", 0), ("attempt", 0), ("priority", DEFAULT_PRIORITY), ("not_before", 0.0)):
            value = getattr(self, name)
            if value != default:
                out[name] = value
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"), ensure_ascii=False)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Request:
        return cls(
            url=str(data["url"]),
            key=str(data.get("key") or ""),
            kind=str(data.get("kind", "page")),
            meta=dict(data.get("meta") or {}),
            depth=int(data.get("depth", 0)),
            attempt=int(data.get("attempt", 0)),
            priority=int(data.get("priority", DEFAULT_PRIORITY)),
            not_before=float(data.get("not_before", 0.0)),
        )

    @classmethod
    def from_json(cls, line: str | bytes) -> Request:
        return cls.from_dict(json.loads(line))


@dataclass(frozen=True, slots=True)
class Response:
    """What a fetch gave. ``error`` is None on success, else an error kind (see scrapekit.fetchers).

    ``status`` is the last HTTP status seen, 0 when none was. ``body`` may be truncated at the
    fetcher's ``max_bytes``; ``truncated`` says so.
    """

    request: Request
    status: int
    reason: str = ""
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes = b""
    truncated: bool = False
    url: str = ""
    fetched_at: float = 0.0
    elapsed: float = 0.0
    error: str | None = None
    retry_after: float | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def final_url(self) -> str:
        return self.url or self.request.url


@dataclass(frozen=True, slots=True)
class Item:
    """One parsed record: its fields plus the request it came from."""

    fields: Mapping[str, Any]
    url: str
    key: str
    scraped_at: float = 0.0


@dataclass(frozen=True, slots=True)
class Job:
    """A request held by a queue; ``id`` is what the queue needs to ack, retry or bury it."""

    id: str
    request: Request
