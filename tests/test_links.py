"""Canonical URLs, registered domains, link extraction and the follow filters."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from scrapekit import BadUrl, Request, Response
from scrapekit import links as links_module
from scrapekit.links import (LINK_REASONS, TRAP_REASONS, LinkExtractor, LinkFilter, TrapFilter, canonicalize,
                             registered_domain)


@pytest.mark.parametrize(("url", "canonical"), [
    # case, ports, fragments
    ("HTTP://Example.COM:80/a", "http://example.com/a"),
    ("https://example.com:443", "https://example.com/"),
    ("https://example.com:80/", "https://example.com:80/"),
    ("http://example.com:8080/a#frag", "http://example.com:8080/a"),
    ("http://example.com/Path/A", "http://example.com/Path/A"),
    ("http://example.com./a", "http://example.com/a"),
    # dot segments
    ("http://example.com/a/./b/../c", "http://example.com/a/c"),
    ("http://example.com/a/b/..", "http://example.com/a/"),
    ("http://example.com/../../x", "http://example.com/x"),
    # query: sorted by key, equal keys keep their order, empty query dropped
    ("http://example.com/?b=2&a=1&a=0", "http://example.com/?a=1&a=0&b=2"),
    ("http://example.com/p?", "http://example.com/p"),
    # session ids, in the query (any case) and as a ;jsessionid= path parameter
    ("http://example.com/p?x=1&PHPSESSID=abc&sid=2&jsessionid=z", "http://example.com/p?x=1"),
    ("http://example.com/p?SessionId=1&aspsessionid=2&CFID=3&cftoken=4", "http://example.com/p"),
    ("http://example.com/p;jsessionid=ABC123?q=1", "http://example.com/p?q=1"),
    ("http://example.com/p;JSESSIONID=ABC123", "http://example.com/p"),
    ("http://example.com/?%73id=1&b=2", "http://example.com/?b=2"),
    ("http://example.com/?s=0123456789abcdef0123456789ABCDEF&q=1", "http://example.com/?q=1"),
    ("http://example.com/?s=words", "http://example.com/?s=words"),  # a search, not a session
    # percent-encoding: unreserved decoded, other escapes upper-cased, non-ASCII escaped
    ("http://example.com/%7euser/a%2fb", "http://example.com/~user/a%2Fb"),
    ("http://example.com/%41%2D%5f?q=%e2%82%ac", "http://example.com/A-_?q=%E2%82%AC"),
    ("http://example.com/café?q=€", "http://example.com/caf%C3%A9?q=%E2%82%AC"),
    ("http://example.com/%zz/100%?q=%g1", "http://example.com/%25zz/100%25?q=%25g1"),
    ('http://example.com/a"b<c>{d}|^`', "http://example.com/a%22b%3Cc%3E%7Bd%7D%7C%5E%60"),
    ("http://example.com/p?a[]=1", "http://example.com/p?a%5B%5D=1"),
    # international hosts to punycode
    ("http://bücher.example/", "http://xn--bcher-kva.example/"),
    ("http://BÜCHER.example/", "http://xn--bcher-kva.example/"),
    # IP literals
    ("http://127.0.0.1:80/", "http://127.0.0.1/"),
    ("http://[::1]:8080/x", "http://[::1]:8080/x"),
    ("http://[0:0::1]/", "http://[::1]/"),
    ("http://user:pw@Example.COM:80/", "http://user:pw@example.com/"),
])
def test_canonical_forms(url: str, canonical: str) -> None:
    assert canonicalize(url) == canonical
    assert canonicalize(canonical) == canonical  # idempotent


@pytest.mark.parametrize(("url", "canonical"), [
    ("../up?b=1&a=2", "http://example.com/up?a=2&b=1"),
    ("sibling.html", "http://example.com/dir/sibling.html"),
    ("./", "http://example.com/dir/"),
    ("..", "http://example.com/"),
    ("/root", "http://example.com/root"),
    ("//other.example/x", "http://other.example/x"),
    ("?page=2", "http://example.com/dir/page.html?page=2"),
    ("#top", "http://example.com/dir/page.html?x=1"),
    ("", "http://example.com/dir/page.html?x=1"),
    ("HTTPS://Example.com/abs", "https://example.com/abs"),
])
def test_relative_links_resolve_against_the_base(url: str, canonical: str) -> None:
    assert canonicalize(url, "http://example.com/dir/page.html?x=1#here") == canonical


# RFC 3986 5.4.1, the normal examples, canonicalised (no empty query, no fragment).
@pytest.mark.parametrize(("url", "canonical"), [
    ("g", "http://a/b/c/g"), ("./g", "http://a/b/c/g"), ("g/", "http://a/b/c/g/"), ("/g", "http://a/g"),
    ("//g", "http://g/"), ("?y", "http://a/b/c/d;p?y"), ("g?y", "http://a/b/c/g?y"), ("#s", "http://a/b/c/d;p?q"),
    ("g#s", "http://a/b/c/g"), ("g?y#s", "http://a/b/c/g?y"), (";x", "http://a/b/c/;x"), ("g;x", "http://a/b/c/g;x"),
    ("g;x?y#s", "http://a/b/c/g;x?y"), ("", "http://a/b/c/d;p?q"), (".", "http://a/b/c/"), ("./", "http://a/b/c/"),
    ("..", "http://a/b/"), ("../", "http://a/b/"), ("../g", "http://a/b/g"), ("../..", "http://a/"),
    ("../../", "http://a/"), ("../../g", "http://a/g"), ("../../../g", "http://a/g"), ("/./g", "http://a/g"),
    ("/../g", "http://a/g"), ("g.", "http://a/b/c/g."), ("..g", "http://a/b/c/..g"), ("./g/.", "http://a/b/c/g/"),
    ("g/./h", "http://a/b/c/g/h"), ("g/../h", "http://a/b/c/h"), ("g?y/./x", "http://a/b/c/g?y/./x"),
    ("?", "http://a/b/c/d;p"),  # an empty query, then dropped (urljoin would keep ?q)
])
def test_relative_resolution_follows_rfc_3986(url: str, canonical: str) -> None:
    assert canonicalize(url, "http://a/b/c/d;p?q") == canonical


@pytest.mark.parametrize("url", [
    "javascript:alert(1)", "JavaScript:void(0)", "mailto:a@b.c", "data:text/html,hi", "ftp://x.example/",
    "tel:123", "file:///etc/passwd", "http://", "https:///path", "http:example.com", "/relative", "",
    "http://exa mple.com/", "http://example.com/a b", "http://example.com/a\tb", "http://example.com/\x00",
    "http://example.com:99999/", "http://example.com:port/", "http://[::1/", "http://" + "ü" * 64 + ".example/",
    "http://exa%20mple.com/", "http://exa<mple.com/", "http://a..b/", "http://example.com/x\u00a0y",
    "http://example.com/\ud800",
])
def test_odd_schemes_and_broken_urls_are_refused(url: str) -> None:
    with pytest.raises(BadUrl):
        canonicalize(url)


def test_a_relative_link_needs_a_base() -> None:
    with pytest.raises(BadUrl):
        canonicalize("page.html")
    with pytest.raises(BadUrl):
        canonicalize("page.html", "mailto:a@b.c")
    with pytest.raises(BadUrl):
        canonicalize("a\tb.html", "http://example.com/")  # urljoin would drop the tab


@pytest.mark.parametrize(("host", "domain"), [
    ("www.bbc.co.uk", "bbc.co.uk"), ("a.b.example.com", "example.com"), ("EXAMPLE.org", "example.org"),
    ("example.com.", "example.com"), ("127.0.0.1", "127.0.0.1"), ("localhost", "localhost"),
    ("[::1]", "::1"), ("2001:db8::1", "2001:db8::1"), ("xn--bcher-kva.de", "xn--bcher-kva.de"),
])
def test_registered_domains(host: str, domain: str) -> None:
    assert registered_domain(host) == domain


def test_the_suffix_list_is_bundled_not_downloaded(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def no_network(*args: object, **kwargs: object) -> None:
        raise AssertionError("registered_domain touched the network")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "getaddrinfo", no_network)
    for variable in ("HOME", "XDG_CACHE_HOME", "TLDEXTRACT_CACHE"):
        monkeypatch.setenv(variable, str(tmp_path))
    monkeypatch.setattr(links_module, "_extractor", None)  # a fresh extractor, built offline
    registered_domain.cache_clear()
    assert registered_domain("news.bbc.co.uk") == "bbc.co.uk"
    assert links_module._extractor is not None
    assert list(tmp_path.iterdir()) == []  # no cache files either
    registered_domain.cache_clear()


def page(body: bytes, url: str = "http://shop.example/dir/list.html", content_type: str = "text/html") -> Response:
    headers = {"content-type": content_type} if content_type else {}
    return Response(Request(url), 200, "OK", headers, body)


LINKS_PAGE = (b'<html><head><base href="/base/"></head><body>'
              b'<a href="a.html">a</a><a href="/b?y=2&amp;x=1#f">b</a><a href="a.html#again">dup</a>'
              b'<a href="javascript:void(0)">js</a><a href="mailto:x@y.z">m</a><a>none</a><a href="">empty</a>'
              b'<a class="x" href="http://OTHER.example:80/c">c</a><a href=" /wrapped/\n\tlink.html ">w</a>'
              b'<a href="my file.pdf">space</a><a href="http://exa mple.com/">broken</a></body></html>')


def test_links_out_of_a_page_are_canonical_absolute_and_unique() -> None:
    assert LinkExtractor().extract(page(LINKS_PAGE)) == [
        "http://shop.example/base/a.html", "http://shop.example/b?x=1&y=2",
        "http://other.example/c", "http://shop.example/wrapped/link.html"]


def test_links_resolve_against_the_final_url_without_a_base_element() -> None:
    response = Response(Request("http://shop.example/old"), 200, "OK", {"content-type": "text/html"},
                        b'<a href="next">n</a>', url="http://shop.example/new/here")
    assert LinkExtractor().extract(response) == ["http://shop.example/new/next"]


def test_an_unusable_base_element_is_ignored() -> None:
    html = b'<base href="javascript:x()"><a href="a.html">a</a>'
    assert LinkExtractor().extract(page(html)) == ["http://shop.example/dir/a.html"]


def test_links_by_css_selector_and_by_element_xpath() -> None:
    assert LinkExtractor("css:a.x").extract(page(LINKS_PAGE)) == ["http://other.example/c"]
    assert LinkExtractor("//a[@class='x']").extract(page(LINKS_PAGE)) == ["http://other.example/c"]
    html = b'<link rel="next" href="/p2"><a href="/nope">n</a>'
    assert LinkExtractor("//link[@rel='next']/@href").extract(page(html)) == ["http://shop.example/p2"]


@pytest.mark.parametrize("body", [b"", b"   \n", b"\x00\xff\xfe binary", b"\x89PNG\r\n\x1a\n" + bytes(range(256)),
                                  b"<a href='x'", b"<<<<>>>", b"not html at all", b"<div>" * 10_000])
def test_broken_pages_give_no_links(body: bytes) -> None:
    assert LinkExtractor().extract(page(body)) == []


def test_unclosed_html_still_gives_its_links() -> None:
    assert LinkExtractor().extract(page(b"<html><body><p><a href=/x>x<a href=/y>")) == [
        "http://shop.example/x", "http://shop.example/y"]


@pytest.mark.parametrize("content_type", ["application/json", "text/plain; charset=utf-8", "image/png"])
def test_non_html_responses_give_no_links(content_type: str) -> None:
    assert LinkExtractor().extract(page(b'<a href="/x">x</a>', content_type=content_type)) == []


@pytest.mark.parametrize("content_type", ["", "text/html; charset=utf-8", "TEXT/HTML", "application/xhtml+xml"])
def test_html_responses_give_links(content_type: str) -> None:
    assert LinkExtractor().extract(page(b'<a href="/x">x</a>', content_type=content_type)) == [
        "http://shop.example/x"]


@pytest.mark.parametrize(("expression", "kind"), [("//a[", "XPath"), ("//a[$undefined]", "XPath"),
                                                   ("//a[nope()]", "XPath"), ("css:a[", "CSS")])
def test_bad_link_expression_is_refused(expression: str, kind: str) -> None:
    with pytest.raises(ValueError, match=f"links: bad {kind}"):
        LinkExtractor(expression)


def test_link_filter_reasons() -> None:
    parent = Request("http://www.shop.co.uk/a", depth=2)
    only = LinkFilter(allow=["/catalogue/"], deny=[r"\?sort="], same_domain=True, max_depth=3)
    assert only.check("http://books.shop.co.uk/catalogue/1", parent) is None  # same registered domain
    assert only.check("http://shop.co.uk/catalogue/1?sort=asc", parent) == "denied"
    assert only.check("http://shop.co.uk/about", parent) == "not_allowed"
    assert only.check("http://other.co.uk/catalogue/1", parent) == "other_domain"
    assert LinkFilter(max_depth=2).check("http://shop.co.uk/x", parent) == "too_deep"
    assert LinkFilter(max_depth=3).check("http://shop.co.uk/x", parent) is None
    assert LinkFilter().check("http://anywhere.example/x", Request("http://a.example/", depth=10**6)) is None
    assert set(LINK_REASONS) == {"denied", "not_allowed", "other_domain", "too_deep"}


def test_deny_wins_over_allow_and_patterns_search_the_whole_url() -> None:
    parent = Request("http://shop.example/")
    both = LinkFilter(allow=["shop"], deny=["^https://"])
    assert both.check("https://shop.example/", parent) == "denied"
    assert both.check("http://shop.example/", parent) is None


def test_bad_filter_pattern_is_refused() -> None:
    with pytest.raises(ValueError, match="bad pattern"):
        LinkFilter(allow=["("])


def test_trap_reasons() -> None:
    traps = TrapFilter(max_url_length=60, max_segment_repeats=3)
    assert traps.check("http://a.example/" + "x" * 43) is None  # 60 characters
    assert traps.check("http://a.example/" + "x" * 44) == "too_long"
    assert traps.check("http://a.example/a/b/a/b/a/b/a/b/") == "repeated_segment"
    assert traps.check("http://a.example/a/b/a/b/a/b/") is None
    assert traps.check("http://a.example/s?q=1&q=2") == "repeated_param"
    assert traps.check("http://a.example/s?q=1&r=1") is None
    assert traps.counts == {}  # check counts nothing
    assert TRAP_REASONS == ("too_long", "repeated_segment", "repeated_param", "pattern_cap")


def test_a_calendar_hits_the_pattern_cap() -> None:
    counts: dict[str, int] = {}
    traps = TrapFilter(max_per_pattern=5, counts=counts)
    calendar = [f"http://a.example/cal/2026/{month}/{day}" for month in range(1, 3) for day in range(1, 5)]
    assert [traps.count(url) for url in calendar] == [None] * 5 + ["pattern_cap"] * 3
    assert counts == {"a.example/cal/N/N/N?": 5}  # refused URLs are not counted
    assert traps.count("http://b.example/cal/2026/1/1") is None  # patterns are per host
    assert traps.count("http://a.example/cal/2026/1/1?view=day") is None  # query keys make a new pattern


def test_growing_query_values_hit_the_pattern_cap() -> None:
    traps = TrapFilter(max_per_pattern=3)
    urls = [f"http://a.example/list?page={n}&sort=asc" for n in range(5)]
    assert [traps.count(url) for url in urls] == [None, None, None, "pattern_cap", "pattern_cap"]


@pytest.mark.parametrize("base", [
    "http://Example.COM:80/dir/page.html?q=1#f", "https://example.com:8443/a/", "http://[::1]:8080/x",
    "http://xn--bcher-kva.example/", "http://bücher.example/d/", "http://user:pw@host.example/p",
])
@pytest.mark.parametrize("link", [
    "/", "/page/12", "/a/b.html", "/a/b/", "/~user/x_y-z.tar.gz", "/a/./b", "/a/../b", "//other.example/x",
    "/.hidden", "/a//b", "/a/b?x=1", "/%7Euser", "/caf%C3%A9", "/a;jsessionid=ABC123", "/a b",
])
def test_the_fast_path_for_root_relative_links_agrees_with_full_resolution(base: str, link: str) -> None:
    from urllib.parse import urljoin

    try:
        expected = canonicalize(urljoin(base, link))
    except BadUrl:
        expected = None
    try:
        got = canonicalize(link, base)
    except BadUrl:
        got = None
    assert got == expected
