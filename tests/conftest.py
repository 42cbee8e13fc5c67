"""Fixtures with real parts: the local site and a beanstalkd on 127.0.0.1 (free ports), and a
fake clock."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from scrapekit.demo.site import DemoSite

ROOT = Path(__file__).resolve().parents[1]


class FakeClock:
    """Time that moves only when a test says so."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self.now = start

    def time(self) -> float:
        return self.now

    __call__ = time

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    advance = sleep


@pytest.fixture
def site() -> Iterator[DemoSite]:
    with DemoSite() as running:
        yield running


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def wait_for(predicate: Callable[[], object], timeout: float = 30.0) -> None:
    """Poll ``predicate`` until it is true; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Beanstalkd:
    """A real beanstalkd on 127.0.0.1 and a free port, its binlog in a temp dir; stopped by pid."""

    def __init__(self, binlog: Path) -> None:
        self.executable = shutil.which("beanstalkd") or "/usr/bin/beanstalkd"
        if not os.path.exists(self.executable):
            pytest.fail("beanstalkd is not installed: run `bash bin/test`, which installs it")
        self.binlog = binlog
        self.port = free_port()
        self.url = f"beanstalk://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Beanstalkd:
        self.binlog.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen([self.executable, "-l", "127.0.0.1", "-p", str(self.port), "-b", str(self.binlog)])
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return self
            except OSError:
                time.sleep(0.02)
        raise RuntimeError(f"beanstalkd did not start on port {self.port}")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=10)
        self.proc = None


@pytest.fixture
def beanstalkd(tmp_path: Path) -> Iterator[Beanstalkd]:
    server = Beanstalkd(tmp_path / "binlog").start()
    yield server
    server.kill(signal.SIGTERM)


def _env(plugins: Sequence[Path]) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(str(path) for path in (ROOT, *plugins))}


def scrapekit(*args: str, cwd: Path, timeout: float = 120, plugins: Sequence[Path] = (),
              **options: Any) -> subprocess.CompletedProcess[str]:
    """``python -m scrapekit ARGS`` run to its end, as a user runs it from ``cwd``; ``plugins``
    are more folders on its PYTHONPATH, ``options`` more arguments of subprocess.run."""
    return subprocess.run([sys.executable, "-m", "scrapekit", *args], cwd=cwd, env=_env(plugins),
                          capture_output=True, text=True, timeout=timeout, **options)


def start(*args: str, cwd: Path) -> subprocess.Popen[str]:
    """``python -m scrapekit ARGS`` started in the background, its output captured."""
    return subprocess.Popen([sys.executable, "-m", "scrapekit", *args], cwd=cwd, env=_env(()),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
