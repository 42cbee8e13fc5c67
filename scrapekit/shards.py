"""Domain shards for many workers: every registered domain has one owner.

With ``--workers N`` a recipe's queue is N shards. A request belongs to shard
``crc32(registered domain) % N`` and lives in that shard's beanstalkd tube; worker i owns
shard i, so per-domain politeness, the robots cache and the seen-set stay exact in one
process without sharing. A follow-up for another shard goes to that shard's inbox tube, which
its owner moves into its own queue (deduplicated against its seen-set).

The layout (how many shards) is written once in ``work/<name>/workers/layout.json``; a worker
started with another N is refused until the run is resharded (``scrapekit reshard``).
"""

from __future__ import annotations

import json
import os
import zlib
from dataclasses import dataclass
from pathlib import Path

from .errors import ScrapekitError
from .links import url_domain


def shard_of(url: str, count: int) -> int:
    """The shard of ``url``: a hash of its registered domain that is the same in every process,
    Python version and machine."""
    if count <= 1:
        return 0
    return zlib.crc32(url_domain(url).encode()) % count


@dataclass(frozen=True, slots=True)
class Shard:
    """Worker ``index`` of ``count``: the shard it owns."""

    index: int
    count: int

    @classmethod
    def parse(cls, text: str) -> Shard:
        """``"I/N"`` (0 <= I < N) as a Shard; ValueError otherwise."""
        index, sep, count = text.partition("/")
        try:
            shard = cls(int(index), int(count))
        except ValueError:
            raise ValueError(f"expected I/N (worker I of N, counting from 0), got {text!r}") from None
        if not sep or shard.count < 1 or not 0 <= shard.index < shard.count:
            raise ValueError(f"expected I/N with 0 <= I < N, got {text!r}")
        return shard

    def owns(self, url: str) -> bool:
        return shard_of(url, self.count) == self.index

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def work_tube(base: str, index: int) -> str:
    return f"{base}.{index}"


def inbox_tube(base: str, index: int) -> str:
    return f"{base}.{index}.in"


def workers_dir(run_dir: Path) -> Path:
    return run_dir / "workers"


def worker_dir(run_dir: Path, index: int) -> Path:
    """A worker's own state, logs, stats and pid file; output goes to the recipe's shared out/."""
    return workers_dir(run_dir) / str(index)


def _layout_path(run_dir: Path) -> Path:
    return workers_dir(run_dir) / "layout.json"


def read_layout(run_dir: Path) -> int | None:
    """The number of shards ``run_dir`` is laid out for, or None when it never ran with workers."""
    try:
        return int(json.loads(_layout_path(run_dir).read_text())["workers"])
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ScrapekitError(f"cannot read {_layout_path(run_dir)}: {exc}") from None


def write_layout(run_dir: Path, count: int) -> None:
    path = _layout_path(run_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".layout.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"workers": count}) + "\n")
    os.replace(tmp, path)


def claim_layout(run_dir: Path, name: str, count: int) -> None:
    """Record ``count`` shards for a first run with workers; refuse a run with another count."""
    laid_out = read_layout(run_dir)
    if laid_out is None:
        if (run_dir / "state").is_dir():
            raise ScrapekitError(
                f"{run_dir} holds a run without workers; dump its queue (scrapekit dump), move the directory "
                "away and load the dump with --workers, or run it without --workers")
        write_layout(run_dir, count)
    elif laid_out != count:
        raise ScrapekitError(
            f"{name} is laid out for {laid_out} workers, not {count}: run it with --workers {laid_out}, "
            f"or change the number with 'scrapekit reshard RECIPE --workers {count}' while no worker runs")
