"""The fetchers against the real local site: anticipated failures come back as data."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from email.utils import formatdate
from urllib.parse import quote

import pytest
import requests
import urllib3.exceptions

from scrapekit import BadUrl, Bytes, Request, Seconds
from scrapekit.demo.site import DemoSite
from scrapekit.fetchers import (
    ERROR_KINDS,
    EXCEPTION_ERRORS,
    STATUS_ERRORS,
    HeadFetcher,
    HttpFetcher,
    exception_error,
    retry_after,
    status_error,
)

from .conftest import FakeClock

CAP = 100_000


@pytest.fixture
def fetcher(clock: FakeClock) -> Iterator[HttpFetcher]:
    with HttpFetcher(allow_private=True, concurrency=4, timeout=Seconds(2.0), max_bytes=Bytes(CAP), clock=clock) as f:
        yield f


def test_a_page_with_status_headers_and_body(site: DemoSite, fetcher: HttpFetcher, clock: FakeClock) -> None:
    r = fetcher.fetch(Request(f"{site.url}/catalogue/page-2.html"))
    assert (r.status, r.reason, r.error, r.truncated, r.retry_after) == (200, "OK", None, False, None)
    assert r.headers["content-type"].startswith("text/html") and r.body.count(b'class="book"') == 20
    assert int(r.headers["content-length"]) == len(r.body)
    assert r.url == f"{site.url}/catalogue/page-2.html" and r.elapsed > 0 and r.fetched_at == clock.now


def test_user_agent_and_headers_reach_the_server(site: DemoSite) -> None:
    with HttpFetcher(allow_private=True, user_agent="sk-test/1", headers={"X-Trace": "abc"}) as fetcher:
        sent = json.loads(fetcher.fetch(Request(f"{site.url}/echo-headers")).body)
    assert sent["User-Agent"] == "sk-test/1" and sent["X-Trace"] == "abc"


def test_keep_alive_reuses_one_connection(site: DemoSite, fetcher: HttpFetcher) -> None:
    for n in range(5):
        assert fetcher.fetch(Request(f"{site.url}/page/{n}")).status == 200
    assert len({port for *_, port in site.requests_log}) == 1


def test_many_threads_share_one_fetcher(site: DemoSite, fetcher: HttpFetcher) -> None:
    with ThreadPoolExecutor(16) as pool:
        responses = list(pool.map(fetcher.fetch, [Request(f"{site.url}/page/{n}") for n in range(200)]))
    assert all(r.status == 200 and f"<title>Page {n}</title>".encode() in r.body for n, r in enumerate(responses))
    assert sum(site.hits_snapshot().values()) == 200


def test_huge_body_is_cut_at_max_bytes_and_flagged(site: DemoSite, fetcher: HttpFetcher) -> None:
    r = fetcher.fetch(Request(f"{site.url}/huge?bytes=50000000"))
    assert (r.status, r.error, r.truncated) == (200, None, True) and r.body == b"x" * CAP


def test_a_body_of_exactly_max_bytes_is_not_truncated(site: DemoSite, fetcher: HttpFetcher) -> None:
    r = fetcher.fetch(Request(f"{site.url}/huge?bytes={CAP}"))
    assert (r.status, r.truncated, len(r.body)) == (200, False, CAP)


def test_gzip_bomb_stops_at_the_cap_of_decompressed_bytes(site: DemoSite, fetcher: HttpFetcher) -> None:
    r = fetcher.fetch(Request(f"{site.url}/gzip-bomb"))
    assert (r.status, r.error, r.truncated) == (200, None, True) and r.body == bytes(CAP)


def test_the_connection_is_dropped_after_a_cut_and_the_next_fetch_still_works(
        site: DemoSite, fetcher: HttpFetcher) -> None:
    assert fetcher.fetch(Request(f"{site.url}/huge?bytes=50000000")).truncated
    assert fetcher.fetch(Request(f"{site.url}/page/1")).status == 200
    ports = [port for *_, port in site.requests_log]
    assert ports[0] != ports[1]


@pytest.mark.parametrize(("status", "kind"), sorted(STATUS_ERRORS.items()))
def test_each_error_status_is_its_kind_with_its_body(site: DemoSite, fetcher: HttpFetcher, status: int, kind: str) -> None:
    r = fetcher.fetch(Request(f"{site.url}/status/{status}"))
    assert (r.status, r.error, r.body) == (status, kind, f"status {status}\n".encode())


@pytest.mark.parametrize(("status", "kind"), [(418, "client_error"), (451, "client_error"), (599, "server_error")])
def test_unlisted_statuses_fall_back_to_their_class(site: DemoSite, fetcher: HttpFetcher, status: int, kind: str) -> None:
    assert fetcher.fetch(Request(f"{site.url}/status/{status}")).error == kind


def test_a_redirect_is_followed_to_its_final_url(site: DemoSite, fetcher: HttpFetcher) -> None:
    r = fetcher.fetch(Request(f"{site.url}/redirect?to=/page/3"))
    assert (r.status, r.error, r.url) == (200, None, f"{site.url}/page/3")


def test_a_redirect_loop_stops_at_max_redirects(site: DemoSite) -> None:
    with HttpFetcher(allow_private=True, max_redirects=3) as fetcher:
        r = fetcher.fetch(Request(f"{site.url}/redirect-loop/0"))
    assert (r.status, r.error) == (302, "too_many_redirects")
    assert sum(n for path, n in site.hits.items() if path.startswith("/redirect-loop/")) == 4


def test_retry_after_in_seconds(site: DemoSite, fetcher: HttpFetcher) -> None:
    r = fetcher.fetch(Request(f"{site.url}/status/503?retry_after=7"))
    assert (r.status, r.error, r.retry_after) == (503, "unavailable", 7.0)


def test_retry_after_as_an_http_date_counts_from_the_clock(site: DemoSite, fetcher: HttpFetcher, clock: FakeClock) -> None:
    when = quote(formatdate(clock.now + 120, usegmt=True))
    r = fetcher.fetch(Request(f"{site.url}/status/429?retry_after={when}"))
    assert (r.status, r.error, r.retry_after) == (429, "rate_limited", 120.0)


@pytest.mark.parametrize(("value", "seconds"), [
    ("7", 7.0), (" 30 ", 30.0), ("Fri, 15 Jan 2027 07:59:00 GMT", 0.0), ("Fri, 15 Jan 2027 08:02:00 -0000", 120.0),
    ("soon", None), ("", None), (None, None), ("-5", None), ("٣", None),
])
def test_retry_after_values(value: str | None, seconds: float | None) -> None:
    now = 1_800_000_000.0  # 2027-01-15 08:00:00 UTC
    assert retry_after(value, now) == seconds


def test_timeout(site: DemoSite) -> None:
    with HttpFetcher(allow_private=True, timeout=Seconds(0.2)) as fetcher:
        r = fetcher.fetch(Request(f"{site.url}/slow?seconds=2"))
    assert (r.status, r.error) == (0, "timeout") and "\n" not in r.reason and r.elapsed < 2


def test_refused_connection() -> None:
    with socket.socket() as s, HttpFetcher(allow_private=True, timeout=Seconds(2.0)) as fetcher:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: connections are refused
        r = fetcher.fetch(Request(f"http://127.0.0.1:{port}/"))
    assert (r.status, r.error) == (0, "refused") and "Connection refused" in r.reason


def test_a_body_cut_short_by_the_server_is_broken_body() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server, HttpFetcher(allow_private=True, timeout=Seconds(2.0)) as fetcher:
        def lie_about_the_length() -> None:
            conn, _ = server.accept()
            with conn:
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\nonly ten b")

        threading.Thread(target=lie_about_the_length, daemon=True).start()
        r = fetcher.fetch(Request(f"http://127.0.0.1:{server.getsockname()[1]}/"))
    assert (r.status, r.error, r.body) == (200, "broken_body", b"")


@pytest.mark.parametrize("url", ["ftp://{host}/x", "not a url", "http:///nohost", "http://{host}/\nx", "http://{host}:99999/"])
def test_bad_urls_are_refused_before_any_traffic(site: DemoSite, fetcher: HttpFetcher, url: str) -> None:
    r = fetcher.fetch(Request(url.format(host=f"127.0.0.1:{site.port}"), key="k"))
    assert (r.status, r.error) == (0, "bad_url") and r.reason and site.requests_log == []


def test_a_redirect_to_a_non_http_url_is_bad_url(site: DemoSite, fetcher: HttpFetcher) -> None:
    assert fetcher.fetch(Request(f"{site.url}/redirect?to=ftp://example.invalid/")).error == "bad_url"


def test_wrong_charset_body_is_kept_as_raw_bytes(site: DemoSite, fetcher: HttpFetcher) -> None:
    r = fetcher.fetch(Request(f"{site.url}/bad-encoding"))
    assert (r.status, r.error) == (200, None) and b"caf\xe9" in r.body


def test_head_keeps_location_and_counts_3xx_as_success(site: DemoSite) -> None:
    with HeadFetcher(allow_private=True) as fetcher:
        r = fetcher.fetch(Request(f"{site.url}/head-redirect", kind="head"))
    assert (r.status, r.error, r.body) == (301, None, b"")
    assert r.headers["location"].endswith("/page/1")
    assert site.hits["/page/1"] == 0 and site.requests_log[-1][0] == "HEAD"


def test_head_errors_and_successes(site: DemoSite) -> None:
    with HeadFetcher(allow_private=True) as fetcher:
        ok = fetcher.fetch(Request(f"{site.url}/page/1"))
        missing = fetcher.fetch(Request(f"{site.url}/status/404"))
    assert (ok.status, ok.error, ok.body, int(ok.headers["content-length"]) > 0) == (200, None, b"", True)
    assert (missing.status, missing.error) == (404, "not_found")


def test_exception_table_looks_inside_wrapped_causes() -> None:
    pool = urllib3.HTTPConnectionPool("a.test")
    conn = urllib3.connection.HTTPConnection("a.test")
    dns = urllib3.exceptions.NameResolutionError("a.test", conn, socket.gaierror(-2, "Name or service not known"))
    refused = urllib3.exceptions.NewConnectionError(conn, "Connection refused")
    assert exception_error(requests.exceptions.ConnectionError(urllib3.exceptions.MaxRetryError(pool, "/", dns))) == "dns"
    assert exception_error(requests.exceptions.ConnectionError(urllib3.exceptions.MaxRetryError(pool, "/", refused))) == "refused"
    read_timeout = urllib3.exceptions.ReadTimeoutError(pool, "/", "Read timed out.")
    assert exception_error(requests.exceptions.ConnectionError(read_timeout)) == "timeout"
    assert exception_error(requests.exceptions.ChunkedEncodingError(urllib3.exceptions.ProtocolError("x"))) == "broken_body"
    assert exception_error(requests.exceptions.ContentDecodingError("x")) == "broken_body"
    assert exception_error(requests.exceptions.SSLError("x")) == "ssl"
    assert exception_error(BadUrl("x")) == "bad_url"
    assert exception_error(requests.exceptions.InvalidHeader("x")) is None


def test_the_tables_cover_every_kind() -> None:
    assert all(status_error(code) == kind for code, kind in STATUS_ERRORS.items())
    assert status_error(200) is None and status_error(399) is None and status_error(600) == "server_error"
    assert ERROR_KINDS == set(STATUS_ERRORS.values()) | {"client_error", "server_error"} | {k for _, k in EXCEPTION_ERRORS}
    assert {"timeout", "refused", "dns", "bad_url", "too_many_redirects", "ssl", "broken_body"} <= ERROR_KINDS
    assert "truncated" not in ERROR_KINDS
