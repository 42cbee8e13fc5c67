"""The fetchers against the real local site: anticipated failures come back as data."""

from __future__ import annotations

import json
import socket
import time
from email.utils import formatdate

import pytest

from scrapekit import Request
from scrapekit.demo.site import DemoSite
from scrapekit.fetchers import ERROR_KINDS, STATUS_ERRORS, HeadFetcher, HttpFetcher, retry_after, status_error


@pytest.fixture
def fetcher() -> HttpFetcher:
    return HttpFetcher(concurrency=4, timeout=2.0, max_bytes=100_000)


def test_a_page_with_status_headers_and_body(site: DemoSite, fetcher: HttpFetcher) -> None:
    r = fetcher.fetch(Request(f"{site.url}/catalogue/page-2.html"))
    assert (r.status, r.reason, r.error, r.truncated) == (200, "OK", None, False)
    assert r.headers["content-type"].startswith("text/html") and r.body.count(b'class="book"') == 20
    assert r.url == f"{site.url}/catalogue/page-2.html" and r.elapsed > 0


def test_user_agent_and_headers_reach_the_server(site: DemoSite) -> None:
    fetcher = HttpFetcher(user_agent="sk-test/1", headers={"X-Trace": "abc"})
    sent = json.loads(fetcher.fetch(Request(f"{site.url}/echo-headers")).body)
    assert sent["User-Agent"] == "sk-test/1" and sent["X-Trace"] == "abc"


def test_keep_alive_reuses_one_connection(site: DemoSite, fetcher: HttpFetcher) -> None:
    for n in range(5):
        assert fetcher.fetch(Request(f"{site.url}/page/{n}")).status == 200
    assert len({port for *_, port in site.requests_log}) == 1


def test_huge_body_is_cut_at_max_bytes_and_flagged(site: DemoSite, fetcher: HttpFetcher) -> None:
    r = fetcher.fetch(Request(f"{site.url}/huge?bytes=50000000"))
    assert r.status == 200 and r.error is None and r.truncated and len(r.body) == 100_000


def test_gzip_bomb_stops_at_the_cap_of_decompressed_bytes(site: DemoSite, fetcher: HttpFetcher) -> None:
    r = fetcher.fetch(Request(f"{site.url}/gzip-bomb"))
    assert r.truncated and len(r.body) == 100_000 and r.body == bytes(100_000)


@pytest.mark.parametrize(("path", "status", "error"), [
    ("/status/404", 404, "not_found"), ("/status/500", 500, "server_error"), ("/status/418", 418, "client_error"),
    ("/status/599", 599, "server_error"), ("/redirect-loop/0", 302, "too_many_redirects"),
])
def test_bad_statuses_are_error_kinds(site: DemoSite, fetcher: HttpFetcher, path: str, status: int, error: str) -> None:
    r = fetcher.fetch(Request(site.url + path))
    assert (r.status, r.error) == (status, error) or (error == "too_many_redirects" and r.error == error)


def test_retry_after_in_seconds_and_as_a_date(site: DemoSite, fetcher: HttpFetcher) -> None:
    r = fetcher.fetch(Request(f"{site.url}/status/503?retry_after=7"))
    assert (r.status, r.error, r.retry_after) == (503, "unavailable", 7.0)
    assert retry_after(formatdate(time.time() + 60, usegmt=True), time.time()) == pytest.approx(60, abs=2)
    assert retry_after("soon", time.time()) is None


def test_timeout(site: DemoSite) -> None:
    r = HttpFetcher(timeout=0.2).fetch(Request(f"{site.url}/slow?seconds=2"))
    assert (r.status, r.error) == (0, "timeout") and "\n" not in r.reason


def test_refused_connection() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: connections are refused
        r = HttpFetcher(timeout=2.0).fetch(Request(f"http://127.0.0.1:{port}/"))
    assert (r.status, r.error) == (0, "refused")


@pytest.mark.parametrize("url", ["ftp://example.invalid/x", "not a url", "http:///nohost", "http://a.test/\nx"])
def test_bad_urls_are_refused_before_any_traffic(url: str) -> None:
    r = HttpFetcher().fetch(Request(url, key="k"))
    assert (r.status, r.error) == (0, "bad_url")


def test_wrong_charset_body_is_kept_as_raw_bytes(site: DemoSite, fetcher: HttpFetcher) -> None:
    r = fetcher.fetch(Request(f"{site.url}/bad-encoding"))
    assert r.status == 200 and b"caf\xe9" in r.body


def test_head_keeps_location_and_counts_3xx_as_success(site: DemoSite) -> None:
    r = HeadFetcher().fetch(Request(f"{site.url}/head-redirect", kind="head"))
    assert (r.status, r.error, r.body) == (301, None, b"")
    assert r.headers["location"].endswith("/page/1")
    assert site.hits["/page/1"] == 0 and site.requests_log[-1][0] == "HEAD"


def test_the_tables_cover_every_kind() -> None:
    assert all(status_error(code) == kind for code, kind in STATUS_ERRORS.items())
    assert status_error(200) is None and status_error(399) is None
    assert {"timeout", "refused", "dns", "bad_url", "too_many_redirects", "broken_body"} <= ERROR_KINDS


def test_site_refuses_a_non_loopback_host() -> None:
    with pytest.raises(ValueError, match="loopback only"):
        DemoSite("0.0.0.0")


def test_site_counts_hits_and_serves_the_catalogue(site: DemoSite, fetcher: HttpFetcher) -> None:
    fetcher.fetch(Request(f"{site.url}/catalogue/page-1.html"))
    assert fetcher.fetch(Request(f"{site.url}/catalogue/page-51.html")).status == 404
    assert fetcher.fetch(Request(f"{site.url}/book/1001.html")).status == 404
    assert json.loads(fetcher.fetch(Request(f"{site.url}/__hits")).body)["/catalogue/page-1.html"] == 1
