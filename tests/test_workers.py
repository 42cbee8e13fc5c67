"""Many workers over one beanstalkd: domain shards, follow-ups routed to their owner's inbox,
the parent that restarts and finishes its workers, joint status, resharding, beanstalkd down."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from scrapekit.errors import ScrapekitError
from scrapekit.model import Request
from scrapekit.shards import Shard, claim_layout, inbox_tube, shard_of, work_tube
from scrapekit.sources.beanstalk import BeanstalkQueue, BeanstalkUrl
from scrapekit.state import StateDB
from scrapekit.stores.chunked import TsvRow, read_tsv

from .conftest import Beanstalkd, scrapekit, start, wait_for

PAGES = 8  # per host


def _hosts(count: int, shards: int) -> list[str]:
    """``count`` loopback addresses, as evenly spread over ``shards`` shards as can be."""
    by_shard: dict[int, list[str]] = {}
    for last in range(2, 250):
        host = f"127.0.0.{last}"
        by_shard.setdefault(shard_of(f"http://{host}/", shards), []).append(host)
    picked = []
    while len(picked) < count:
        for shard in range(shards):
            if by_shard[shard] and len(picked) < count:
                picked.append(by_shard[shard].pop(0))
    return picked


class _Web:
    """One small site per loopback host: page n links to page n+1 of its host and to page n of
    the next host, so a crawl from one seed reaches every host only across shards."""

    def __init__(self, hosts: list[str], delay: float = 0.0) -> None:
        self.hits: Counter[str] = Counter()
        self.lock = threading.Lock()
        self.servers = [self._server(host, delay) for host in hosts]
        self.urls = [f"http://{s.server_address[0]}:{s.server_address[1]}" for s in self.servers]
        for server in self.servers:
            threading.Thread(target=server.serve_forever, daemon=True).start()

    def _server(self, host: str, delay: float) -> ThreadingHTTPServer:
        web = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                origin = f"http://{self.server.server_address[0]}:{self.server.server_address[1]}"  # type: ignore[str-bytes-safe]
                with web.lock:
                    web.hits[origin + self.path] += 1
                time.sleep(delay)
                n = int(self.path.rsplit("/", 1)[-1]) if self.path.startswith("/p/") else -1
                links = ""
                if 0 <= n:
                    me = web.urls.index(origin)
                    if n + 1 < PAGES:
                        links += f'<a href="/p/{n + 1}">next</a>'
                    links += f'<a href="{web.urls[(me + 1) % len(web.urls)]}/p/{n}">other</a>'
                body = f"<html><title>{self.path}</title><body>{links}</body></html>".encode()
                self.send_response(200 if n >= 0 else 404)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        return ThreadingHTTPServer((host, 0), Handler)

    def all_pages(self) -> set[str]:
        return {f"{url}/p/{n}" for url in self.urls for n in range(PAGES)}

    def close(self) -> None:
        for server in self.servers:
            server.shutdown()
            server.server_close()


@pytest.fixture
def web() -> Iterator[_Web]:
    site = _Web(_hosts(4, 2))
    yield site
    site.close()


def _recipe(tmp_path: Path, beanstalkd: Beanstalkd, seeds: list[str], crawl: bool = True, extra: str = "") -> Path:
    (tmp_path / "seeds.txt").write_text("\n".join(seeds) + "\n")
    follow = "follow: {links: '//a/@href', allow: ['/p/\\d+$']}\n" if crawl else ""
    path = tmp_path / "w.yaml"
    path.write_text(
        "name: w\nwork_dir: work\nsource: {type: flat_file, path: seeds.txt}\n"
        f"queue: {{type: beanstalk, url: '{beanstalkd.url}', tube: w{os.getpid()}}}\n"
        "fetch: {concurrency: 4, timeout: 10s}\n"
        "politeness: {allow_private: true, robots: false}\n"
        f"{follow}store: {{type: chunked_tsv}}\nlog: {{stats_interval: 1s, progress_interval: 1s}}\n{extra}")
    return path


def _rows(tmp_path: Path) -> list[TsvRow]:
    chunks = sorted((tmp_path / "work" / "w" / "out").glob("*/*.tsv"))
    return [row for chunk in chunks for row in read_tsv(chunk)]


def _stored_urls(tmp_path: Path) -> Counter[str]:
    return Counter(row.url for row in _rows(tmp_path))


def _chunks_by_worker(tmp_path: Path) -> dict[str, set[str]]:
    """URLs stored per worker, told apart by the chunk names (w.w0+..., w.w1+...)."""
    found: dict[str, set[str]] = {}
    for chunk in (tmp_path / "work" / "w" / "out").glob("*/*.tsv"):
        worker = chunk.name.split("+", 1)[0]
        found.setdefault(worker, set()).update(row.url for row in read_tsv(chunk))
    return found


# -- shards ------------------------------------------------------------------------------------

def test_the_shard_of_a_url_is_its_registered_domains_crc32_and_the_same_everywhere() -> None:
    import zlib

    assert shard_of("http://www.example.co.uk/a", 7) == zlib.crc32(b"example.co.uk") % 7
    assert shard_of("https://news.example.co.uk/b?x=1", 7) == shard_of("http://example.co.uk/", 7)
    assert shard_of("http://anything.org/", 1) == 0
    counts = Counter(shard_of(f"http://site{i}.com/", 4) for i in range(4000))
    assert set(counts) == {0, 1, 2, 3} and min(counts.values()) > 900  # spread evenly over many domains


def test_worker_arguments_and_layout_are_checked(tmp_path: Path) -> None:
    assert Shard.parse("1/3") == Shard(1, 3)
    for bad in ("3/3", "-1/2", "1", "a/b", "0/0"):
        with pytest.raises(ValueError, match="I/N"):
            Shard.parse(bad)
    claim_layout(tmp_path, "w", 2)
    claim_layout(tmp_path, "w", 2)
    with pytest.raises(ScrapekitError, match="laid out for 2 workers.*reshard"):
        claim_layout(tmp_path, "w", 3)


def test_a_request_of_another_shard_goes_to_its_owners_inbox_once(tmp_path: Path, beanstalkd: Beanstalkd) -> None:
    hosts = _hosts(2, 2)
    mine, theirs = (f"http://{h}/p/1" for h in hosts)
    url = BeanstalkUrl(beanstalkd.url)
    with StateDB(tmp_path / "s0") as s0, StateDB(tmp_path / "s1") as s1:
        q0 = BeanstalkQueue(s0, url, tube="t", shard=Shard(shard_of(mine, 2), 2))
        q1 = BeanstalkQueue(s1, url, tube="t", shard=Shard(shard_of(theirs, 2), 2))
        assert q0.put(Request(mine)) and q0.put(Request(theirs))
        assert not q0.put(Request(theirs))  # sent once: known to the sender from then on
        assert q0.counts()["ready"] == 1 and q1.counts() == {**q1.counts(), "ready": 0, "inbox": 1}
        assert q1.intake() == 1
        assert q1.counts()["ready"] == 1 and q1.counts()["inbox"] == 0
        job = q1.reserve()
        assert job is not None and job.request.url == theirs
        q1.ack(job)
        # A second copy from elsewhere (another worker, or a replay) is dropped by the owner.
        with q0.transaction() as tx:
            tx.put(Request(theirs), unseen=True)
        assert q1.intake() == 1 and q1.counts()["ready"] == 0 and q1.reserve() is None
        assert work_tube("t", 0) == "t.0" and inbox_tube("t", 1) == "t.1.in"
        q0.close()
        q1.close()


def test_a_dump_holds_the_jobs_still_in_the_inbox(tmp_path: Path, beanstalkd: Beanstalkd) -> None:
    mine, theirs = (f"http://{h}/p/1" for h in _hosts(2, 2))
    url = BeanstalkUrl(beanstalkd.url)
    with StateDB(tmp_path / "s0") as s0, StateDB(tmp_path / "s1") as s1:
        q0 = BeanstalkQueue(s0, url, tube="d", shard=Shard(shard_of(mine, 2), 2))
        q1 = BeanstalkQueue(s1, url, tube="d", shard=Shard(shard_of(theirs, 2), 2))
        assert q0.put(Request(theirs)) and q1.counts()["inbox"] == 1
        assert [record["request"]["url"] for record in q1.dump()] == [theirs]
        assert q1.counts()["inbox"] == 0 and q1.counts()["ready"] == 1  # taken in, still queued
        q0.close()
        q1.close()


# -- the parent and its workers ----------------------------------------------------------------

def test_two_workers_crawl_across_shards_each_page_once_each_domain_by_its_owner(
        tmp_path: Path, beanstalkd: Beanstalkd, web: _Web) -> None:
    path = _recipe(tmp_path, beanstalkd, [f"{web.urls[0]}/p/0"])
    result = scrapekit("run", str(path), "--workers", "2", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    stored = _stored_urls(tmp_path)
    assert set(stored) == web.all_pages() and set(stored.values()) == {1}
    assert set(web.hits.values()) == {1}  # fetched once each: the owner's seen-set is exact
    by_worker = _chunks_by_worker(tmp_path)
    assert set(by_worker) == {"w.w0", "w.w1"}
    for worker, urls in by_worker.items():
        index = int(worker.rsplit("w", 1)[1])
        assert {shard_of(u, 2) for u in urls} == {index}
    assert not list((tmp_path / "work" / "w" / "out").glob("*/*.part"))  # sealed on stop
    status = json.loads(scrapekit("status", str(path), "--json", cwd=tmp_path).stdout)
    assert [w["worker"] for w in status["workers"]] == ["0/2", "1/2"]
    assert status["done"] == len(web.all_pages()) == sum(w["done"] for w in status["workers"])
    assert all(w["stop_reason"] == "done" and not w["running"] for w in status["workers"])
    assert set(status["tubes"]) == {f"w{os.getpid()}.{i}{x}" for i in (0, 1) for x in ("", ".in")}
    assert all(sum(c[k] for k in ("ready", "reserved", "delayed")) == 0 for c in status["tubes"].values())
    report = scrapekit("report", str(path), cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    page = Path(report.stdout.strip()).read_text()
    top = page.split("<h2>Top domains</h2>", 1)[1].split("</table>", 1)[0]
    hosts = [url.split("//")[1].split(":")[0] for url in web.urls]
    assert all(f"<td>{host}</td><td class=\"n\">{PAGES}</td>" in top for host in hosts), top
    assert f'<td class="n">{len(web.all_pages())}</td>' in page.split("</table>", 1)[0]  # done, all workers
    again = scrapekit("run", str(path), "--workers", "3", cwd=tmp_path)
    assert again.returncode != 0 and "laid out for 2 workers" in again.stderr and "reshard" in again.stderr
    single = scrapekit("run", str(path), cwd=tmp_path)
    assert single.returncode != 0 and "--workers 2" in single.stderr


def test_when_one_worker_reaches_its_limit_the_idle_others_finish(tmp_path: Path, beanstalkd: Beanstalkd) -> None:
    web = _Web(_hosts(2, 2))
    try:
        busy, quiet = web.urls
        seeds = [f"{busy}/p/{n}" for n in range(PAGES)] + [f"{quiet}/p/0"]
        path = _recipe(tmp_path, beanstalkd, seeds, crawl=False)
        result = scrapekit("run", str(path), "--workers", "2", "--max-requests", "3", cwd=tmp_path, timeout=60)
        assert result.returncode == 0, result.stderr
        assert "idle and another reached its limit" in result.stderr
        status = json.loads(scrapekit("status", str(path), "--json", cwd=tmp_path).stdout)
        reasons = sorted(w["stop_reason"] for w in status["workers"])
        assert reasons == ["done", "max_requests"]
        assert status["done"] == 4  # 3 of the busy host's, the quiet host's one
    finally:
        web.close()


def test_two_machines_each_with_its_own_work_dir_share_one_beanstalkd(
        tmp_path: Path, beanstalkd: Beanstalkd, web: _Web) -> None:
    """Workers started by hand, as on two machines: each its own copy of the recipe and its own
    work directory, only beanstalkd in common. They idle when done, until stopped."""
    machines = [tmp_path / "a", tmp_path / "b"]
    workers = []
    for index, machine in enumerate(machines):
        machine.mkdir()
        path = _recipe(machine, beanstalkd, [f"{web.urls[0]}/p/0"])
        workers.append(start("run", str(path), "--worker", f"{index}/2", cwd=machine))
    try:
        wait_for(lambda: set(web.hits) == web.all_pages(), timeout=60)  # chunks are sealed at the stop
        time.sleep(2)  # the last acks; nothing more comes
        assert set(web.hits.values()) == {1}
    finally:
        for worker in workers:
            worker.send_signal(signal.SIGTERM)
        codes = [worker.wait(timeout=60) for worker in workers]
    assert codes == [0, 0]
    stored = _stored_urls_in(machines)
    assert set(stored) == web.all_pages() and set(stored.values()) == {1}
    for index, machine in enumerate(machines):
        assert {shard_of(u, 2) for u in _stored_urls_in([machine])} == {index}
        assert not list((machine / "work" / "w" / "out").glob("*/*.part"))  # sealed on stop


def _stored_urls_in(machines: list[Path]) -> Counter[str]:
    return sum((_stored_urls(machine) for machine in machines), Counter())


def test_workers_that_cannot_start_say_why_and_the_run_stops(tmp_path: Path) -> None:
    from .conftest import free_port

    (tmp_path / "seeds.txt").write_text("http://127.0.0.2/p/0\n")
    path = tmp_path / "d.yaml"
    path.write_text("name: d\nwork_dir: work\nsource: {type: flat_file, path: seeds.txt}\n"
                    f"queue: {{type: beanstalk, url: 'beanstalk://127.0.0.1:{free_port()}'}}\n"
                    "politeness: {allow_private: true, robots: false}\n")
    result = scrapekit("run", str(path), "--workers", "2", cwd=tmp_path, timeout=60)
    assert result.returncode == 1
    assert "worker 0/2 exited with code 1 (error: cannot reach beanstalkd at beanstalk://127.0.0.1:" in result.stderr


def test_workers_need_a_beanstalk_queue(tmp_path: Path, web: _Web) -> None:
    (tmp_path / "seeds.txt").write_text(f"{web.urls[0]}/p/0\n")
    path = tmp_path / "l.yaml"
    path.write_text("name: l\nwork_dir: work\nsource: {type: flat_file, path: seeds.txt}\n"
                    "politeness: {allow_private: true, robots: false}\n")
    result = scrapekit("run", str(path), "--workers", "2", cwd=tmp_path)
    assert result.returncode == 2 and "l.yaml" in result.stderr and "beanstalk" in result.stderr


def test_a_worker_killed_with_sigkill_is_started_again_and_nothing_is_lost_or_doubled(
        tmp_path: Path, beanstalkd: Beanstalkd) -> None:
    web = _Web(_hosts(4, 2), delay=0.3)
    try:
        path = _recipe(tmp_path, beanstalkd, [f"{url}/p/0" for url in web.urls])
        parent = start("run", str(path), "--workers", "2", cwd=tmp_path)
        pid_file = tmp_path / "work" / "w" / "workers" / "1" / "run.pid"
        stats = tmp_path / "work" / "w" / "workers" / "1" / "stats.json"
        wait_for(lambda: stats.exists() and json.loads(stats.read_text()).get("done", 0) >= 2)
        victim = int(pid_file.read_text())
        live = json.loads(scrapekit("status", str(path), "--json", cwd=tmp_path).stdout)
        assert live["running"] == 2 and live["workers"][1]["pid"] == victim
        assert all(w["uptime"] is not None and w["uptime"] >= 0 for w in live["workers"])
        assert set(live["tubes"]) == {f"w{os.getpid()}.{i}{x}" for i in (0, 1) for x in ("", ".in")}
        shown = scrapekit("status", str(path), cwd=tmp_path).stdout
        assert "2 of 2 workers running" in shown and f"worker 1/2: pid {victim}" in shown
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: pid_file.exists() and pid_file.read_text().strip() not in ("", str(victim))
                 and int(pid_file.read_text()) > 0)
        _, err = parent.communicate(timeout=120)
        assert parent.returncode == 0, err
        assert "killed by signal 9" in err and "starting it again" in err
        assert "workers running | done" in err  # the parent's progress line for all workers
        stored = _stored_urls(tmp_path)
        assert set(stored) == web.all_pages() and set(stored.values()) == {1}
    finally:
        web.close()


def test_beanstalkd_down_while_workers_run_they_wait_and_resume(tmp_path: Path, beanstalkd: Beanstalkd) -> None:
    web = _Web(_hosts(4, 2), delay=0.3)
    try:
        path = _recipe(tmp_path, beanstalkd, [f"{url}/p/0" for url in web.urls])
        parent = start("run", str(path), "--workers", "2", cwd=tmp_path)
        stats = tmp_path / "work" / "w" / "workers" / "0" / "stats.json"
        wait_for(lambda: stats.exists() and json.loads(stats.read_text()).get("done", 0) >= 2)
        beanstalkd.kill()
        time.sleep(2)
        beanstalkd.start()  # same port, same binlog: the jobs are back
        _, err = parent.communicate(timeout=120)
        assert parent.returncode == 0, err
        logs = "".join(p.read_text() for p in (tmp_path / "work" / "w" / "workers").glob("*/log/info.log"))
        assert "unreachable" in logs and "reconnected" in logs
        stored = _stored_urls(tmp_path)
        assert set(stored) == web.all_pages() and set(stored.values()) == {1}
    finally:
        web.close()


def test_reshard_from_two_workers_to_three_keeps_every_job_and_the_seen_set(
        tmp_path: Path, beanstalkd: Beanstalkd) -> None:
    web = _Web(_hosts(6, 3))
    try:
        urls = sorted(web.all_pages())
        path = _recipe(tmp_path, beanstalkd, urls, crawl=False)
        first = scrapekit("run", str(path), "--workers", "2", "--max-requests", "6", cwd=tmp_path)
        assert first.returncode == 0, first.stderr
        done_before = set(_stored_urls(tmp_path))
        assert 0 < len(done_before) < len(urls)
        dumped = scrapekit("dump", str(path), str(tmp_path / "before.jsonl"), cwd=tmp_path)
        assert dumped.returncode == 0, dumped.stderr
        queued = {json.loads(line)["request"]["url"] for line in (tmp_path / "before.jsonl").read_text().splitlines()}
        assert queued and not queued & done_before
        result = scrapekit("reshard", str(path), "--workers", "3", cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        assert "from 2 to 3 workers" in result.stdout
        hits_before = Counter(web.hits)
        rest = scrapekit("run", str(path), "--workers", "3", cwd=tmp_path)
        assert rest.returncode == 0, rest.stderr
        stored = _stored_urls(tmp_path)
        assert set(stored) == set(urls) and set(stored.values()) == {1}
        assert all(web.hits[u] == 1 for u in done_before) and hits_before == Counter(
            {u: n for u, n in web.hits.items() if u in done_before})  # done pages not fetched again
        status = json.loads(scrapekit("status", str(path), "--json", cwd=tmp_path).stdout)
        assert len(status["workers"]) == 3
    finally:
        web.close()


def test_supervise_refuses_another_number_of_workers_than_the_layout(tmp_path: Path, beanstalkd: Beanstalkd) -> None:
    path = _recipe(tmp_path, beanstalkd, ["http://127.0.0.2/p/0"])
    claim_layout(tmp_path / "work" / "w", "w", 2)
    result = scrapekit("supervise", str(path), "--workers", "3", cwd=tmp_path)
    assert result.returncode != 0 and "laid out for 2 workers" in result.stderr and "reshard" in result.stderr
    assert not (tmp_path / "work" / "supervisord.conf").exists()
