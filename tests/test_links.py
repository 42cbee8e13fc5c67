"""Canonical URLs, registered domains, link extraction and the follow filters."""

from __future__ import annotations

import socket

import pytest

from scrapekit import BadUrl, Request, Response
from scrapekit import links as links_module
from scrapekit.links import LinkExtractor, LinkFilter, TrapFilter, canonicalize, registered_domain


@pytest.mark.parametrize(("url", "canonical"), [
    ("HTTP://Example.COM:80/a", "http://example.com/a"),
    ("https://example.com:443", "https://example.com/"),
    ("http://example.com:8080/a#frag", "http://example.com:8080/a"),
    ("http://example.com/a/./b/../c", "http://example.com/a/c"),
    ("http://example.com/?b=2&a=1&a=0", "http://example.com/?a=1&a=0&b=2"),
    ("http://example.com/p?x=1&PHPSESSID=abc&sid=2&jsessionid=z", "http://example.com/p?x=1"),
    ("http://example.com/p;jsessionid=ABC123?q=1", "http://example.com/p?q=1"),
    ("http://example.com/%7euser/a%2fb", "http://example.com/~user/a%2Fb"),
    ("http://bücher.example/", "http://xn--bcher-kva.example/"),
])
def test_canonical_forms(url: str, canonical: str) -> None:
    assert canonicalize(url) == canonical
    assert canonicalize(canonical) == canonical  # idempotent


def test_relative_links_resolve_against_the_base() -> None:
    base = "http://example.com/dir/page.html"
    assert canonicalize("../up?b=1&a=2", base) == "http://example.com/up?a=2&b=1"
    assert canonicalize("//other.example/x", base) == "http://other.example/x"
    assert canonicalize("#top", base) == "http://example.com/dir/page.html"


@pytest.mark.parametrize("url", ["javascript:alert(1)", "mailto:a@b.c", "data:text/html,hi", "ftp://x.example/",
                                 "tel:123", "http://", "http://exa mple.com/", "http://example.com:99999/", "/relative"])
def test_odd_schemes_and_broken_urls_are_refused(url: str) -> None:
    with pytest.raises(BadUrl):
        canonicalize(url)


@pytest.mark.parametrize(("host", "domain"), [
    ("www.bbc.co.uk", "bbc.co.uk"), ("a.b.example.com", "example.com"), ("127.0.0.1", "127.0.0.1"),
    ("localhost", "localhost"), ("[::1]", "::1"), ("EXAMPLE.org", "example.org"),
])
def test_registered_domains_offline(host: str, domain: str, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_network(*args: object) -> None:
        raise AssertionError("registered_domain touched the network")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(links_module, "_extractor", None)  # a fresh extractor, built offline
    registered_domain.cache_clear()
    assert registered_domain(host) == domain


def page(body: bytes, url: str = "http://shop.example/dir/list.html") -> Response:
    return Response(Request(url), 200, "OK", {"content-type": "text/html"}, body)


def test_links_out_of_a_page() -> None:
    html = (b'<html><head><base href="http://shop.example/base/"></head><body>'
            b'<a href="a.html">a</a><a href="/b?y=2&x=1#f">b</a><a href="a.html">dup</a>'
            b'<a href="javascript:void(0)">js</a><a href="mailto:x@y.z">m</a><a>none</a>'
            b'<a class="x" href="http://OTHER.example:80/c">c</a></body></html>')
    assert LinkExtractor().extract(page(html)) == [
        "http://shop.example/base/a.html", "http://shop.example/b?x=1&y=2", "http://other.example/c"]
    assert LinkExtractor("css:a.x").extract(page(html)) == ["http://other.example/c"]


@pytest.mark.parametrize("body", [b"", b"\x00\xff\xfe binary", b"<a href='x'", b"<<<<>>>", b"not html at all"])
def test_broken_pages_give_no_error(body: bytes) -> None:
    assert isinstance(LinkExtractor().extract(page(body)), list)


def test_bad_link_expression_is_refused() -> None:
    with pytest.raises(ValueError, match="links: bad XPath"):
        LinkExtractor("//a[")


def test_link_filter_reasons() -> None:
    parent = Request("http://www.shop.co.uk/a", depth=2)
    only = LinkFilter(allow=["/catalogue/"], deny=[r"\?sort="], same_domain=True, max_depth=3)
    assert only.check("http://books.shop.co.uk/catalogue/1", parent) is None  # same registered domain
    assert only.check("http://shop.co.uk/catalogue/1?sort=asc", parent) == "denied"
    assert only.check("http://shop.co.uk/about", parent) == "not_allowed"
    assert only.check("http://other.co.uk/catalogue/1", parent) == "other_domain"
    assert LinkFilter(max_depth=2).check("http://shop.co.uk/x", parent) == "too_deep"
    with pytest.raises(ValueError, match="bad pattern"):
        LinkFilter(allow=["("])


def test_trap_reasons() -> None:
    traps = TrapFilter(max_url_length=60, max_segment_repeats=3, max_per_pattern=5)
    assert traps.check("http://a.example/" + "x" * 60) == "too_long"
    assert traps.check("http://a.example/a/b/a/b/a/b/a/b/") == "repeated_segment"
    assert traps.check("http://a.example/a/b/a/b/a/b/") is None
    assert traps.check("http://a.example/s?q=1&q=2") == "repeated_param"
    calendar = [f"http://a.example/cal/2026/{month}/{day}" for month in range(1, 3) for day in range(1, 4)]
    assert [traps.count(url) for url in calendar] == [None] * 5 + ["pattern_cap"]
    assert traps.count("http://b.example/cal/2026/1/1") is None  # patterns are per host
