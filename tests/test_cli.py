"""The command line as a user runs it: check, run (foreground, --detach, SIGTERM, SIGKILL and
restart), status and tail, each in a subprocess against the real site and real LevelDB."""

from __future__ import annotations

import json
import resource
import re
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

from scrapekit.stores.chunked import read_tsv

from .conftest import scrapekit, start, wait_for

ROOT = Path(__file__).resolve().parents[1]


def recipe(tmp_path: Path, urls: list[str], extra: str = "") -> Path:
    (tmp_path / "urls.txt").write_text("\n".join(urls) + "\n")
    path = tmp_path / "r.yaml"
    path.write_text(f"name: t\nsource: {{type: flat_file, path: urls.txt}}\n{extra}politeness: {{allow_private: true, robots: false}}\n")
    return path


def sealed_rows(tmp_path: Path) -> list:
    return [row for chunk in sorted((tmp_path / "work" / "t" / "out").glob("*/*.tsv")) for row in read_tsv(chunk)]


def stats_done(tmp_path: Path) -> int:
    try:
        data = json.loads((tmp_path / "work" / "t" / "stats.json").read_text())
    except (OSError, ValueError):
        return 0
    return int(data.get("done", 0))


def test_check_good_recipe_prints_a_summary(tmp_path: Path) -> None:
    path = recipe(tmp_path, ["http://127.0.0.1:1/x"], "parse: {type: raw}\nstore: [{type: chunked_tsv}, {type: jsonl}]\n")
    result = scrapekit("check", str(path), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    for fragment in ("source    flat_file", "queue     leveldb", "fetch     http", "max_bytes=200000",
                     "parse     raw", "store[0]  chunked_tsv", "store[1]  jsonl", "rotate=14400"):
        assert fragment in result.stdout


def test_check_bad_recipe_prints_path_line_key_and_exits_2(tmp_path: Path) -> None:
    path = recipe(tmp_path, [], "fetch:\n  concurency: 4\nparse: {type: html, items: {each: '//[', fields: {a: b}}}\n")
    result = scrapekit("check", str(path), cwd=tmp_path)
    assert result.returncode == 2
    assert f"{path}:4: fetch.concurency: unknown key (did you mean 'concurrency'?)" in result.stderr
    bad_xpath = scrapekit("check", str(recipe(tmp_path, [], "parse: {type: html, items: {each: '//[', fields: {a: b}}}\n")), cwd=tmp_path)
    assert bad_xpath.returncode == 2 and f"{path}:3: parse: items.each: bad XPath" in bad_xpath.stderr


def test_run_foreground_then_status(tmp_path: Path, site) -> None:
    urls = [f"{site.url}/page/{n}" for n in range(30)]
    path = recipe(tmp_path, urls, "log: {progress_every: 10}\n")
    result = scrapekit("run", str(path), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "stopped: done" in result.stderr and str(tmp_path / "work" / "t" / "out") in result.stderr
    assert len(sealed_rows(tmp_path)) == 30
    status = json.loads(scrapekit("status", str(path), "--json", cwd=tmp_path).stdout)
    assert {k: status[k] for k in ("queued", "reserved", "delayed", "buried", "done", "failed", "running")} == {
        "queued": 0, "reserved": 0, "delayed": 0, "buried": 0, "done": 30, "failed": 0, "running": False}
    console = (tmp_path / "work" / "t" / "log" / "console.log").read_text()
    assert re.search(r"progress: done [1-9]\d* failed 0", console) and "stopped: done" in console
    tail = scrapekit("tail", str(path), "--log", "console", "--no-follow", "-n", "1", cwd=tmp_path)
    assert tail.stdout.count("\n") == 1 and "stopped: done" in tail.stdout


def test_sigterm_stops_cleanly_and_seals_chunks(tmp_path: Path, site) -> None:
    urls = [f"{site.url}/slow?seconds=0.05&n={n}" for n in range(400)]
    path = recipe(tmp_path, urls, "fetch: {concurrency: 4}\n")
    proc = start("run", str(path), cwd=tmp_path)
    wait_for(lambda: stats_done(tmp_path) >= 20)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    assert not list((tmp_path / "work" / "t" / "out").glob("*/*.part"))
    done = len(sealed_rows(tmp_path))
    status = json.loads(scrapekit("status", str(path), "--json", cwd=tmp_path).stdout)
    assert status["done"] == done and status["queued"] + status["delayed"] == 400 - done and not status["running"]


def test_second_run_at_once_says_already_running(tmp_path: Path, site) -> None:
    urls = [f"{site.url}/slow?seconds=0.2&n={n}" for n in range(200)]
    path = recipe(tmp_path, urls, "fetch: {concurrency: 2}\n")
    first = start("run", str(path), cwd=tmp_path)
    try:
        wait_for(lambda: stats_done(tmp_path) >= 1)
        second = scrapekit("run", str(path), cwd=tmp_path)
        assert second.returncode == 2
        assert f"already running (pid {first.pid})" in second.stderr
        assert "Traceback" not in second.stderr and "LOCK" not in second.stderr
        status = json.loads(scrapekit("status", str(path), "--json", cwd=tmp_path).stdout)
        assert status["running"] and status["pid"] == first.pid
    finally:
        first.send_signal(signal.SIGTERM)
        first.wait(timeout=30)


def test_detach_returns_at_once_and_runs_in_the_background(tmp_path: Path, site) -> None:
    urls = [f"{site.url}/page/{n}" for n in range(50)]
    path = recipe(tmp_path, urls)
    result = scrapekit("run", str(path), "--detach", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    pid = int((tmp_path / "work" / "t" / "run.pid").read_text())
    assert f"pid {pid}" in result.stdout
    wait_for(lambda: not json.loads(scrapekit("status", str(path), "--json", cwd=tmp_path).stdout)["running"])
    assert sorted(r.url for r in sealed_rows(tmp_path)) == sorted(urls)
    assert "stopped: done" in (tmp_path / "work" / "t" / "log" / "console.log").read_text()


def test_sigkill_mid_run_then_restart_gives_exactly_one_row_per_seed(tmp_path: Path, site) -> None:
    urls = [f"{site.url}/slow?seconds=0.01&n={n}" for n in range(600)]
    path = recipe(tmp_path, urls, "fetch: {concurrency: 8}\nstore: {type: chunked_tsv, size: 20KB}\n")
    for threshold in (50, 200, 400):
        proc = start("run", str(path), cwd=tmp_path)
        wait_for(lambda: stats_done(tmp_path) >= threshold or proc.poll() is not None)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    final = scrapekit("run", str(path), cwd=tmp_path)
    assert final.returncode == 0, final.stderr
    counts = Counter(r.url for r in sealed_rows(tmp_path))
    assert set(counts) == set(urls)
    assert max(counts.values()) == 1
    assert not list((tmp_path / "work" / "t" / "out").glob("*/*.part"))


def test_unwritable_work_dir_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("")
    path = recipe(tmp_path, ["http://127.0.0.1:1/x"], "work_dir: afile/work\n")
    result = scrapekit("run", str(path), cwd=tmp_path)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    assert "afile/work" in result.stderr


def test_full_disk_is_a_clear_error_and_loses_nothing(tmp_path: Path, site) -> None:
    """Writes past RLIMIT_FSIZE fail with EFBIG, as on a full disk: the run stops with one line,
    and a restart still gives exactly one row per seed."""
    urls = [f"{site.url}/page/{n}" for n in range(400)]
    path = recipe(tmp_path, urls, "fetch: {concurrency: 4}\n")

    def small_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (300_000, 300_000))

    full = scrapekit("run", str(path), cwd=tmp_path, preexec_fn=small_files)
    assert full.returncode == 1
    assert "error: cannot write" in full.stderr and "File too large" in full.stderr
    assert "Traceback" not in full.stderr
    assert list((tmp_path / "work" / "t" / "out").glob("*/*.tsv.part"))  # left for recovery, not sealed
    again = scrapekit("run", str(path), cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    counts = Counter(r.url for r in sealed_rows(tmp_path))
    assert set(counts) == set(urls) and max(counts.values()) == 1


def test_the_bundled_demo_recipe_runs_through_the_cli(tmp_path: Path, site) -> None:
    demo = (ROOT / "recipes" / "demo.yaml").read_text()
    seeds = (ROOT / "recipes" / "demo-urls.txt").read_text().replace("http://127.0.0.1:8765", site.url)
    (tmp_path / "demo-urls.txt").write_text(seeds)
    (tmp_path / "demo.yaml").write_text(demo)
    result = scrapekit("run", str(tmp_path / "demo.yaml"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    out = tmp_path / "work" / "demo" / "out"
    pages = [row for chunk in out.glob("*/*.tsv") for row in read_tsv(chunk)]
    seed_urls = [line for line in seeds.splitlines() if line and not line.startswith("#")]
    assert sorted(r.url for r in pages) == sorted(seed_urls)
    assert {r.status for r in pages if "page-999" in r.url} == {404}
    items = [json.loads(line) for chunk in out.glob("*/*.jsonl") for line in chunk.read_text().splitlines()]
    catalogue_items = [i for i in items if "/catalogue/" in i["_url"]]
    assert len(catalogue_items) == 50 * 20
    assert all(i["title"] and i["price"].startswith("£") and i["url"].startswith("/book/") for i in catalogue_items)


def test_unreachable_beanstalkd_at_start_names_the_url(tmp_path: Path) -> None:
    from .conftest import free_port
    url = f"beanstalk://127.0.0.1:{free_port()}"
    path = recipe(tmp_path, ["http://127.0.0.1:1/x"], f"queue: {{type: beanstalk, url: '{url}'}}\n")
    result = scrapekit("run", str(path), cwd=tmp_path)
    assert result.returncode == 1
    assert f"error: cannot reach beanstalkd at {url}: Connection refused" in result.stderr
    assert "Traceback" not in result.stderr
    bad = recipe(tmp_path, ["http://127.0.0.1:1/x"], "queue: {type: beanstalk, url: 'http://127.0.0.1:1'}\n")
    checked = scrapekit("check", str(bad), cwd=tmp_path)
    assert checked.returncode == 2 and f"{bad}:3: queue.url: expected beanstalk://HOST:PORT" in checked.stderr


def test_a_broken_part_stops_the_run_with_exit_code_3(tmp_path: Path, site) -> None:
    urls = [f"{site.url}/page/{n}?boom" for n in range(200)]
    path = recipe(tmp_path, urls, "parse: {type: 'skplugins:BrokenParser'}\nlimits: {part_errors: 5/1m}\n"
                                  "fetch: {concurrency: 2}\n")

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return scrapekit(*args, cwd=tmp_path, plugins=[ROOT / "tests" / "plugins"])

    result = cli("run", str(path))
    assert result.returncode == 3, result.stderr
    assert "stopping: 5 unanticipated errors" in result.stderr
    status = json.loads(cli("status", str(path), "--json").stdout)
    assert status["stop_reason"] == "circuit_breaker"
    assert 5 <= status["buried"] < 50 and status["queued"] + status["delayed"] > 100  # the rest wait, unharmed
    critical = (tmp_path / "work" / "t" / "log" / "critical.log").read_text()
    assert "Traceback" in critical and "a bug in a plugin" in critical
