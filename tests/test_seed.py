"""Dump and load: a queue copied to JSON lines and back, across queue types, and the commands."""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scrapekit import Request
from scrapekit.seed import load_into, write_dump
from scrapekit.sources.beanstalk import BeanstalkQueue
from scrapekit.sources.leveldb import LevelDbQueue
from scrapekit.state import StateDB
from scrapekit.stores.chunked import read_tsv

from .conftest import Beanstalkd, scrapekit, start

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def leveldb_queue(tmp_path: Path) -> Iterator[LevelDbQueue]:
    with StateDB(tmp_path / "a") as state:
        yield LevelDbQueue(state)


def fill(queue: Any) -> None:
    """Two ready jobs of different priorities, one delayed, one buried, one reserved."""
    queue.put(Request("http://a.test/ready-5", priority=5))
    queue.put(Request("http://a.test/ready-10", priority=10, meta={"k": [1, 2]}))
    queue.put(Request("http://a.test/held", priority=1))
    queue.put(Request("http://a.test/to-bury", priority=2))
    held = queue.reserve()
    assert held is not None and held.request.url == "http://a.test/held"
    buried = queue.reserve()
    assert buried is not None
    queue.bury(buried, "part_error")
    queue.put(Request("http://a.test/delayed", priority=7, not_before=time.time() + 300))


def shape(records: list[dict[str, Any]]) -> dict[str, tuple[str, int, int, str, Any]]:
    """What must survive a round trip, by URL (reserved jobs come back ready)."""
    return {
        r["request"]["url"]: ("ready" if r["state"] == "reserved" else r["state"], r["request"].get("priority", 1024),
                              round(r["delay"] / 10), r.get("reason", ""), r["request"].get("meta"))
        for r in records
    }


def dumped(queue: Any, path: Path) -> list[dict[str, Any]]:
    write_dump(queue, path)
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_dump_lists_every_job_with_state_priority_and_delay(leveldb_queue: LevelDbQueue, tmp_path: Path) -> None:
    fill(leveldb_queue)
    records = dumped(leveldb_queue, tmp_path / "d.jsonl")
    by_url = {r["request"]["url"]: r for r in records}
    assert {url: r["state"] for url, r in by_url.items()} == {
        "http://a.test/ready-5": "ready", "http://a.test/ready-10": "ready", "http://a.test/held": "reserved",
        "http://a.test/to-bury": "buried", "http://a.test/delayed": "delayed"}
    assert 290 < by_url["http://a.test/delayed"]["delay"] <= 300
    assert by_url["http://a.test/to-bury"]["reason"] == "part_error"
    assert leveldb_queue.counts() == {"ready": 2, "reserved": 1, "delayed": 1, "buried": 1, "done": 0}


def test_leveldb_to_beanstalkd_and_back(leveldb_queue: LevelDbQueue, tmp_path: Path, beanstalkd: Beanstalkd) -> None:
    fill(leveldb_queue)
    first = dumped(leveldb_queue, tmp_path / "1.jsonl")
    with StateDB(tmp_path / "b") as state:
        beanstalk = BeanstalkQueue(state, beanstalkd.url, tube="moved")
        assert load_into(beanstalk, tmp_path / "1.jsonl") == {"added": 5, "skipped": 0, "bad": 0}
        assert beanstalk.counts() == {"ready": 3, "reserved": 0, "delayed": 1, "buried": 1, "done": 0}
        second = dumped(beanstalk, tmp_path / "2.jsonl")
        beanstalk.close()
    assert shape(second) == shape(first)
    with StateDB(tmp_path / "c") as state:
        back = LevelDbQueue(state)
        assert load_into(back, tmp_path / "2.jsonl")["added"] == 5
        assert shape(dumped(back, tmp_path / "3.jsonl")) == shape(first)
        order = [back.reserve() for _ in range(3)]
        assert [j.request.url for j in order if j] == ["http://a.test/held", "http://a.test/ready-5", "http://a.test/ready-10"]


def test_load_skips_known_keys_and_reports_bad_lines(leveldb_queue: LevelDbQueue, tmp_path: Path,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    leveldb_queue.put(Request("http://a.test/queued"))
    job = leveldb_queue.reserve()
    assert job is not None
    leveldb_queue.ack(job)
    seed = tmp_path / "seed.txt"
    seed.write_text('http://a.test/queued\n# note\nhttp://a.test/new\n{"request": {"url": "http://a.test/x"}, "state": "nope"}\n'
                    '{"request": \nhttp://a.test/new\n{"url": "http://a.test/json"}\n')
    caplog.set_level(logging.WARNING, logger="scrapekit")
    assert load_into(leveldb_queue, seed) == {"added": 2, "skipped": 2, "bad": 2}
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith(f"{seed}:4: skipped: unknown state 'nope'") for m in messages)
    assert any(m.startswith(f"{seed}:5: skipped:") for m in messages)


def test_dump_and_load_through_the_cli_while_a_run_goes_on(tmp_path: Path, site) -> None:
    urls = [f"{site.url}/slow?seconds=0.02&n={n}" for n in range(200)]
    (tmp_path / "urls.txt").write_text("\n".join(urls) + "\n")
    recipe = tmp_path / "r.yaml"
    recipe.write_text("name: t\nsource: {type: flat_file, path: urls.txt}\npoliteness: {allow_private: true, robots: false}\nfetch: {concurrency: 2}\n")
    run = start("run", str(recipe), "--no-console", cwd=tmp_path)
    deadline = time.monotonic() + 30
    while not (tmp_path / "work" / "t" / "stats.json").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    result = scrapekit("dump", str(recipe), "live.jsonl", cwd=tmp_path, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("dumped ") and "live.jsonl" in result.stdout
    dumped_urls = {json.loads(line)["request"]["url"] for line in (tmp_path / "live.jsonl").read_text().splitlines()}
    assert dumped_urls and dumped_urls <= set(urls)
    extra = tmp_path / "extra.txt"
    extra.write_text(f"{site.url}/page/1\n{urls[0]}\n")
    loaded = scrapekit("load", str(recipe), str(extra), cwd=tmp_path, timeout=60)
    assert loaded.returncode == 0, loaded.stderr
    assert "added 1, skipped 1 already queued or done, 0 bad lines" in loaded.stdout
    assert run.wait(timeout=120) == 0
    rows = [row.url for chunk in (tmp_path / "work" / "t" / "out").glob("*/*.tsv") for row in read_tsv(chunk)]
    assert sorted(rows) == sorted(urls + [f"{site.url}/page/1"])  # the dump disturbed nothing
    again = scrapekit("dump", str(recipe), cwd=tmp_path, timeout=60)
    assert again.returncode == 0 and again.stdout.startswith("dumped 0 jobs to ") and "/seed/" in again.stdout


def test_kick_command_brings_buried_jobs_back(tmp_path: Path, site, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "urls.txt").write_text(f"{site.url}/page/1?boom\n{site.url}/page/2?boom\n")
    recipe = tmp_path / "r.yaml"
    plugins = ROOT / "tests" / "plugins"
    recipe.write_text("name: t\nsource: {type: flat_file, path: urls.txt}\nparse: {type: 'skplugins:BrokenParser'}\npoliteness: {allow_private: true, robots: false}\n")

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return scrapekit(*args, cwd=tmp_path, timeout=60, plugins=[plugins])

    assert cli("run", str(recipe), "--no-console").returncode == 0
    assert json.loads(cli("status", str(recipe), "--json").stdout)["buried"] == 2
    assert cli("kick", str(recipe), "1").stdout.strip() == "kicked 1 jobs"
    status = json.loads(cli("status", str(recipe), "--json").stdout)
    assert (status["buried"], status["queued"]) == (1, 1)
