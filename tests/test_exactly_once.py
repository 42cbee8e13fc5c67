"""Exactly-once output across kill -9, for both queue types: every seed request is fetched and
every output row appears once, checked row by row."""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from scrapekit.stores.chunked import read_tsv

from .conftest import Beanstalkd, scrapekit

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def write_recipe(tmp_path: Path, urls: list[str], queue: str = "") -> Path:
    (tmp_path / "urls.txt").write_text("\n".join(urls) + "\n")
    path = tmp_path / "r.yaml"
    path.write_text("name: t\nsource: {type: flat_file, path: urls.txt, window: 300}\npoliteness: {allow_private: true, robots: false}\n"
                    f"{queue}fetch: {{concurrency: 8}}\nstore: {{type: chunked_tsv, size: 50KB}}\n")
    return path


def start(path: Path, cwd: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "scrapekit", "run", str(path), "--no-console"], cwd=cwd,
                            env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def finish(path: Path, cwd: Path) -> None:
    final = scrapekit("run", str(path), "--no-console", cwd=cwd, timeout=300)
    assert final.returncode == 0, final.stderr


def check_rows(tmp_path: Path, urls: list[str]) -> None:
    out = tmp_path / "work" / "t" / "out"
    assert not list(out.glob("*/*.part")), "every chunk is sealed after a clean stop"
    rows = [row for chunk in sorted(out.glob("*/*.tsv")) for row in read_tsv(chunk)]
    counts = Counter(row.url for row in rows)
    assert set(counts) == set(urls), f"missing: {sorted(set(urls) - set(counts))[:5]}"
    assert [url for url, n in counts.items() if n > 1] == []
    for row in rows:  # each row is whole and belongs to its own URL
        n = re.search(r"/page/(\d+)$", row.url)
        assert n is not None and row.status == 200 and f"<title>Page {n.group(1)}</title>".encode() in row.body


def test_leveldb_run_killed_at_20_random_moments(tmp_path: Path, site) -> None:
    rng = random.Random(int(os.environ.get("SCRAPEKIT_TEST_SEED", "20261123")))
    urls = [f"{site.url}/page/{n}" for n in range(1500)]
    path = write_recipe(tmp_path, urls)
    for _ in range(20):
        proc = start(path, tmp_path)
        time.sleep(rng.uniform(0.05, 0.7))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finish(path, tmp_path)
    check_rows(tmp_path, urls)
    assert sum(site.hits.values()) >= len(urls)


def test_beanstalk_run_killed_and_server_restarted_mid_run(tmp_path: Path, site, beanstalkd: Beanstalkd) -> None:
    rng = random.Random(int(os.environ.get("SCRAPEKIT_TEST_SEED", "20261123")))
    urls = [f"{site.url}/page/{n}" for n in range(1000)]
    path = write_recipe(tmp_path, urls, f"queue: {{type: beanstalk, url: '{beanstalkd.url}', tube: t, ttr: 30s}}\n")
    for round_ in range(8):
        proc = start(path, tmp_path)
        time.sleep(rng.uniform(0.2, 0.8))
        if round_ % 2:
            beanstalkd.kill()  # the server dies under a running worker, which waits and retries
            time.sleep(rng.uniform(0.1, 0.5))
            beanstalkd.start()
            time.sleep(rng.uniform(0.1, 0.5))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        if round_ % 3 == 2:
            beanstalkd.kill()  # and dies with the worker
            beanstalkd.start()
    finish(path, tmp_path)
    check_rows(tmp_path, urls)


def test_a_run_waits_for_a_dead_beanstalkd_and_a_second_signal_stops_it(tmp_path: Path, site,
                                                                          beanstalkd: Beanstalkd) -> None:
    urls = [f"{site.url}/page/{n}" for n in range(300)]
    path = write_recipe(tmp_path, urls, f"queue: {{type: beanstalk, url: '{beanstalkd.url}', tube: t}}\n")
    proc = start(path, tmp_path)
    deadline = time.monotonic() + 30
    while not list((tmp_path / "work" / "t" / "out").glob("*/*.part")) and time.monotonic() < deadline:
        time.sleep(0.05)
    beanstalkd.kill()
    time.sleep(1.0)
    assert proc.poll() is None  # waiting for beanstalkd, not crashed
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 1 and b"stopped at once by a second signal" in err
    info = (tmp_path / "work" / "t" / "log" / "info.log").read_text()
    assert "beanstalkd at " + beanstalkd.url + " unreachable" in info
    beanstalkd.start()
    finish(path, tmp_path)
    check_rows(tmp_path, urls)
