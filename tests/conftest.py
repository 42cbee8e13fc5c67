"""Fixtures with real parts: the local site on 127.0.0.1 (a free port) and a fake clock."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from scrapekit.demo.site import DemoSite


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
