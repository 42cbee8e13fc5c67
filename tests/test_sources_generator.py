"""The generator source: every code once in either order, resuming, shards, alphabets, errors,
and a recipe run against the local site."""

from __future__ import annotations

import http.client
import string
from collections import Counter
from pathlib import Path

import pytest

from scrapekit import RecipeError, ScrapekitError
from scrapekit.demo.site import DemoSite
from scrapekit.recipe import load_recipe
from scrapekit.runner import Runner, build
from scrapekit.sources.generator import FeistelPermutation, GeneratorSource, Order, code_value, format_code
from scrapekit.stores.chunked import read_tsv

URL = "http://127.0.0.1:8765/s/{code}"
BASE62 = string.digits + string.ascii_uppercase + string.ascii_lowercase


def codes_of(source: GeneratorSource, position: str | None = None) -> list[str]:
    return [request.url.rsplit("/", 1)[1] for request, _ in source.requests(position)]


def test_sequential_gives_every_code_of_the_range_once_in_value_order() -> None:
    source = GeneratorSource(URL, start="0", stop="zz")
    codes = codes_of(source)
    assert len(codes) == len(set(codes)) == 61 * 62 + 61 == source.count
    assert codes[:11] == [*"0123456789", "A"]
    assert codes[60:64] == ["y", "z", "10", "11"]
    assert codes[-1] == "zy"
    assert [code_value(code, "base62") for code in codes] == list(range(len(codes)))


def test_requests_are_keyed_by_canonical_url_with_the_kind_asked() -> None:
    source = GeneratorSource("HTTP://Example.COM:80/s/{code}?b=2&a=1", start="aB", stop="aD", kind="page")
    got = list(source.requests(None))
    assert [(r.url, r.key, r.kind, position) for r, position in got] == [
        ("HTTP://Example.COM:80/s/aB?b=2&a=1", "http://example.com/s/aB?a=1&b=2", "page", "1"),
        ("HTTP://Example.COM:80/s/aC?b=2&a=1", "http://example.com/s/aC?a=1&b=2", "page", "2")]
    assert next(GeneratorSource(URL, length=1).requests(None))[0].kind == "head"


def test_random_order_is_a_permutation_fixed_by_the_seed() -> None:
    sequential = codes_of(GeneratorSource(URL, start="0", stop="zz"))
    shuffled = codes_of(GeneratorSource(URL, start="0", stop="zz", order="random", seed=7))
    assert len(shuffled) == len(set(shuffled)) == len(sequential)
    assert set(shuffled) == set(sequential)
    assert shuffled != sequential
    # Not merely rotated or reversed: few neighbours of the sequential order stay neighbours.
    pairs = set(zip(sequential, sequential[1:]))
    assert sum(pair in pairs for pair in zip(shuffled, shuffled[1:])) < len(shuffled) // 20
    assert codes_of(GeneratorSource(URL, start="0", stop="zz", order="random", seed=7)) == shuffled
    assert codes_of(GeneratorSource(URL, start="0", stop="zz", order="random", seed=8)) != shuffled


@pytest.mark.parametrize("size", [*range(0, 70), 255, 256, 257, 1000, 4097])
def test_feistel_permutation_is_a_bijection_of_the_range(size: int) -> None:
    permutation = FeistelPermutation(size, seed=size)
    assert sorted(permutation(i) for i in range(size)) == list(range(size))
    with pytest.raises(IndexError):
        permutation(size)


def test_a_huge_random_range_starts_at_once_anywhere_in_constant_memory() -> None:
    source = GeneratorSource(URL, length=8, order="random", seed=3)
    assert source.count == 62**8
    requests = source.requests(str(10**12))
    first = [next(requests) for _ in range(2000)]
    codes = [request.url.rsplit("/", 1)[1] for request, _ in first]
    assert len(set(codes)) == 2000 and all(len(code) == 8 for code in codes)
    assert [position for _, position in first[:2]] == [str(10**12 + 1), str(10**12 + 2)]


@pytest.mark.parametrize("order", ["sequential", "random"])
def test_resuming_from_a_saved_position_gives_exactly_the_rest(order: Order) -> None:
    source = GeneratorSource(URL, start="0", stop="zz", order=order, seed=1)
    whole = list(source.requests(None))
    codes = [request.url for request, _ in whole]
    for middle in (0, 1, 1234, len(whole) - 1):
        position = whole[middle][1]  # saved after the request at ``middle`` was queued
        assert [request.url for request, _ in source.requests(position)] == codes[middle + 1:]
    assert list(source.requests(whole[-1][1])) == []
    assert list(source.requests("0")) == whole


def test_a_position_that_cannot_be_this_sources_is_an_error() -> None:
    source = GeneratorSource(URL, start="0", stop="10")
    for position in ("63", "-1", "x", "1:2"):
        with pytest.raises(ScrapekitError, match="saved position"):
            next(source.requests(position))


@pytest.mark.parametrize(("order", "shards"), [("sequential", 3), ("random", 3), ("random", 7), ("sequential", 5000)])
def test_shards_split_the_range_exactly_by_index(order: Order, shards: int) -> None:
    whole = codes_of(GeneratorSource(URL, start="0", stop="zz"))
    index = {code: i for i, code in enumerate(whole)}
    parts = [codes_of(GeneratorSource(URL, start="0", stop="zz", order=order, seed=4, shard=i, shards=shards))
             for i in range(shards)]
    assert sum(len(part) for part in parts) == len(whole)
    assert Counter(code for part in parts for code in part) == Counter(whole)
    for i, part in enumerate(parts):
        assert all(index[code] % shards == i for code in part)


def test_a_shard_resumes_within_its_own_codes() -> None:
    source = GeneratorSource(URL, start="0", stop="zz", order="random", shard=2, shards=3)
    whole = list(source.requests(None))
    assert len(whole) == source.count == len(range(2, 3843, 3))
    assert [r.url for r, _ in source.requests(whole[99][1])] == [r.url for r, _ in whole[100:]]


def test_base36_and_base62_codes() -> None:
    base36 = codes_of(GeneratorSource(URL, alphabet="base36", start="0", stop="100"))
    assert len(base36) == 36 * 36 and base36[9:11] == ["9", "a"] and base36[35:37] == ["z", "10"]
    assert set("".join(base36)) == set(string.digits + string.ascii_lowercase)
    base62 = codes_of(GeneratorSource(URL, start="0", stop="100"))
    assert len(base62) == 62 * 62 and base62[35:37] == ["Z", "a"] and base62[61:63] == ["z", "10"]
    assert set("".join(base62)) == set(BASE62)
    assert code_value("zz", "base36") == 36 * 36 - 1 and code_value("zz", "base62") == 62 * 62 - 1
    assert format_code(61, "base62") == "z" and format_code(35, "base36", width=3) == "00z"


def test_length_gives_every_code_of_exactly_that_length() -> None:
    codes = codes_of(GeneratorSource(URL, alphabet="base36", length=2, order="random"))
    assert len(codes) == len(set(codes)) == 36 * 36
    assert all(len(code) == 2 for code in codes)
    assert {"00", "0z", "zz"} <= set(codes)


def test_a_start_with_leading_zeros_keeps_codes_that_long() -> None:
    assert codes_of(GeneratorSource(URL, start="00Y", stop="011"))[:4] == ["00Y", "00Z", "00a", "00b"]
    assert codes_of(GeneratorSource(URL, start="00y", stop="011")) == ["00y", "00z", "010"]


@pytest.mark.parametrize(("options", "message"), [
    ({"start": "zz", "stop": "10"}, "start 'zz' must come before stop '10'"),
    ({"start": "5", "stop": "5"}, "must come before"),
    ({"start": "0", "stop": "0000"}, "must come before"),
    ({"start": "0", "stop": "a-b"}, "code 'a-b' has '-', which is not a base62 digit"),
    ({"start": "A", "stop": "zz", "alphabet": "base36"}, "'A', which is not a base36 digit (0-9 a-z)"),
    ({"start": "", "stop": "zz"}, "a code cannot be empty"),
    ({"start": "0"}, "give start and stop"),
    ({}, "give start and stop"),
    ({"length": 3, "start": "0", "stop": "z"}, "either length or start and stop"),
    ({"length": 0}, "length must be 1 or more"),
    ({"length": 2, "template": "http://127.0.0.1/s/"}, "template must contain {code}"),
    ({"length": 2, "template": "ftp://127.0.0.1/{code}"}, "does not give a URL to fetch: not an http"),
    ({"length": 2, "template": "http://{code}.example.com/"}, "same URL key for different codes"),
    ({"length": 2, "template": "http://127.0.0.1/?sid={code}"}, "same URL key for different codes"),
    ({"length": 2, "shard": 3, "shards": 3}, "shard must be from 0 to shards - 1"),
    ({"length": 2, "shards": 0}, "shard must be from 0"),
    ({"length": 2, "order": "shuffled"}, "order must be one of sequential, random"),
    ({"length": 2, "kind": "video"}, "kind must be one of"),
])
def test_bad_options_are_value_errors_that_say_what_is_wrong(options: dict[str, object], message: str) -> None:
    options = {"template": URL, **options}
    with pytest.raises(ValueError) as info:
        GeneratorSource(**options)  # type: ignore[arg-type]
    assert message in str(info.value)


def test_base36_codes_may_sit_in_the_host_name() -> None:
    source = GeneratorSource("http://{code}.example.com/", alphabet="base36", start="a", stop="c")
    assert [r.key for r, _ in source.requests(None)] == ["http://a.example.com/", "http://b.example.com/"]


# -- recipes ----------------------------------------------------------------------------------

def write_recipe(tmp_path: Path, source: str, extra: str = "") -> Path:
    path = tmp_path / "r.yaml"
    path.write_text(f"name: t\nwork_dir: work\nsource: {source}\n{extra}")
    return path


def test_a_recipe_names_the_generator_source(tmp_path: Path) -> None:
    path = write_recipe(tmp_path, f'{{type: generator, template: "{URL}", start: "0", stop: "zz", order: random, seed: 5}}')
    recipe = load_recipe(path)
    assert recipe.source.type == "generator" and recipe.source.cls is GeneratorSource
    assert dict(recipe.source.options) == {"template": URL, "start": "0", "stop": "zz", "order": "random", "seed": 5}
    source = build(recipe.source, recipe)
    assert isinstance(source, GeneratorSource) and source.count == 3843


def test_recipe_errors_name_the_line_and_key(tmp_path: Path) -> None:
    path = write_recipe(tmp_path, f'\n  type: generator\n  template: "{URL}"\n  length: 2\n  alphabet: base64\n')
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    assert str(info.value).startswith(f"{path}:7: source.alphabet: expected one of base36, base62")
    path = write_recipe(tmp_path, f'\n  type: generator\n  template: "{URL}"\n  start: "z"\n  stop: "a"\n')
    recipe = load_recipe(path)
    with pytest.raises(RecipeError) as info:
        build(recipe.source, recipe)
    assert str(info.value).startswith(f"{path}:4: source: start 'z' must come before stop 'a'")


def _has_shortener(site: DemoSite) -> bool:
    """Whether the site serves /s/<code> yet: 300 is base-62 for 11532, a multiple of 3."""
    connection = http.client.HTTPConnection("127.0.0.1", site.port, timeout=5)
    try:
        connection.request("HEAD", "/s/300")
        return connection.getresponse().status == 301
    finally:
        connection.close()


def test_a_run_writes_one_page_record_per_code(tmp_path: Path, site: DemoSite) -> None:
    route = "s" if _has_shortener(site) else "page"
    template = f"{site.url}/{route}/{{code}}"
    path = write_recipe(tmp_path, f'{{type: generator, template: "{template}", start: "0", stop: "3E", order: random}}',
                        "fetch: {type: head, concurrency: 4}\npoliteness: {allow_private: true, robots: false}\n")
    assert Runner(load_recipe(path)).run() == "done"
    rows = [row for chunk in sorted((tmp_path / "work" / "t" / "out").glob("*/*.tsv")) for row in read_tsv(chunk)]
    codes = [format_code(value, "base62") for value in range(code_value("3E", "base62"))]
    assert len(codes) == 200
    assert sorted(row.url for row in rows) == sorted(template.replace("{code}", code) for code in codes)
    assert all(row.kind == "head" for row in rows)
    assert all(site.hits[f"/{route}/{code}"] == 1 for code in codes)
    status = {row.url.rsplit("/", 1)[1]: row for row in rows}
    digits_only = [code for code in codes if code.isdigit()]  # the same value whatever the letters' order
    assert len(digits_only) == 40
    if route == "s":
        assert {row.status for row in rows} == {301, 404}
        assert all((status[code].status == 301) == (code_value(code, "base62") % 3 == 0) for code in digits_only)
        assert all(row.meta["location"] for row in rows if row.status == 301)
    else:
        assert all(status[code].status == (200 if code.isdigit() else 404) for code in codes)
