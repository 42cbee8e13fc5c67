"""The bundled demo site, read with http.client: the bookshop, the hostile routes, HEAD, hits,
loopback only, and the ``python -m scrapekit.demo.site`` entry point."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import struct
import subprocess
import sys
import zlib
from pathlib import Path
from xml.etree import ElementTree

import pytest

from scrapekit.demo.site import BLOG_POSTS, BOOKS, CATALOGUE_PAGES, DemoSite, gzip_bomb

ROOT = Path(__file__).resolve().parent.parent


def get(site: DemoSite, path: str, method: str = "GET",
        headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    """(status, lower-cased headers, raw body) of one request on a fresh connection."""
    conn = http.client.HTTPConnection(site.host, site.port, timeout=5)
    try:
        conn.request(method, path, headers=headers or {})
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


def test_the_index_links_every_catalogue_page(site: DemoSite) -> None:
    status, _, body = get(site, "/")
    links = re.findall(rb'href="(/catalogue/page-\d+\.html)"', body)
    assert status == 200 and links == [f"/catalogue/page-{n}.html".encode() for n in range(1, CATALOGUE_PAGES + 1)]


def test_a_catalogue_page_has_twenty_books_and_a_next_link(site: DemoSite) -> None:
    status, headers, body = get(site, "/catalogue/page-3.html")
    books = re.findall(rb'<article class="book"><h2><a href="/book/(\d+)\.html">[^<]+</a></h2>'
                       rb'<p class="price">\xc2\xa3\d+\.\d\d</p><p class="author">[^<]+</p></article>', body)
    assert status == 200 and headers["content-type"] == "text/html; charset=utf-8"
    assert [int(b) for b in books] == list(range(41, 61))
    assert b'<a class="next" href="/catalogue/page-4.html">' in body


def test_the_last_catalogue_page_has_no_next_link(site: DemoSite) -> None:
    status, _, body = get(site, f"/catalogue/page-{CATALOGUE_PAGES}.html")
    assert status == 200 and body.count(b'class="book"') == 20 and b'class="next"' not in body
    assert f'href="/book/{BOOKS}.html"'.encode() in body


@pytest.mark.parametrize("path", ["/catalogue/page-0.html", f"/catalogue/page-{CATALOGUE_PAGES + 1}.html",
                                  "/catalogue/page-x.html", "/catalogue/page-1.htm", "/catalogue/page-1.html/x",
                                  "/catalogue/", "/book/0.html", f"/book/{BOOKS + 1}.html", "/book/1", "/nowhere"])
def test_outside_the_shop_is_404(site: DemoSite, path: str) -> None:
    assert get(site, path)[0] == 404


def test_a_book_page_matches_its_catalogue_entry(site: DemoSite) -> None:
    _, _, catalogue = get(site, "/catalogue/page-2.html")
    _, _, book = get(site, "/book/25.html")
    title = re.search(rb'href="/book/25.html">([^<]+)<', catalogue)
    price = re.search(rb'/book/25.html">[^<]+</a></h2><p class="price">([^<]+)<', catalogue)
    assert title and price
    assert b"<h1>" + title.group(1) + b"</h1>" in book and b'<p class="price">' + price.group(1) in book
    assert b'<p class="description">' in book and b'href="/catalogue/page-2.html"' in book


def test_the_shop_is_deterministic(site: DemoSite) -> None:
    assert get(site, "/catalogue/page-7.html")[2] == get(site, "/catalogue/page-7.html")[2]
    with DemoSite() as other:
        assert get(other, "/book/123.html")[2] == get(site, "/book/123.html")[2]


@pytest.mark.parametrize("n", [0, 7, -3, 10**12])
def test_numbered_pages_are_small_and_link_to_five_others(site: DemoSite, n: int) -> None:
    status, _, body = get(site, f"/page/{n}")
    links = {int(m) for m in re.findall(rb'href="/page/(-?\d+)"', body)}
    assert status == 200 and f"<title>Page {n}</title>".encode() in body
    assert len(links) == 5 and n not in links and 1500 < len(body) < 4000


def test_robots_allows_everything(site: DemoSite) -> None:
    assert get(site, "/robots.txt")[::2] == (200, b"User-agent: *\nDisallow:\n")


@pytest.mark.parametrize("path", ["/", "/catalogue/page-1.html", "/catalogue/page-99.html", "/book/5.html",
                                  "/page/3", "/huge?bytes=10000000", "/gzip-bomb", "/redirect-loop/1",
                                  "/head-redirect", "/status/503?retry_after=7", "/status/204", "/bad-encoding",
                                  "/slow?seconds=0", "/nowhere"])
def test_head_answers_every_route_like_get_without_a_body(site: DemoSite, path: str) -> None:
    get_status, get_headers, _ = get(site, path)
    head_status, head_headers, head_body = get(site, path, "HEAD")
    assert (head_status, head_body) == (get_status, b"")
    assert {k: v for k, v in head_headers.items() if k != "date"} == \
           {k: v for k, v in get_headers.items() if k != "date"}


def test_huge_streams_exactly_the_bytes_asked_for(site: DemoSite) -> None:
    status, headers, body = get(site, "/huge?bytes=200001")
    assert (status, headers["content-length"], body) == (200, "200001", b"x" * 200_001)


def test_the_gzip_bomb_is_small_on_the_wire_and_a_gibibyte_inflated(site: DemoSite) -> None:
    status, headers, body = get(site, "/gzip-bomb")
    assert (status, headers["content-encoding"], body) == (200, "gzip", gzip_bomb())
    assert len(body) < 1_100_000 and struct.unpack("<I", body[-4:])[0] == (1 << 30) % (1 << 32)
    inflater = zlib.decompressobj(zlib.MAX_WBITS | 16)
    assert inflater.decompress(body[:65536], 1 << 20) == bytes(1 << 20)


def test_redirects(site: DemoSite) -> None:
    status, headers, body = get(site, "/redirect-loop/41")
    assert (status, headers["location"], body) == (302, "/redirect-loop/42", b"")
    assert get(site, "/redirect?to=/page/2")[1]["location"] == "/page/2"
    assert get(site, "/head-redirect")[0] == 301 and get(site, "/head-redirect")[1]["location"] == "/page/1"
    assert get(site, "/redirect?to=/a%0d%0aSet-Cookie:%20x=1")[0] == 400  # no header injection


def test_status_with_retry_after(site: DemoSite) -> None:
    status, headers, body = get(site, "/status/503?retry_after=7")
    assert (status, headers["retry-after"], body) == (503, "7", b"status 503\n")
    assert "retry-after" not in get(site, "/status/429")[1]
    assert get(site, "/status/99")[0] == 404 and get(site, "/status/600")[0] == 404


def test_a_body_less_status_keeps_the_connection_usable(site: DemoSite) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", site.port, timeout=5)
    try:
        for path, status in (("/status/204", 204), ("/status/304", 304), ("/page/1", 200)):
            conn.request("GET", path)
            response = conn.getresponse()
            assert response.status == status and (response.read() == b"") == (status != 200)
    finally:
        conn.close()
    assert len({port for *_, port in site.requests_log}) == 1


def test_bad_encoding_says_utf8_but_sends_latin1(site: DemoSite) -> None:
    status, headers, body = get(site, "/bad-encoding")
    assert status == 200 and headers["content-type"] == "text/html; charset=utf-8"
    assert b"caf\xe9" in body and b'<meta charset="iso-8859-1">' in body
    with pytest.raises(UnicodeDecodeError):
        body.decode("utf-8")


def test_echo_headers(site: DemoSite) -> None:
    echoed = json.loads(get(site, "/echo-headers", headers={"X-Probe": "42", "User-Agent": "probe/1"})[2])
    assert echoed["X-Probe"] == "42" and echoed["User-Agent"] == "probe/1"


def test_slow_waits_and_bad_numbers_are_400(site: DemoSite) -> None:
    assert get(site, "/slow?seconds=0.05")[0] == 200
    assert get(site, "/slow?seconds=soon")[0] == 400 and get(site, "/huge?bytes=-1")[0] == 400


def test_hits_count_paths_without_query_and_are_served_as_json(site: DemoSite) -> None:
    get(site, "/page/1?a=1")
    get(site, "/page/1?a=2")
    get(site, "/nowhere", "HEAD")
    assert site.hits["/page/1"] == 2 and site.hits["/nowhere"] == 1
    assert json.loads(get(site, "/__hits")[2]) == {"/page/1": 2, "/nowhere": 1} == site.hits_snapshot()
    assert [(method, path) for method, path, *_ in site.requests_log] == [
        ("GET", "/page/1?a=1"), ("GET", "/page/1?a=2"), ("HEAD", "/nowhere"), ("GET", "/__hits")]


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.10", "example.com", "::1", ""])
def test_only_ipv4_loopback_can_be_bound(host: str) -> None:
    with pytest.raises(ValueError, match="loopback only"):
        DemoSite(host)


def test_close_hangs_up_on_keep_alive_clients_and_frees_the_port() -> None:
    site = DemoSite("127.0.0.2").start()
    conn = http.client.HTTPConnection("127.0.0.2", site.port, timeout=5)
    conn.request("GET", "/page/1")
    conn.getresponse().read()
    site.close()
    site.close()
    with pytest.raises((ConnectionError, http.client.HTTPException)):
        conn.request("GET", "/page/2")
        conn.getresponse()
    conn.close()
    with DemoSite("127.0.0.2", site.port) as again:
        assert get(again, "/page/2")[0] == 200


def test_python_m_serves_until_sigterm() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "scrapekit.demo.site", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        match = re.fullmatch(r"demo site at http://127\.0\.0\.1:(\d+)\n", line)
        assert match, line
        conn = http.client.HTTPConnection("127.0.0.1", int(match.group(1)), timeout=5)
        conn.request("GET", "/robots.txt")
        assert conn.getresponse().status == 200
        conn.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=5) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.stderr is not None and proc.stderr.read() == ""


def test_a_site_without_a_request_log_still_counts_hits() -> None:
    with DemoSite(log_requests=False) as site:
        get(site, "/page/1")
        assert site.hits["/page/1"] == 1 and site.requests_log == []


def test_the_blog_links_its_posts_and_feeds_and_serves_rss_and_atom(site: DemoSite) -> None:
    status, _, index = get(site, "/blog/")
    assert status == 200 and b'type="application/atom+xml" title="Demo blog" href="/blog/atom.xml"' in index
    posts = re.findall(rb'href="/blog/post/(\d+)"', index)
    assert [int(n) for n in posts] == list(range(1, BLOG_POSTS + 1))
    _, _, post = get(site, "/blog/post/3")
    assert b'href="/blog/feed.xml"' in post and b"atom.xml" not in post
    assert b'href="https://twitter.com/demoblog"' in post and b'href="https://twitter.com/intent/tweet?url=' in post
    for path, root, content_type in (("/blog/feed.xml", "rss", "application/rss+xml"),
                                     ("/blog/atom.xml", "{http://www.w3.org/2005/Atom}feed", "application/atom+xml")):
        status, headers, body = get(site, path)
        assert status == 200 and headers["content-type"].startswith(content_type)
        assert ElementTree.fromstring(body).tag == root and body.count(b"<item>") + body.count(b"<entry>") == BLOG_POSTS


@pytest.mark.parametrize("path", ["/blog/post/0", f"/blog/post/{BLOG_POSTS + 1}", "/blog/post/x", "/blog/page/1",
                                  "/blog/rss.xml", "/blog/post/1/x"])
def test_outside_the_blog_is_404(site: DemoSite, path: str) -> None:
    assert get(site, path)[0] == 404
