"""The flat-file source: formats, skipped lines, and resuming from a saved position."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from scrapekit.sources.flatfile import FlatFileSource


def test_formats_and_bad_lines(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    seeds = tmp_path / "seeds.txt"
    seeds.write_bytes(b"# header\n\nhttp://a.test/1\nhttp://a.test/2\tx\ty\n"
                      b'{"url": "http://a.test/3", "kind": "feed", "priority": 7}\n'
                      b"javascript:alert(1)\n\xff\xfe\n{\"no\": 1}\n  http://a.test/4  \n")
    caplog.set_level(logging.INFO, logger="scrapekit")
    got = list(FlatFileSource(seeds, kind="resource").requests(None))
    assert [(r.url, r.kind) for r, _ in got] == [
        ("http://a.test/1", "resource"), ("http://a.test/2", "resource"), ("http://a.test/3", "feed"),
        ("http://a.test/4", "resource")]
    assert got[1][0].meta == {"fields": ["x", "y"]} and got[2][0].priority == 7
    skipped = [r.getMessage() for r in caplog.records]
    assert any(":6: skipped: not an http(s) URL" in m for m in skipped)
    assert any(":7: skipped: not UTF-8" in m for m in skipped)
    assert any(":8: skipped:" in m for m in skipped)


def test_resumes_after_the_saved_position(tmp_path: Path) -> None:
    seeds = tmp_path / "seeds.txt"
    seeds.write_text("".join(f"http://a.test/{n}\n" for n in range(10)))
    source = FlatFileSource(seeds)
    first = list(source.requests(None))
    position = first[3][1]
    rest = [r.url for r, _ in source.requests(position)]
    assert rest == [f"http://a.test/{n}" for n in range(4, 10)]
    with seeds.open("a") as handle:  # lines appended later are read on the next pass
        handle.write("http://a.test/10\n")
    assert [r.url for r, _ in source.requests(first[-1][1])] == ["http://a.test/10"]
