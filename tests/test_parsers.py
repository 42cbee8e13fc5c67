"""The html and raw parsers on responses made by hand (parsing needs no network)."""

from __future__ import annotations

import pytest

from scrapekit import Request, Response
from scrapekit.parsers import HtmlParser, RawParser

PAGE = b"""<html><head><meta charset="utf-8"><title>Shop</title></head><body>
<article class="book"><h2><a href="/b/1">One</a></h2><p class="price"> \xc2\xa31.00 </p></article>
<article class="book"><h2><a href="/b/2">Two <em>bold</em></a></h2></article>
</body></html>"""


def response(body: bytes, content_type: str = "text/html; charset=utf-8") -> Response:
    return Response(Request("http://shop.test/list"), 200, "OK", {"content-type": content_type}, body,
                    fetched_at=1_800_000_000.0)


def test_items_by_xpath_and_css_fields() -> None:
    parser = HtmlParser({"each": "//article", "fields": {"title": "h2/a", "href": "h2/a/@href", "price": "css:.price"}})
    items, links = parser.parse(response(PAGE))
    assert [dict(i.fields) for i in items] == [
        {"title": "One", "href": "/b/1", "price": "£1.00"},
        {"title": "Two bold", "href": "/b/2", "price": None},
    ]
    assert all(i.url == "http://shop.test/list" and i.scraped_at == 1_800_000_000.0 for i in items)
    assert links == []


def test_wrong_charset_header_falls_back_to_the_page_meta() -> None:
    body = '<html><head><meta charset="iso-8859-1"></head><body><p>café</p></body></html>'.encode("latin-1")
    items, _ = HtmlParser({"each": "//p", "fields": {"text": "."}}).parse(response(body))
    assert items[0].fields["text"] == "café"


@pytest.mark.parametrize("body", [b"", b"   ", b"\x00\x01\x02", b"<<<>>>"])
def test_broken_pages_give_no_items_and_no_exception(body: bytes) -> None:
    items, _ = HtmlParser({"each": "//article", "fields": {"t": "h2"}}).parse(response(body))
    assert items == []


@pytest.mark.parametrize(("spec", "message"), [
    ({"each": "//[", "fields": {"a": "b"}}, "items.each: bad XPath"),
    ({"each": "//a", "fields": {"a": "css:>>>"}}, "items.fields.a: bad CSS"),
    ({"each": "//a", "field": {}}, "unknown key 'field'"),
])
def test_bad_expressions_are_refused_when_built(spec: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        HtmlParser(spec)


def test_raw_parser_describes_the_response() -> None:
    (item,), _ = RawParser().parse(response(PAGE))
    assert item.fields == {"status": 200, "content_type": "text/html; charset=utf-8", "length": len(PAGE),
                           "final_url": "http://shop.test/list"}
