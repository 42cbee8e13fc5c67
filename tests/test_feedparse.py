"""The feed parser on feeds made by hand (RSS 2.0, RSS 1.0, Atom, broken and hostile ones) and on
the demo site's feeds, and its recipe options."""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scrapekit import RecipeError, Request, Response
from scrapekit.demo.site import TIMELINE_EPOCH, DemoSite
from scrapekit.feedparse import FeedParser, read_feed, without_entity_declarations
from scrapekit.fetchers import HttpFetcher
from scrapekit.recipe import load_recipe
from scrapekit.runner import build
from tests.conftest import FakeClock

FEED_URL = "http://news.example.org/dir/feed.xml"
RSS = "application/rss+xml; charset=utf-8"
ATOM = "application/atom+xml"

MARKER = "scrapekit-secret"
_touched: list[str] = []


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event in ("open", "urllib.Request") and args and MARKER in str(args[0]):
        _touched.append(f"{event} {args[0]}")


sys.addaudithook(_audit)  # stays for the process; it only records paths holding MARKER


@pytest.fixture
def touched() -> list[str]:
    """Files and URLs holding MARKER opened while the test runs."""
    _touched.clear()
    return _touched


def feed(body: bytes | str, content_type: str = RSS, url: str = FEED_URL, final_url: str = "",
         depth: int = 0) -> Response:
    data = body.encode() if isinstance(body, str) else body
    headers = {"content-type": content_type} if content_type else {}
    return Response(Request(url, depth=depth), 200, "OK", headers, data, url=final_url, fetched_at=1_800_000_000.0)


def rss(items: str, head: str = '<?xml version="1.0" encoding="utf-8"?>\n') -> str:
    return f'{head}<rss version="2.0"><channel><title>News</title><link>/</link>{items}</channel></rss>'


def fields(parser: FeedParser, response: Response) -> list[dict[str, Any]]:
    items, _ = parser.parse(response)
    return [dict(item.fields) for item in items]


def test_rss2_items_have_guid_title_absolute_link_utc_date_and_summary() -> None:
    body = rss('<item><guid isPermaLink="false">tag:news,2027:1</guid><title>A &amp; B</title><link>/a/1?b=2&amp;a=1</link>'
               "<pubDate>Fri, 15 Jan 2027 09:00:00 +0100</pubDate>"
               "<description>&lt;p&gt;Hi &lt;script&gt;x()&lt;/script&gt;&lt;a href='rel'&gt;r&lt;/a&gt;&lt;/p&gt;</description></item>")
    items, links = FeedParser().parse(feed(body))
    (item,) = items
    assert dict(item.fields) == {
        "guid": "tag:news,2027:1", "title": "A & B", "link": "http://news.example.org/a/1?a=1&b=2",
        "published": "2027-01-15T08:00:00Z",
        "summary": '<p>Hi <a href="http://news.example.org/dir/rel">r</a></p>',
    }
    assert (item.key, item.url, item.scraped_at) == (f"{FEED_URL}#tag:news,2027:1", FEED_URL, 1_800_000_000.0)
    assert links == []


def test_rss1_and_atom_entries() -> None:
    rdf = ('<?xml version="1.0"?><rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#" '
           'xmlns="http://purl.org/rss/1.0/" xmlns:dc="http://purl.org/dc/elements/1.1/">'
           '<channel rdf:about="http://news.example.org/"><title>t</title></channel>'
           '<item rdf:about="http://news.example.org/a"><title>A</title><link>http://news.example.org/a</link>'
           "<description>d</description><dc:date>2027-01-15T10:00:00+02:00</dc:date></item></rdf:RDF>")
    assert fields(FeedParser(), feed(rdf, "application/rdf+xml")) == [
        {"guid": "http://news.example.org/a", "title": "A", "link": "http://news.example.org/a",
         "published": "2027-01-15T08:00:00Z", "summary": "d"}]
    atom = ('<feed xmlns="http://www.w3.org/2005/Atom"><title>t</title><id>urn:f</id>'
            '<entry><id>urn:e:1</id><title type="html">&lt;b&gt;T&lt;/b&gt;</title><link href="e/1"/>'
            '<content type="html">&lt;p&gt;c&lt;/p&gt;</content><updated>2027-01-15T08:00:00Z</updated></entry>'
            '<entry><id>urn:e:2</id><title>U</title><link rel="alternate" href="https://x.example.net/u"/>'
            "<summary>s</summary><published>2027-01-14T08:00:00Z</published><updated>2027-01-16T08:00:00Z</updated>"
            "</entry></feed>")
    assert fields(FeedParser(), feed(atom, ATOM, final_url="https://news.example.org/feeds/atom")) == [
        {"guid": "urn:e:1", "title": "<b>T</b>", "link": "https://news.example.org/feeds/e/1",
         "published": "2027-01-15T08:00:00Z", "summary": "<p>c</p>"},
        {"guid": "urn:e:2", "title": "U", "link": "https://x.example.net/u", "published": "2027-01-14T08:00:00Z",
         "summary": "s"}]


def test_guid_falls_back_to_the_link_then_a_digest_of_title_and_summary() -> None:
    body = rss("<item><title>linked</title><link>/a</link></item>"
               "<item><title>bare</title><description>text</description></item>"
               "<item><title>bare</title><description>other text</description></item>"
               "<item><title>no date</title><link>javascript:x()</link></item>")
    first = fields(FeedParser(), feed(body))
    assert [f["guid"] for f in first][0] == "http://news.example.org/a"
    digests = [f["guid"] for f in first][1:]
    assert all(g.startswith("sha256:") and len(g) == 7 + 32 for g in digests) and len(set(digests)) == 3
    assert [f["link"] for f in first][3] is None and first[3]["published"] is None
    assert [f["guid"] for f in fields(FeedParser(), feed(body))] == [f["guid"] for f in first]  # stable


def test_an_entry_repeated_in_the_feed_is_one_item() -> None:
    body = rss("<item><guid>urn:g1</guid><title>first</title></item><item><guid>urn:g1</guid><title>again</title></item>")
    assert [(f["title"]) for f in fields(FeedParser(), feed(body))] == ["first"]


def test_links_are_followed_only_when_asked() -> None:
    body = rss("<item><guid>urn:1</guid><link>/a</link></item><item><guid>urn:2</guid><link>/a#frag</link></item>"
               "<item><guid>urn:3</guid><link>mailto:x@y.z</link></item><item><guid>urn:4</guid><link>b</link></item>")
    assert FeedParser().parse(feed(body))[1] == []
    items, links = FeedParser(links=True).parse(feed(body, depth=4))
    assert len(items) == 4
    assert [r.url for r in links] == ["http://news.example.org/a", "http://news.example.org/dir/b"]
    assert {(r.kind, r.depth, r.key == r.url, dict(r.meta)["parent"]) for r in links} == {("page", 5, True, FEED_URL)}


def test_a_malformed_feed_still_gives_its_entries_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    body = rss("<item><guid>urn:g1</guid><title>nbsp&nbsp;and &bogus; here</title></item><item><guid>urn:g2</guid>")
    with caplog.at_level(logging.INFO, logger="scrapekit.feedparse"):
        items = fields(FeedParser(), feed(body))
    assert [f["guid"] for f in items] == ["urn:g1", "urn:g2"] and items[0]["title"] == "nbsp\xa0and &bogus; here"
    (record,) = caplog.records
    assert record.getMessage().startswith(f"feed {FEED_URL} is malformed (") and "2 entries read anyway" in record.getMessage()


NOT_FEEDS = [
    ("", RSS), ("  \n ", RSS), ("just text", RSS), ("{\"items\": []}", "application/json"),
    ("<!DOCTYPE html><html><head><title>t</title></head><body><p>page <b>bold</p></body></html>", "text/html"),
    ("<!DOCTYPE html><html><body><p>an HTML page served as RSS</body></html>", RSS),
    (b"\x00\xff\xfe\x01\x80" * 1000, ""), (b"<" * 100_000, RSS), ("<rss version='2.0'><channel>" + "<a>" * 5000, RSS),
    ("<?xml version='1.0'?><svg xmlns='http://www.w3.org/2000/svg'><item><title>x</title></item></svg>", "image/svg+xml"),
    ("<rss version='2.0'><channel><item><guid>urn:g</guid><title>&#99999999;</title></item></channel></rss>", RSS),
]


@pytest.mark.parametrize(("body", "content_type"), NOT_FEEDS)
def test_what_is_no_feed_gives_nothing_and_one_info_line(body: str | bytes, content_type: str,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="scrapekit.feedparse"):
        assert FeedParser(links=True).parse(feed(body, content_type)) == ([], [])
    (record,) = caplog.records
    assert record.levelno == logging.INFO and record.getMessage().startswith(f"no feed entries in {FEED_URL}: ")


PIECES = [b"<?xml version='1.0' encoding='utf-7'?>", b"<!DOCTYPE rss [", b"<!ENTITY a 'b'>", b"]>",
          b"<rss version='2.0'>", b"<channel>", b"<item>", b"<title>", b"&a;", b"&#x0;", b"&#99999999;", b"<![CDATA[",
          b"]]>", b"</item>", b"<guid>", b"\xff\xfe", b"\x00", b"<!--", b"-->", b"<?", b"?>", b"<entry>",
          b"<feed xmlns='http://www.w3.org/2005/Atom'>", b"<link href='javascript:x'/>", b"<link>", b"</link>",
          b"<pubDate>Mon, 99 Foo 99999 99:99:99 +9999</pubDate>", b"<updated>0000-00-00T00:00:00Z</updated>"]
CONTENT_TYPES = ["", RSS, "application/rss+xml; charset=nonexistent", "text/xml; charset=utf-7", "text/html",
                 "application/xml; charset=cp037", ";;;"]


@settings(max_examples=400, deadline=None)
@given(parts=st.lists(st.sampled_from(PIECES) | st.binary(max_size=8), max_size=20),
       content_type=st.sampled_from(CONTENT_TYPES))
def test_no_body_makes_the_parser_raise(parts: list[bytes], content_type: str) -> None:
    items, links = FeedParser(links=True).parse(feed(b"".join(parts), content_type))
    assert all(item.key.startswith(f"{FEED_URL}#") for item in items) and len(links) <= len(items)


def test_a_10_mb_body_is_not_parsed_unless_max_bytes_allows(caplog: pytest.LogCaptureFixture) -> None:
    huge = feed(b"x" * 10_000_000)
    started = time.perf_counter()
    with caplog.at_level(logging.INFO, logger="scrapekit.feedparse"):
        assert FeedParser().parse(huge) == ([], [])
    assert time.perf_counter() - started < 0.5
    assert "10000000 bytes, more than max_bytes 2000000" in caplog.text
    assert FeedParser(max_bytes=20_000_000).parse(huge) == ([], [])
    many = rss("".join(f"<item><guid>urn:g{n}</guid><title>{'word ' * 100}</title></item>" for n in range(20_000)))
    assert len(many) > 10_000_000 and len(FeedParser(max_bytes=20_000_000).parse(feed(many))[0]) == 20_000


# -- entities, DTDs and files: nothing expands, nothing is read --------------------------------

LAUGHS = rss("<item><guid>urn:g</guid><title>&lol9;</title></item>", head=(
    '<?xml version="1.0"?>\n<!DOCTYPE rss [\n<!ENTITY lol "lol">\n'
    + "".join(f'<!ENTITY lol{n} "{f"&lol{n - 1 or str()};" * 10}">\n'.replace("&lol0;", "&lol;") for n in range(1, 10))
    + "]>\n"))


def test_a_billion_laughs_expands_nothing() -> None:
    assert LAUGHS.count("<!ENTITY") == 10 and "&lol8;&lol8;" in LAUGHS
    for body in (LAUGHS, LAUGHS.replace("\n<!ENTITY", "<!ENTITY"), LAUGHS.replace("</channel>", "")):
        started = time.perf_counter()
        (item,) = fields(FeedParser(), feed(body))
        assert time.perf_counter() - started < 1 and "lollol" not in str(item) and len(item["title"] or "") < 10


def test_a_quadratic_blowup_expands_nothing() -> None:
    head = f'<?xml version="1.0"?>\n<!DOCTYPE rss [\n<!ENTITY a "{"A" * 100_000}">\n]>\n'
    body = rss(f"<item><guid>urn:g</guid><title>{'&a;' * 3000}</title></item>", head=head)
    for text in (body, body.replace("</channel>", "</chanel>")):  # the XML parser, then the lenient one
        (item,) = fields(FeedParser(), feed(text))
        assert "AAAA" not in item["title"] and len(item["title"]) == 9000


def test_the_same_in_utf16_expands_nothing() -> None:
    head = '<?xml version="1.0" encoding="utf-16"?>\n<!DOCTYPE rss [\n<!ENTITY a "AAAAAAAAAA">\n]>\n'
    body = rss("<item><guid>urn:g</guid><title>&a;&a;</title></item>", head=head).encode("utf-16")
    assert b"<!ENTITY" not in body
    (item,) = fields(FeedParser(), feed(body, "application/rss+xml"))
    assert "AAAA" not in item["title"] and item["guid"] == "urn:g"


def test_external_entities_and_dtds_are_not_read(tmp_path: Path, touched: list[str]) -> None:
    secret = tmp_path / f"{MARKER}.txt"
    secret.write_text("TOP-SECRET")
    dtd = tmp_path / f"{MARKER}.dtd"
    dtd.write_text('<!ENTITY s "TOP-SECRET">')
    bodies = [
        rss("<item><guid>urn:g</guid><title>a&xxe;b</title><description>&xxe;</description></item>",
            head=f'<?xml version="1.0"?>\n<!DOCTYPE rss [\n<!ENTITY xxe SYSTEM "file://{secret}">\n]>\n'),
        rss("<item><guid>urn:g</guid><title>a&xxe;b</title></item>",
            head=f'<?xml version="1.0"?><!DOCTYPE rss [<!ENTITY xxe SYSTEM "file://{secret}">]>'),
        rss("<item><guid>urn:g</guid><title>a&s;b</title></item>",
            head=f'<?xml version="1.0"?>\n<!DOCTYPE rss SYSTEM "file://{dtd}">\n'),
        rss("<item><guid>urn:g</guid><title>a</title></item>",
            head=f'<?xml version="1.0"?>\n<!DOCTYPE rss [\n<!ENTITY % p SYSTEM "file://{dtd}">\n%p;\n]>\n'),
    ]
    touched.clear()
    for body in bodies:
        items = fields(FeedParser(), feed(body))
        assert [f["guid"] for f in items] == ["urn:g"] and "TOP-SECRET" not in str(items)
    assert touched == []
    with open(secret) as handle:  # the audit hook does see opens
        handle.read()
    assert touched == [f"open {secret}"]


def test_a_body_naming_a_file_is_not_opened(tmp_path: Path, touched: list[str]) -> None:
    local = tmp_path / f"{MARKER}.xml"
    local.write_text(rss("<item><guid>urn:local</guid><title>from the disk</title></item>"))
    touched.clear()
    for body in (str(local), f"file://{local}"):  # feedparser opens byte strings that name a file
        assert FeedParser().parse(feed(body)) == ([], [])
    assert touched == []


def test_entity_declarations_hidden_in_comments_are_refused(caplog: pytest.LogCaptureFixture) -> None:
    body = rss("<item><guid>urn:g</guid><title>&a;&a;</title></item>",
               head='<?xml version="1.0"?>\n<!DOCTYPE rss>\n<!--\n<!ENTITY a "AAAAAAAAAA">\n-->\n')
    with caplog.at_level(logging.INFO, logger="scrapekit.feedparse"):
        assert FeedParser().parse(feed(body)) == ([], [])
    assert "entity declarations refused" in caplog.text


@pytest.mark.parametrize(("document", "screened"), [
    (b"<?xml version='1.0'?>\n<rss/>", b"<?xml version='1.0'?>\n<rss/>"),
    (b'<?xml version="1.0"?><!DOCTYPE rss PUBLIC "-//Netscape//DTD RSS 0.91//EN" "http://x/rss.dtd" [<!ENTITY a "b">]><rss/>',
     b'<?xml version="1.0"?><!DOCTYPE rss PUBLIC "-//Netscape//DTD RSS 0.91//EN" "http://x/rss.dtd" ><rss/>'),
    (b'<!-- c --><!DOCTYPE rss [<!ENTITY a "]>"><!-- ] --><?pi ]?><!ATTLIST x y CDATA \'>\'>]>\n<rss>&a;</rss>',
     b"<!-- c --><!DOCTYPE rss >\n<rss>&a;</rss>"),
    (b"<rss><![CDATA[<!ENTITY x 'y'>]]></rss>", b"<rss><![CDATA[<!ENTITY x 'y'>]]></rss>"),
    (b"text first <!DOCTYPE rss><rss/>", b"text first <!DOCTYPE rss><rss/>"),
    (b'<!DOCTYPE rss [<!ENTITY a "unterminated>]><rss/>', None),
    (b'junk<!DOCTYPE rss [<!ENTITY a "b">]><rss/>', None),
    (b'<?pi <!ENTITY a "b"> ?><!DOCTYPE rss><rss/>', None),
    (b'<!DOCTYPE rss [<!ENTITY a "b">]><!DOCTYPE rss [<!ENTITY c "d">]><rss/>', None),
])
def test_without_entity_declarations(document: bytes, screened: bytes | None) -> None:
    assert without_entity_declarations(document) == screened


def test_read_feed_says_why_there_is_nothing() -> None:
    assert read_feed(feed(b"")) == ([], "empty body")
    small = rss("<item><guid>urn:g</guid></item>")
    assert read_feed(feed(small), max_bytes=10)[1] == f"{len(small)} bytes, more than max_bytes 10"
    entries, problem = read_feed(feed("<html><body>hi</body></html>", "text/html"))
    assert entries == [] and problem is not None and problem.startswith("not a feed (NonXMLContentType: ")


# -- on the demo site ------------------------------------------------------------------------


@pytest.fixture
def fetcher() -> Any:
    with HttpFetcher(allow_private=True) as fetcher:
        yield fetcher


@pytest.mark.parametrize("suffix", ["xml", "atom"])
def test_the_demo_feeds_give_the_twenty_newest_posts(site: DemoSite, clock: FakeClock, fetcher: HttpFetcher,
                                                     suffix: str) -> None:
    site.now = clock.time
    clock.advance(300)
    url = f"{site.url}/feed/bob.{suffix}"
    items, links = FeedParser(links=True).parse(fetcher.fetch(Request(url)))
    assert [i.key for i in items] == [f"{url}#urn:scrapekit-demo:bob:{n}" for n in range(30, 10, -1)]
    newest = items[0].fields
    assert (newest["title"], newest["link"]) == ("bob #30", f"{site.url}/post/bob/30")
    assert newest["published"] == time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(TIMELINE_EPOCH + 300))
    assert newest["summary"].startswith("bob #30: ")
    assert [r.url for r in links] == [i.fields["link"] for i in items]
    assert fetcher.fetch(links[0]).status == 200


def test_rss_and_atom_of_one_timeline_agree_and_grow_by_guid(site: DemoSite, clock: FakeClock,
                                                             fetcher: HttpFetcher) -> None:
    site.now = clock.time
    clock.advance(60)
    parser = FeedParser()

    def entries(suffix: str) -> list[tuple[str, str, str]]:
        items, _ = parser.parse(fetcher.fetch(Request(f"{site.url}/feed/fast.{suffix}")))
        return [(i.fields["guid"], i.fields["link"], i.fields["published"]) for i in items]

    rss_entries, atom_entries = entries("xml"), entries("atom")
    assert rss_entries == atom_entries and len(rss_entries) == 20
    clock.advance(3)
    newer = entries("xml")
    assert newer[3:] == rss_entries[:17] and [g for g, *_ in newer[:3]] == [
        f"urn:scrapekit-demo:fast:{n}" for n in (63, 62, 61)]


def test_the_demo_not_xml_route_and_the_blog(site: DemoSite, fetcher: HttpFetcher,
                                             caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="scrapekit.feedparse"):
        assert FeedParser().parse(fetcher.fetch(Request(f"{site.url}/feed/not-xml.xml"))) == ([], [])
    assert caplog.records[0].getMessage().startswith(f"no feed entries in {site.url}/feed/not-xml.xml: not a feed")
    items, _ = FeedParser().parse(fetcher.fetch(Request(f"{site.url}/blog/feed.xml")))
    assert [i.fields["guid"] for i in items] == [f"{site.url}/blog/post/{n}" for n in range(1, 6)]


# -- in a recipe -----------------------------------------------------------------------------


def write_recipe(tmp_path: Path, parse: str) -> Path:
    (tmp_path / "urls.txt").write_text("http://127.0.0.1:1/feed/fast.xml\n")
    path = tmp_path / "r.yaml"
    path.write_text(f"source: {{type: flat_file, path: urls.txt, kind: feed}}\nparse:\n{parse}")
    return path


def test_a_recipe_builds_a_feed_parser(tmp_path: Path) -> None:
    recipe = load_recipe(write_recipe(tmp_path, "  type: feed\n"))
    assert recipe.parse is not None and recipe.parse.cls is FeedParser and dict(recipe.parse.options) == {}
    parser = build(recipe.parse, recipe)
    assert (parser.links, parser.max_bytes) == (False, 2_000_000)
    recipe = load_recipe(write_recipe(tmp_path, "  type: feed\n  links: true\n  max_bytes: 5MB\n"))
    assert recipe.parse is not None and dict(recipe.parse.options) == {"links": True, "max_bytes": 5_000_000}
    parser = build(recipe.parse, recipe)
    _, links = parser.parse(feed(rss("<item><guid>urn:g</guid><link>/x</link></item>")))
    assert [r.url for r in links] == ["http://news.example.org/x"]


@pytest.mark.parametrize(("parse", "message"), [
    ("  type: feed\n  links: sometimes\n", "parse.links: expected true or false"),
    ("  type: feed\n  max_bytes: lots\n", "parse.max_bytes: expected a size like 200KB"),
    ("  type: feed\n  link: true\n", "parse.link: unknown key (did you mean 'links'?)"),
])
def test_a_bad_feed_option_names_file_line_and_key(tmp_path: Path, parse: str, message: str) -> None:
    path = write_recipe(tmp_path, parse)
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    assert str(info.value).splitlines()[0].startswith(f"{path}:4: {message}")


def test_max_bytes_zero_is_refused_when_built(tmp_path: Path) -> None:
    path = write_recipe(tmp_path, "  type: feed\n  max_bytes: 0\n")
    recipe = load_recipe(path)
    assert recipe.parse is not None
    with pytest.raises(RecipeError) as info:
        build(recipe.parse, recipe)
    assert str(info.value) == f"{path}:3: parse: max_bytes: expected a size of 1 byte or more"
