"""Fetchers: ``http`` (GET, redirects followed) and ``head`` (HEAD, Location kept), each on one pooled
requests.Session, and the tables that turn statuses and requests/urllib3 exceptions into error kinds."""

from __future__ import annotations

import email.utils
import ipaddress
import itertools
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timezone
from typing import Protocol, Self
from urllib.parse import urlsplit

import requests
import requests.adapters
import urllib3
import urllib3.connection
import urllib3.exceptions

from .model import BadUrl, Request, Response, canonical_url, loggable
from .units import Bytes, Seconds

log = logging.getLogger(__name__)


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

class PrivateAddress(Exception):
    """The host resolved to a private, loopback, link-local or otherwise non-public address
    and the recipe does not set ``politeness.allow_private``. Deliberately not an OSError, so
    urllib3 neither retries it nor tries the host's next address."""


EXCEPTION_ERRORS: tuple[tuple[type[BaseException], str], ...] = (
    (PrivateAddress, "private_address"),
    (requests.exceptions.TooManyRedirects, "too_many_redirects"),
    (urllib3.exceptions.NameResolutionError, "dns"),
    (requests.exceptions.SSLError, "ssl"),
    (requests.exceptions.ProxyError, "proxy_error"),
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

_LIBRARY_ERRORS = (requests.exceptions.RequestException, urllib3.exceptions.HTTPError, PrivateAddress)
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
    return loggable(" ".join(f"{type(inner).__name__}: {inner}".split()))[:_MAX_REASON]


def _read_capped(response: requests.Response, cap: int) -> tuple[bytes, bool]:
    """The body up to ``cap`` decompressed bytes, and whether more was left unread."""
    body = bytearray()
    for chunk in response.iter_content(_CHUNK):
        body += chunk
        if len(body) > cap:
            return bytes(body[:cap]), True
    return bytes(body), False


def public_address(address: str) -> bool:
    """Whether an IP address is one a crawler may visit: not private, loopback, link-local,
    shared (CGNAT), multicast, reserved or unspecified; IPv4-mapped IPv6 judged as IPv4."""
    ip = ipaddress.ip_address(address.partition("%")[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


def _check_host(host: str) -> None:
    """Refuse a host that is a non-public IP literal or a localhost name, before any traffic."""
    host = host.strip("[]").rstrip(".").lower()
    if host == "localhost" or host.endswith(".localhost"):
        raise PrivateAddress(f"{host} is a loopback name (politeness.allow_private is false)")
    try:
        public = public_address(host)
    except ValueError:
        return  # a name: judged after resolution, or by the proxy
    if not public:
        raise PrivateAddress(f"{host} is not a public address (politeness.allow_private is false)")


class _PublicOnlyConnection(urllib3.connection.HTTPConnection):
    """Checks the address it actually connected to, after DNS: no rebinding trick gets past it."""

    def _new_conn(self) -> socket.socket:
        sock = super()._new_conn()
        address = sock.getpeername()[0]
        if not public_address(address):
            sock.close()
            raise PrivateAddress(f"{self.host} resolved to {address}, not a public address "
                                 f"(politeness.allow_private is false)")
        return sock


class _PublicOnlyHTTPSConnection(_PublicOnlyConnection, urllib3.connection.HTTPSConnection):
    pass


class _PublicOnlyPool(urllib3.HTTPConnectionPool):
    ConnectionCls = _PublicOnlyConnection


class _PublicOnlyHTTPSPool(urllib3.HTTPSConnectionPool):
    ConnectionCls = _PublicOnlyHTTPSConnection


_PROXY_SLOWDOWN = 1.0  # seconds a proxy rests after its first 429/503 or failure; doubles each time
_PROXY_MAX_REST = 300.0
_PROXY_FAILING_STATUSES = frozenset({429, 503})
_PROXY_FAILING_ERRORS = frozenset({"proxy_error", "refused", "timeout"})


@dataclass
class _Proxy:
    """One proxy's health: it rests until ``resting_until`` after failures, longer each time."""

    url: str
    failures: int = 0
    resting_until: float = 0.0

    @property
    def shown(self) -> str:
        return loggable(self.url)


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
        proxies: list[str] | None = None,
        allow_private: bool = False,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.timeout = timeout
        self.max_bytes = max_bytes
        self.user_agent = user_agent
        self.clock = clock
        self.sleep = sleep
        self.allow_private = allow_private
        self.proxies = [_Proxy(_proxy_url(url)) for url in proxies or []]
        self._slots = itertools.count()
        self._slot = threading.local()
        self._lock = threading.Lock()
        self._session = requests.Session()
        self._session.trust_env = False  # no proxies or netrc from the environment behind the recipe's back
        self._session.max_redirects = max_redirects
        adapter = requests.adapters.HTTPAdapter(pool_connections=concurrency, pool_maxsize=concurrency)
        if not allow_private:  # proxied requests use other pools: there the proxy resolves names
            adapter.poolmanager.pool_classes_by_scheme = {"http": _PublicOnlyPool, "https": _PublicOnlyHTTPSPool}
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
        proxy = self._proxy()
        try:
            if not self.allow_private:
                _check_host(urlsplit(request.url).hostname or "")
            head = request.kind == "head"  # a request of kind head is a HEAD whatever the fetcher
            with self._session.request("HEAD" if head else self._method, request.url, stream=True,
                                       timeout=self.timeout, allow_redirects=self._follow_redirects and not head,
                                       hooks=self._hooks,
                                       proxies=None if proxy is None else {"http": proxy.url, "https": proxy.url}) as r:
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
            if proxy is not None:
                self._proxy_result(proxy, failed=kind in _PROXY_FAILING_ERRORS)
            return Response(request, status, reason=_one_line(exc), headers=headers, url=url,
                            fetched_at=self.clock(), elapsed=time.perf_counter() - started, error=kind)
        if proxy is not None:
            self._proxy_result(proxy, failed=status in _PROXY_FAILING_STATUSES)
        now = self.clock()
        return Response(request, status, reason=reason, headers=headers, body=body, truncated=truncated,
                        url=url, fetched_at=now, elapsed=time.perf_counter() - started,
                        error=status_error(status), retry_after=retry_after(headers.get("retry-after"), now))

    @property
    def _hooks(self) -> dict[str, Callable[..., None]]:
        return {} if self.allow_private else {"response": _check_redirect}

    def _proxy(self) -> _Proxy | None:
        """The proxy of this thread's slot (slots are numbered as threads first fetch), after
        waiting out its rest, if it is resting."""
        if not self.proxies:
            return None
        slot = getattr(self._slot, "index", None)
        if slot is None:
            slot = self._slot.index = next(self._slots)
        proxy = self.proxies[slot % len(self.proxies)]
        wait = proxy.resting_until - self.clock()
        if wait > 0:
            self.sleep(wait)
        return proxy

    def _proxy_result(self, proxy: _Proxy, failed: bool) -> None:
        with self._lock:
            if not failed:
                proxy.failures = 0
                return
            proxy.failures += 1
            rest = min(_PROXY_MAX_REST, _PROXY_SLOWDOWN * 2 ** (proxy.failures - 1))
            proxy.resting_until = max(proxy.resting_until, self.clock() + rest)
        log.info("proxy %s failed %d times in a row: resting it %.0fs", proxy.shown, proxy.failures, rest)

    def close(self) -> None:
        """Close the pooled connections."""
        self._session.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _proxy_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https", "socks5", "socks5h", "socks4", "socks4a") or not parts.hostname:
        raise ValueError(f"proxies: {loggable(url)!r} is not an http, https or socks5h proxy URL")
    return url


def _check_redirect(response: requests.Response, *args: object, **kwargs: object) -> None:
    """A redirect to a literal private address is refused before it is followed (names are
    checked when connected)."""
    if response.is_redirect:
        location = response.headers.get("location", "")
        host = urlsplit(requests.compat.urljoin(response.url, location)).hostname
        if host:
            _check_host(host)


class HeadFetcher(HttpFetcher):
    """HEAD without following redirects: a 3xx is a success and ``headers["location"]`` says where
    it points. The body is always empty. Options as for HttpFetcher."""

    _method = "HEAD"
    _follow_redirects = False
