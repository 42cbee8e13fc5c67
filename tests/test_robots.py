"""RobotsCache against real local HTTP servers: one robots.txt fetch per host, cached in LevelDB,
and every way a robots.txt can fail coming back as a verdict."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from scrapekit import Bytes, Request, Response, Seconds
from scrapekit.demo.site import DemoSite
from scrapekit.fetchers import HttpFetcher
from scrapekit.robots import (
    ERROR_RULES,
    KEY_PREFIX,
    STATUS_CLASS_RULES,
    RobotsCache,
    Verdict,
    host_key,
    product_token,
    rule_for,
)
from scrapekit.state import StateDB

from .conftest import FakeClock

UA = "scrapekit/0.1 (+https://example.org/bot)"
DAY = 86_400.0
HOUR = 3_600.0


# -- a local server whose robots.txt each test sets ----------------------------------------------


@dataclass
class Answer:
    """What the server sends for one path."""

    status: int = 200
    body: bytes = b""
    delay: float = 0.0
    headers: dict[str, str] = field(default_factory=lambda: {"Content-Type": "text/plain"})


class RobotsServer(ThreadingHTTPServer):
    """127.0.0.1 on a free port; ``answers`` maps a path to its Answer (404 otherwise) and
    ``hits`` counts requests per path."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.answers: dict[str, Answer] = {}
        self.hits: Counter[str] = Counter()
        self.arrived = threading.Event()
        self._hits_lock = threading.Lock()
        self.url = f"http://127.0.0.1:{self.server_address[1]}"

    def robots(self, body: bytes | str = b"", status: int = 200, delay: float = 0.0) -> RobotsServer:
        self.answers["/robots.txt"] = Answer(status, body.encode() if isinstance(body, str) else body, delay)
        return self

    def count(self, path: str) -> None:
        with self._hits_lock:
            self.hits[path] += 1
        self.arrived.set()

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # the client hanging up on a slow or huge answer is what those tests do


class _Handler(BaseHTTPRequestHandler):
    server: RobotsServer

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self.server.count(self.path)
        answer = self.server.answers.get(self.path, Answer(404, b"not here\n"))
        time.sleep(answer.delay)
        try:
            self.send_response(answer.status)
            for name, value in answer.headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(answer.body)))
            self.end_headers()
            self.wfile.write(answer.body)
        except (BrokenPipeError, ConnectionResetError):
            pass


@pytest.fixture
def server() -> Iterator[RobotsServer]:
    yield from _serve()


@pytest.fixture
def other_server() -> Iterator[RobotsServer]:
    yield from _serve()


def _serve() -> Iterator[RobotsServer]:
    running = RobotsServer()
    thread = threading.Thread(target=running.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    yield running
    running.shutdown()
    running.server_close()


@pytest.fixture
def state(tmp_path: Path) -> Iterator[StateDB]:
    with StateDB(tmp_path / "state") as db:
        yield db


@pytest.fixture
def fetcher(clock: FakeClock) -> Iterator[HttpFetcher]:
    with HttpFetcher(allow_private=True, concurrency=16, timeout=Seconds(5.0), user_agent=UA, clock=clock) as f:
        yield f


@pytest.fixture
def robots(state: StateDB, fetcher: HttpFetcher, clock: FakeClock) -> RobotsCache:
    return RobotsCache(state.db, fetcher.fetch, UA, clock=clock)


# -- rules -------------------------------------------------------------------------------------


def test_star_group_allows_and_disallows_paths(server: RobotsServer, robots: RobotsCache) -> None:
    server.robots("User-agent: *\nDisallow: /private\nAllow: /private/open\n")
    assert robots.check(f"{server.url}/public/page") == Verdict(True, "allowed")
    assert robots.check(f"{server.url}/private/page") == Verdict(False, "disallowed")
    assert robots.check(f"{server.url}/private/open/page") == Verdict(True, "allowed")
    assert robots.stats == Counter(fetched=1, cache_hits=2, disallowed=1)


def test_group_for_our_user_agent_replaces_star(server: RobotsServer, robots: RobotsCache) -> None:
    server.robots("User-agent: *\nDisallow: /\n\nUser-agent: scrapekit\nDisallow: /admin\nCrawl-delay: 1\n")
    assert robots.check(f"{server.url}/page").allowed
    assert not robots.check(f"{server.url}/admin/x").allowed
    assert robots.check(f"{server.url}/page").crawl_delay == 1.0


def test_a_group_matching_only_our_contact_url_does_not_apply(server: RobotsServer, robots: RobotsCache) -> None:
    server.robots("User-agent: bot\nDisallow: /\n")  # "bot" appears in UA's "+https://example.org/bot"
    assert robots.check(f"{server.url}/page").allowed


def test_crawl_delay_is_returned(server: RobotsServer, other_server: RobotsServer, robots: RobotsCache) -> None:
    server.robots("User-agent: *\nCrawl-delay: 2.5\nDisallow: /x\n")
    other_server.robots("User-agent: *\nRequest-rate: 1/10s\n")
    assert robots.check(f"{server.url}/page") == Verdict(True, "allowed", crawl_delay=2.5)
    assert robots.check(f"{other_server.url}/page").crawl_delay == 10.0


def test_no_crawl_delay_is_none(server: RobotsServer, robots: RobotsCache) -> None:
    server.robots("User-agent: *\nDisallow: /x\n")
    assert robots.check(f"{server.url}/page").crawl_delay is None


def test_a_byte_order_mark_does_not_hide_the_first_group(server: RobotsServer, robots: RobotsCache) -> None:
    server.robots("\ufeffUser-agent: *\nDisallow: /private\n")
    assert not robots.check(f"{server.url}/private").allowed


def test_a_redirected_robots_is_followed(server: RobotsServer, robots: RobotsCache) -> None:
    server.answers["/robots.txt"] = Answer(301, b"", headers={"Location": "/real-robots.txt"})
    server.answers["/real-robots.txt"] = Answer(200, b"User-agent: *\nDisallow: /private\n")
    assert not robots.check(f"{server.url}/private").allowed
    assert robots.check(f"{server.url}/public").allowed


def test_the_demo_site_robots_allows_everything(site: DemoSite, robots: RobotsCache) -> None:
    assert robots.check(f"{site.url}/catalogue/page-1.html") == Verdict(True, "allowed")
    assert site.hits_snapshot().get("/robots.txt") == 1


# -- once per host, in parallel across hosts -----------------------------------------------------


def test_sixteen_threads_at_once_fetch_a_host_once(server: RobotsServer, robots: RobotsCache) -> None:
    server.robots("User-agent: *\nDisallow: /private\n", delay=0.3)
    barrier = threading.Barrier(16)
    verdicts: list[Verdict] = []

    def ask(n: int) -> None:
        barrier.wait()
        verdicts.append(robots.check(f"{server.url}/{'private' if n % 2 else 'public'}/{n}"))

    threads = [threading.Thread(target=ask, args=(n,)) for n in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert server.hits["/robots.txt"] == 1
    assert sorted(v.allowed for v in verdicts) == [False] * 8 + [True] * 8
    assert robots.stats == Counter(fetched=1, cache_hits=15, disallowed=8)


def test_other_hosts_are_checked_while_one_is_loading(
    server: RobotsServer, other_server: RobotsServer, robots: RobotsCache
) -> None:
    server.robots("User-agent: *\nDisallow:\n", delay=1.0)
    other_server.robots("User-agent: *\nDisallow: /x\n")
    slow = threading.Thread(target=robots.check, args=(f"{server.url}/page",))
    slow.start()
    assert server.arrived.wait(5)
    started = time.monotonic()
    assert not robots.check(f"{other_server.url}/x").allowed
    assert time.monotonic() - started < 0.5 and slow.is_alive()
    slow.join(5)


# -- the LevelDB cache ---------------------------------------------------------------------------


def test_a_new_cache_on_the_same_db_reuses_the_entry_until_it_expires(
    server: RobotsServer, state: StateDB, fetcher: HttpFetcher, clock: FakeClock
) -> None:
    server.robots("User-agent: *\nDisallow: /private\n")
    assert not RobotsCache(state.db, fetcher.fetch, UA, clock=clock).check(f"{server.url}/private").allowed
    again = RobotsCache(state.db, fetcher.fetch, UA, clock=clock)
    clock.advance(DAY - 1)
    assert not again.check(f"{server.url}/private").allowed
    assert server.hits["/robots.txt"] == 1 and again.stats["fetched"] == 0
    server.robots("User-agent: *\nDisallow:\n")
    clock.advance(2)
    assert again.check(f"{server.url}/private").allowed
    assert server.hits["/robots.txt"] == 2 and again.stats["fetched"] == 1


def test_entries_are_json_under_the_r_prefix_only(
    server: RobotsServer, state: StateDB, robots: RobotsCache, clock: FakeClock
) -> None:
    server.robots("User-agent: *\nDisallow: /private\n")
    robots.check(f"{server.url}/page")
    keys = [key for key, _ in state.db.iterator()]
    assert keys == [KEY_PREFIX + host_key(server.url).encode()]
    entry = json.loads(state.db.get(keys[0]))
    assert entry == {"fetched_at": clock.now, "status": 200, "text": "User-agent: *\nDisallow: /private\n",
                     "until": clock.now + DAY, "rule": "parse"}


def test_an_unreadable_db_entry_is_fetched_again(server: RobotsServer, state: StateDB, robots: RobotsCache) -> None:
    server.robots("User-agent: *\nDisallow: /private\n")
    state.db.put(KEY_PREFIX + host_key(server.url).encode(), b"{not json")
    assert not robots.check(f"{server.url}/private").allowed
    assert server.hits["/robots.txt"] == 1


def test_the_memory_keeps_at_most_max_hosts(
    server: RobotsServer, other_server: RobotsServer, state: StateDB, fetcher: HttpFetcher, clock: FakeClock
) -> None:
    robots = RobotsCache(state.db, fetcher.fetch, UA, clock=clock, max_hosts=1)
    server.robots("User-agent: *\nDisallow: /a\n")
    other_server.robots("User-agent: *\nDisallow: /b\n")
    for _ in range(2):
        assert not robots.check(f"{server.url}/a").allowed
        assert not robots.check(f"{other_server.url}/b").allowed
    # evicted hosts come back from LevelDB, not from the server
    assert server.hits["/robots.txt"] == other_server.hits["/robots.txt"] == 1
    assert robots.stats["fetched"] == 2 and robots.stats["cache_hits"] == 2


# -- failures ------------------------------------------------------------------------------------


def test_404_allows_everything(server: RobotsServer, robots: RobotsCache) -> None:
    server.robots("gone", status=404)
    assert robots.check(f"{server.url}/anything") == Verdict(True, "no_robots")
    assert robots.stats["errors"] == 0


def test_500_disallows_until_error_wait_then_fetches_again(
    server: RobotsServer, robots: RobotsCache, clock: FakeClock
) -> None:
    server.robots("oops", status=500)
    fetched_at = clock.now
    verdict = robots.check(f"{server.url}/page")
    assert verdict == Verdict(False, "robots_unavailable", retry_at=fetched_at + HOUR)
    clock.advance(HOUR - 1)
    assert robots.check(f"{server.url}/page") == verdict
    assert server.hits["/robots.txt"] == 1
    server.robots("User-agent: *\nDisallow:\n")
    clock.advance(1)
    assert robots.check(f"{server.url}/page") == Verdict(True, "allowed")
    assert server.hits["/robots.txt"] == 2
    assert robots.stats == Counter(fetched=2, cache_hits=1, disallowed=2, errors=1)


def test_a_timeout_disallows_for_a_while(
    server: RobotsServer, state: StateDB, clock: FakeClock
) -> None:
    server.robots("User-agent: *\nDisallow:\n", delay=1.0)
    with HttpFetcher(allow_private=True, timeout=Seconds(0.2), user_agent=UA, clock=clock) as fetcher:
        robots = RobotsCache(state.db, fetcher.fetch, UA, error_wait=600.0, clock=clock)
        verdict = robots.check(f"{server.url}/page")
    assert verdict == Verdict(False, "robots_unavailable", retry_at=clock.now + 600.0)
    assert robots.stats["errors"] == 1


def test_refused_connection_disallows_for_a_while(robots: RobotsCache, clock: FakeClock) -> None:
    server = RobotsServer()
    url = server.url
    server.server_close()  # nothing listens on the port now
    assert robots.check(f"{url}/page") == Verdict(False, "robots_unavailable", retry_at=clock.now + HOUR)


def test_an_html_page_as_robots_allows_everything(server: RobotsServer, robots: RobotsCache) -> None:
    server.robots("<!doctype html><html><head><title>Welcome</title></head>"
                  "<body><h1>Disallow: nothing here</h1><p>User-agent: *</p></body></html>")
    assert robots.check(f"{server.url}/page").allowed


def test_a_10mb_robots_is_cut_and_still_answers(
    server: RobotsServer, state: StateDB, clock: FakeClock
) -> None:
    head = b"User-agent: *\nDisallow: /private\n"
    filler = b"Disallow: /filler-path-that-goes-on-and-on\n"
    server.robots(head + filler * (10_000_000 // len(filler)))
    with HttpFetcher(allow_private=True, max_bytes=Bytes(20_000_000), user_agent=UA, clock=clock) as fetcher:
        robots = RobotsCache(state.db, fetcher.fetch, UA, max_bytes=500_000, clock=clock)
        assert not robots.check(f"{server.url}/private").allowed
        assert robots.check(f"{server.url}/public").allowed
    stored = json.loads(state.db.get(KEY_PREFIX + host_key(server.url).encode()))
    assert len(stored["text"]) <= 500_000 and stored["text"].endswith("\n")


def test_a_cut_robots_drops_its_partial_last_line(server: RobotsServer, state: StateDB, fetcher: HttpFetcher,
                                                   clock: FakeClock) -> None:
    head = "User-agent: *\nDisallow: /secret\n"
    server.robots(head + "Disallow: /private-area\n")
    robots = RobotsCache(state.db, fetcher.fetch, UA, max_bytes=len(head) + len("Disallow: /p"), clock=clock)
    assert not robots.check(f"{server.url}/secret").allowed
    assert robots.check(f"{server.url}/public").allowed  # not caught by a cut "Disallow: /p"


def test_a_binary_garbage_robots_does_not_crash(server: RobotsServer, robots: RobotsCache) -> None:
    server.robots(bytes(range(256)) * 64 + b"\xff\xfe\x00Disallow\x00/\n\x80\x81")
    assert robots.check(f"{server.url}/page").allowed


def test_a_bad_url_gets_a_verdict_not_an_exception(robots: RobotsCache) -> None:
    assert robots.check("ftp://example.org/file") == Verdict(False, "bad_url")


# -- the tables and helpers, row by row ----------------------------------------------------------


@pytest.mark.parametrize(("status", "error", "rule"), [
    (200, None, "parse"),
    (204, None, "parse"),
    (304, None, "allow_all"),
    (401, "unauthorized", "allow_all"),
    (403, "forbidden", "allow_all"),
    (404, "not_found", "allow_all"),
    (429, "rate_limited", "allow_all"),
    (500, "server_error", "unavailable"),
    (503, "unavailable", "unavailable"),
    (0, "timeout", "unavailable"),
    (200, "timeout", "unavailable"),  # headers came, the body did not
    (0, "refused", "unavailable"),
    (0, "dns", "unavailable"),
    (200, "broken_body", "unavailable"),
    (302, "too_many_redirects", "allow_all"),
])
def test_rule_for_each_answer(status: int, error: str | None, rule: str) -> None:
    assert rule_for(Response(Request("http://example.org/robots.txt"), status, error=error)) == rule


def test_tables_cover_the_http_status_classes() -> None:
    assert set(STATUS_CLASS_RULES) == {2, 3, 4, 5} and set(ERROR_RULES) == {"too_many_redirects"}


@pytest.mark.parametrize(("url", "key"), [
    ("http://Example.ORG/a?b#c", "http://example.org:80"),
    ("https://example.org/", "https://example.org:443"),
    ("http://example.org:8080/x", "http://example.org:8080"),
    ("http://user:pw@example.org/x", "http://example.org:80"),
    ("http://[::1]:9000/x", "http://[::1]:9000"),
])
def test_host_key(url: str, key: str) -> None:
    assert host_key(url) == key


@pytest.mark.parametrize(("user_agent", "token"), [
    (UA, "scrapekit"),
    ("Mozilla/5.0 (compatible; Foobot/1.0)", "Mozilla"),
    ("my-bot_2 (x)", "my-bot_2"),
    ("/weird", "/weird"),
])
def test_product_token(user_agent: str, token: str) -> None:
    assert product_token(user_agent) == token
