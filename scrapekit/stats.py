"""Live counters of a run, saved to work/<name>/stats.json for ``scrapekit status``.

Totals (done, failed, items, ...) are cumulative over every run of the recipe: the runner saves
them in the same batch as its acks, so they agree with the queue after kill -9."""

from __future__ import annotations

import json
import os
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

_DOMAINS_KEPT = 10_000  # domains counted per session; past it the least busy half is forgotten
TOP_DOMAINS = 20
TOTALS = ("done", "failed", "buried", "retries", "items", "bytes", "cache_hits", "cache_misses", "skipped")


class Stats:
    """Counters plus a sliding window for the current rate (finished requests per second)."""

    def __init__(self, totals: Mapping[str, Any] | None = None, monotonic: Callable[[], float] = time.monotonic,
                 window: float = 10.0) -> None:
        totals = totals or {}
        self.totals: dict[str, int] = {name: int(totals.get(name, 0)) for name in TOTALS}
        self.statuses: Counter[str] = Counter(totals.get("statuses", {}))
        self.errors: Counter[str] = Counter(totals.get("errors", {}))
        self.links: Counter[str] = Counter(totals.get("links", {}))  # queued, seen, rejected by reason
        self.session: Counter[str] = Counter()
        self.domains: Counter[str] = Counter()  # requests finished per registered domain, this session
        self._monotonic = monotonic
        self._window = window
        self._started = monotonic()
        self._marks: deque[tuple[float, int]] = deque([(self._started, 0)])

    def count(self, name: str, n: int = 1) -> None:
        self.totals[name] += n
        self.session[name] += n

    def count_domain(self, domain: str) -> None:
        self.domains[domain] += 1
        if len(self.domains) > _DOMAINS_KEPT:
            self.domains = Counter(dict(self.domains.most_common(_DOMAINS_KEPT // 2)))

    def finished(self) -> int:
        """Requests that reached their final outcome in this session."""
        return self.session["done"] + self.session["failed"] + self.session["buried"]

    def tick(self) -> None:
        now = self._monotonic()
        self._marks.append((now, self.finished()))
        while len(self._marks) > 2 and now - self._marks[1][0] >= self._window:
            self._marks.popleft()

    def rate(self) -> float:
        (t0, n0), (t1, n1) = self._marks[0], self._marks[-1]
        return (n1 - n0) / (t1 - t0) if t1 > t0 else 0.0

    def average_rate(self) -> float:
        elapsed = self._monotonic() - self._started
        return self.finished() / elapsed if elapsed > 0 else 0.0

    def persistent(self) -> dict[str, Any]:
        """What goes into the state batch with the acks."""
        return {**self.totals, "statuses": dict(self.statuses), "errors": dict(self.errors), "links": dict(self.links)}

    def snapshot(self, queue: Mapping[str, int], **extra: Any) -> dict[str, Any]:
        return {
            **self.totals,
            "session": dict(self.session),
            "rate": round(self.rate(), 2),
            "rate_avg": round(self.average_rate(), 2),
            "uptime": round(self._monotonic() - self._started, 1),
            "statuses": dict(self.statuses),
            "errors": dict(self.errors),
            "links": dict(self.links),
            "domains": dict(self.domains.most_common(TOP_DOMAINS)),
            "queue": dict(queue),
            **extra,
        }


def write_json_atomic(path: Path, data: Mapping[str, Any]) -> None:
    """Write ``data`` so a reader never sees half a file (write aside, then rename)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def append_snapshot(stats_dir: Path, data: Mapping[str, Any]) -> None:
    """Add ``data`` as one JSON line to ``stats_dir/YYYYmmdd.jsonl`` (the UTC day of its
    ``updated_at``): the history ``scrapekit report`` draws."""
    stats_dir.mkdir(parents=True, exist_ok=True)
    day = time.strftime("%Y%m%d", time.gmtime(float(data.get("updated_at") or time.time())))
    with open(stats_dir / f"{day}.jsonl", "a", encoding="utf-8") as out:
        out.write(json.dumps(data, sort_keys=True, separators=(",", ":")) + "\n")


def read_snapshots(stats_dir: Path) -> list[dict[str, Any]]:
    """Every snapshot in ``stats_dir``, oldest first; a torn last line (a crash) is skipped."""
    snapshots = []
    for path in sorted(stats_dir.glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                snapshots.append(dict(json.loads(line)))
            except (ValueError, TypeError):
                continue
    return snapshots


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        return dict(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError):
        return None
