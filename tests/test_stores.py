"""The chunked stores on real files: escaping, rows, chunk names, rotation, checkpoint/recover."""

from __future__ import annotations

import calendar
import json
import os
import re
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scrapekit.errors import StoreError
from scrapekit.model import Item, Request, Response
from scrapekit.stores import Checkpointed
from scrapekit.stores.chunked import (
    ChunkedTsvStore,
    JsonlStore,
    TsvRow,
    escape_field,
    read_jsonl,
    read_tsv,
    unescape_field,
)
from scrapekit.units import Bytes, Seconds

T0 = float(calendar.timegm((2026, 11, 22, 16, 48, 24)))  # 20261122164824 UTC
NASTY = bytes(range(256)) + b"\\n\\\\n\\t\r\n\t\\"


class Clock:
    """Time that moves only when the test moves it."""

    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def page(url: str = "http://example.org/a", body: bytes = b"<html>", final_url: str = "", **fields: Any) -> Response:
    request = fields.pop("request", None) or Request(url)
    return Response(request, fields.pop("status", 200), fields.pop("reason", "OK"), body=body, url=final_url,
                    fetched_at=fields.pop("fetched_at", T0), elapsed=fields.pop("elapsed", 0.25), **fields)


def files(out: Path, pattern: str = "*/*") -> list[str]:
    return sorted(p.relative_to(out).as_posix() for p in out.glob(pattern))


def sealed(out: Path, ext: str = "tsv") -> list[Path]:
    return sorted(out.glob(f"*/*.{ext}"))


def urls(path: Path) -> list[str]:
    return [row.url for row in read_tsv(path)]


def committed_rows(store: ChunkedTsvStore, start: int, stop: int) -> dict[str, Any]:
    """Write rows start..stop-1, flush and checkpoint them: what the runner does before its batch."""
    for n in range(start, stop):
        store.write(page(f"http://example.org/{n}"))
    store.flush()
    return store.checkpoint()


# -- escaping -------------------------------------------------------------------------------

@given(st.binary())
def test_any_bytes_round_trip_through_escape_and_unescape(value: bytes) -> None:
    escaped = escape_field(value)
    assert unescape_field(escaped) == value
    assert not {b"\t", b"\n", b"\r"} & {escaped[i:i + 1] for i in range(len(escaped))}


@pytest.mark.parametrize(("raw", "escaped"), [
    (b"a\tb", b"a\\tb"),
    (b"\\n", b"\\\\n"),  # a backslash then n, not a newline
    (b"\\\n", b"\\\\\\n"),
    (b"\r\n", b"\\r\\n"),
    (b"plain", b"plain"),
])
def test_escapes_are_exact_and_reversible(raw: bytes, escaped: bytes) -> None:
    assert escape_field(raw) == escaped
    assert unescape_field(escaped) == raw


# -- rows -----------------------------------------------------------------------------------

def test_page_row_has_the_fields_in_order_and_reads_back_exactly(tmp_path: Path) -> None:
    request = Request("http://example.org/a?x=1", meta={"tag": "é"}, depth=2, attempt=1)
    response = page(request=request, body=NASTY, final_url="http://example.org/b", truncated=True,
                    headers={"Content-Type": "text/html", "Location": "/c"}, elapsed=0.12345)
    with ChunkedTsvStore(tmp_path, "t", clock=Clock()) as store:
        store.write(response)
    (chunk,) = sealed(tmp_path)
    raw = chunk.read_bytes()
    assert raw.count(b"\n") == 1 and raw.endswith(b"\n")
    fields = raw[:-1].split(b"\t")
    assert fields[:5] == [b"page", b"http://example.org/a?x=1", b"20261122164824", b"200", b"OK"]
    meta = {"attempt": 1, "content_type": "text/html", "depth": 2, "elapsed": 0.123, "final_url": "http://example.org/b",
            "key": "http://example.org/a?x=1", "length": len(NASTY), "location": "/c", "meta": {"tag": "é"},
            "truncated": True}
    assert fields[5] == json.dumps(meta, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    assert list(read_tsv(chunk)) == [TsvRow("page", "http://example.org/a?x=1", "20261122164824", 200, "OK", meta, NASTY)]


def test_page_meta_leaves_out_what_does_not_apply(tmp_path: Path) -> None:
    with ChunkedTsvStore(tmp_path, "t", clock=Clock()) as store:
        store.write(page(body=b"abc"))
    (row,) = read_tsv(sealed(tmp_path)[0])
    assert row.meta == {"key": "http://example.org/a", "depth": 0, "attempt": 0, "elapsed": 0.25, "length": 3}


def test_an_error_record_gives_the_error_kind_as_reason(tmp_path: Path) -> None:
    with ChunkedTsvStore(tmp_path, "t", clock=Clock()) as store:
        store.write(page(status=0, reason="", body=b"", error="timeout"))
        store.write(page("http://example.org/b", status=404, reason=""))
    rows = list(read_tsv(sealed(tmp_path)[0]))
    assert [(r.status, r.reason) for r in rows] == [(0, "timeout"), (404, "Not Found")]


def test_item_rows_carry_the_fields_as_meta(tmp_path: Path) -> None:
    item = Item({"title": "A\tB", "price": 3}, "http://example.org/a", "k1", scraped_at=T0)
    with ChunkedTsvStore(tmp_path, "t", records="items", clock=Clock()) as store:
        assert store.records == "items"
        store.write(item)
    assert list(read_tsv(sealed(tmp_path)[0])) == [
        TsvRow("item", "http://example.org/a", "20261122164824", 200, "OK", {"title": "A\tB", "price": 3}, b"")]


def test_records_must_be_pages_or_items(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="pages, items"):
        ChunkedTsvStore(tmp_path, "t", records="rows")  # type: ignore[arg-type]


def test_reader_refuses_an_incomplete_row(tmp_path: Path) -> None:
    path = tmp_path / "x.tsv"
    path.write_bytes(b"page\turl\t20261122164824\t200\tOK\t{}\tbody\npage\turl\t2026")
    with pytest.raises(StoreError, match=r"x\.tsv:2:"):
        list(read_tsv(path))


# -- chunk files ----------------------------------------------------------------------------

def test_a_chunk_is_a_part_file_while_open_and_sealed_on_close(tmp_path: Path) -> None:
    store = ChunkedTsvStore(tmp_path, "books", clock=Clock())
    store.write(page())
    (name,) = files(tmp_path)
    assert re.fullmatch(rf"20261122/books\+20261122164824-[A-Za-z0-9.-]+-{os.getpid()}\.tsv\.part", name)
    store.close()
    assert files(tmp_path) == [name.removesuffix(".part")]


def test_the_host_in_a_chunk_name_is_sanitised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("socket.gethostname", lambda: "bad host/x_y")
    with ChunkedTsvStore(tmp_path, "t", clock=Clock()) as store:
        store.write(page())
    assert files(tmp_path) == [f"20261122/t+20261122164824-bad-host-x-y-{os.getpid()}.tsv"]


def test_nothing_written_leaves_no_file(tmp_path: Path) -> None:
    ChunkedTsvStore(tmp_path, "t", clock=Clock()).close()
    assert list(tmp_path.iterdir()) == []


def test_no_chunk_is_created_when_on_open_fails(tmp_path: Path) -> None:
    def refuse(checkpoint: dict[str, Any]) -> None:
        raise RuntimeError("state DB down")

    store = ChunkedTsvStore(tmp_path, "t", clock=Clock(), on_open=refuse)
    with pytest.raises(RuntimeError):
        store.write(page())
    assert files(tmp_path) == []
    store.close()
    assert files(tmp_path) == []


def test_on_open_names_the_chunk_before_the_file_exists(tmp_path: Path) -> None:
    """So a kill between creating the file and saving its name cannot leave an orphan."""
    seen: list[tuple[dict[str, Any], bool]] = []

    def on_open(checkpoint: dict[str, Any]) -> None:
        seen.append((checkpoint, (tmp_path / checkpoint["part"]).exists()))

    with ChunkedTsvStore(tmp_path, "t", clock=Clock(), on_open=on_open) as store:
        store.write(page())
        store.write(page())
        store.flush()
        assert seen == [({"part": files(tmp_path)[0], "length": 0}, False)]


def test_checkpoint_names_the_part_and_its_flushed_length(tmp_path: Path) -> None:
    with ChunkedTsvStore(tmp_path, "t", clock=Clock()) as store:
        assert isinstance(store, Checkpointed)
        assert store.checkpoint() == {"part": None, "length": 0}
        checkpoint = committed_rows(store, 0, 3)
        (part,) = files(tmp_path)
        assert checkpoint == {"part": part, "length": (tmp_path / part).stat().st_size}
        assert checkpoint["length"] > 0


# -- rotation -------------------------------------------------------------------------------

def test_rotation_by_time_happens_only_in_committed(tmp_path: Path) -> None:
    clock = Clock()
    store = ChunkedTsvStore(tmp_path, "t", rotate=Seconds(60), clock=clock)
    committed_rows(store, 0, 2)
    clock.now += 61
    committed_rows(store, 2, 4)
    assert [name.endswith(".part") for name in files(tmp_path)] == [True]  # due, but not committed yet
    store.committed()
    (first,) = sealed(tmp_path)
    assert urls(first) == [f"http://example.org/{n}" for n in range(4)]
    committed_rows(store, 4, 5)
    store.committed()
    store.close()
    assert [p.name[:16] for p in sealed(tmp_path)] == ["t+20261122164824", "t+20261122164925"]
    assert urls(sealed(tmp_path)[1]) == ["http://example.org/4"]


def test_rotation_by_size_names_a_same_second_chunk_with_a_suffix(tmp_path: Path) -> None:
    with ChunkedTsvStore(tmp_path / "probe", "t", clock=Clock()) as probe:
        row_length = committed_rows(probe, 0, 1)["length"]
    out = tmp_path / "out"
    store = ChunkedTsvStore(out, "t", size=Bytes(3 * row_length), clock=Clock())
    committed_rows(store, 0, 2)
    store.committed()
    assert sealed(out) == []  # two rows are under the size
    committed_rows(store, 2, 3)
    store.committed()
    committed_rows(store, 3, 4)
    store.committed()
    store.close()
    endings = {p.name.split(f"-{os.getpid()}")[-1]: len(list(read_tsv(p))) for p in sealed(out)}
    assert endings == {".tsv": 3, "-2.tsv": 1}


def test_a_chunk_is_not_rotated_while_rows_after_its_checkpoint_are_uncommitted(tmp_path: Path) -> None:
    clock = Clock()
    store = ChunkedTsvStore(tmp_path, "t", rotate=Seconds(60), clock=clock)
    committed_rows(store, 0, 1)
    store.write(page("http://example.org/late"))
    clock.now += 61
    store.committed()
    assert sealed(tmp_path) == []


# -- checkpoint and recovery -----------------------------------------------------------------

def test_recovery_after_a_crash_keeps_exactly_the_committed_rows(tmp_path: Path) -> None:
    saved: list[dict[str, Any]] = []
    crashed = ChunkedTsvStore(tmp_path, "t", clock=Clock(), on_open=saved.append)
    saved.append(committed_rows(crashed, 0, 3))
    crashed.committed()
    committed_rows(crashed, 3, 5)  # flushed, but its batch never commits: kill -9 here
    del crashed
    (part,) = files(tmp_path)
    assert len((tmp_path / part).read_bytes().splitlines()) == 5

    with ChunkedTsvStore(tmp_path, "t", clock=Clock()) as store:
        store.recover(saved[-1])
    assert files(tmp_path) == [part.removesuffix(".part")]
    assert urls(tmp_path / part.removesuffix(".part")) == [f"http://example.org/{n}" for n in range(3)]


def test_recovery_deletes_a_chunk_opened_after_the_last_commit(tmp_path: Path) -> None:
    saved: list[dict[str, Any]] = []
    crashed = ChunkedTsvStore(tmp_path, "t", clock=Clock(), on_open=saved.append)
    committed_rows(crashed, 0, 2)  # never committed
    del crashed
    assert saved[-1]["length"] == 0
    ChunkedTsvStore(tmp_path, "t", clock=Clock()).recover(saved[-1])
    assert list((tmp_path / "20261122").iterdir()) == []


def test_recovery_leaves_a_chunk_sealed_after_its_commit_alone(tmp_path: Path) -> None:
    with ChunkedTsvStore(tmp_path, "t", clock=Clock()) as store:
        checkpoint = committed_rows(store, 0, 2)
        store.committed()
    (chunk,) = sealed(tmp_path)
    before = chunk.read_bytes()
    ChunkedTsvStore(tmp_path, "t", clock=Clock()).recover(checkpoint)
    assert sealed(tmp_path) == [chunk] and chunk.read_bytes() == before


def test_recovery_touches_no_other_file(tmp_path: Path) -> None:
    other = tmp_path / "20261122" / "t+20261122164824-otherhost-7.tsv.part"
    other.parent.mkdir()
    other.write_bytes(b"another worker's rows\n")
    saved: list[dict[str, Any]] = []
    crashed = ChunkedTsvStore(tmp_path, "t", clock=Clock(), on_open=saved.append)
    saved.append(committed_rows(crashed, 0, 1))
    del crashed
    ChunkedTsvStore(tmp_path, "t", clock=Clock()).recover(saved[-1])
    assert other.read_bytes() == b"another worker's rows\n"
    assert len(sealed(tmp_path)) == 1


def test_close_keeps_only_committed_rows_once_checkpoints_are_taken(tmp_path: Path) -> None:
    store = ChunkedTsvStore(tmp_path, "t", clock=Clock())
    committed_rows(store, 0, 2)
    store.committed()
    committed_rows(store, 2, 3)  # its batch failed: the job will be redone after restart
    store.close()
    assert urls(sealed(tmp_path)[0]) == ["http://example.org/0", "http://example.org/1"]


@pytest.mark.parametrize("part", ["../x.tsv.part", "/etc/x.tsv.part", "20261122/../../x.tsv.part",
                                  "20261122/x.tsv", 5])
def test_recovery_refuses_a_path_that_is_not_a_part_inside_out_dir(tmp_path: Path, part: object) -> None:
    out = tmp_path / "out"
    victim = tmp_path / "x.tsv.part"
    victim.write_bytes(b"keep me\n")
    with pytest.raises(StoreError, match="refusing checkpoint part"):
        ChunkedTsvStore(out, "t").recover({"part": part, "length": 0})
    assert victim.read_bytes() == b"keep me\n"


def test_recovery_refuses_a_symlink_leading_outside(tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "x.tsv.part").write_bytes(b"keep me\n")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "link").symlink_to(outside)
    with pytest.raises(StoreError, match="refusing"):
        ChunkedTsvStore(tmp_path / "out", "t").recover({"part": "link/x.tsv.part", "length": 0})
    assert (outside / "x.tsv.part").exists()


def test_recovery_refuses_to_pad_a_part_shorter_than_its_checkpoint(tmp_path: Path) -> None:
    part = tmp_path / "20261122" / "t+x.tsv.part"
    part.parent.mkdir()
    part.write_bytes(b"short\n")
    with pytest.raises(StoreError, match="fewer than the 100 committed"):
        ChunkedTsvStore(tmp_path, "t").recover({"part": "20261122/t+x.tsv.part", "length": 100})
    assert part.read_bytes() == b"short\n"


# -- failures -------------------------------------------------------------------------------

def test_an_unwritable_out_dir_is_a_store_error_naming_the_path(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("a regular file, so nothing can be created under it")
    store = ChunkedTsvStore(tmp_path / "afile" / "out", "t", clock=Clock())
    with pytest.raises(StoreError, match=r"afile/out/20261122") as caught:
        store.write(page())
    assert "\n" not in str(caught.value)
    store.close()


# -- JSON lines -----------------------------------------------------------------------------

def test_jsonl_item_lines_have_url_key_and_scraped_at(tmp_path: Path) -> None:
    with JsonlStore(tmp_path, "t", clock=Clock()) as store:
        assert store.records == "items"
        store.write(Item({"title": "£5 book\n", "price": Decimal("5.00")}, "http://example.org/a", "k1", T0))
    (chunk,) = sealed(tmp_path, "jsonl")
    assert chunk.name.endswith(".jsonl")
    assert "£".encode() in chunk.read_bytes()  # ensure_ascii=False
    assert list(read_jsonl(chunk)) == [{"title": "£5 book\n", "price": "5.00", "_url": "http://example.org/a",
                                        "_key": "k1", "_scraped_at": "20261122164824"}]


def test_jsonl_page_lines_carry_meta_and_length_but_no_body(tmp_path: Path) -> None:
    with JsonlStore(tmp_path, "t", records="pages", clock=Clock()) as store:
        store.write(page(body=b"12345", headers={"content-type": "text/plain"}))
    (line,) = read_jsonl(sealed(tmp_path, "jsonl")[0])
    assert line == {"_url": "http://example.org/a", "_key": "http://example.org/a", "_scraped_at": "20261122164824",
                    "kind": "page", "status": 200, "reason": "OK", "length": 5,
                    "meta": {"key": "http://example.org/a", "depth": 0, "attempt": 0, "elapsed": 0.25, "length": 5,
                             "content_type": "text/plain"}}


def test_jsonl_recovery_works_like_tsv(tmp_path: Path) -> None:
    saved: list[dict[str, Any]] = []
    crashed = JsonlStore(tmp_path, "t", clock=Clock(), on_open=saved.append)
    crashed.write(Item({"n": 1}, "http://example.org/1", "1"))
    crashed.flush()
    saved.append(crashed.checkpoint())
    crashed.write(Item({"n": 2}, "http://example.org/2", "2"))
    crashed.flush()
    del crashed
    JsonlStore(tmp_path, "t").recover(saved[-1])
    assert [line["n"] for line in read_jsonl(sealed(tmp_path, "jsonl")[0])] == [1]
