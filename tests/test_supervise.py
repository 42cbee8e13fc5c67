"""scrapekit supervise as a user runs it: a real supervisord over workers of beanstalk recipes
against the local site; a worker killed with SIGKILL comes back, a crash loop shows as BACKOFF or
FATAL, one supervisord per work directory, stop leaves nothing behind."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scrapekit.demo.site import DemoSite
from scrapekit.shards import worker_dir

from .conftest import Beanstalkd, free_port, scrapekit, start, wait_for

WORKERS = 2
FAST = ("--startsecs", "1")  # RUNNING sooner; the crash loop test keeps a longer one so a slow failure counts


def recipe(tmp_path: Path, name: str, queue_url: str, urls: list[str], extra: str = "") -> Path:
    (tmp_path / f"{name}.txt").write_text("\n".join(urls) + "\n")
    path = tmp_path / f"{name}.yaml"
    path.write_text(f"name: {name}\nwork_dir: work\nsource: {{type: flat_file, path: {name}.txt}}\n"
                    f"queue: {{type: beanstalk, url: '{queue_url}', tube: {name}}}\nfetch: {{concurrency: 1}}\n"
                    f"politeness: {{allow_private: true, robots: false}}\n{extra}")
    return path


def slow_urls(site: DemoSite) -> list[str]:
    """Work for minutes at concurrency 1: the workers are busy for the whole test."""
    return [f"{site.url}/slow?seconds=0.3&n={n}" for n in range(1000)]


def status(tmp_path: Path) -> tuple[int, list[dict[str, Any]]]:
    result = scrapekit("supervise", "status", "--json", "--work-dir", str(tmp_path / "work"), cwd=tmp_path)
    return result.returncode, (json.loads(result.stdout) if result.stdout.strip() else [])


def all_running(tmp_path: Path, count: int) -> bool:
    code, processes = status(tmp_path)
    return code == 0 and len(processes) == count and all(p["state"] == "RUNNING" and p["pid"] for p in processes)


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for its reaper does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def supervisord_pid(tmp_path: Path) -> int:
    return int((tmp_path / "work" / "supervisord.pid").read_text())


@pytest.fixture
def cleanup(tmp_path: Path, beanstalkd: Beanstalkd, site: DemoSite) -> Iterator[None]:
    """Stops whatever supervisord the test left in its work directory (before beanstalkd and the site stop)."""
    yield
    pid_file = tmp_path / "work" / "supervisord.pid"
    pid = int(pid_file.read_text()) if pid_file.exists() else None
    scrapekit("supervise", "stop", "--work-dir", str(tmp_path / "work"), cwd=tmp_path)
    if pid is not None and alive(pid):
        os.kill(pid, signal.SIGTERM)  # supervisord stops its children on TERM
        pytest.fail(f"supervise stop left supervisord {pid} running")


@pytest.mark.usefixtures("cleanup")
def test_a_worker_killed_with_sigkill_is_restarted(tmp_path: Path, beanstalkd: Beanstalkd, site: DemoSite) -> None:
    path = recipe(tmp_path, "t", beanstalkd.url, slow_urls(site))
    started = scrapekit("supervise", str(path), "--workers", str(WORKERS), *FAST, cwd=tmp_path)
    assert started.returncode == 0, started.stderr
    assert "started supervisord" in started.stdout and str(tmp_path / "work" / "supervisord.conf") in started.stdout
    wait_for(lambda: all_running(tmp_path, WORKERS), timeout=30)
    _, processes = status(tmp_path)
    assert [p["name"] for p in processes] == [f"t_{i}" for i in range(WORKERS)]
    assert [p["worker"] for p in processes] == list(range(WORKERS))
    assert (tmp_path / "work" / "supervisor" / "t_0.log").exists()
    victim = processes[0]
    pid_file = worker_dir(tmp_path / "work" / "t", victim["worker"]) / "run.pid"
    wait_for(lambda: pid_file.exists() and pid_file.read_text().strip() == str(victim["pid"]), timeout=30)

    os.kill(victim["pid"], signal.SIGKILL)

    def restarted() -> bool:
        _, now = status(tmp_path)
        return any(p["name"] == victim["name"] and p["state"] == "RUNNING" and p["pid"] not in (None, victim["pid"])
                   for p in now)

    wait_for(restarted, timeout=30)
    _, after = status(tmp_path)
    assert {p["name"]: p["pid"] for p in after if p["name"] != victim["name"]} == \
        {p["name"]: p["pid"] for p in processes if p["name"] != victim["name"]}
    by_recipe = scrapekit("supervise", "status", str(path), cwd=tmp_path)  # the recipe names the work dir
    assert by_recipe.returncode == 0, by_recipe.stderr
    assert by_recipe.stdout.count("RUNNING") == WORKERS and f"t:t_0 " in by_recipe.stdout


@pytest.mark.usefixtures("cleanup")
def test_two_supervise_commands_at_once_start_one_supervisord(tmp_path: Path, beanstalkd: Beanstalkd,
                                                               site: DemoSite) -> None:
    path = recipe(tmp_path, "t", beanstalkd.url, slow_urls(site))
    first, second = (start("supervise", str(path), "--workers", str(WORKERS), *FAST, cwd=tmp_path)
                     for _ in range(2))
    results = sorted((p.wait(timeout=60), *p.communicate()) for p in (first, second))
    assert [code for code, _, _ in results] == [0, 2], results
    pid = supervisord_pid(tmp_path)
    refused = results[1][2]
    assert "supervisord already runs" in refused and f"pid {pid}" in refused and "supervise status" in refused
    wait_for(lambda: all_running(tmp_path, WORKERS), timeout=30)

    again = scrapekit("supervise", str(path), "--workers", str(WORKERS), *FAST, cwd=tmp_path)
    assert again.returncode == 2 and f"supervisord already runs for {tmp_path / 'work'} (pid {pid})" in again.stderr
    assert all_running(tmp_path, WORKERS) and supervisord_pid(tmp_path) == pid


@pytest.mark.usefixtures("cleanup")
def test_a_worker_that_fails_at_start_shows_backoff_or_fatal(tmp_path: Path, beanstalkd: Beanstalkd,
                                                              site: DemoSite) -> None:
    good = recipe(tmp_path, "good", beanstalkd.url, slow_urls(site))
    bad = recipe(tmp_path, "bad", f"beanstalk://127.0.0.1:{free_port()}", [f"{site.url}/page/1"])  # nobody listens
    started = scrapekit("supervise", str(good), str(bad), "--workers", str(WORKERS), "--startsecs", "8",
                        cwd=tmp_path)
    assert started.returncode == 0, started.stderr

    def crash_looping() -> bool:
        code, processes = status(tmp_path)
        return code == 3 and any(p["group"] == "bad" and p["state"] in ("BACKOFF", "FATAL")
                                 and "Exited too quickly" in p["description"] for p in processes)

    def shown_crash_looping() -> bool:
        shown = scrapekit("supervise", "status", "--work-dir", str(tmp_path / "work"), cwd=tmp_path)
        return shown.returncode == 3 and any(line.startswith("bad:bad_") and "Exited too quickly" in line
                                             and ("BACKOFF" in line or "FATAL" in line)
                                             for line in shown.stdout.splitlines())

    wait_for(crash_looping, timeout=90)
    wait_for(shown_crash_looping, timeout=90)
    assert "cannot reach beanstalkd" in (tmp_path / "work" / "supervisor" / "bad_0.log").read_text()

    def in_scrapekit_status() -> bool:  # scrapekit status shows it too, per worker
        joint = json.loads(scrapekit("status", str(bad), "--json", cwd=tmp_path).stdout)
        assert [w["worker"] for w in joint["workers"]] == [f"{i}/{WORKERS}" for i in range(WORKERS)]
        shown = scrapekit("status", str(bad), cwd=tmp_path).stdout
        return (any(w["supervisor"]["state"] in ("BACKOFF", "FATAL") for w in joint["workers"])
                and any(f"[supervisord: {state}, Exited too quickly" in shown for state in ("BACKOFF", "FATAL")))

    wait_for(in_scrapekit_status, timeout=90)
    wait_for(lambda: all(p["state"] == "RUNNING" for p in status(tmp_path)[1] if p["group"] == "good"), timeout=30)


@pytest.mark.usefixtures("cleanup")
def test_restart_gives_new_pids_and_stop_leaves_nothing(tmp_path: Path, beanstalkd: Beanstalkd,
                                                        site: DemoSite) -> None:
    path = recipe(tmp_path, "t", beanstalkd.url, slow_urls(site))
    assert scrapekit("supervise", str(path), "--workers", str(WORKERS), *FAST, cwd=tmp_path).returncode == 0
    wait_for(lambda: all_running(tmp_path, WORKERS), timeout=30)
    before = {p["name"]: p["pid"] for p in status(tmp_path)[1]}

    restarted = scrapekit("supervise", "restart", "--work-dir", str(tmp_path / "work"), cwd=tmp_path)
    assert restarted.returncode == 0, restarted.stderr
    after = {p["name"]: p["pid"] for p in status(tmp_path)[1]}
    assert after.keys() == before.keys() and all(after[n] != before[n] for n in before)
    assert all(f"pid {pid} " in restarted.stdout for pid in after.values())
    assert not any(alive(pid) for pid in before.values())

    supervisor = supervisord_pid(tmp_path)
    stopped = scrapekit("supervise", "stop", "--work-dir", str(tmp_path / "work"), cwd=tmp_path)
    assert stopped.returncode == 0, stopped.stderr
    assert f"stopped supervisord (pid {supervisor})" in stopped.stdout
    assert not alive(supervisor) and not any(alive(pid) for pid in after.values())
    assert not (tmp_path / "work" / "supervisord.sock").exists()
    gone = scrapekit("supervise", "status", "--work-dir", str(tmp_path / "work"), cwd=tmp_path)
    assert gone.returncode == 1 and "error: no supervisord runs for" in gone.stderr


@pytest.mark.usefixtures("cleanup")
def test_a_stale_socket_and_pid_file_do_not_block_a_start(tmp_path: Path, beanstalkd: Beanstalkd,
                                                          site: DemoSite) -> None:
    path = recipe(tmp_path, "t", beanstalkd.url, slow_urls(site))
    work = tmp_path / "work"
    work.mkdir()
    with socket.socket(socket.AF_UNIX) as stale:
        stale.bind(str(work / "supervisord.sock"))  # closed without unlinking, like a supervisord killed with -9
    dead = subprocess.Popen(["true"])
    dead.wait()
    (work / "supervisord.pid").write_text(f"{dead.pid}\n")

    started = scrapekit("supervise", str(path), "--workers", str(WORKERS), *FAST, cwd=tmp_path)
    assert started.returncode == 0, started.stderr
    wait_for(lambda: all_running(tmp_path, WORKERS), timeout=30)
    assert supervisord_pid(tmp_path) != dead.pid


def test_status_without_supervisord_is_a_clear_error(tmp_path: Path) -> None:
    result = scrapekit("supervise", "status", cwd=tmp_path)
    assert result.returncode == 1
    assert f"error: no supervisord runs for {tmp_path / 'work'}" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("case", ["malformed", "leveldb", "two work dirs"])
def test_recipes_that_cannot_be_supervised_start_nothing(tmp_path: Path, case: str) -> None:
    good = recipe(tmp_path, "good", "beanstalk://127.0.0.1:11300", ["http://127.0.0.1:1/x"])
    other = tmp_path / "other.yaml"
    other.write_text({
        "malformed": "name: other\nwork_dir: work\nsource: {type: flat_file, path: good.txt, nope: 1}\n",
        "leveldb": "name: other\nwork_dir: work\nsource: {type: flat_file, path: good.txt}\nqueue: {type: leveldb}\n",
        "two work dirs": "name: other\nwork_dir: elsewhere\nsource: {type: flat_file, path: good.txt}\n"
                         "queue: {type: beanstalk, url: 'beanstalk://127.0.0.1:11300'}\n",
    }[case])
    result = scrapekit("supervise", str(good), str(other), "--workers", "2", cwd=tmp_path)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    expected = {
        "malformed": f"{other}:3: source.nope:",
        "leveldb": f"{other}:4: queue: workers share their queue on beanstalkd",
        "two work dirs": f"error: the recipes must share one work_dir (one supervisord per work directory); "
                         f"they use {tmp_path / 'elsewhere'}, {tmp_path / 'work'}",
    }[case]
    assert expected in result.stderr
    assert not (tmp_path / "work" / "supervisord.conf").exists()
    assert not (tmp_path / "work" / "supervisord.sock").exists()
