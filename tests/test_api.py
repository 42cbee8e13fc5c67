"""The public surface plugin authors rely on: pinned, so a change to it is a deliberate one."""

from __future__ import annotations

import sys
from pathlib import Path

import scrapekit

ROOT = Path(__file__).resolve().parents[1]


def test_public_names_are_pinned() -> None:
    assert scrapekit.__all__ == [
        "AlreadyRunning", "BadUrl", "Bytes", "Checkpointed", "Fetcher", "Item", "Job", "Parser", "PartError",
        "PersistentQueue", "Queue", "QueueError", "RecipeError", "RecipeErrors", "Request", "Response",
        "ScrapekitError", "Seconds", "Source", "Store", "StoreError", "Transaction", "__version__", "canonical_url",
    ]
    assert all(hasattr(scrapekit, name) for name in scrapekit.__all__)


def test_errors_have_one_root_and_exit_codes() -> None:
    for name in ("AlreadyRunning", "PartError", "QueueError", "RecipeError", "RecipeErrors", "StoreError"):
        assert issubclass(getattr(scrapekit, name), scrapekit.ScrapekitError)
    assert scrapekit.RecipeError("r.yaml", 3, "fetch.timeout", "bad").exit_code == 2
    assert str(scrapekit.RecipeError("r.yaml", 3, "fetch.timeout", "bad")) == "r.yaml:3: fetch.timeout: bad"


def test_the_test_plugins_match_the_protocols() -> None:
    sys.path.insert(0, str(ROOT / "tests" / "plugins"))
    try:
        import skplugins
        assert isinstance(skplugins.RangeSource("http://a.test/{n}"), scrapekit.Source)
    finally:
        sys.path.remove(str(ROOT / "tests" / "plugins"))


def test_the_package_ships_its_types() -> None:
    """bin/test runs ``mypy --strict`` on the package before pytest."""
    assert (ROOT / "scrapekit" / "py.typed").exists()
    assert 'scrapekit = ["py.typed"]' in (ROOT / "pyproject.toml").read_text()
