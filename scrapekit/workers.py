"""Many workers on one machine (``scrapekit run R --workers N``), their joint status, and
resharding.

The parent starts ``scrapekit run R --worker I/N`` N times and watches them: a worker killed by
a signal is started again (with backoff), a SIGTERM or Ctrl-C is passed on once. Workers never
stop by themselves when idle, because another worker may still send them follow-ups. The
parent tells them to finish when every worker has read its whole source and no job of the
run is left in any tube (ready, reserved or delayed): puts reach beanstalkd before the job that
made them is deleted, so that state cannot change back.
"""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import greenstalk

from . import control
from .errors import CIRCUIT_BREAKER_EXIT, ScrapekitError
from .logs import CONSOLE
from .recipe import Recipe
from .seed import join_dumps, load_into, write_dump
from .shards import Shard, claim_layout, inbox_tube, read_layout, work_tube, worker_dir, workers_dir, write_layout
from .sources.beanstalk import BeanstalkQueue, parse_url
from .sources.beanstalk import tube_counts as beanstalk_tube_counts
from .state import RunLock, StateDB, running_pid
from .stats import read_json
from .supervise import supervised

log = logging.getLogger(__name__)

_POLL = 0.5
_RESTART_BACKOFF = (1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
_STEADY = 60.0  # a worker up this long has its restart backoff reset
_FINISH_WAIT = 60.0  # seconds a worker told to finish may take before it gets a SIGTERM


@dataclass
class _Child:
    shard: Shard
    process: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    restarts: int = 0
    restart_at: float | None = None
    exit_code: int | None = None  # once it stopped for good
    told: bool = False  # to finish


@dataclass
class WorkerPool:
    """Runs the N workers of one recipe on this machine until they are done or stopped."""

    recipe: Recipe
    recipe_path: Path
    count: int
    max_requests: int | None = None
    children: list[_Child] = field(default_factory=list)
    _signals: int = 0
    _finishing: float | None = None  # since when the workers were told to finish

    def run(self) -> int:
        """Start, watch and finish the workers; returns the exit code for the command."""
        claim_layout(self.recipe.home, self.recipe.name, self.count)
        self.children = [_Child(Shard(i, self.count)) for i in range(self.count)]
        with ExitStack() as stack:
            for signum in (signal.SIGTERM, signal.SIGINT):
                previous = signal.signal(signum, self._on_signal)
                stack.callback(signal.signal, signum, previous)
            for child in self.children:
                self._start(child)
            self._watch()
        return self._exit_code()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        log.warning("stopping the workers (signal %d)", signum, extra=CONSOLE)
        self._stop_all()

    def _stop_all(self) -> None:
        """SIGTERM to every running worker (a second call stops them at once, without grace)."""
        self._signals += 1
        for child in self.children:
            if child.process is not None and child.process.poll() is None:
                child.process.send_signal(signal.SIGTERM)

    def _start(self, child: _Child) -> None:
        command = [sys.executable, "-m", "scrapekit", "run", str(self.recipe_path), "--worker", str(child.shard),
                   "--no-console"]
        if self.max_requests is not None:
            command += ["--max-requests", str(self.max_requests)]
        log_dir = worker_dir(self.recipe.home, child.shard.index) / "log"
        log_dir.mkdir(parents=True, exist_ok=True)
        with open(log_dir / "worker.out", "ab") as out:
            # Its own session: a Ctrl-C reaches the parent only, which passes on one SIGTERM.
            child.process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                             start_new_session=True)
        child.started = time.monotonic()
        child.restart_at = None
        log.info("worker %s started, pid %d", child.shard, child.process.pid, extra=CONSOLE)

    def _watch(self) -> None:
        """Until every worker has stopped: restart the killed, finish the run when it is done.

        A worker that stopped by itself with 0 reached a limit (max_requests, max_seconds): the
        others then finish once they are idle, leaving what others send them for a later run.
        A worker that failed (exit code not 0) stops the others: the run cannot complete.
        """
        next_progress = time.monotonic() + self.recipe.progress_interval
        while any(child.exit_code is None for child in self.children):
            time.sleep(_POLL)
            now = time.monotonic()
            for child in self.children:
                self._check(child, now)
            if now >= next_progress:
                next_progress = now + self.recipe.progress_interval
                self._log_progress()
            exited = [child.exit_code for child in self.children if child.exit_code is not None]
            if self._finishing is None and any(code != 0 for code in exited) and not self._signals:
                log.error("a worker failed; stopping the others", extra=CONSOLE)
                self._stop_all()
            elif self._finishing is None and not self._signals and not exited and self._all_done():
                self._finishing = now
                log.info("every worker read its source and no job is left in any tube: finishing", extra=CONSOLE)
                for child in self.children:
                    self._tell_finish(child)
            elif self._finishing is None and exited and not self._signals:
                for child in self.children:
                    if not child.told and child.exit_code is None and self._idle(child):
                        log.info("worker %s is idle and another reached its limit: finishing it", child.shard,
                                 extra=CONSOLE)
                        self._tell_finish(child)
            elif self._finishing is not None and now - self._finishing > _FINISH_WAIT:
                self._finishing = now
                for child in self.children:
                    if child.process is not None and child.process.poll() is None:
                        log.warning("worker %s did not finish in %.0fs; stopping it", child.shard, _FINISH_WAIT)
                        child.process.send_signal(signal.SIGTERM)

    def _check(self, child: _Child, now: float) -> None:
        if child.exit_code is not None:
            return
        if child.process is None:
            if child.restart_at is not None and now >= child.restart_at and not self._signals:
                self._start(child)
            return
        code = child.process.poll()
        if code is None:
            if now - child.started > _STEADY:
                child.restarts = 0
            return
        pid, child.process = child.process.pid, None
        if code >= 0 or self._signals or self._finishing is not None or child.told:
            child.exit_code = code
            level = logging.INFO if code == 0 else logging.ERROR
            log.log(level, "worker %s exited with code %d (%s)", child.shard, code, self._stop_reason(child, pid),
                    extra=CONSOLE)
            return
        wait = _RESTART_BACKOFF[min(child.restarts, len(_RESTART_BACKOFF) - 1)]
        child.restarts += 1
        child.restart_at = now + wait
        log.error("worker %s was killed by signal %d; starting it again in %.0fs", child.shard, -code, wait,
                  extra=CONSOLE)

    def _stop_reason(self, child: _Child, pid: int) -> str:
        """Its stop reason, or when it stopped before recording one, the last line it printed."""
        directory = worker_dir(self.recipe.home, child.shard.index)
        stats = read_json(directory / "stats.json") or {}
        if stats.get("pid") == pid and stats.get("stop_reason"):
            return str(stats["stop_reason"])
        try:
            said = [line for line in (directory / "log" / "worker.out").read_text(errors="replace").splitlines() if line]
        except OSError:
            said = []
        return said[-1] if said else "no stop reason recorded; see its log"

    def _log_progress(self) -> None:
        """One line for all workers, like a single run's progress line."""
        snapshots = [stats for child in self.children if (stats := self._current_stats(child)) is not None]
        totals = {k: sum(int(s.get(k, 0)) for s in snapshots) for k in ("done", "failed", "buried", "items")}
        rate = sum(float(s.get("rate", 0.0)) for s in snapshots)
        queued = sum(int((s.get("queue") or {}).get("ready", 0)) for s in snapshots)
        log.info("progress: %d of %d workers running | done %d failed %d buried %d items %d | %.1f/s | queue %d",
                 len(snapshots), self.count, totals["done"], totals["failed"], totals["buried"], totals["items"],
                 rate, queued, extra=CONSOLE)

    def _tell_finish(self, child: _Child) -> None:
        child.told = True
        control.send(worker_dir(self.recipe.home, child.shard.index), {"command": "finish"})

    def _current_stats(self, child: _Child) -> dict[str, Any] | None:
        """The running worker's stats.json once it wrote one itself (not a previous run's)."""
        if child.process is None or child.process.poll() is not None:
            return None
        stats = read_json(worker_dir(self.recipe.home, child.shard.index) / "stats.json")
        return stats if stats is not None and stats.get("pid") == child.process.pid else None

    def _idle(self, child: _Child) -> bool:
        stats = self._current_stats(child)
        if stats is None or not stats.get("source_exhausted") or stats.get("in_flight"):
            return False
        queue = stats.get("queue") or {}
        return not any(queue.get(state) for state in ("ready", "reserved", "delayed"))

    def _all_done(self) -> bool:
        for child in self.children:
            stats = self._current_stats(child)
            if stats is None or not stats.get("source_exhausted"):
                return False
        try:
            return all(counts["ready"] + counts["reserved"] + counts["delayed"] == 0
                       for counts in tube_counts(self.recipe, self.count).values())
        except OSError as exc:
            log.warning("cannot ask beanstalkd whether the run is done: %s", exc)
            return False

    def _exit_code(self) -> int:
        codes = [child.exit_code or 0 for child in self.children]
        if CIRCUIT_BREAKER_EXIT in codes:
            return CIRCUIT_BREAKER_EXIT
        return next((code for code in codes if code != 0), 0)


# -- beanstalkd side ---------------------------------------------------------------------------

def _base_tube(recipe: Recipe) -> tuple[str, str]:
    url = str(recipe.queue.options.get("url", "beanstalk://127.0.0.1:11300"))
    return url, str(recipe.queue.options.get("tube") or recipe.name)


def tube_counts(recipe: Recipe, count: int) -> dict[str, dict[str, int]]:
    """Jobs per state in every tube of the run (each shard's tube and inbox); OSError when
    beanstalkd cannot be reached."""
    url, base = _base_tube(recipe)
    result: dict[str, dict[str, int]] = {}
    with greenstalk.Client(parse_url(url), encoding=None) as client:
        for i in range(count):
            for tube in (work_tube(base, i), inbox_tube(base, i)):
                result[tube] = beanstalk_tube_counts(client, tube)
    return result


# -- status ------------------------------------------------------------------------------------

def status(recipe: Recipe, count: int) -> dict[str, Any]:
    """Every worker's state from its stats.json and pid lock, and the queue of every tube."""
    workers = []
    now = time.time()
    for i in range(count):
        directory = worker_dir(recipe.home, i)
        stats = read_json(directory / "stats.json") or {}
        pid = running_pid(directory / "run.pid")
        started = stats.get("started_at")
        workers.append({
            "worker": f"{i}/{count}", "running": pid is not None, "pid": pid,
            "uptime": round(now - float(started), 1) if pid and started else None,
            "rate": stats.get("rate", 0.0) if pid else 0.0, "rate_avg": stats.get("rate_avg", 0.0),
            **{k: int(stats.get(k, 0)) for k in ("done", "failed", "buried", "items", "retries", "bytes")},
            "errors": stats.get("errors", {}), "current_domains": stats.get("current_domains", []) if pid else [],
            "domains": stats.get("domains", {}), "stop_reason": None if pid else stats.get("stop_reason"),
            "updated_at": stats.get("updated_at"),
        })
    for process in supervised(recipe.work_dir) or []:
        if process["group"] == recipe.name and process["worker"] is not None and process["worker"] < count:
            workers[process["worker"]]["supervisor"] = {k: process[k] for k in ("state", "description", "pid")}
    try:
        tubes: dict[str, Any] = tube_counts(recipe, count)
        error = None
    except OSError as exc:
        tubes, error = {}, f"beanstalkd unreachable: {exc.strerror or exc}"
    totals = {k: sum(w[k] for w in workers) for k in ("done", "failed", "buried", "items", "retries", "bytes")}
    return {"name": recipe.name, "workers": workers, "tubes": tubes, "beanstalkd_error": error,
            "running": sum(w["running"] for w in workers), "rate": round(sum(w["rate"] for w in workers), 2),
            **totals}


# -- resharding --------------------------------------------------------------------------------

_SEEN_PREFIXES = (b"q:k:", b"s:res/", b"s:h/", b"s:u/")
"""What a worker knows of keys beyond its queue: done keys, recurring resources' state, content
hashes and unique-item marks. Resharding gives every new worker all of them."""


@contextmanager
def _worker_state(recipe: Recipe, index: int) -> Iterator[StateDB]:
    """Worker ``index``'s LevelDB, opened under its run lock (so never while it runs)."""
    directory = worker_dir(recipe.home, index)
    with RunLock(directory / "run.pid", f"{recipe.name} worker {index}"), StateDB(directory / "state") as state:
        yield state


@contextmanager
def _worker_queue(recipe: Recipe, shard: Shard) -> Iterator[BeanstalkQueue]:
    from .runner import build

    worker = recipe.for_worker(shard)
    with _worker_state(recipe, shard.index) as state:
        queue = build(worker.queue, worker, state=state, name=recipe.name, shard=shard)
        try:
            yield queue
        finally:
            queue.close()


def reshard(recipe: Recipe, count: int) -> dict[str, Any]:
    """Change the number of workers (shards) of a stopped run: dump every worker's queue, clear
    the old tubes, give every new worker the seen-set of all, then load the dump so each job
    goes to its new owner. Interrupted, it resumes from its saved dump when run again."""
    run_dir = recipe.home
    old = read_layout(run_dir)
    if old is None:
        raise ScrapekitError(f"{recipe.name} never ran with workers; nothing to reshard")
    for i in range(old):
        pid = running_pid(worker_dir(run_dir, i) / "run.pid")
        if pid is not None:
            raise ScrapekitError(f"worker {i}/{old} is running (pid {pid}); stop every worker first")
    for i in range(count, old):
        unsealed = sorted(recipe.out_dir.glob(f"*/{recipe.name}.w{i}+*.part"))
        if unsealed:
            raise ScrapekitError(f"worker {i}/{old} did not stop cleanly ({unsealed[0]} is not sealed): start it "
                                 f"once more with --worker {i}/{old} and stop it, then reshard")
    marker = workers_dir(run_dir) / "resharding.json"
    saved = read_json(marker)
    if saved is None and old == count:
        raise ScrapekitError(f"{recipe.name} is laid out for {count} workers already")
    if saved is None:
        dump = run_dir / "seed" / f"reshard-{time.strftime('%Y%m%d%H%M%S', time.gmtime())}-{old}-to-{count}.jsonl"
        jobs = dump_workers(old, dump, lambda shard, part: _dump_offline(recipe, shard, part))
        marker.write_text(json.dumps({"dump": str(dump), "from": old, "to": count, "jobs": jobs}))
        for i in range(old):
            with _worker_queue(recipe, Shard(i, old)) as queue:
                queue.clear()
    else:
        dump, old, jobs = Path(saved["dump"]), int(saved["from"]), int(saved["jobs"])
        log.warning("resuming an unfinished reshard from %s", dump)
    _share_seen(recipe, old, count)
    write_layout(run_dir, count)
    with _worker_queue(recipe, Shard(0, count)) as queue:
        loaded = load_into(queue, dump)
    marker.unlink()
    return {"from": old, "to": count, "dump": str(dump), "jobs": jobs, **loaded}


def dump_workers(count: int, path: Path, dump_one: Callable[[Shard, Path], int]) -> int:
    """Every worker's jobs in one dump file at ``path``: ``dump_one(shard, part)`` writes one
    worker's part and says how many jobs it holds. Returns the total."""
    parts = [path.with_name(f"{path.name}.{i}") for i in range(count)]
    total = sum(dump_one(Shard(i, count), part) for i, part in enumerate(parts))
    join_dumps(parts, path)
    return total


def _dump_offline(recipe: Recipe, shard: Shard, part: Path) -> int:
    with _worker_queue(recipe, shard) as queue:
        return write_dump(queue, part)


def _share_seen(recipe: Recipe, old: int, count: int) -> None:
    """Copy what each old worker has seen into every new worker; reset each new worker's source
    position (it reads the source again; keys queued or done are skipped)."""
    run_dir = recipe.home
    for i in range(old):
        with _worker_state(recipe, i) as src:
            for j in range(count):
                if j == i:
                    continue
                with _worker_state(recipe, j) as dst, dst.db.write_batch() as batch:
                    for prefix in _SEEN_PREFIXES:
                        for key, value in src.db.iterator(prefix=prefix):
                            batch.put(key, value)
    for j in range(count):
        with _worker_state(recipe, j) as state:
            state.db.delete(b"s:source")
    for i in range(count, old):
        retired = workers_dir(run_dir) / f"retired-{time.strftime('%Y%m%d%H%M%S', time.gmtime())}-{i}"
        worker_dir(run_dir, i).rename(retired)
        log.info("worker %d's directory moved to %s (its output stays in out/)", i, retired)
