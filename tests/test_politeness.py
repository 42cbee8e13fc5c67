"""The politeness gate: per-domain delay and concurrency on a fake clock, domain clumping, 429/503
and crawl-delay raising the delay, the per-domain circuit breaker; then a real run against two
local hosts whose request times are recorded by the servers themselves."""

from __future__ import annotations

import calendar
import json
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from click.testing import CliRunner

from scrapekit import cli

from scrapekit.model import Job, Request, Response
from scrapekit.links import url_domain as domain_of
from scrapekit.politeness import Gate
from scrapekit.recipe import load_recipe
from scrapekit.runner import Runner

from .conftest import FakeClock, wait_for


def job(url: str, n: int = 0) -> Job:
    return Job(f"{n}:{url}", Request(url))


def answer(j: Job, status: int = 200, error: str | None = None, retry_after: float | None = None,
           elapsed: float = 0.1) -> Response:
    return Response(j.request, status, error=error, retry_after=retry_after, elapsed=elapsed)


def drive(gate: Gate, clock: FakeClock, jobs: list[Job], until: float, step: float = 0.5,
          status: int = 200) -> list[tuple[float, str]]:
    """Run the gate with a stand-in for the durable queue: jobs put back are offered again when
    due; each started job finishes at once. Returns the (time, url) of every start."""
    starts: list[tuple[float, str]] = []
    queue = [(clock.monotonic(), j) for j in jobs]
    end = clock.monotonic() + until
    while clock.monotonic() < end:
        now = clock.monotonic()
        due, queue = [j for at, j in queue if at <= now], [(at, j) for at, j in queue if at > now]
        for j in due:
            if not gate.offer(j, now):
                queue.append((now + gate.put_back_delay, j))
        for started in gate.ready(now, most=100):
            starts.append((now, started.request.url))
            gate.finished(started, answer(started, status), now)
        clock.advance(step)
    return starts


def per_domain(starts: list[tuple[float, str]]) -> dict[str, list[float]]:
    times: dict[str, list[float]] = defaultdict(list)
    for at, url in starts:
        times[domain_of(url)].append(at)
    return times


def test_domain_of_uses_the_registered_domain_or_the_ip() -> None:
    assert domain_of("http://www.shop.example.co.uk/x") == "example.co.uk"
    assert domain_of("http://a.b.example.com/") == domain_of("https://example.com:8443/") == "example.com"
    assert domain_of("http://127.0.0.2:8080/x") == "127.0.0.2"


def test_delay_spaces_the_starts_of_each_domain_and_not_across_domains(clock: FakeClock) -> None:
    gate = Gate(delay=10.0, per_domain=1, hold=8)
    jobs = [job(f"http://{host}/p{i}") for i in range(4) for host in ("a.example.com", "www.example.com", "b.org")]
    starts = drive(gate, clock, jobs, until=120)
    times = per_domain(starts)
    assert sorted(times) == ["b.org", "example.com"]
    assert len(times["example.com"]) == 8 and len(times["b.org"]) == 4
    for domain, at in times.items():
        gaps = [b - a for a, b in zip(at, at[1:])]
        assert min(gaps) >= 10.0, (domain, gaps)  # subdomains share their registered domain's delay
    assert times["b.org"][0] == times["example.com"][0]  # b.org did not wait for example.com


def test_per_domain_caps_concurrent_requests(clock: FakeClock) -> None:
    gate = Gate(delay=0.0, per_domain=2, hold=8)
    jobs = [job(f"http://a.com/{i}") for i in range(5)]
    for j in jobs:
        assert gate.offer(j, clock.monotonic())
    first = gate.ready(clock.monotonic(), most=100)
    assert [j.request.url for j in first] == ["http://a.com/0", "http://a.com/1"]
    assert gate.ready(clock.monotonic(), most=100) == []  # both slots busy
    gate.finished(first[0], answer(first[0]), clock.monotonic())
    assert [j.request.url for j in gate.ready(clock.monotonic(), most=100)] == ["http://a.com/2"]
    assert gate.held() == 2


def test_ready_gives_at_most_the_room_asked_for(clock: FakeClock) -> None:
    gate = Gate(delay=0.0, per_domain=0, hold=8)
    for i in range(6):
        gate.offer(job(f"http://d{i}.com/"), clock.monotonic())
    assert len(gate.ready(clock.monotonic(), most=4)) == 4
    assert len(gate.ready(clock.monotonic(), most=4)) == 2


def test_a_clump_of_one_domain_goes_back_to_the_queue_spread_out_and_others_pass(clock: FakeClock) -> None:
    gate = Gate(delay=5.0, per_domain=1, hold=8)
    now = clock.monotonic()
    held, delays = [], []
    for i in range(1000):
        held.append(gate.offer(job(f"http://big.com/{i}"), now))
        if not held[-1]:
            delays.append(gate.put_back_delay)
    # One start now and at most what can start within a few seconds is held; the rest go back,
    # due one delay apart, so they come back at the pace the domain can take them.
    assert held[0] and sum(held) <= 2 and len(delays) >= 998
    gaps = [b - a for a, b in zip(delays, delays[1:])]
    assert min(gaps) == pytest.approx(5.0) and max(gaps) == pytest.approx(5.0)
    assert delays[0] >= 0.1
    assert all(gate.offer(job(f"http://small{i}.org/"), now) for i in range(3))
    started = {domain_of(j.request.url) for j in gate.ready(now, most=100)}
    assert started == {"big.com", "small0.org", "small1.org", "small2.org"}


def test_429_and_503_raise_the_delay_and_successes_bring_it_back(clock: FakeClock) -> None:
    gate = Gate(delay=1.0, per_domain=1, max_delay=60.0, hold=8)
    j = job("http://a.com/1")
    gate.offer(j, clock.monotonic())
    (started,) = gate.ready(clock.monotonic(), most=1)
    gate.finished(started, answer(started, 429, "rate_limited", retry_after=30.0), clock.monotonic())
    domain = gate._domains["a.com"]
    assert domain.delay == 30.0  # Retry-After wins over doubling
    assert not gate.offer(job("http://a.com/2"), clock.monotonic())  # 30 s away: back to the queue
    assert gate.put_back_delay >= 30.0
    assert gate.offer(job("http://a.com/3"), clock.monotonic() + 29.0)
    assert gate.ready(clock.monotonic() + 29.0, most=1) == []
    (second,) = gate.ready(clock.monotonic() + 30.0, most=1)
    gate.finished(second, answer(second, 503, "unavailable"), clock.monotonic() + 30.0)
    assert domain.delay == 60.0  # doubled, capped at max_delay
    now = clock.monotonic() + 30.0
    for i in range(4, 80):
        now += 60.0
        extra = job(f"http://a.com/{i}")
        assert gate.offer(extra, now) and gate.ready(now, most=1) == [extra]
        gate.finished(extra, answer(extra), now)
    assert domain.delay == pytest.approx(1.0, abs=0.1)  # decays back towards the base, not below


def test_crawl_delay_from_robots_raises_the_spacing(clock: FakeClock) -> None:
    gate = Gate(delay=0.5, per_domain=1, hold=8)
    first = job("http://slow.org/1")
    gate.offer(first, clock.monotonic())
    gate.ready(clock.monotonic(), most=1)
    gate.finished(first, answer(first), clock.monotonic(), crawl_delay=7.0)
    starts = drive(gate, clock, [job(f"http://slow.org/{i}") for i in range(2, 5)], until=40)
    at = [t for t, _ in starts]
    assert len(at) == 3 and min(b - a for a, b in zip(at, at[1:])) >= 7.0


def test_the_breaker_pauses_a_failing_domain_then_half_opens(clock: FakeClock) -> None:
    gate = Gate(delay=0.0, per_domain=4, breaker_failures=3, breaker_pause=600.0, hold=8)
    now = clock.monotonic()
    for i in range(3):
        j = job(f"http://down.com/{i}")
        gate.offer(j, now)
        gate.ready(now, most=1)
        gate.finished(j, answer(j, 0, "refused"), now)
    assert gate.paused(now) == {"down.com": pytest.approx(600.0)}
    late = job("http://down.com/late")
    assert not gate.offer(late, now)  # put back until the pause is over
    assert gate.put_back_delay >= 600.0
    assert gate.offer(job("http://up.com/"), now) and len(gate.ready(now, most=10)) == 1
    clock.advance(601)
    now = clock.monotonic()
    probe = job("http://down.com/probe")
    assert gate.offer(probe, now) and gate.ready(now, most=1) == [probe]
    gate.finished(probe, answer(probe, 0, "timeout"), now)  # one more failure trips it again
    assert "down.com" in gate.paused(now)


def test_ordinary_errors_do_not_trip_the_breaker(clock: FakeClock) -> None:
    gate = Gate(breaker_failures=2, hold=8)
    now = clock.monotonic()
    for i in range(5):
        j = job(f"http://a.com/{i}")
        gate.offer(j, now)
        gate.ready(now, most=1)
        gate.finished(j, answer(j, 404, "not_found"), now)
    assert gate.paused(now) == {}


def test_withdraw_gives_back_every_held_job(clock: FakeClock) -> None:
    gate = Gate(delay=100.0, per_domain=1, hold=8)
    jobs = [job("http://a.com/1"), job("http://b.com/1"), job("http://c.com/1")]
    for j in jobs:
        gate.offer(j, clock.monotonic())
    assert gate.withdraw() == jobs and gate.held() == 0 and gate.wake_at() is None


# -- a real run: two hosts on loopback, times taken by the servers ------------------------------


class _Recorder(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, host: str, log: list[tuple[float, str, str]]) -> None:
        self.log = log
        super().__init__((host, 0), _Handler)


class _Handler(BaseHTTPRequestHandler):
    server: _Recorder
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self.server.log.append((time.monotonic(), self.server.server_address[0], self.path))
        body = b"<html><body>ok</body></html>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def two_hosts() -> Iterator[tuple[list[tuple[float, str, str]], list[str]]]:
    log: list[tuple[float, str, str]] = []
    servers = []
    for host in ("127.0.0.1", "127.0.0.2"):
        try:
            servers.append(_Recorder(host, log))
        except OSError:
            pytest.skip("127.0.0.2 is not usable as a loopback address here")
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    yield log, [f"http://{s.server_address[0]}:{s.server_address[1]}" for s in servers]
    for server in servers:
        server.shutdown()
        server.server_close()


def test_a_run_keeps_each_domains_delay_and_one_big_domain_does_not_stall_the_other(tmp_path: Path, two_hosts) -> None:
    log, (a, b) = two_hosts
    urls = [f"{a}/a{i}" for i in range(8)] + [f"{b}/b{i}" for i in range(3)]
    (tmp_path / "urls.txt").write_text("\n".join(urls) + "\n")
    path = tmp_path / "r.yaml"
    path.write_text("name: p\nwork_dir: work\nsource: {type: flat_file, path: urls.txt}\nfetch: {concurrency: 4}\n"
                    "politeness: {allow_private: true, robots: false, delay: 300ms, per_domain: 1}\n")
    assert Runner(load_recipe(path)).run() == "done"
    times: dict[str, list[float]] = defaultdict(list)
    for at, host, _ in sorted(log):
        times[host].append(at)
    assert len(times["127.0.0.1"]) == 8 and len(times["127.0.0.2"]) == 3
    for host, at in times.items():
        gaps = [y - x for x, y in zip(at, at[1:])]
        assert min(gaps) >= 0.25, (host, gaps)  # 300 ms apart at dispatch; arrival jitter is small
    assert times["127.0.0.2"][-1] < times["127.0.0.1"][4]  # b's three were not queued behind a's eight


# -- bandwidth --------------------------------------------------------------------------------


def test_bandwidth_periods_roll_over_at_utc_midnight_and_month_end() -> None:
    from scrapekit.politeness import Bandwidth

    end_of_year = calendar.timegm((2026, 12, 31, 23, 59, 0))
    bandwidth = Bandwidth(daily=1000, monthly=5000)
    bandwidth.add(999, end_of_year)
    assert bandwidth.paused_until(end_of_year) is None
    bandwidth.add(1, end_of_year)
    assert bandwidth.paused_until(end_of_year) == calendar.timegm((2027, 1, 1, 0, 0, 0))
    assert bandwidth.paused_until(end_of_year + 60) is None  # a new day and a new month
    assert bandwidth.state() == {"day": "2027-01-01", "day_bytes": 0, "month": "2027-01", "month_bytes": 0}
    again = Bandwidth(daily=0, monthly=5000, saved={"day": "2027-01-01", "day_bytes": 10, "month": "2027-01",
                                                      "month_bytes": 5000})
    assert again.paused_until(end_of_year + 86_400) == calendar.timegm((2027, 2, 1, 0, 0, 0))


def test_a_run_pauses_at_its_daily_bandwidth_until_the_next_day_and_remembers_across_restarts(
        tmp_path: Path, site) -> None:
    clock = FakeClock(calendar.timegm((2026, 11, 23, 22, 0, 0)))
    urls = [f"{site.url}/page/{n}" for n in range(12)]
    (tmp_path / "urls.txt").write_text("\n".join(urls) + "\n")
    path = tmp_path / "r.yaml"
    path.write_text("name: b\nwork_dir: work\nsource: {type: flat_file, path: urls.txt}\nfetch: {concurrency: 1}\n"
                    "politeness: {allow_private: true, robots: false, bandwidth: {daily: 5KB}}\n")
    stats_file = tmp_path / "work" / "b" / "stats.json"

    def stats() -> dict:
        try:
            return json.loads(stats_file.read_text())
        except (OSError, ValueError):
            return {}

    runner = Runner(load_recipe(path), clock=clock)
    thread = threading.Thread(target=runner.run)
    thread.start()
    wait_for(lambda: (stats().get("bandwidth") or {}).get("paused_until") is not None)
    time.sleep(0.5)
    paused = stats()
    assert paused["bandwidth"]["paused_until"] == calendar.timegm((2026, 11, 24, 0, 0, 0))
    assert 5000 <= paused["bandwidth"]["day_bytes"] < 5000 + 3 * 2500 and paused["done"] < 6  # at most the jobs in flight past it
    shown = CliRunner().invoke(cli.main, ["status", str(path)])
    assert "PAUSED: bandwidth limit reached, until 2026-11-24T00:00:00Z" in shown.output
    assert "today (limit 5.0KB)" in shown.output and "this month (limit none)" in shown.output
    runner.stop_reason = "signal"  # as SIGTERM does
    thread.join(timeout=30)

    # Restarted the same day: the count was kept with the acks, so it is still paused.
    runner = Runner(load_recipe(path), clock=clock)
    thread = threading.Thread(target=runner.run)
    thread.start()
    wait_for(lambda: stats().get("running") and (stats().get("bandwidth") or {}).get("paused_until"))
    time.sleep(0.5)
    assert stats()["done"] == paused["done"]
    clock.advance(2 * 3600)  # midnight UTC: a new day, and so on until the work is done
    days = 1
    while thread.is_alive():
        thread.join(timeout=0.2)
        until = (stats().get("bandwidth") or {}).get("paused_until")
        if until is not None and until > clock.time():
            clock.advance(86_400)
            days += 1
        assert days < 12
    assert runner.stop_reason == "done", stats()
    final = stats()
    assert final["done"] == 12 and days >= 2
    log = (tmp_path / "work" / "b" / "log" / "info.log")
    assert not log.exists() or "paused until 2026-11-24T00:00:00Z" in log.read_text()


def test_a_run_pauses_a_failing_domain_and_the_others_go_on(tmp_path: Path, site, caplog) -> None:
    from .conftest import free_port

    dead = f"http://127.0.0.2:{free_port()}"  # nothing listens there: every connection is refused
    urls = [f"{dead}/x{i}" for i in range(10)] + [f"{site.url}/page/{n}" for n in range(10)]
    (tmp_path / "urls.txt").write_text("\n".join(urls) + "\n")
    path = tmp_path / "r.yaml"
    path.write_text("name: br\nwork_dir: work\nsource: {type: flat_file, path: urls.txt}\n"
                    "fetch: {concurrency: 2, retries: 0}\nlimits: {max_seconds: 4s}\n"
                    "politeness: {allow_private: true, robots: false, per_domain: 1, breaker_failures: 3, breaker_pause: 1h}\n")
    assert Runner(load_recipe(path)).run() == "max_seconds"
    stats = json.loads((tmp_path / "work" / "br" / "stats.json").read_text())
    assert stats["errors"] == {"refused": 3}  # three tries, then the domain rests
    assert stats["done"] == 10  # the good domain was not held up
    queue = stats["queue"]
    assert queue["delayed"] + queue["ready"] + queue["reserved"] == 7  # the rest wait for the pause to end
    assert queue["done"] == 13 and queue["buried"] == 0
    assert "127.0.0.2 failed 3 times in a row: paused for 3600s" in caplog.text
