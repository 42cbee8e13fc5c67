"""The HTML report: charts and tables from hand-made snapshots (parsed back out of the page), and
end to end from a real run on the local site through ``scrapekit report``."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from html import unescape
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from scrapekit.recipe import load_recipe
from scrapekit.report import bar_chart, line_chart, render, write_report
from scrapekit.runner import Runner

from .conftest import scrapekit

T0 = 1_800_000_000.0  # 2027-01-15 08:00 UTC
VOID = {"meta", "br", "hr", "img", "input", "link", "wbr", "source"}


class Page(HTMLParser):
    """The page's elements, each with the id of the <svg> around it, and its text; end tags are
    checked against the open elements, so a page that nests badly fails."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.source = text
        self.stack: list[str] = []
        self.problems: list[str] = []
        self.elements: list[tuple[str, dict[str, str | None], str | None]] = []
        self.texts: list[tuple[str | None, str]] = []
        self.svg: str | None = None
        self.feed(text)
        self.close()
        if self.stack:
            self.problems.append(f"never closed: {self.stack}")

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "svg":
            self.svg = dict(attrs).get("id")
        self.elements.append((tag, dict(attrs), self.svg))
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append((tag, dict(attrs), self.svg))

    def handle_endtag(self, tag: str) -> None:
        if not self.stack or self.stack[-1] != tag:
            self.problems.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
        else:
            self.stack.pop()
        if tag == "svg":
            self.svg = None

    def handle_data(self, data: str) -> None:
        if data.strip():
            self.texts.append((self.svg, data.strip()))

    def tags(self, name: str, svg: str | None = None) -> list[dict[str, str | None]]:
        return [attrs for tag, attrs, inside in self.elements if tag == name and (svg is None or inside == svg)]

    def points(self, chart: str) -> list[tuple[float, float]]:
        (line,) = self.tags("polyline", f"chart-{chart}")
        return [(float(x), float(y)) for x, y in (p.split(",") for p in (line["points"] or "").split())]

    def svg_texts(self, chart: str) -> list[str]:
        return [text for inside, text in self.texts if inside == f"chart-{chart}"]

    def baseline(self, chart: str) -> float:
        """The y of the x axis: where a value of 0 is drawn when the axis starts at 0."""
        return max(float(a["y1"] or 0) for a in self.tags("line", f"chart-{chart}") if a.get("class") == "axis")

    def table(self, index: int) -> list[list[str]]:
        """The rows (header row first) of the index-th table, read again from the page's source."""
        return _tables(self.source)[index]


def _tables(text: str) -> list[list[list[str]]]:
    tables = re.findall(r"<table>(.*?)</table>", text, re.S)
    return [[[unescape(re.sub(r"<[^>]+>", "", cell)) for cell in re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", row)]
             for row in re.findall(r"<tr>(.*?)</tr>", table)] for table in tables]


def parse(text: str) -> Page:
    page = Page(text)
    assert page.problems == []
    return page


def snapshot(t: float, done: int, **extra: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "updated_at": T0 + t, "done": done, "failed": 0, "buried": 0, "retries": 0, "items": 0, "bytes": 0,
        "rate": 0.0, "running": True, "pid": 4242, "statuses": {"200": done}, "errors": {}, "links": {},
        "queue": {"ready": 0, "reserved": 0, "delayed": 0, "buried": 0, "done": done},
        "bandwidth": {"day": time.strftime("%Y-%m-%d", time.gmtime(T0 + t)), "day_bytes": 0, "daily_limit": 0},
    }
    return {**base, **extra}


def full_history() -> list[dict[str, Any]]:
    return [
        snapshot(0, 0, queue={"ready": 100, "reserved": 4, "delayed": 0}),
        snapshot(60, 120, failed=3, statuses={"200": 120, "404": 3}, errors={"not_found": 3},
                 queue={"ready": 50, "reserved": 4, "delayed": 6}, bandwidth={"day_bytes": 5000, "daily_limit": 20000}),
        snapshot(120, 200, failed=5, buried=1, items=400, bytes=9_000_000, statuses={"200": 200, "404": 5},
                 errors={"not_found": 5, "timeout": 1}, links={"queued": 30, "seen": 90, "rejected_depth": 4},
                 queue={"ready": 0, "reserved": 0, "delayed": 2}, bandwidth={"day_bytes": 9000, "daily_limit": 20000},
                 next_due=[{"key": "feed-a", "at": T0 + 3600}]),
    ]


# -- charts -----------------------------------------------------------------------------------

def test_rate_chart_is_drawn_from_done_differences_not_the_rate_field() -> None:
    snapshots = [snapshot(0, 0, rate=50.0), snapshot(10, 10, rate=50.0), snapshot(20, 50, rate=50.0),
                 snapshot(30, 60, rate=50.0)]  # differences: 1/s, 4/s, 1/s; the rate field says 50
    page = parse(render("t", snapshots, None))
    points = page.points("rate")
    assert len(points) == 3
    assert [x for x, _ in points] == sorted(x for x, _ in points)
    (y1, y2, y3) = (y for _, y in points)
    assert y2 < y1 == y3  # the fastest interval is drawn highest
    assert "4" in page.svg_texts("rate") and "50" not in page.svg_texts("rate")


def test_a_single_snapshot_draws_its_rate_field_as_a_dot() -> None:
    page = parse(render("t", [snapshot(0, 5, rate=2.5)], None))
    assert len(page.points("rate")) == 1 and len(page.tags("circle", "chart-rate")) == 1
    assert "2.50" in page.svg_texts("rate")


def test_counter_reset_draws_no_negative_rate_or_error_count() -> None:
    snapshots = [snapshot(0, 0), snapshot(10, 100, failed=10), snapshot(20, 5, failed=0),  # work dir wiped
                 snapshot(30, 15, failed=2)]
    page = parse(render("t", snapshots, None))
    for chart in ("rate", "errors"):
        points = page.points(chart)
        assert len(points) == 3
        assert all(y <= page.baseline(chart) for _, y in points)  # nothing below 0
        assert page.svg_texts(chart)[4:6] == ["0", "10"]  # y ticks: min 0, max 10/s and 10 errors
    rate_ys = [y for _, y in page.points("rate")]
    assert rate_ys[0] < rate_ys[1]  # 10/s before the reset, 0.5/s (5 done since it) after


def test_errors_and_queue_size_follow_the_snapshots() -> None:
    page = parse(render("t", full_history(), None))
    errors = page.points("errors")  # failed + buried grew by 3, then by 3
    assert len(errors) == 2 and errors[0][1] == errors[1][1]
    queue = [y for _, y in page.points("queue")]  # 104, 60, 2: shrinking, so drawn lower and lower
    assert queue == sorted(queue)
    assert page.svg_texts("queue")[4:6] == ["0", "104"]


def test_time_axis_shows_hours_within_a_day_and_dates_past_one() -> None:
    short = parse(render("t", [snapshot(0, 0), snapshot(3600, 10)], None))
    assert {"08:00", "09:00"} <= set(short.svg_texts("queue"))
    long = parse(render("t", [snapshot(0, 0), snapshot(3 * 86_400, 10)], None))
    assert {"2027-01-15", "2027-01-18"} <= set(long.svg_texts("queue"))


def test_bandwidth_bars_take_each_days_maximum_and_draw_the_limit() -> None:
    snapshots = [snapshot(0, 0, bandwidth={"day": "2027-01-15", "day_bytes": 1000, "daily_limit": 8000}),
                 snapshot(60, 1, bandwidth={"day": "2027-01-15", "day_bytes": 4000, "daily_limit": 8000}),
                 snapshot(120, 1, bandwidth={"day": "2027-01-15", "day_bytes": 3000, "daily_limit": 8000}),  # a lost count
                 snapshot(86_400, 2, bandwidth={"day": "2027-01-16", "day_bytes": 2000, "daily_limit": 8000})]
    page = parse(render("t", snapshots, None))
    bars = page.tags("rect", "chart-bandwidth")
    assert len(bars) == 2
    assert float(bars[0]["height"] or 0) == pytest.approx(2 * float(bars[1]["height"] or 0), abs=0.2)
    assert [a for a in page.tags("line", "chart-bandwidth") if a.get("class") == "limit"]
    assert "limit 8.0KB" in page.svg_texts("bandwidth")
    assert {"2027-01-15", "2027-01-16"} <= set(page.svg_texts("bandwidth"))


def test_no_limit_line_when_no_daily_limit_is_set() -> None:
    page = parse(render("t", [snapshot(0, 0, bandwidth={"day_bytes": 10})], None))
    assert len(page.tags("rect", "chart-bandwidth")) == 1
    assert not [a for a in page.tags("line", "chart-bandwidth") if a.get("class") == "limit"]


def test_chart_helpers_say_no_data_when_empty() -> None:
    for svg in (line_chart([], chart_id="x", title="X", y_label="y"),
                bar_chart([], chart_id="x", title="X", y_label="y")):
        page = parse(svg)
        assert page.svg_texts("x")[-1] == "no data" and not page.tags("polyline") and not page.tags("rect")


# -- tables, header, robustness ---------------------------------------------------------------

def test_header_and_tables_show_the_latest_counts_with_shares() -> None:
    latest = {**full_history()[-1], "running": False, "stop_reason": "done"}
    text = render("books", full_history(), latest)
    page = parse(text)
    assert "scrapekit report: books" in page.source and "not running (last stop: done)" in page.source
    assert "last update 2027-01-15 08:02:00 UTC" in page.source
    header, statuses, errors, links, due = (page.table(i) for i in range(5))
    assert dict(zip(*header)) == {"done": "200", "failed": "5", "buried": "1", "items": "400", "bytes": "9.0MB",
                                  "retries": "0"}
    assert statuses[1:] == [["200", "200", "97.6%"], ["404", "5", "2.4%"]]
    assert errors[1:] == [["not_found", "5", "83.3%"], ["timeout", "1", "16.7%"]]
    assert ["rejected_depth", "4"] in links
    assert due[1:] == [["feed-a", "2027-01-15 09:00:00 UTC"]]
    assert "Top domains" not in page.source  # the snapshots have none: the section is left out
    assert len(page.tags("svg")) == 4 and len(page.tags("table")) == 5


def test_top_domains_are_listed_when_the_snapshot_has_them() -> None:
    latest = {**full_history()[-1], "domains": {"a.example": 5, "b.example": 50}}
    page = parse(render("t", full_history(), latest))
    top = next(t for t in (page.table(i) for i in range(len(page.tags("table")))) if t[0] == ["domain", "requests"])
    assert top[1:] == [["b.example", "50"], ["a.example", "5"]]


def test_hostile_names_and_error_kinds_are_escaped() -> None:
    evil = "<script>alert(1)</script>"
    history = full_history()
    history[-1]["errors"] = {evil: 2, '"><img src=x onerror=alert(1)>': 1}
    history[-1]["next_due"] = [{"key": evil, "at": T0}]
    text = render(evil, history, None)
    page = parse(text)
    assert not page.tags("script") and not page.tags("img")
    assert "<script>" not in text and "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert page.table(2)[1:] == [[evil, "2", "66.7%"], ['"><img src=x onerror=alert(1)>', "1", "33.3%"]]


def test_no_snapshots_and_no_stats_gives_a_page_saying_so() -> None:
    page = parse(render("never", [], None))
    assert "never has not run" in page.source
    assert not page.tags("svg") and page.tags("h1")


def test_stats_without_history_shows_the_header_and_says_the_charts_need_snapshots() -> None:
    page = parse(render("t", [], {**full_history()[-1], "running": False}))
    assert "No snapshots yet" in page.source and not page.tags("svg")
    assert dict(zip(*page.table(0)))["done"] == "200"


def test_snapshots_missing_keys_or_with_odd_values_are_tolerated() -> None:
    odd = [{}, {"updated_at": T0, "done": 1},
           {"updated_at": T0 + 10, "done": "many", "rate": 3.0, "queue": None, "bandwidth": 5, "statuses": [200],
            "errors": None, "next_due": [3]},
           {"updated_at": T0 + 20, "done": 21, "rate": True, "links": {"queued": "x"}},
           {"updated_at": float("nan"), "done": float("inf")}]
    page = parse(render("t", odd, None))
    assert len(page.tags("svg")) == 4
    assert len(page.points("rate")) == 1 and "3" in page.svg_texts("rate")  # the one usable rate: the field's
    assert "no data" in page.svg_texts("queue") and "None recorded." in page.source
    latest = {"updated_at": T0, "done": float("nan"), "failed": 2, "next_due": 7, "statuses": {"200": float("inf")}}
    page = parse(render("t", odd, latest))
    assert dict(zip(*page.table(0))) == {"failed": "2"} and "Next due" not in page.source


def test_the_page_fetches_nothing_from_the_network() -> None:
    text = render("t", full_history(), None)
    page = parse(text)
    assert not any(attrs.get(key) for _, attrs, _ in page.elements for key in ("src", "href", "xlink:href"))
    assert not page.tags("script") and not page.tags("link") and not page.tags("img")
    assert "http://" not in text and "https://" not in text and "url(" not in text and "@import" not in text


def test_write_report_on_a_run_that_never_ran(tmp_path: Path) -> None:
    path = write_report(tmp_path / "work" / "x", "x")
    assert path == tmp_path / "work" / "x" / "report.html" and "x has not run" in path.read_text()


def test_write_report_does_not_trust_a_stale_running_flag(tmp_path: Path) -> None:
    (tmp_path / "stats.json").write_text(json.dumps({**full_history()[-1], "running": True}))  # killed -9
    text = write_report(tmp_path, "t").read_text()
    assert "not running" in text and 'class="running"' not in text


# -- end to end -------------------------------------------------------------------------------

@pytest.fixture
def reported_run(tmp_path: Path, site: Any) -> tuple[Path, dict[str, Any], subprocess.CompletedProcess[str]]:
    urls = [f"{site.url}/slow?seconds=0.1&n={n}" for n in range(24)] + [f"{site.url}/status/404"]
    (tmp_path / "urls.txt").write_text("\n".join(urls) + "\n")
    recipe = tmp_path / "r.yaml"
    recipe.write_text("name: t\nwork_dir: work\nsource: {type: flat_file, path: urls.txt}\n"
                      "fetch: {concurrency: 2, retries: 0}\nlog: {stats_interval: 1s}\n"
                      "politeness: {allow_private: true, robots: false}\n")
    assert Runner(load_recipe(recipe)).run() == "done"
    result = scrapekit("report", str(recipe), cwd=tmp_path, timeout=60)
    stats = json.loads((tmp_path / "work" / "t" / "stats.json").read_text())
    return tmp_path / "work" / "t" / "report.html", stats, result


def test_report_command_writes_the_runs_totals_and_charts(reported_run: Any) -> None:
    path, stats, result = reported_run
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(path) and path.is_file()
    page = parse(path.read_text())
    header = dict(zip(*page.table(0)))
    assert stats["done"] + stats["failed"] == 25
    assert header["done"] == str(stats["done"]) and header["failed"] == str(stats["failed"])
    assert "not running (last stop: done)" in page.source
    assert {a.get("id") for a in page.tags("svg")} == {"chart-rate", "chart-errors", "chart-queue", "chart-bandwidth"}
    assert len(page.points("rate")) >= 1 and len(page.tags("rect", "chart-bandwidth")) == 1
    assert ["404", "1", f"{100 / 25:.1f}%"] in page.table(1)


def test_the_report_renders_in_a_headless_browser(reported_run: Any, tmp_path: Path) -> None:
    chromium = shutil.which("chromium") or ("/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else None)
    if chromium is None:
        pytest.skip("chromium is not installed")
    path, _, result = reported_run
    assert result.returncode == 0, result.stderr
    dumped = subprocess.run([chromium, "--headless", "--disable-gpu", "--no-sandbox", f"--user-data-dir={tmp_path / 'profile'}",
                             "--dump-dom", path.as_uri()], capture_output=True, text=True, timeout=120)
    assert dumped.returncode == 0, dumped.stderr
    assert dumped.stdout.count("<svg") == 4 and "<polyline" in dumped.stdout and "chart-bandwidth" in dumped.stdout


def test_workers_histories_add_up_moment_by_moment() -> None:
    from scrapekit.report import merge_histories

    one = [{"updated_at": 10.0, "done": 5, "queue": {"ready": 3}, "domains": {"a.com": 5}},
           {"updated_at": 30.0, "done": 9, "queue": {"ready": 1}, "domains": {"a.com": 9}}]
    two = [{"updated_at": 20.0, "done": 4, "queue": {"ready": 7}, "domains": {"b.com": 4}, "running": True}]
    merged = merge_histories([one, two])
    assert [m["updated_at"] for m in merged] == [10.0, 20.0, 30.0]
    assert [m["done"] for m in merged] == [5, 9, 13]  # worker two counts from its first snapshot on
    assert [m["queue"]["ready"] for m in merged] == [3, 10, 8]
    assert merged[-1]["domains"] == {"a.com": 9, "b.com": 4} and merged[-1]["running"] is True
