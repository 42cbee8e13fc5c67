"""Fetchers: ``http`` (GET, redirects followed) and ``head`` (HEAD, Location kept), on one pooled
requests.Session. Anticipated failures come back as a Response with an error kind, never raised."""

from __future__ import annotations

import email.utils
import time
from collections.abc import Callable
from typing import Protocol

import requests
import requests.adapters
import urllib3.exceptions

from .model import BadUrl, Request, Response, canonical_url
from .units import Bytes, Seconds


class Fetcher(Protocol):
    """``fetch(request)`` gives a Response; called from many threads at once.

    It never raises for anticipated failures (timeouts, refused connections, bad status, too
    large): the Response carries the error kind and the last status seen (0 when none).
    """

    def fetch(self, request: Request) -> Response: ...

    def close(self) -> None: ...


STATUS_ERRORS: dict[int, str] = {
    400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found", 410: "gone",
    429: "rate_limited", 500: "server_error", 502: "bad_gateway", 503: "unavailable", 504: "gateway_timeout",
}
"""HTTP status -> error kind; other 4xx are client_error, other 5xx server_error."""

EXCEPTION_ERRORS: tuple[tuple[type[BaseException], str], ...] = (
    (requests.exceptions.TooManyRedirects, "too_many_redirects"),
    (requests.exceptions.SSLError, "ssl"),
    (requests.exceptions.ProxyError, "proxy"),
    (requests.exceptions.Timeout, "timeout"),
    (urllib3.exceptions.TimeoutError, "timeout"),
    (urllib3.exceptions.NameResolutionError, "dns"),
    (requests.exceptions.ChunkedEncodingError, "broken_body"),
    (requests.exceptions.ContentDecodingError, "broken_body"),
    (urllib3.exceptions.ProtocolError, "broken_body"),
    (urllib3.exceptions.DecodeError, "broken_body"),
    (requests.exceptions.ConnectionError, "refused"),
    (requests.exceptions.InvalidURL, "bad_url"),
    (requests.exceptions.MissingSchema, "bad_url"),
    (requests.exceptions.InvalidSchema, "bad_url"),
    (requests.exceptions.InvalidHeader, "bad_header"),
    (BadUrl, "bad_url"),
)
"""Exception -> error kind, first match wins (subclasses before their bases)."""

ERROR_KINDS = frozenset(STATUS_ERRORS.values()) | {kind for _, kind in EXCEPTION_ERRORS} | {"client_error"}

_CHUNK = 16384  # decompressed bytes per read: a gzip bomb inflates at most this much past the cap


def status_error(status: int) -> str | None:
    if status < 400:
        return None
    return STATUS_ERRORS.get(status) or ("client_error" if status < 500 else "server_error")


def exception_error(exc: BaseException) -> str:
    for cls, kind in EXCEPTION_ERRORS:
        if isinstance(exc, cls):
            if kind == "refused" and "NameResolution" in repr(exc):
                return "dns"
            return kind
    return "broken_body" if isinstance(exc, OSError) else "refused"


def retry_after(value: str | None, now: float) -> float | None:
    """Seconds from a Retry-After header: delta seconds or an HTTP date."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - now)


def _one_line(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text.replace("\n", " ").replace("\r", " ")[:300]


class HttpFetcher:
    """GET with keep-alive and a connection pool sized to ``concurrency``; bodies streamed and
    cut at ``max_bytes`` (decompressed), flagged ``truncated``; at most ``max_redirects`` hops."""

    method = "GET"
    follow_redirects = True

    def __init__(
        self,
        concurrency: int = 16,
        timeout: Seconds = Seconds(30.0),
        max_bytes: Bytes = Bytes(200_000),
        user_agent: str = "scrapekit/0.1 (+https://example.org/bot)",
        headers: dict[str, str] | None = None,
        max_redirects: int = 10,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.timeout = timeout
        self.max_bytes = max_bytes
        self.clock = clock
        self.session = requests.Session()
        self.session.trust_env = False  # no proxies or netrc from the environment behind the recipe's back
        self.session.max_redirects = max_redirects
        adapter = requests.adapters.HTTPAdapter(pool_connections=concurrency, pool_maxsize=concurrency)
        self.session.mount("http://", adapter)
        self.session.mount("https://", adapter)
        self.session.headers["User-Agent"] = user_agent
        self.session.headers.update(headers or {})

    def fetch(self, request: Request) -> Response:
        started = time.monotonic()
        status, reason, headers, url = 0, "", {}, request.url
        body = b""
        truncated = False
        try:
            canonical_url(request.url)
            with self.session.request(self.method, request.url, stream=True, timeout=self.timeout,
                                      allow_redirects=self.follow_redirects) as r:
                status, reason, url = r.status_code, r.reason or "", r.url
                headers = {k.lower(): v for k, v in r.headers.items()}
                if self.method != "HEAD":
                    body, truncated = self._read(r)
        except Exception as exc:  # translated to data; the table decides which kinds exist
            if not isinstance(exc, (requests.exceptions.RequestException, urllib3.exceptions.HTTPError,
                                    BadUrl, OSError)):
                raise
            return Response(request, status, _one_line(exc), headers, body, truncated, url, self.clock(),
                            time.monotonic() - started, exception_error(exc))
        now = self.clock()
        error = self._status_error(status)
        return Response(request, status, reason, headers, body, truncated, url, now,
                        time.monotonic() - started, error, retry_after(headers.get("retry-after"), now))

    def _status_error(self, status: int) -> str | None:
        return status_error(status)

    def _read(self, r: requests.Response) -> tuple[bytes, bool]:
        cap = self.max_bytes
        chunks: list[bytes] = []
        size = 0
        for chunk in r.iter_content(_CHUNK):
            chunks.append(chunk)
            size += len(chunk)
            if size > cap:
                return b"".join(chunks)[:cap], True  # leaving the with-block drops the connection
        return b"".join(chunks), False

    def close(self) -> None:
        self.session.close()


class HeadFetcher(HttpFetcher):
    """HEAD without following redirects: a 3xx is a success and its Location header is kept."""

    method = "HEAD"
    follow_redirects = False
