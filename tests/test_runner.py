"""The runner end to end, in process: real site, real LevelDB, real chunk files."""

from __future__ import annotations

import json
import time
import sys
from collections import Counter
from pathlib import Path

import pytest

from scrapekit.errors import RecipeError
from scrapekit.recipe import load_recipe
from scrapekit.runner import Runner
from scrapekit.stores.chunked import read_jsonl, read_tsv

PLUGINS = str(Path(__file__).parent / "plugins")


def make_recipe(tmp_path: Path, urls: list[str], extra: str = "", seeds: str | None = None) -> Path:
    (tmp_path / "urls.txt").write_text(seeds if seeds is not None else "\n".join(urls) + "\n")
    path = tmp_path / "r.yaml"
    path.write_text(f"name: t\nwork_dir: work\nsource: {{type: flat_file, path: urls.txt}}\n{extra}politeness: {{allow_private: true, robots: false}}\n")
    return path


def rows(tmp_path: Path, ext: str = "tsv") -> list:
    out = tmp_path / "work" / "t" / "out"
    reader = read_tsv if ext == "tsv" else read_jsonl
    return [row for chunk in sorted(out.glob(f"*/*.{ext}")) for row in reader(chunk)]


def test_every_seed_gets_one_page_row_and_items(tmp_path: Path, site) -> None:
    urls = [f"{site.url}/catalogue/page-{n}.html" for n in range(1, 6)] + [f"{site.url}/catalogue/page-99.html"]
    path = make_recipe(tmp_path, urls, extra=(
        "parse:\n  type: html\n  items: {each: \"//article[@class='book']\", fields: {title: h2/a/text(), price: 'css:.price'}}\n"
        "store:\n  - {type: chunked_tsv}\n  - {type: jsonl, records: items}\n"))
    assert Runner(load_recipe(path)).run() == "done"
    pages = rows(tmp_path)
    assert sorted(r.url for r in pages) == sorted(urls)
    by_url = {r.url: r for r in pages}
    assert by_url[urls[-1]].status == 404 and by_url[urls[-1]].reason == "not_found"
    assert by_url[urls[0]].status == 200 and b"<article" in by_url[urls[0]].body
    assert by_url[urls[0]].meta["depth"] == 0
    items = rows(tmp_path, "jsonl")
    assert len(items) == 5 * 20
    assert all(i["title"] and i["price"].startswith("£") for i in items)
    assert {i["_url"] for i in items} == set(urls[:5])
    assert not list((tmp_path / "work" / "t" / "out").glob("*/*.part"))


def test_a_second_run_resumes_and_refetches_nothing(tmp_path: Path, site) -> None:
    urls = [f"{site.url}/page/{n}" for n in range(40)]
    recipe = load_recipe(make_recipe(tmp_path, urls, extra="fetch: {concurrency: 4}\n"))
    first = Runner(recipe, max_requests=15, grace=1.0)
    assert first.run() == "max_requests"
    assert first._in_flight == 0  # every job reserved but not started was given back, none waited out
    assert 15 <= len(rows(tmp_path)) < 40
    assert Runner(recipe).run() == "done"
    assert Runner(recipe).run() == "done"
    assert sorted(r.url for r in rows(tmp_path)) == sorted(urls)
    assert all(site.hits[f"/page/{n}"] == 1 for n in range(40))


def test_retryable_status_is_retried_then_recorded_once(tmp_path: Path, site) -> None:
    urls = [f"{site.url}/status/503?retry_after=0", f"{site.url}/status/404"]
    path = make_recipe(tmp_path, urls, extra="fetch: {retries: 2, backoff: {503: 10ms}}\n")
    assert Runner(load_recipe(path)).run() == "done"
    assert site.hits["/status/503"] == 3 and site.hits["/status/404"] == 1
    reasons = sorted((r.status, r.reason, r.meta["attempt"]) for r in rows(tmp_path))
    assert reasons == [(404, "not_found", 0), (503, "unavailable", 2)]


def test_hostile_responses_are_recorded_not_fatal(tmp_path: Path, site) -> None:
    urls = [f"{site.url}/huge?bytes=5000000", f"{site.url}/gzip-bomb", f"{site.url}/redirect-loop/0",
            f"{site.url}/bad-encoding", f"{site.url}/slow?seconds=3", f"{site.url}/page/1"]
    path = make_recipe(tmp_path, urls, extra=(
        "fetch: {timeout: 300ms, max_bytes: 100KB, retries: 0}\n"
        "parse: {type: html, items: {each: //body, fields: {t: //title/text()}}}\n"))
    assert Runner(load_recipe(path)).run() == "done"
    by_path = {r.url.removeprefix(site.url): r for r in rows(tmp_path)}
    assert len(by_path) == 6
    assert by_path["/huge?bytes=5000000"].meta["truncated"] and len(by_path["/huge?bytes=5000000"].body) == 100_000
    assert by_path["/gzip-bomb"].meta["truncated"] and len(by_path["/gzip-bomb"].body) == 100_000
    assert by_path["/redirect-loop/0"].reason == "too_many_redirects"
    assert by_path["/slow?seconds=3"].reason == "timeout" and by_path["/slow?seconds=3"].status == 0
    assert by_path["/bad-encoding"].status == 200 and b"caf\xe9" in by_path["/bad-encoding"].body
    assert by_path["/page/1"].status == 200


def test_bad_seed_lines_are_logged_with_line_numbers_and_skipped(tmp_path: Path, site) -> None:
    seeds = (f"# comment\n\n{site.url}/page/1\nftp://example.invalid/x\nnot a url\n{{\"url\": 5}}\n"
             f"{site.url}/page/2\tsome\tfields\n{{\"url\": \"{site.url}/page/3\", \"meta\": {{\"k\": 1}}}}\n")
    path = make_recipe(tmp_path, [], seeds=seeds)
    assert Runner(load_recipe(path)).run() == "done"
    got = {r.url.removeprefix(site.url): r for r in rows(tmp_path)}
    assert set(got) == {"/page/1", "/page/2", "/page/3"}
    assert got["/page/2"].meta["meta"] == {"fields": ["some", "fields"]}
    assert got["/page/3"].meta["meta"] == {"k": 1}


def test_a_bug_in_a_part_buries_the_job_and_the_run_goes_on(tmp_path: Path, site, monkeypatch) -> None:
    monkeypatch.syspath_prepend(PLUGINS)
    urls = [f"{site.url}/page/1?boom", f"{site.url}/page/2"]
    path = make_recipe(tmp_path, urls, extra="parse: {type: 'skplugins:BrokenParser'}\n")
    recipe = load_recipe(path)
    assert Runner(recipe).run() == "done"
    got = {r.url: r.reason for r in rows(tmp_path)}
    assert got == {urls[0]: "part_error", urls[1]: "OK"}
    status = json.loads((tmp_path / "work" / "t" / "stats.json").read_text())
    assert status["queue"]["buried"] == 1 and status["done"] == 1


def test_plugins_by_entry_point_and_by_dotted_path(tmp_path: Path, site, monkeypatch) -> None:
    monkeypatch.syspath_prepend(PLUGINS)
    (tmp_path / "urls.txt").write_text("")
    for source, store in (("range", "skplugins:ListStore"), ("skplugins:RangeSource", "list")):
        path = tmp_path / "r.yaml"
        path.write_text(f"name: t-{source.replace(':', '_')}\nwork_dir: work\n"
                        f"source: {{type: '{source}', template: '{site.url}/page/{{n}}', stop: 5}}\npoliteness: {{allow_private: true, robots: false}}\n"
                        f"store: {{type: '{store}', label: x}}\n")
        recipe = load_recipe(path)
        assert Runner(recipe).run() == "done"
        lines = (recipe.run_dir / "out" / f"{recipe.name}.list").read_text().splitlines()
        assert sorted(json.loads(line)["url"] for line in lines) == [f"{site.url}/page/{n}" for n in range(5)]
    assert sys.modules["skplugins"].__file__.startswith(PLUGINS)


def test_the_source_feeds_at_most_window_jobs_ahead(tmp_path: Path, site) -> None:
    urls = [f"{site.url}/page/{n}" for n in range(3000)]
    path = make_recipe(tmp_path, urls, extra="fetch: {concurrency: 4}\n")
    path.write_text(path.read_text().replace("path: urls.txt}", "path: urls.txt, window: 50}"))
    recipe = load_recipe(path)
    assert recipe.window == 50
    assert Runner(recipe, max_requests=20).run() == "max_requests"
    from scrapekit.sources.leveldb import LevelDbQueue
    from scrapekit.state import StateDB
    with StateDB(recipe.run_dir / "state") as state:
        queue = LevelDbQueue(state)
        counts = queue.counts()
        assert counts["done"] == 20 and 0 < counts["ready"] + counts["delayed"] <= 50
        offset, line = (int(x) for x in queue.get_state("source")["position"].split(":"))
        assert line <= 20 + 50  # the file was read no further than the window


def test_a_long_fetch_keeps_its_beanstalkd_job(tmp_path: Path, site, beanstalkd) -> None:
    """The runner touches jobs in flight past half their TTR, so a slow page is fetched once."""
    path = make_recipe(tmp_path, [f"{site.url}/slow?seconds=3.5"],
                       extra=f"queue: {{type: beanstalk, url: '{beanstalkd.url}', ttr: 2s}}\nfetch: {{timeout: 10s}}\n")
    assert Runner(load_recipe(path)).run() == "done"
    assert site.hits["/slow"] == 1
    assert [r.status for r in rows(tmp_path)] == [200]


def test_stats_snapshots_are_kept_as_json_lines_per_day(tmp_path: Path, site) -> None:
    from scrapekit.stats import read_snapshots

    urls = [f"{site.url}/slow?seconds=0.1&n={n}" for n in range(30)]
    recipe = load_recipe(make_recipe(tmp_path, urls, extra="fetch: {concurrency: 2}\nlog: {stats_interval: 1s}\n"))
    assert Runner(recipe).run() == "done"
    files = list((recipe.run_dir / "stats").glob("*.jsonl"))
    assert len(files) == 1 and files[0].name == time.strftime("%Y%m%d.jsonl", time.gmtime())
    snapshots = read_snapshots(recipe.run_dir / "stats")
    assert len(snapshots) >= 2  # one a second while running, and the last at the stop
    done = [s["done"] for s in snapshots]
    assert done == sorted(done) and done[-1] == 30 and snapshots[-1]["running"] is False
    assert all({"rate", "queue", "statuses", "errors", "bandwidth", "updated_at"} <= set(s) for s in snapshots)
    with open(files[0], "a") as torn:  # a crash mid-line leaves a torn last line: skipped
        torn.write('{"done": 3')
    assert len(read_snapshots(recipe.run_dir / "stats")) == len(snapshots)


def test_statsd_gets_the_counters_and_gauges_over_udp(tmp_path: Path, site) -> None:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.settimeout(0.5)
        port = listener.getsockname()[1]
        urls = [f"{site.url}/slow?seconds=0.05&n={n}" for n in range(20)]
        recipe = load_recipe(make_recipe(tmp_path, urls, extra=f"fetch: {{concurrency: 2}}\nlog: {{statsd: '127.0.0.1:{port}'}}\n"))
        assert Runner(recipe).run() == "done"
        lines = []
        while True:
            try:
                lines += listener.recv(2048).decode().splitlines()
            except TimeoutError:
                break
    done = sum(int(line.split(":")[1].split("|")[0]) for line in lines if line.startswith("scrapekit.t.done:"))
    assert done == 20
    assert any(line.startswith("scrapekit.t.rate:") and line.endswith("|g") for line in lines)
    assert any(line.startswith("scrapekit.t.queue.ready:") for line in lines)


def test_a_bad_statsd_address_is_a_recipe_error(tmp_path: Path) -> None:
    path = make_recipe(tmp_path, [], extra="log: {statsd: 'nowhere'}\n")
    with pytest.raises(RecipeError, match=r":\d+: log.statsd: expected host:port"):
        load_recipe(path)
