"""The values that flow between parts: Request, Response, Item and Job.

Small frozen dataclasses with one-JSON-line (de)serialisation; follow-ups are made with
``dataclasses.replace``.
"""

from __future__ import annotations

import json
import re
import string
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urljoin, urlsplit, urlunsplit

KINDS = ("page", "resource", "timeline", "feed", "head")
DEFAULT_PRIORITY = 1024


class BadUrl(ValueError):
    """A URL scrapekit will not fetch (not http(s), no host, unparseable)."""


SESSION_PARAMS = frozenset({"jsessionid", "phpsessid", "sid", "sessionid", "aspsessionid", "cfid", "cftoken"})
"""Query keys (any case) that name a session, not a page: dropped from canonical URLs."""

_DEFAULT_PORTS = {"http": 80, "https": 443}
_PATH_PARAMS = re.compile(r";(?:jsessionid|phpsessid|sessionid)=[^/?#]*", re.IGNORECASE)
_SAFE_PATH = "/:@!$&'()*+,;=-._~%"
_SAFE_QUERY = "/:@!$'()*+,;-._~%?"
_BAD_CHARS = re.compile(r"[\x00-\x20\x7f]")
_ESCAPE = re.compile(r"%([0-9A-Fa-f]{2})")
_UNRESERVED = frozenset(string.ascii_letters + string.digits + "-._~")


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


def canonical_url(url: str, base: str | None = None) -> str:
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
