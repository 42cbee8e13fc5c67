"""Seed lines and queue dumps: the JSON-lines format that moves a queue between runs, machines
and queue types, and the line parser shared with the flat-file source.

A dump line is ``{"request": {...}, "state": "ready|reserved|delayed|buried", "delay": seconds
left, "reason": bury reason}``. A seed line may also be a bare URL, ``url<TAB>field...``, or a
JSON object with a ``url``. '#' lines and blank lines are skipped; a bad line is logged with its
line number and skipped.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from .errors import ScrapekitError
from .model import BadUrl, Request

log = logging.getLogger(__name__)

STATES = ("ready", "reserved", "delayed", "buried")
_LOAD_BATCH = 1000


@dataclass(frozen=True, slots=True)
class SeedLine:
    """One parsed line: the request and, for a dump line, its state, delay left and reason."""

    request: Request
    state: str = "ready"
    delay: float = 0.0
    reason: str = ""


class BadLine(ValueError):
    """A seed or dump line that cannot be read; the message says why."""


def parse_line(raw: bytes, kind: str = "page") -> SeedLine | None:
    """The line ``raw``, None for a blank or '#' line; BadLine for a line that cannot be read."""
    try:
        line = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise BadLine("not UTF-8") from None
    if not line or line.startswith("#"):
        return None
    try:
        if not line.startswith("{"):
            url, _, rest = line.partition("\t")
            return SeedLine(Request(url=url.strip(), kind=kind, meta={"fields": rest.split("\t")} if rest else {}))
        data = json.loads(line)
        if not isinstance(data, dict):
            raise ValueError("expected a JSON object")
        if "request" in data:
            state = str(data.get("state", "ready"))
            if state not in STATES:
                raise ValueError(f"unknown state {state!r}")
            return SeedLine(Request.from_dict(data["request"]), state, float(data.get("delay") or 0.0),
                            str(data.get("reason") or ""))
        if not isinstance(data.get("url"), str):
            raise ValueError("a JSON line needs a string 'url' or a 'request'")
        data.setdefault("kind", kind)
        return SeedLine(Request.from_dict(data))
    except (BadUrl, ValueError, TypeError, KeyError, AttributeError) as exc:
        raise BadLine(str(exc)) from None


def read_seed(path: Path, kind: str = "page", bad: Counter[str] | None = None) -> Iterator[SeedLine]:
    """Every good line of a seed or dump file; bad ones are logged with their line numbers
    (and counted in ``bad["bad"]``)."""
    try:
        handle = open(path, "rb")
    except OSError as exc:
        raise ScrapekitError(f"cannot read {path}: {exc.strerror or exc}") from None
    with handle:
        for number, raw in enumerate(handle, 1):
            try:
                parsed = parse_line(raw, kind)
            except BadLine as exc:
                log.warning("%s:%d: skipped: %s", path, number, exc)
                if bad is not None:
                    bad["bad"] += 1
                continue
            if parsed is not None:
                yield parsed


class Dumpable(Protocol):
    """A queue that can list its jobs and take them back (both built-in queues)."""

    def dump(self) -> Iterator[dict[str, Any]]: ...

    def transaction(self) -> Any: ...


def dump_path(run_dir: Path, clock: Callable[[], float] = time.time) -> Path:
    return run_dir / "seed" / f"{time.strftime('%Y%m%d%H%M%S', time.gmtime(clock()))}.jsonl"


def write_dump(queue: Dumpable, path: Path) -> int:
    """Write every job of ``queue`` to ``path`` (whole or not at all); returns how many."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".part")
    count = 0
    try:
        with open(partial, "w", encoding="utf-8") as out:
            for record in queue.dump():
                out.write(json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n")
                count += 1
        os.replace(partial, path)
    except OSError as exc:
        raise ScrapekitError(f"cannot write {path}: {exc.strerror or exc}") from None
    return count


def join_dumps(parts: list[Path], path: Path) -> None:
    """Join the dumps ``parts`` (one per worker) into ``path``, synced, then delete them."""
    with open(path, "wb") as out:
        for part in parts:
            out.write(part.read_bytes())
        out.flush()
        os.fsync(out.fileno())
    for part in parts:
        part.unlink()


def load_into(queue: Dumpable, path: Path, clock: Callable[[], float] = time.time) -> dict[str, int]:
    """Add the jobs of a dump or seed file; keys already queued or done are skipped."""
    counts: Counter[str] = Counter()
    lines = read_seed(path, bad=counts)
    while True:
        with queue.transaction() as tx:
            n = 0
            for line in lines:
                request = line.request
                if line.state == "buried":
                    added = tx.put_buried(request, line.reason or "loaded buried")
                else:
                    if line.state == "delayed" and line.delay > 0:
                        request = replace(request, not_before=clock() + line.delay)
                    added = tx.put(request)
                counts["added" if added else "skipped"] += 1
                n += 1
                if n >= _LOAD_BATCH:
                    break
        if n < _LOAD_BATCH:
            return {"added": counts["added"], "skipped": counts["skipped"], "bad": counts["bad"]}
