"""Fetchers: ``http`` (GET, redirects followed) and ``head`` (HEAD, Location kept), each on one pooled
requests.Session, and the tables that turn statuses and requests/urllib3 exceptions into error kinds."""

from __future__ import annotations

import email.utils
import time
from collections.abc import Callable, Iterator
from datetime import timezone
from typing import Protocol, Self

import requests
import requests.adapters
import urllib3.exceptions

from .model import BadUrl, Request, Response, canonical_url
from .units import Bytes, Seconds


class Fetcher(Protocol):
    """Turns a Request into a Response; the runner calls ``fetch`` from many threads at once.

    The runner may rely on: ``fetch`` never raises for an anticipated failure (timeout, refused
    connection, DNS, bad URL, redirect loop, broken body, status >= 400). It returns a Response whose
    ``error`` is one of ERROR_KINDS (None on success) and whose ``status`` is the last HTTP status
    seen, 0 when none was. A body cut at the size cap is not an error: ``truncated`` says so.
    Anything it does raise is a bug, caught by the runner at the part boundary. After ``close``
    no fetch is made.
    """

    def fetch(self, request: Request) -> Response: ...

    def close(self) -> None: ...


STATUS_ERRORS: dict[int, str] = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    410: "gone",
    429: "rate_limited",
    500: "server_error",
    502: "bad_gateway",
    503: "unavailable",
    504: "gateway_timeout",
}
"""HTTP status -> error kind; a status not listed falls back to its class in STATUS_CLASS_ERRORS."""

STATUS_CLASS_ERRORS: dict[int, str] = {4: "client_error", 5: "server_error"}
"""Status // 100 -> error kind for statuses STATUS_ERRORS does not list; below 400 is success."""

EXCEPTION_ERRORS: tuple[tuple[type[BaseException], str], ...] = (
    (requests.exceptions.TooManyRedirects, "too_many_redirects"),
    (urllib3.exceptions.NameResolutionError, "dns"),
    (requests.exceptions.SSLError, "ssl"),
    (requests.exceptions.Timeout, "timeout"),
    (urllib3.exceptions.ReadTimeoutError, "timeout"),  # mid-body, requests wraps it in a ConnectionError
    (requests.exceptions.ChunkedEncodingError, "broken_body"),
    (requests.exceptions.ContentDecodingError, "broken_body"),
    (requests.exceptions.ConnectionError, "refused"),  # before a response: refused, reset, hung up
    (urllib3.exceptions.ProtocolError, "broken_body"),
    (requests.exceptions.InvalidURL, "bad_url"),
    (requests.exceptions.MissingSchema, "bad_url"),
    (requests.exceptions.InvalidSchema, "bad_url"),
    (BadUrl, "bad_url"),
)
"""Exception -> error kind. The first row matching the exception or any exception it wraps wins,
so the specific rows come first: a ConnectionError wrapping a NameResolutionError is ``dns``."""

ERROR_KINDS: frozenset[str] = (
    frozenset(STATUS_ERRORS.values()) | frozenset(STATUS_CLASS_ERRORS.values())
    | frozenset(kind for _, kind in EXCEPTION_ERRORS)
)
"""Every error kind a fetcher in this module can put on a Response."""

_LIBRARY_ERRORS = (requests.exceptions.RequestException, urllib3.exceptions.HTTPError)
_CHUNK = 16384  # decompressed bytes per read: a gzip bomb inflates at most this much past the cap
_MAX_WRAPPED = 4  # requests -> MaxRetryError -> urllib3 cause is as deep as it gets
_MAX_REASON = 200


def status_error(status: int) -> str | None:
    """The error kind of an HTTP status; None for a status below 400."""
    if status < 400:
        return None
    # statuses past 599 are nonstandard; they count as server errors rather than successes
    return STATUS_ERRORS.get(status) or STATUS_CLASS_ERRORS[min(status // 100, 5)]


def exception_error(exc: BaseException) -> str | None:
    """The error kind of an exception from requests or urllib3, None if it is not an anticipated one."""
    chain = tuple(_wrapped(exc))
    for cls, kind in EXCEPTION_ERRORS:
        if any(isinstance(link, cls) for link in chain):
            return kind
    return None


def retry_after(value: str | None, now: float) -> float | None:
    """Seconds to wait from a Retry-After value: delay seconds (``120``) or an HTTP date counted
    from ``now`` (a date in the past is 0); None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)  # HTTP dates are GMT; a "-0000" zone parses naive
    return max(0.0, when.timestamp() - now)


def _wrapped(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and the exceptions inside it: requests puts its cause in ``args[0]``, urllib3's
    MaxRetryError in ``reason``."""
    link: BaseException | None = exc
    for _ in range(_MAX_WRAPPED):
        if link is None:
            return
        yield link
        if isinstance(link, urllib3.exceptions.MaxRetryError):
            link = link.reason
        elif link.args and isinstance(link.args[0], BaseException):
            link = link.args[0]
        else:
            link = None


def _one_line(exc: BaseException) -> str:
    """The innermost cause as one short line: safe to log, no traceback."""
    *_, inner = _wrapped(exc)
    return " ".join(f"{type(inner).__name__}: {inner}".split())[:_MAX_REASON]


def _read_capped(response: requests.Response, cap: int) -> tuple[bytes, bool]:
    """The body up to ``cap`` decompressed bytes, and whether more was left unread."""
    body = bytearray()
    for chunk in response.iter_content(_CHUNK):
        body += chunk
        if len(body) > cap:
            return bytes(body[:cap]), True
    return bytes(body), False


class HttpFetcher:
    """GET with keep-alive on one session whose connection pool is sized to ``concurrency``.

    Redirects are followed up to ``max_redirects`` hops. Bodies are streamed and cut at ``max_bytes``
    decompressed bytes (``truncated`` set, the connection dropped rather than drained). A status
    >= 400 keeps its body and gets an error kind from STATUS_ERRORS. ``clock`` stamps ``fetched_at``
    and is the "now" a Retry-After date counts from.
    """

    _method = "GET"
    _follow_redirects = True

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
        self.user_agent = user_agent
        self.clock = clock
        self._session = requests.Session()
        self._session.trust_env = False  # no proxies or netrc from the environment behind the recipe's back
        self._session.max_redirects = max_redirects
        adapter = requests.adapters.HTTPAdapter(pool_connections=concurrency, pool_maxsize=concurrency)
        self._session.mount("http://", adapter)
        self._session.mount("https://", adapter)
        self._session.headers["User-Agent"] = user_agent
        self._session.headers.update(headers or {})

    def fetch(self, request: Request) -> Response:
        """The response to ``request``; see Fetcher for what fails as data."""
        started = time.perf_counter()
        try:
            canonical_url(request.url)
        except BadUrl as exc:  # refused before any traffic
            return Response(request, 0, reason=_one_line(exc), url=request.url, fetched_at=self.clock(),
                            error="bad_url")
        status, reason, headers, url = 0, "", {}, request.url
        try:
            with self._session.request(self._method, request.url, stream=True, timeout=self.timeout,
                                       allow_redirects=self._follow_redirects) as r:
                status, reason, url = r.status_code, r.reason or "", r.url
                headers = {name.lower(): value for name, value in r.headers.items()}
                body, truncated = _read_capped(r, self.max_bytes)
        except _LIBRARY_ERRORS as exc:
            kind = exception_error(exc)
            if kind is None:
                raise
            last = exc.response if isinstance(exc, requests.exceptions.RequestException) else None
            if last is not None and not status:  # e.g. the last hop of a redirect loop
                status, url = last.status_code, last.url
            return Response(request, status, reason=_one_line(exc), headers=headers, url=url,
                            fetched_at=self.clock(), elapsed=time.perf_counter() - started, error=kind)
        now = self.clock()
        return Response(request, status, reason=reason, headers=headers, body=body, truncated=truncated,
                        url=url, fetched_at=now, elapsed=time.perf_counter() - started,
                        error=status_error(status), retry_after=retry_after(headers.get("retry-after"), now))

    def close(self) -> None:
        """Close the pooled connections."""
        self._session.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class HeadFetcher(HttpFetcher):
    """HEAD without following redirects: a 3xx is a success and ``headers["location"]`` says where
    it points. The body is always empty. Options as for HttpFetcher."""

    _method = "HEAD"
    _follow_redirects = False
