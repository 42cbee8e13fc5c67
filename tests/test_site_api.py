"""The demo site's timelines on a fake clock: the JSON API, its page and cursor listings, the
RSS and Atom feeds, the posts, the URL shortener and the bad-input routes."""

from __future__ import annotations

import http.client
import json
import re
from email.utils import parsedate_to_datetime
from xml.etree import ElementTree

import pytest

from scrapekit.demo.site import (
    LISTING_TOTAL,
    TIMELINE_EPOCH,
    DemoSite,
    cursor_token,
    newest_post,
    short_code_value,
)
from tests.conftest import FakeClock

ATOM = "{http://www.w3.org/2005/Atom}"


def get(site: DemoSite, path: str, method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    """(status, lower-cased headers, raw body) of one request on a fresh connection."""
    conn = http.client.HTTPConnection(site.host, site.port, timeout=5)
    try:
        conn.request(method, path)
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


def get_json(site: DemoSite, path: str) -> dict[str, object]:
    status, headers, body = get(site, path)
    assert (status, headers["content-type"]) == (200, "application/json"), body
    data = json.loads(body)
    assert isinstance(data, dict)
    return data


def ids(data: dict[str, object]) -> list[int]:
    items = data["items"]
    assert isinstance(items, list)
    return [item["id"] for item in items]


@pytest.fixture
def timed(site: DemoSite, clock: FakeClock) -> DemoSite:
    """The site on the fake clock, which starts at the timelines' epoch."""
    assert clock.time() == TIMELINE_EPOCH
    site.now = clock.time
    return site


def test_a_timeline_grows_as_the_clock_advances(timed: DemoSite, clock: FakeClock) -> None:
    assert get_json(timed, "/api/timeline/fast.json") == {"items": []}
    clock.advance(5)
    assert ids(get_json(timed, "/api/timeline/fast.json")) == [5, 4, 3, 2, 1]
    assert ids(get_json(timed, "/api/timeline/slow.json")) == []
    clock.advance(0.5)
    assert ids(get_json(timed, "/api/timeline/fast.json")) == [5, 4, 3, 2, 1]
    clock.advance(54.5)
    assert ids(get_json(timed, "/api/timeline/fast.json?count=3")) == [60, 59, 58]
    assert ids(get_json(timed, "/api/timeline/slow.json")) == [1]


def test_a_post_is_stable_and_dated_by_its_id(timed: DemoSite, clock: FakeClock) -> None:
    clock.advance(30)
    first = get_json(timed, "/api/timeline/bob.json")
    clock.advance(3600)
    later = get_json(timed, "/api/timeline/bob.json?max_id=4")
    post = first["items"][0]
    assert post == {"id": 3, "text": post["text"], "user": "bob", "created_at": "2027-01-15T08:00:30Z",
                    "url": "/post/bob/3"}
    assert post["text"].startswith("bob #3: ") and later["items"][0] == post


@pytest.mark.parametrize(("user", "rate"), [("fast", 1), ("slow", 60), ("rare", 3600), ("bob", 10), ("x-9_Z", 10)])
def test_each_name_posts_at_its_rate(timed: DemoSite, clock: FakeClock, user: str, rate: int) -> None:
    clock.advance(7200)
    (newest,) = ids(get_json(timed, f"/api/timeline/{user}.json?count=1"))
    assert newest == 7200 // rate == newest_post(user, clock.time())
    clock.advance(rate - 1)
    assert ids(get_json(timed, f"/api/timeline/{user}.json?count=1")) == [newest]
    clock.advance(1)
    assert ids(get_json(timed, f"/api/timeline/{user}.json?count=1")) == [newest + 1]


def test_max_id_pages_through_the_whole_timeline_once(timed: DemoSite, clock: FakeClock) -> None:
    clock.advance(45)
    pages = [get_json(timed, "/api/timeline/fast.json")]
    while "next_max_id" in pages[-1]:
        pages.append(get_json(timed, f"/api/timeline/fast.json?max_id={pages[-1]['next_max_id']}"))
    assert [ids(page) for page in pages] == [list(range(45, 25, -1)), list(range(25, 5, -1)), [5, 4, 3, 2, 1]]
    assert [page.get("next_max_id") for page in pages] == [26, 6, None]


def test_count_and_since_id(timed: DemoSite, clock: FakeClock) -> None:
    clock.advance(1000)
    assert len(ids(get_json(timed, "/api/timeline/fast.json?count=1000"))) == 200
    assert ids(get_json(timed, "/api/timeline/fast.json?since_id=997")) == [1000, 999, 998]
    assert "next_max_id" not in get_json(timed, "/api/timeline/fast.json?since_id=997")
    assert get_json(timed, "/api/timeline/fast.json?since_id=990&count=5")["next_max_id"] == 996
    assert ids(get_json(timed, "/api/timeline/fast.json?max_id=1")) == []
    assert ids(get_json(timed, "/api/timeline/fast.json?max_id=5000&count=2")) == [1000, 999]


def test_listing_pages_follow_the_link_header_to_a_partial_last_page(timed: DemoSite) -> None:
    seen: list[int] = []
    path: str | None = "/api/list?per_page=20"
    pages = 0
    while path is not None:
        status, headers, body = get(timed, path)
        data = json.loads(body)
        pages += 1
        assert status == 200 and (data["page"], data["per_page"], data["total"]) == (pages, 20, LISTING_TOTAL)
        seen += [item["id"] for item in data["items"]]
        link = headers.get("link")
        match = re.fullmatch(r'<(http://127\.0\.0\.1:\d+)(/api/list\?page=\d+&per_page=20)>; rel="next"', link or "")
        assert (match is None) == (link is None) and (match is None or match[1] == timed.url)
        path = match[2] if match else None
    assert seen == list(range(1, LISTING_TOTAL + 1)) and pages == 5 and len(data["items"]) == 15
    past = get(timed, "/api/list?page=6&per_page=20")
    assert json.loads(past[2])["items"] == [] and "link" not in past[1]


def test_the_default_listing_page_has_ten_items(timed: DemoSite) -> None:
    status, headers, body = get(timed, "/api/list")
    assert [item["id"] for item in json.loads(body)["items"]] == list(range(1, 11))
    assert headers["link"] == f'<{timed.url}/api/list?page=2&per_page=10>; rel="next"'


def test_the_cursor_listing_ends_without_a_next_cursor(timed: DemoSite) -> None:
    seen: list[int] = []
    cursors: list[str] = []
    data = get_json(timed, "/api/cursor?per_page=30")
    while True:
        seen += ids(data)
        if "next_cursor" not in data:
            break
        cursor = data["next_cursor"]
        assert isinstance(cursor, str) and not cursor.isdigit()
        cursors.append(cursor)
        data = get_json(timed, f"/api/cursor?per_page=30&cursor={cursor}")
    assert seen == list(range(1, LISTING_TOTAL + 1)) and cursors == [cursor_token(n) for n in (30, 60, 90)]


@pytest.mark.parametrize("path", [
    "/api/timeline/fast.json?count=0", "/api/timeline/fast.json?count=x", "/api/timeline/fast.json?max_id=1.5",
    "/api/list?page=0", "/api/list?per_page=101", "/api/list?per_page=-1", "/api/cursor?cursor=!!!",
    "/api/cursor?cursor=" + cursor_token(0).upper(), "/api/cursor?cursor=Zm9vOjE", "/api/retry-after",
    "/api/retry-after?value=1%0d%0aSet-Cookie:%20x=1",
])
def test_malformed_queries_are_400(timed: DemoSite, path: str) -> None:
    assert get(timed, path)[0] == 400


@pytest.mark.parametrize("path", [
    "/api/timeline/fast.txt", "/api/timeline/a.b.json", "/api/timeline/.json", "/api/people/fast.json",
    "/api/timeline/fast.json/x", "/api/nothing", "/feed/fast.rss", "/feed/a%20b.xml", "/post/fast/1",
    "/post/fast/x", "/s/a-b", "/s/" + "1" * 65,
])
def test_outside_the_api_is_404(timed: DemoSite, path: str) -> None:
    assert get(timed, path)[0] == 404


def test_posts_exist_once_published(timed: DemoSite, clock: FakeClock) -> None:
    assert get(timed, "/post/slow/1")[0] == 404
    clock.advance(60)
    status, _, body = get(timed, "/post/slow/1")
    assert status == 200 and b"<h1>slow #1</h1>" in body and get(timed, "/post/slow/2")[0] == 404


def test_rss_and_atom_list_the_twenty_newest_posts(timed: DemoSite, clock: FakeClock) -> None:
    clock.advance(250)
    status, headers, body = get(timed, "/feed/bob.xml")
    assert status == 200 and headers["content-type"] == "application/rss+xml; charset=utf-8"
    items = ElementTree.fromstring(body).findall("./channel/item")
    assert [item.findtext("guid") for item in items] == [f"urn:scrapekit-demo:bob:{n}" for n in range(25, 5, -1)]
    newest = items[0]
    assert newest.findtext("title") == "bob #25" and newest.findtext("link") == f"{timed.url}/post/bob/25"
    assert parsedate_to_datetime(newest.findtext("pubDate") or "").timestamp() == TIMELINE_EPOCH + 250
    status, headers, body = get(timed, "/feed/bob.atom")
    assert status == 200 and headers["content-type"] == "application/atom+xml; charset=utf-8"
    entries = ElementTree.fromstring(body).findall(f"{ATOM}entry")
    assert [e.findtext(f"{ATOM}id") for e in entries] == [item.findtext("guid") for item in items]
    assert entries[0].find(f"{ATOM}link").get("href") == f"{timed.url}/post/bob/25"
    assert entries[0].findtext(f"{ATOM}published") == "2027-01-15T08:04:10+00:00"


def test_a_feed_grows_and_keeps_each_posts_guid(timed: DemoSite, clock: FakeClock) -> None:
    def guids() -> dict[str, str | None]:
        items = ElementTree.fromstring(get(timed, "/feed/slow.xml")[2]).findall("./channel/item")
        return {item.findtext("guid") or "": item.findtext("pubDate") for item in items}

    assert guids() == {}
    clock.advance(120)
    before = guids()
    clock.advance(60 * 18)
    full = guids()
    clock.advance(60)
    after = guids()
    assert len(before) == 2 and len(full) == 20 and before.items() <= full.items()
    assert set(after) - set(full) == {"urn:scrapekit-demo:slow:21"}
    assert set(full) - set(after) == {"urn:scrapekit-demo:slow:1"}


@pytest.mark.parametrize(("code", "status"), [
    ("0", 301), ("3", 301), ("4", 404), ("z", 404), ("A", 301), ("10", 404), ("11", 301), ("Zz", 404),
    ("ZZ", 301), ("1" * 64, 301),
])
def test_the_shortener_redirects_codes_divisible_by_three(timed: DemoSite, code: str, status: int) -> None:
    value = short_code_value(code)
    assert value is not None and (value % 3 == 0) == (status == 301)
    location = f"https://example.org/target/{code}" if status == 301 else None
    for method in ("GET", "HEAD"):
        got, headers, body = get(timed, f"/s/{code}", method)
        assert (got, headers.get("location")) == (status, location)
        assert (body == b"") == (method == "HEAD" or status == 301)


def test_short_code_values() -> None:
    assert [short_code_value(c) for c in ("0", "9", "a", "Z", "10", "zz")] == [0, 9, 10, 61, 62, 35 * 62 + 35]
    assert [short_code_value(c) for c in ("", "a b", "é", "1" * 65)] == [None, None, None, None]


def test_the_bad_input_routes(timed: DemoSite) -> None:
    status, headers, body = get(timed, "/api/broken.json")
    assert status == 200 and headers["content-type"] == "application/json"
    with pytest.raises(json.JSONDecodeError):
        json.loads(body)
    items = get_json(timed, "/api/missing-id.json")["items"]
    assert isinstance(items, list) and len(items) == 3 and not any(isinstance(i.get("id"), int) for i in items)
    status, headers, body = get(timed, "/feed/not-xml.xml")
    assert status == 200 and headers["content-type"].startswith("application/rss+xml")
    assert body.startswith(b"<!DOCTYPE html>")
    with pytest.raises(ElementTree.ParseError):
        ElementTree.fromstring(body)


@pytest.mark.parametrize("value", ["-5", "999999999", "soon", "Wed, 21 Oct 2015 07:28:00 GMT", "0"])
def test_retry_after_passes_the_value_through(timed: DemoSite, value: str) -> None:
    status, headers, _ = get(timed, "/api/retry-after?value=" + value.replace(" ", "%20"))
    assert (status, headers["retry-after"]) == (503, value)


@pytest.mark.parametrize("path", ["/api/timeline/fast.json?count=2", "/api/list?page=2", "/api/cursor",
                                  "/feed/fast.xml", "/feed/fast.atom", "/feed/not-xml.xml", "/post/fast/3",
                                  "/api/broken.json", "/api/retry-after?value=7", "/s/3", "/s/4"])
def test_head_answers_the_api_like_get_without_a_body(timed: DemoSite, clock: FakeClock, path: str) -> None:
    clock.advance(5)
    get_status, get_headers, get_body = get(timed, path)
    head_status, head_headers, head_body = get(timed, path, "HEAD")
    assert (head_status, head_body) == (get_status, b"") and get_status in (200, 301, 404, 503)
    assert {k: v for k, v in head_headers.items() if k != "date"} == \
           {k: v for k, v in get_headers.items() if k != "date"}
    assert int(get_headers["content-length"]) == len(get_body)


def test_two_sites_on_one_clock_serve_the_same_timeline(timed: DemoSite, clock: FakeClock) -> None:
    clock.advance(777)
    with DemoSite() as other:
        other.now = clock.time
        for path in ("/api/timeline/bob.json?count=50", "/api/cursor?per_page=7", "/api/timeline/rare.json"):
            assert get(other, path)[2] == get(timed, path)[2]
