"""The key store on real LevelDB files: records by key, written at flush, counted, reopened."""

from __future__ import annotations

import json

import base64
from pathlib import Path

import pytest

from scrapekit import RecipeError, StoreError
from scrapekit.model import Item, Request, Response
from scrapekit.recipe import load_recipe
from scrapekit.runner import build
from scrapekit.sources.leveldb import LevelDbQueue
from scrapekit.state import StateDB
from scrapekit.stores.keyvalue import LevelDbStore

WHEN = 1_800_000_000.0  # 2027-01-15 08:00:00 UTC


def item(key: str, **fields: object) -> Item:
    return Item(fields, f"http://a.test/{key}", key, WHEN)


def page(url: str, body: bytes = b"<p>hi</p>", status: int = 200, **kwargs: object) -> Response:
    return Response(Request(url), status, body=body, fetched_at=WHEN, **kwargs)  # type: ignore[arg-type]


def test_items_are_kept_under_their_key_once_flushed(tmp_path: Path) -> None:
    with StateDB(tmp_path / "state") as state:
        store = LevelDbStore(state, "t")
        assert store.records == "items"
        store.write(item("b", title="B", price=2))
        store.write(item("a", title="A", tags=["x", "y"]))
        assert store.get("a") is None and "a" not in store and len(store) == 0  # buffered until flush
        store.flush()
        assert store.get("a") == {"title": "A", "tags": ["x", "y"], "_url": "http://a.test/a",
                                  "_scraped_at": "20270115080000"}
        assert "a" in store and "b" in store and "c" not in store and 5 not in store
        assert len(store) == 2
        assert [key for key, _ in store.items()] == ["a", "b"]
        assert store.get("c") is None


def test_a_page_record_keeps_status_reason_some_headers_and_the_body(tmp_path: Path) -> None:
    with StateDB(tmp_path / "state") as state:
        store = LevelDbStore(state, "t", records="pages")
        headers = {"Content-Type": "text/html; charset=utf-8", "Set-Cookie": "id=1", "ETag": '"v1"'}
        store.write(page("http://A.test/x?b=1&a=2", headers=headers))
        store.write(page("http://a.test/gone", b"", 404, error="not_found"))
        store.write(page("http://a.test/moved", b"", 301, headers={"Location": "/new"}, truncated=True))
        store.flush()
        assert store.get("http://a.test/x?a=2&b=1") == {
            "url": "http://A.test/x?b=1&a=2", "status": 200, "reason": "OK",
            "headers": {"content-type": "text/html; charset=utf-8", "etag": '"v1"'},
            "fetched_at": "20270115080000", "body": "<p>hi</p>"}
        gone = store.get("http://a.test/gone")
        assert gone is not None and (gone["status"], gone["reason"], gone["body"]) == (404, "not_found", "")
        moved = store.get("http://a.test/moved")
        assert moved is not None and moved["headers"] == {"location": "/new"} and moved["truncated"] is True


def test_bytes_and_unicode_come_back_exactly(tmp_path: Path) -> None:
    binary = bytes(range(256)) + b"caf\xe9"
    text = "naïve 東京 🚀 \u2028 \\ \" \t\n"
    with StateDB(tmp_path / "state") as state:
        store = LevelDbStore(state, "t")
        store.write(page("http://a.test/bin", binary))
        store.write(page("http://a.test/text", text.encode()))
        store.write(item("ключ 🔑", text=text, lone="\udcff", raw=b"\x00\xff"))
        store.flush()
        stored = store.get("http://a.test/bin")
        assert stored is not None and "body" not in stored
        assert base64.b64decode(stored["body_base64"]) == binary
        stored = store.get("http://a.test/text")
        assert stored is not None and stored["body"].encode() == text.encode() and "body_base64" not in stored
        stored = store.get("ключ 🔑")
        assert stored is not None and stored["text"] == text and stored["lone"] == "\udcff"
        assert stored["raw"] == str(b"\x00\xff")  # what JSON cannot hold is kept as its str, as in jsonl
        assert [key for key, _ in store.items("ключ")] == ["ключ 🔑"]


def test_writing_a_key_again_overwrites_it_and_counts_it_once(tmp_path: Path) -> None:
    with StateDB(tmp_path / "state") as state:
        store = LevelDbStore(state, "t")
        store.write(item("k", v=1))
        store.write(item("k", v=2))  # twice in one batch
        store.flush()
        assert len(store) == 1 and store.get("k") == {"v": 2, "_url": "http://a.test/k", "_scraped_at": "20270115080000"}
        before = dict(store.items())
        store.write(item("k", v=2))  # a job done again after a crash writes the same record
        store.write(item("j", v=3))
        store.flush()
        assert len(store) == 2 and dict(store.items())["k"] == before["k"]
        store.flush()  # nothing buffered: nothing changes
        assert len(store) == 2


def test_the_records_and_the_count_survive_a_reopen(tmp_path: Path) -> None:
    with StateDB(tmp_path / "state") as state:
        with LevelDbStore(state, "t") as store:
            for n in range(1000):
                store.write(item(f"k{n:04}", n=n))
            store.flush()
            store.write(item("late", n=-1))  # flushed by close
        with pytest.raises(StoreError, match="closed"):
            store.write(item("after", n=0))
    with StateDB(tmp_path / "state") as state:
        store = LevelDbStore(state, "t")
        assert len(store) == 1001 == sum(1 for _ in store.items())
        assert store.get("k0999") == {"n": 999, "_url": "http://a.test/k0999", "_scraped_at": "20270115080000"}
        assert store.get("late") is not None
        store.write(item("k0000", n=0))
        store.write(item("new", n=0))
        store.flush()
        assert len(store) == 1002


def test_records_are_written_at_flush_not_before(tmp_path: Path) -> None:
    state = StateDB(tmp_path / "state")
    store = LevelDbStore(state, "t")
    store.write(item("flushed", n=1))
    store.flush()
    store.write(item("buffered", n=2))
    state.close()  # the process dies before the next flush: the store is never closed
    with StateDB(tmp_path / "state") as state:
        store = LevelDbStore(state, "t")
        assert [key for key, _ in store.items()] == ["flushed"] and len(store) == 1


def test_a_failed_write_is_a_store_error(tmp_path: Path) -> None:
    state = StateDB(tmp_path / "state")
    store = LevelDbStore(state, "t")
    store.write(item("k", n=1))
    state.close()
    with pytest.raises(StoreError, match="cannot write the t 'kv' key store"):
        store.flush()


def test_prefixes_keep_stores_apart_and_off_the_queue(tmp_path: Path) -> None:
    with StateDB(tmp_path / "state") as state:
        queue = LevelDbQueue(state)
        with queue.transaction() as tx:
            tx.put(Request("http://a.test/1"))
            tx.set_state("source", {"position": "1"})
        pages = LevelDbStore(state, "t", records="pages", prefix="pages")
        items = LevelDbStore(state, "t")
        pages.write(page("http://a.test/1"))
        items.write(item("http://a.test/1", n=1))
        pages.flush()
        items.flush()
        first_page = pages.get("http://a.test/1")
        assert first_page is not None and first_page["status"] == 200
        assert items.get("http://a.test/1") == {"n": 1, "_url": "http://a.test/http://a.test/1",
                                                "_scraped_at": "20270115080000"}
        assert len(pages) == len(items) == 1
        assert queue.counts()["ready"] == 1 and queue.get_state("source") == {"position": "1"}
        for taken in ("q", "s", "r"):
            with pytest.raises(ValueError, match=f"prefix '{taken}' is taken by"):
                LevelDbStore(state, "t", prefix=taken)
        for bad in ("", "a:b", "k v"):
            with pytest.raises(ValueError, match="prefix must be letters"):
                LevelDbStore(state, "t", prefix=bad)
        with pytest.raises(ValueError, match="records must be pages or items"):
            LevelDbStore(state, "t", records="rows")  # type: ignore[arg-type]


def test_a_recipe_names_the_leveldb_store(tmp_path: Path) -> None:
    (tmp_path / "urls.txt").write_text("http://127.0.0.1:1/x\n")
    path = tmp_path / "r.yaml"
    path.write_text("name: t\nsource: {type: flat_file, path: urls.txt}\nstore:\n"
                    "  - {type: leveldb}\n  - {type: leveldb, records: pages, prefix: pages}\n")
    recipe = load_recipe(path)
    assert [(spec.type, spec.cls, dict(spec.options)) for spec in recipe.stores] == [
        ("leveldb", LevelDbStore, {}), ("leveldb", LevelDbStore, {"records": "pages", "prefix": "pages"})]
    with StateDB(tmp_path / "state") as state:
        stores = [build(spec, recipe, state=state, name=recipe.name, out_dir=tmp_path / "out") for spec in recipe.stores]
        assert [(s.records, s.prefix, s.name) for s in stores] == [("items", "kv", "t"), ("pages", "pages", "t")]
    path.write_text("name: t\nsource: {type: flat_file, path: urls.txt}\nstore:\n  type: leveldb\n  records: rows\n")
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    assert str(info.value).startswith(f"{path}:5: store.records: expected one of pages, items")


# -- the store in a run: read-through cache and conditional store -----------------------------


def _run_recipe(tmp_path: Path, urls: list[str], store: str, parse: str = "") -> dict:
    import json as _json

    from scrapekit.recipe import load_recipe
    from scrapekit.runner import Runner

    (tmp_path / "urls.txt").write_text("\n".join(urls) + "\n")
    path = tmp_path / "r.yaml"
    path.write_text("name: kv\nwork_dir: work\nsource: {type: flat_file, path: urls.txt}\n"
                    f"politeness: {{allow_private: true, robots: false}}\nstore: {store}\n{parse}")
    assert Runner(load_recipe(path)).run() == "done"
    return _json.loads((tmp_path / "work" / "kv" / "stats.json").read_text())


def test_a_read_through_cache_fetches_only_on_a_miss_and_parses_the_stored_page(tmp_path: Path, site) -> None:
    from scrapekit.model import Request, Response
    from scrapekit.state import StateDB

    run_dir = tmp_path / "work" / "kv"
    with StateDB(run_dir / "state") as state:  # pages cached earlier
        cache = LevelDbStore(state, "kv", records="pages", mode="cache")
        for n in range(2):
            page = b"<html><head><title>cached %d</title></head></html>" % n
            cache.write(Response(Request(f"{site.url}/page/{n}"), 200, "OK", {"content-type": "text/html"}, page))
        cache.close()
    tmp_path.mkdir(exist_ok=True)
    stats = _run_recipe(tmp_path, [f"{site.url}/page/{n}" for n in range(4)],
                        "[{type: leveldb, records: pages, mode: cache}, {type: jsonl, records: items}]",
                        "parse: {type: html, items: {each: /html, fields: {title: //title/text()}}}\n")
    assert (stats["cache_hits"], stats["cache_misses"]) == (2, 2)
    assert [site.hits_snapshot().get(f"/page/{n}", 0) for n in range(4)] == [0, 0, 1, 1]
    titles = sorted(json.loads(line)["title"] for chunk in (run_dir / "out").glob("*/*.jsonl")
                    for line in chunk.read_text().splitlines())
    assert titles == ["Page 2", "Page 3", "cached 0", "cached 1"]  # hits parsed from the store
    with StateDB(run_dir / "state") as state:
        assert "Page 3" in LevelDbStore(state, "kv", records="pages").get(f"{site.url}/page/3")["body"]


def test_a_conditional_store_skips_what_it_holds(tmp_path: Path, site) -> None:
    from scrapekit.state import StateDB
    from scrapekit.model import Request, Response

    run_dir = tmp_path / "work" / "kv"
    with StateDB(run_dir / "state") as state:  # a store filled earlier (another recipe, a load)
        store = LevelDbStore(state, "kv", records="pages", mode="conditional")
        for n in range(3):
            request = Request(f"{site.url}/page/{n}")
            store.write(Response(request, 200, "OK", {}, b"earlier", fetched_at=1.0))
        store.close()
    stats = _run_recipe(tmp_path, [f"{site.url}/page/{n}" for n in range(5)],
                        "{type: leveldb, records: pages, mode: conditional}")
    assert stats["skipped"] == 3 and stats["done"] == 5
    assert [site.hits_snapshot().get(f"/page/{n}", 0) for n in range(5)] == [0, 0, 0, 1, 1]
    with StateDB(run_dir / "state") as state:
        kept = LevelDbStore(state, "kv", records="pages")
        assert kept.get(f"{site.url}/page/0")["body"] == "earlier"  # not overwritten
        assert "Page 4" in kept.get(f"{site.url}/page/4")["body"]
