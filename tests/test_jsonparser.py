"""The json parser and its helpers on responses made by hand and on the demo site's API, and its
recipe options."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scrapekit import RecipeError, Request, Response
from scrapekit.demo.site import DemoSite
from scrapekit.fetchers import HttpFetcher
from scrapekit.jsonparser import JsonParser, decode_json, json_values
from scrapekit.recipe import load_recipe
from scrapekit.runner import build
from tests.conftest import FakeClock

API_URL = "http://api.example.org/v1/timeline.json?user=ada"
KEY = "http://api.example.org/v1/timeline.json?user=ada"
DOC = {
    "items": [
        {"id": 7, "text": "seven", "user": {"name": "ada"}, "url": "/posts/7"},
        {"id": "x8", "text": "eight", "tags": ["a", "b"], "url": "https://other.example.net/p/8#top"},
        {"text": "no id", "url": "javascript:alert(1)"},
    ],
    "next": "?user=ada&max_id=7",
}


def response(body: bytes | str | object, url: str = API_URL, final_url: str = "", depth: int = 0,
             truncated: bool = False) -> Response:
    if isinstance(body, str):
        data = body.encode()
    elif isinstance(body, bytes):
        data = body
    else:
        data = json.dumps(body).encode()
    return Response(Request(url, depth=depth), 200, "OK", {"content-type": "application/json"}, data,
                    url=final_url, truncated=truncated, fetched_at=1_800_000_000.0)


def fields_of(parser: JsonParser, body: object) -> list[dict[str, Any]]:
    items, _ = parser.parse(response(body))
    return [dict(item.fields) for item in items]


def test_each_and_fields_pick_the_first_match_or_none() -> None:
    parser = JsonParser({"each": "$.items[*]", "fields": {"id": "$.id", "name": "$.user.name", "tag": "tags[*]"}})
    items, links = parser.parse(response(DOC))
    assert [dict(i.fields) for i in items] == [
        {"id": 7, "name": "ada", "tag": None},
        {"id": "x8", "name": None, "tag": "a"},
        {"id": None, "name": None, "tag": None},
    ]
    assert [(i.url, i.scraped_at) for i in items] == [(API_URL, 1_800_000_000.0)] * 3
    assert links == []


def test_keys_use_the_id_field_else_the_items_index() -> None:
    items, _ = JsonParser({"each": "$.items[*]", "fields": {"id": "$.id", "text": "$.text"}}).parse(response(DOC))
    assert [i.key for i in items] == [f"{KEY}#7", f"{KEY}#x8", f"{KEY}#2"]
    odd = {"items": [{"id": True}, {"id": 1.5}, {"id": ""}, {"id": [1]}, {"id": 0}, {"id": None}]}
    items, _ = JsonParser({"each": "$.items[*]"}).parse(response(odd))
    assert [i.key.rpartition("#")[2] for i in items] == ["0", "1", "2", "3", "0", "5"]


def test_without_fields_each_selected_object_is_the_item_whole() -> None:
    assert fields_of(JsonParser({"each": "$.items[*]"}), DOC) == DOC["items"]
    assert fields_of(JsonParser({"each": "$.items[*].text"}), DOC) == [
        {"value": "seven"}, {"value": "eight"}, {"value": "no id"}]


def test_without_items_the_whole_document_is_one_item() -> None:
    for parser in (JsonParser(), JsonParser({}), JsonParser({"fields": {"next": "next"}})):
        (item,), _ = parser.parse(response(DOC))
        assert item.key == f"{KEY}#0"
    assert fields_of(JsonParser(), DOC) == [DOC]
    assert fields_of(JsonParser({"fields": {"next": "next"}}), DOC) == [{"next": "?user=ada&max_id=7"}]
    assert fields_of(JsonParser(), [1, 2]) == [{"value": [1, 2]}]
    assert [i.key for i in JsonParser().parse(response({"id": 42, "a": 1}))[0]] == [f"{KEY}#42"]


def test_extended_paths_filter_and_sort() -> None:
    parser = JsonParser({"each": "$.items[?(@.score > 2)]", "fields": {"id": "id"}})
    doc = {"items": [{"id": 1, "score": 3}, {"id": 2, "score": 1}, {"id": 3, "score": "high"}, {"id": 4, "score": 5}]}
    assert fields_of(parser, doc) == [{"id": 1}, {"id": 4}]
    assert json_values("$.items[/id][*].id")({"items": [{"id": 3}, {"id": 1}, {"id": 2}]}) == [1, 2, 3]


def test_a_path_that_matches_nothing_gives_no_items() -> None:
    parser = JsonParser({"each": "$.items[*]", "fields": {"id": "$.id"}}, links="$..url")
    for document in ({"other": []}, {"items": 5}, "text", 12, [], {}):
        assert parser.parse(response(document)) == ([], [])


def test_links_resolve_against_the_final_url_each_once_one_level_deeper() -> None:
    parser = JsonParser({"each": "$.nothing"}, links="$..url")
    doc = {**DOC, "more": [{"url": "/posts/7"}, {"url": 7}, {"url": None}, {"url": "mailto:a@b.c"}, {"url": ""}]}
    items, links = parser.parse(response(doc, final_url="https://api.example.org/v2/", depth=2))
    assert items == []
    assert [r.url for r in links] == ["https://api.example.org/posts/7", "https://other.example.net/p/8",
                                      "https://api.example.org/v2/"]
    assert {(r.kind, r.depth, r.key == r.url, dict(r.meta)["parent"]) for r in links} == {("page", 3, True, KEY)}
    _, (link,) = JsonParser(links="$.next").parse(response(DOC))
    assert link.url == "http://api.example.org/v1/timeline.json?max_id=7&user=ada"


@pytest.mark.parametrize("body", [
    b"", b"   \n", b"not json", b'{"items": [{"id": 1}', b"\xff\xfe{\x00}\x00", b'{"text": "caf\xe9"}',
    b'{"a": NaN}', b"[Infinity]", b"[" * 100_000 + b"]" * 100_000, b"1" * 5000, b"null", b"<html></html>",
])
def test_bad_bodies_give_nothing_and_one_info_line(body: bytes, caplog: pytest.LogCaptureFixture) -> None:
    parser = JsonParser({"each": "$.items[*]", "fields": {"id": "$.id"}}, links="$..url")
    with caplog.at_level(logging.INFO, logger="scrapekit.jsonparser"):
        assert parser.parse(response(body)) == ([], [])
    (record,) = caplog.records
    assert record.levelno == logging.INFO and API_URL in record.getMessage()


def test_a_truncated_body_is_logged_as_truncated(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="scrapekit.jsonparser"):
        assert JsonParser().parse(response(b'{"items": [1, 2', truncated=True)) == ([], [])
    assert "truncated" in caplog.text


def test_decode_json() -> None:
    assert decode_json(response(b'\xef\xbb\xbf{"a": "caf\xc3\xa9"}')) == {"a": "café"}
    assert decode_json(response(b" [1, 2.5, true] ")) == [1, 2.5, True]
    for bad in (b"", b"{", b'"\xff"', b"NaN", "[1]".encode("utf-16"), b"[" * 10_000):
        assert decode_json(response(bad)) is None


def test_json_values_is_compiled_once_and_reusable() -> None:
    ids = json_values("$.items[*].id")
    assert ids({"items": [{"id": 3}, {"id": 1}, {"x": 2}]}) == [3, 1]
    assert ids({"items": []}) == [] and ids(None) == [] and ids("text") == []
    assert json_values("$")({"a": 1}) == [{"a": 1}]


@pytest.mark.parametrize("path", ["$[", "", "$.items[?(@.a ==)]", "$.`nosuchfunction`", "$..", "a b",
                                  "$.a.`sub(/(/, x)`"])
def test_a_bad_path_is_a_value_error_naming_where(path: str) -> None:
    with pytest.raises(ValueError, match=r"^paginate\.id_path: bad JSON path "):
        json_values(path, "paginate.id_path")


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(["id", "a", "items", "url"]), inner, max_size=4),
                    max_leaves=30)
PATHS = ["$.items[*].id", "$..id", "$.items[/id]", "$.items[?(@.id > 2)]", "$.items[*].a.`sub(/x/, y)`",
         "$.items.`len`", "$.a[-1:]", "$.items[?(@.a =~ '(')]", "$..url.`split(/, 0, -1)`", "$[*][*]"]


@settings(max_examples=300, deadline=None)
@given(document=JSON)
def test_json_values_never_raise_for_any_document(document: object) -> None:
    for path in PATHS:
        assert isinstance(json_values(path)(document), list)


def test_deep_documents_are_searched() -> None:
    deep = json.loads('{"a":' * 900 + '{"id": 1}' + "}" * 900)
    assert json_values("$..id")(deep) == [1]
    assert json_values("$..id")([[[[{"id": 5}]]]]) == [5]


@pytest.mark.parametrize(("spec", "links", "message"), [
    ({"each": "$["}, None, r"^items\.each: bad JSON path '\$\['"),
    ({"each": "$.items[*]", "fields": {"id": "$..["}}, None, r"^items\.fields\.id: bad JSON path"),
    ({"each": "$.items[*]", "fields": {"id": 5}}, None, r"^items\.fields\.id: expected a JSON path string"),
    ({"each": ["$"]}, None, r"^items\.each: expected a JSON path string"),
    ({"each": "$", "fields": ["id"]}, None, r"^items\.fields: expected a mapping"),
    ({"each": "$", "field": {}}, None, r"^items: unknown key 'field'; known: each, fields"),
    (None, "$[?", r"^links: bad JSON path"),
])
def test_bad_options_are_refused_when_built(spec: dict[str, Any] | None, links: str | None, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        JsonParser(spec, links)


# -- on the demo site ------------------------------------------------------------------------


@pytest.fixture
def fetcher() -> Any:
    with HttpFetcher(allow_private=True) as fetcher:
        yield fetcher


def test_the_demo_timeline_gives_one_item_per_post_and_its_links(site: DemoSite, clock: FakeClock,
                                                                 fetcher: HttpFetcher) -> None:
    site.now = clock.time
    clock.advance(25)
    url = f"{site.url}/api/timeline/fast.json?count=5"
    parser = JsonParser({"each": "$.items[*]", "fields": {"id": "$.id", "text": "$.text"}}, links="$.items[*].url")
    response = fetcher.fetch(Request(url))
    assert response.ok
    items, links = parser.parse(response)
    assert [i.key for i in items] == [f"{url}#{n}" for n in range(25, 20, -1)]
    assert items[0].fields["text"].startswith("fast #25: ")
    assert [r.url for r in links] == [f"{site.url}/post/fast/{n}" for n in range(25, 20, -1)]
    assert all(fetcher.fetch(r).status == 200 for r in links[:2])
    clock.advance(3)
    newer, _ = parser.parse(fetcher.fetch(Request(url)))
    assert [i.key for i in newer][:4] == [f"{url}#{n}" for n in (28, 27, 26, 25)]


def test_the_demo_bad_input_routes(site: DemoSite, fetcher: HttpFetcher, caplog: pytest.LogCaptureFixture) -> None:
    parser = JsonParser({"each": "$.items[*]", "fields": {"id": "$.id", "text": "$.text"}})
    url = f"{site.url}/api/missing-id.json"
    items, _ = parser.parse(fetcher.fetch(Request(url)))
    assert [i.key for i in items] == [f"{url}#0", f"{url}#1", f"{url}#2"]
    assert [i.fields["text"] for i in items] == ["no id here", "a null id", "an id in a list"]
    with caplog.at_level(logging.INFO, logger="scrapekit.jsonparser"):
        assert parser.parse(fetcher.fetch(Request(f"{site.url}/api/broken.json"))) == ([], [])
        assert parser.parse(fetcher.fetch(Request(f"{site.url}/feed/not-xml.xml"))) == ([], [])
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == [
        f"no JSON document in {site.url}/api/broken.json", f"no JSON document in {site.url}/feed/not-xml.xml"]


def test_the_demo_listing_pages_by_cursor(site: DemoSite, fetcher: HttpFetcher) -> None:
    parser = JsonParser({"each": "$.items[*]", "fields": {"id": "id"}})
    next_cursor = json_values("$.next_cursor")
    url, seen = f"{site.url}/api/cursor?per_page=40", []
    while True:
        response = fetcher.fetch(Request(url))
        seen += [i.fields["id"] for i in parser.parse(response)[0]]
        cursor = next_cursor(decode_json(response))
        if not cursor:
            break
        url = f"{site.url}/api/cursor?per_page=40&cursor={cursor[0]}"
    assert seen == list(range(1, 96))


# -- in a recipe -----------------------------------------------------------------------------


def write_recipe(tmp_path: Path, parse: str) -> Path:
    (tmp_path / "urls.txt").write_text("http://127.0.0.1:1/api/timeline/fast.json\n")
    path = tmp_path / "r.yaml"
    path.write_text(f"source: {{type: flat_file, path: urls.txt}}\nparse:\n{parse}")
    return path


def test_a_recipe_builds_a_json_parser_from_its_options(tmp_path: Path) -> None:
    path = write_recipe(tmp_path, '  type: json\n  items: {each: "$.items[*]", fields: {id: "$.id", text: "$.text"}}\n'
                                  '  links: "$.items[*].url"\n')
    recipe = load_recipe(path)
    assert recipe.parse is not None and recipe.parse.cls is JsonParser
    assert dict(recipe.parse.options) == {"items": {"each": "$.items[*]", "fields": {"id": "$.id", "text": "$.text"}},
                                          "links": "$.items[*].url"}
    parser = build(recipe.parse, recipe)
    items, links = parser.parse(response({"items": [{"id": 1, "text": "t", "url": "/p/1"}]}))
    assert [(i.key, dict(i.fields)) for i in items] == [(f"{KEY}#1", {"id": 1, "text": "t"})]
    assert [r.url for r in links] == ["http://api.example.org/p/1"]


@pytest.mark.parametrize(("parse", "line", "message"), [
    ('  type: json\n  items: {each: "$.items[", fields: {id: "$.id"}}\n', 3,
     "parse: items.each: bad JSON path '$.items['"),
    ('  type: json\n  items:\n    each: "$.items[*]"\n    fields: {id: "$.id["}\n', 3,
     "parse: items.fields.id: bad JSON path '$.id['"),
    ('  type: json\n  links: "$..[?"\n', 3, "parse: links: bad JSON path"),
])
def test_a_bad_json_path_is_a_recipe_error_with_file_and_line(tmp_path: Path, parse: str, line: int,
                                                               message: str) -> None:
    path = write_recipe(tmp_path, parse)
    recipe = load_recipe(path)  # paths are checked when the parser is built, as `scrapekit check` does
    assert recipe.parse is not None
    with pytest.raises(RecipeError) as info:
        build(recipe.parse, recipe)
    assert str(info.value).startswith(f"{path}:{line}: {message}")


@pytest.mark.parametrize(("parse", "message"), [
    ("  type: json\n  items: [each]\n", "parse.items: expected a mapping"),
    ("  type: json\n  links: {a: b}\n", "parse.links: expected a string"),
    ("  type: json\n  itmes: {}\n", "parse.itmes: unknown key (did you mean 'items'?)"),
])
def test_a_bad_json_option_names_file_line_and_key(tmp_path: Path, parse: str, message: str) -> None:
    path = write_recipe(tmp_path, parse)
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    assert str(info.value).splitlines()[0].startswith(f"{path}:4: {message}")
