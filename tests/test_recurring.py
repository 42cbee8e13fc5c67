"""Recurring resources on a fake clock: a periodic source revisits each job when it is due and
idles in between; seed identifiers fill a URL template; the schedule survives a restart."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from click.testing import CliRunner

from scrapekit import cli
from scrapekit.recipe import load_recipe
from scrapekit.runner import Runner
from scrapekit.sources.flatfile import FlatFileSource, PeriodicSource

from .conftest import FakeClock, wait_for


def stats(run_dir: Path) -> dict:
    try:
        return json.loads((run_dir / "stats.json").read_text())
    except (OSError, ValueError):
        return {}


def test_a_template_fills_identifiers_and_fields_into_urls(tmp_path: Path) -> None:
    seeds = tmp_path / "ids.txt"
    seeds.write_text("# users\n42\n7\tshop\tnote\n{\"id\": \"a b\", \"lang\": \"en\"}\n{\"lang\": \"fr\"}\n")
    source = FlatFileSource(seeds, kind="resource", template="http://api.example.org/users/{id}.json")
    got = [request for request, _ in source.requests(None)]
    assert [r.url for r in got] == ["http://api.example.org/users/42.json", "http://api.example.org/users/7.json",
                                    "http://api.example.org/users/a%20b.json"]
    assert got[1].meta == {"id": "7", "fields": ["shop", "note"]} and got[0].kind == "resource"
    assert got[2].meta["fields"] == {"id": "a b", "lang": "en"}  # the line without an id was skipped
    named = FlatFileSource(seeds, template="http://h/{lang}/{id}")
    assert [r.url for r, _ in named.requests(None)] == ["http://h/en/a%20b"]  # others lack "lang"


def test_a_periodic_source_stamps_its_interval_unless_a_line_has_one(tmp_path: Path) -> None:
    seeds = tmp_path / "jobs.jsonl"
    seeds.write_text('{"url": "http://h/a"}\n{"url": "http://h/b", "meta": {"every": "10m"}}\n')
    got = [r.meta["every"] for r, _ in PeriodicSource(seeds, every=30.0).requests(None)]
    assert got == [30.0, "10m"]


def test_periodic_jobs_are_revisited_when_due_and_the_run_idles_in_between(tmp_path: Path, site) -> None:
    clock = FakeClock()
    urls = [f"{site.url}/page/{n}" for n in range(3)]
    (tmp_path / "jobs.txt").write_text("\n".join(urls) + "\n")
    path = tmp_path / "r.yaml"
    path.write_text("name: every\nwork_dir: work\nsource: {type: periodic, path: jobs.txt, every: 10m}\n"
                    "politeness: {allow_private: true, robots: false}\n")
    run_dir = tmp_path / "work" / "every"
    runner = Runner(load_recipe(path), clock=clock)
    thread = threading.Thread(target=runner.run)
    thread.start()
    try:
        wait_for(lambda: stats(run_dir).get("done") == 3 and stats(run_dir)["queue"]["delayed"] == 3)
        time.sleep(0.5)  # nothing is due: nothing is fetched again
        assert all(site.hits_snapshot()[f"/page/{n}"] == 1 for n in range(3))
        due = stats(run_dir)["next_due"]
        assert [d["at"] for d in due] == [clock.time() + 600.0] * 3
        shown = CliRunner().invoke(cli.main, ["status", str(path)])
        assert "next due:" in shown.output and "/page/0" in shown.output
        clock.advance(601)
        wait_for(lambda: stats(run_dir).get("done") == 6)
        assert all(site.hits_snapshot()[f"/page/{n}"] == 2 for n in range(3))
    finally:
        runner.stop_reason = "signal"
        thread.join(timeout=30)

    # After a restart the jobs keep their due times: nothing is fetched before they are due.
    runner = Runner(load_recipe(path), clock=clock)
    thread = threading.Thread(target=runner.run)
    thread.start()
    try:
        wait_for(lambda: stats(run_dir).get("running"))
        time.sleep(0.5)
        assert all(site.hits_snapshot()[f"/page/{n}"] == 2 for n in range(3))
        clock.advance(601)
        wait_for(lambda: all(site.hits_snapshot()[f"/page/{n}"] == 3 for n in range(3)))
    finally:
        runner.stop_reason = "signal"
        thread.join(timeout=30)


def test_bad_answers_keep_a_resource_scheduled_and_stop_nothing(tmp_path: Path, site, caplog) -> None:
    import logging

    caplog.set_level(logging.INFO, logger="scrapekit")
    clock = FakeClock()
    urls = [f"{site.url}/api/broken.json", f"{site.url}/api/missing-id.json",
            f"{site.url}/api/retry-after?value=-5", f"{site.url}/api/retry-after?value=999999999"]
    (tmp_path / "urls.txt").write_text("\n".join(urls) + "\n")
    path = tmp_path / "r.yaml"
    path.write_text("name: bad\nwork_dir: work\nsource: {type: flat_file, path: urls.txt, kind: resource}\n"
                    "parse: {type: json, items: {each: '$.items[*]', fields: {id: '$.id'}}}\n"
                    "reschedule: {type: rate, target_items: 10, min_delay: 1m, max_delay: 1d}\n"
                    "politeness: {allow_private: true, robots: false}\n")
    run_dir = tmp_path / "work" / "bad"
    runner = Runner(load_recipe(path), clock=clock)
    thread = threading.Thread(target=runner.run)
    thread.start()
    try:
        wait_for(lambda: stats(run_dir).get("done") == 2 and stats(run_dir).get("retries") == 2)
        time.sleep(0.3)
        now = stats(run_dir)
        assert now["running"] and now["buried"] == 0 and now["failed"] == 0
        assert now["queue"]["delayed"] == 4  # two rescheduled, two waiting to be retried
        assert {d["key"].rsplit("/", 1)[1] for d in now["next_due"]} == {"broken.json", "missing-id.json"}
    finally:
        runner.stop_reason = "signal"
        thread.join(timeout=30)
    assert "retry in 86400.0s" in caplog.text  # an absurd Retry-After is capped at a day
    assert "retry in 2.0s" in caplog.text  # a negative one is ignored: the 503 backoff applies
    assert "resched" in caplog.text


def test_periodic_jobs_on_beanstalkd_are_released_with_a_delay_and_come_back(tmp_path: Path, site, beanstalkd) -> None:
    urls = [f"{site.url}/page/{n}" for n in range(3)]
    (tmp_path / "jobs.txt").write_text("\n".join(urls) + "\n")
    path = tmp_path / "r.yaml"
    path.write_text("name: bs\nwork_dir: work\nsource: {type: periodic, path: jobs.txt, every: 1s}\n"
                    f"queue: {{type: beanstalk, url: '{beanstalkd.url}'}}\n"
                    "politeness: {allow_private: true, robots: false}\n")
    runner = Runner(load_recipe(path))  # beanstalkd keeps the delays itself: the real clock
    thread = threading.Thread(target=runner.run)
    thread.start()
    try:
        wait_for(lambda: all(site.hits_snapshot().get(f"/page/{n}", 0) >= 3 for n in range(3)))
        assert stats(tmp_path / "work" / "bs")["failed"] == 0
    finally:
        runner.stop_reason = "signal"
        thread.join(timeout=30)


def test_resource_state_survives_kill_9(tmp_path: Path, site) -> None:
    """The timeline example through the CLI, killed with SIGKILL after its first visits: the
    restarted run goes on from each user's highest id, storing no item twice."""
    import os
    import signal
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    text = (root / "recipes" / "timeline.yaml").read_text().replace("http://127.0.0.1:8765", site.url)
    (tmp_path / "timeline.yaml").write_text("work_dir: work\n" + text)
    (tmp_path / "timeline-users.txt").write_text("fast\nslow\n")
    run_dir = tmp_path / "work" / "timeline"
    env = {**os.environ, "PYTHONPATH": str(root)}

    def start() -> subprocess.Popen[bytes]:
        return subprocess.Popen([sys.executable, "-m", "scrapekit", "run", "timeline.yaml", "--no-console"],
                                cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    proc = start()
    wait_for(lambda: stats(run_dir).get("done", 0) >= 2, timeout=60)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    proc = start()
    wait_for(lambda: stats(run_dir).get("running") and stats(run_dir).get("done", 0) >= 4, timeout=60)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
    items = [json.loads(line) for chunk in (run_dir / "out").glob("*/*.jsonl") for line in chunk.read_text().splitlines()]
    keys = [(item["user"], item["id"]) for item in items]
    assert len(keys) == len(set(keys))  # the restart did not store the first visit's items again
    fast = sorted(i for user, i in keys if user == "fast")
    assert 3301 <= fast[0] <= 3320 and fast == list(range(fast[0], fast[-1] + 1)) and fast[-1] > fast[0] + 300
