"""The example recipes of recipes/, run end to end against the demo site on a fake clock."""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path

from scrapekit.recipe import load_recipe
from scrapekit.runner import Runner
from scrapekit.stores.chunked import read_tsv

from .conftest import FakeClock, wait_for

ROOT = Path(__file__).resolve().parents[1]
DEMO = "http://127.0.0.1:8765"


def copy_recipe(tmp_path: Path, name: str, seeds: str, site_url: str) -> Path:
    text = (ROOT / "recipes" / seeds).read_text()
    assert DEMO in text or "{id}" in (ROOT / "recipes" / f"{name}.yaml").read_text()
    (tmp_path / seeds).write_text(text.replace(DEMO, site_url))
    recipe_text = (ROOT / "recipes" / f"{name}.yaml").read_text().replace(DEMO, site_url)
    assert "work_dir" not in recipe_text
    (tmp_path / f"{name}.yaml").write_text(f"work_dir: work\n{recipe_text}")  # not the cwd's work/
    return tmp_path / f"{name}.yaml"


def test_the_spider_follows_five_generations_and_no_more(tmp_path: Path, site) -> None:
    recipe = load_recipe(copy_recipe(tmp_path, "spider", "spider-urls.txt", site.url))
    assert Runner(recipe, clock=FakeClock()).run() == "done"
    rows = [row for chunk in (recipe.run_dir / "out").glob("*/*.tsv") for row in read_tsv(chunk)]
    depths = {row.url: row.meta.get("depth", 0) for row in rows}
    assert max(depths.values()) == 5 and min(depths.values()) == 0
    # /page/N links to N+1, N+2, N+3, N+17, N+1000: generation g reaches at most N = 1000 * g.
    numbers = {int(url.rsplit("/", 1)[1]) for url in depths}
    assert max(numbers) == 5000 and len(rows) == len(depths)  # one row per page
    generation_one = {url for url, depth in depths.items() if depth == 1}
    assert {int(u.rsplit("/", 1)[1]) for u in generation_one} == {1, 2, 3, 17, 1000}


def read_stats(run_dir: Path) -> dict:
    try:
        return json.loads((run_dir / "stats.json").read_text())
    except (OSError, ValueError):
        return {}


def jsonl_items(run_dir: Path) -> list[dict]:
    return [json.loads(line) for chunk in sorted((run_dir / "out").glob("*/*.jsonl"))
            for line in chunk.read_text().splitlines()]


class Background:
    """A Runner in a thread, stopped as SIGTERM would stop it."""

    def __init__(self, recipe, clock: FakeClock) -> None:
        self.runner = Runner(recipe, clock=clock)
        self.thread = threading.Thread(target=self.runner.run)

    def __enter__(self) -> Background:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.runner.stop_reason = "signal"
        self.thread.join(timeout=30)


def test_the_timeline_example_walks_down_with_max_id_and_revisits_each_user_at_its_rate(tmp_path: Path, site,
                                                                                       caplog) -> None:
    from scrapekit.demo.site import TIMELINE_EPOCH

    caplog.set_level(logging.INFO, logger="scrapekit")
    clock = FakeClock(TIMELINE_EPOCH + 3600)  # fast has posted 3600 times, slow 60, rare once
    site.now = clock.time
    recipe = load_recipe(copy_recipe(tmp_path, "timeline", "timeline-users.txt", site.url))
    run_dir = recipe.run_dir
    with Background(recipe, clock):
        wait_for(lambda: read_stats(run_dir).get("done") == 3)
        first = read_stats(run_dir)
        assert first["items"] == 15 * 20 + 60 + 1  # fast: max_pages pages of 20; slow and rare: all
        assert first["queue"]["delayed"] == 3  # every user is due again, none is done for good
        def fast_due() -> float:
            return next(d["at"] for d in read_stats(run_dir)["next_due"] if "/fast." in d["key"])

        for _ in range(3):  # three more visits of fast: 5 s later, then at its observed rate
            clock.advance(fast_due() - clock.time())
            wait_for(lambda: fast_due() > clock.time())
        due = {d["key"].split("/")[-1].split(".")[0]: d["at"] - clock.time() for d in read_stats(run_dir)["next_due"]}
    ids = [(item["user"], item["id"]) for item in jsonl_items(run_dir)]
    assert len(ids) == len(set(ids))  # overlap stops each visit: no item is stored twice
    fast = sorted(i for user, i in ids if user == "fast")
    assert fast == list(range(3301, int(clock.time() - TIMELINE_EPOCH) + 1))  # each new post once, no gap
    # fast posts 1/s: about 50 s between visits once its rate is known; rare is left alone longer.
    assert 40 <= due["fast"] <= 60
    assert due["rare"] >= 20  # nothing new at rare: its interval doubled from 5 s at each visit
    assert "resched " in caplog.text and "new items in" in caplog.text


def test_the_feed_example_stores_each_guid_once(tmp_path: Path, site) -> None:
    from scrapekit.demo.site import TIMELINE_EPOCH

    clock = FakeClock(TIMELINE_EPOCH + 600)
    site.now = clock.time
    recipe = load_recipe(copy_recipe(tmp_path, "feeds", "feeds.txt", site.url))
    run_dir = recipe.run_dir
    with Background(recipe, clock):
        wait_for(lambda: read_stats(run_dir).get("done") == 2)
        first = read_stats(run_dir)["items"]  # the chunk is sealed only at the stop
        clock.advance(31)  # 31 new posts on fast; the feed shows the last 20
        wait_for(lambda: read_stats(run_dir).get("done") == 4)
    items = jsonl_items(run_dir)
    guids = [item["guid"] for item in items]
    assert len(guids) == len(set(guids))
    assert first == 20 + 10  # fast: the feed's 20; slow: one post a minute for 10 minutes
    assert len(items) - first == 20  # the next poll: only the new entries


def test_the_shortener_example_keeps_each_codes_location(tmp_path: Path, site) -> None:
    recipe = load_recipe(copy_recipe(tmp_path, "shortener", "shortener.yaml", site.url))
    assert Runner(recipe, clock=FakeClock()).run() == "done"
    rows = [row for chunk in (recipe.run_dir / "out").glob("*/*.tsv") for row in read_tsv(chunk)]
    codes = [row.url.rsplit("/", 1)[1] for row in rows]
    assert len(codes) == len(set(codes)) == 61 * 62 + 61  # every code from "0" below "zz", once
    moved = [row for row in rows if row.status == 301]
    assert moved and all(row.meta["location"].endswith("/target/" + row.url.rsplit("/", 1)[1]) for row in moved)
    assert {row.status for row in rows} == {301, 404}
    assert {entry[0] for entry in site.requests_log if "/s/" in entry[1]} == {"HEAD"}
