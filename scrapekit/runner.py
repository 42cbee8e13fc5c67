"""The runner: ``assemble`` builds the parts from a recipe, ``Runner.run`` owns the loop.

reserve -> fetch -> parse (in fetch threads) -> write -> ack. Only the main thread touches the
queue and the stores: a group of finished jobs is written, flushed, and acked in ONE batch with
the stores' checkpoints, so after kill -9 every output row belongs to an acked job and every
acked job has its row.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import logging
import os
import queue as stdqueue
import signal
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from . import control
from .errors import RecipeError, ScrapekitError
from .crawl import Strategy
from .fetchers import Fetcher
from .links import url_domain
from .logs import CONSOLE
from .model import Item, Job, Request, Response, loggable
from .parsers import Parser
from .paginate import Paginator
from .policy import Decision, decide
from .politeness import Bandwidth, Gate
from .recipe import PartSpec, Recipe
from .reschedule import MAX_GUIDS, EveryRescheduler, Rescheduler, ResourceState
from .robots import RobotsCache, Verdict
from .sources import Queue, Source, Transaction
from .state import RunLock, StateDB
from .stats import Stats, append_snapshot, write_json_atomic
from .statsd import StatsdSender
from .stores import Checkpointed, Store
from .units import format_size, parse_duration, utc_text

log = logging.getLogger(__name__)

_FEED_BATCH = 1000
_COMMIT_BATCH = 512
_STATS_EVERY = 1.0
_FEED_EVERY = 0.05
_FIRST_RETRY = 60.0  # seconds before a recurring resource that failed on its first visit is tried again


def build(spec: PartSpec, recipe: Recipe, **services: Any) -> Any:
    """One part from its spec: recipe options plus the services its constructor asks for."""
    params = inspect.signature(spec.cls).parameters
    kwargs = dict(spec.options)
    kwargs.update({name: value for name, value in services.items() if name in params})
    try:
        return spec.cls(**kwargs)
    except (ValueError, TypeError) as exc:
        raise RecipeError(str(recipe.path), spec.line, spec.section, str(exc)) from None


@dataclass
class Parts:
    """Everything a run uses, built by ``assemble``; closed in reverse order by the ExitStack."""

    source: Source
    queue: Queue
    fetcher: Fetcher
    parser: Parser | None
    follow: Strategy | None = None
    robots: RobotsCache | None = None
    stores: list[tuple[str, Store]] = field(default_factory=list)
    paginator: Paginator | None = None
    rescheduler: Rescheduler | None = None


def assemble(recipe: Recipe, state: StateDB, stack: ExitStack, clock: Callable[[], float] = time.time) -> Parts:
    """The composition root: turns the validated recipe into parts, sharing the state DB and clock."""
    queue = build(recipe.queue, recipe, state=state, clock=clock, name=recipe.name, shard=recipe.worker)
    stack.callback(queue.close)
    source = build(recipe.source, recipe, clock=clock)
    fetcher = build(recipe.fetch, recipe, concurrency=recipe.concurrency, clock=clock,
                    allow_private=recipe.allow_private)
    stack.callback(fetcher.close)
    parser = build(recipe.parse, recipe) if recipe.parse else None
    follow = build(recipe.follow, recipe) if recipe.follow else None
    robots = None
    if recipe.robots:
        user_agent = getattr(fetcher, "user_agent", "scrapekit")
        robots = RobotsCache(state.db, fetcher.fetch, user_agent, expiry=recipe.robots_expiry, clock=clock)
    parts = Parts(source, queue, fetcher, parser, follow, robots)
    parts.paginator = build(recipe.paginate, recipe) if recipe.paginate else None
    parts.rescheduler = build(recipe.reschedule, recipe) if recipe.reschedule else None
    out_dir = recipe.out_dir
    for index, spec in enumerate(recipe.stores):
        state_name = f"store/{index}"

        def on_open(checkpoint: dict[str, Any], state_name: str = state_name) -> None:
            with queue.transaction() as tx:  # known to recovery before its first row
                tx.set_state(state_name, checkpoint)

        name = recipe.name if recipe.worker is None else f"{recipe.name}.w{recipe.worker.index}"
        store = build(spec, recipe, out_dir=out_dir, name=name, clock=clock, on_open=on_open, state=state)
        if isinstance(store, Checkpointed):
            store.recover(queue.get_state(state_name))
            # Seal only on a clean stop: after a failure the chunk may hold rows of unacked jobs,
            # so it stays a .part file that the next start cuts back to the last checkpoint.
            stack.push(lambda exc_type, exc, tb, store=store: store.close() if exc_type is None else None)
        else:
            stack.callback(store.close)
        parts.stores.append((state_name, store))
    return parts


@dataclass(frozen=True, slots=True)
class Outcome:
    """A job back from a fetch thread."""

    job: Job
    response: Response
    items: list[Item]
    links: list[Request]
    rejected: Counter[str] = field(default_factory=Counter)
    digest: str = ""  # of the body, for content dedupe when following links
    crawl_delay: float | None = None  # asked by the host's robots.txt
    lookup: str = ""  # "hit": answered by a read-through cache; "skipped": a conditional store holds it
    pages: tuple[Response, ...] = ()  # every page of a paginated visit, the first being ``response``
    resource: dict[str, Any] | None = None  # the resource's state after this visit
    reschedule: float | None = None  # seconds until the next visit of a recurring resource

    @property
    def responses(self) -> tuple[Response, ...]:
        return self.pages or (self.response,)


class Runner:
    """Runs one recipe until its work is done, a limit is reached or a signal stops it.

    ``run()`` returns the stop reason: done, max_requests, max_seconds or signal.
    """

    def __init__(
        self,
        recipe: Recipe,
        max_requests: int | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        on_progress: Callable[[dict[str, Any]], None] | None = None,
        grace: float = 10.0,
    ) -> None:
        self.recipe = recipe
        self.max_requests = recipe.max_requests if max_requests is None else max_requests
        self.clock = clock
        self.monotonic = monotonic
        self.on_progress = on_progress
        self.grace = grace
        self.stop_reason: str | None = None
        self._signals = 0
        self._work: stdqueue.Queue[Job | None] = stdqueue.Queue()
        self._done: stdqueue.Queue[Outcome] = stdqueue.Queue()
        self._flying: dict[str, tuple[Job, float]] = {}  # job id -> (job, last dispatch or touch)
        self._requests: Iterator[tuple[Request, str]] | None = None
        self._source_exhausted = False
        self._next_feed = 0.0
        self._counts: dict[str, int] = {"ready": 0, "reserved": 0, "delayed": 0, "buried": 0, "done": 0}
        self._part_errors: deque[float] = deque()
        self._paused_until: float | None = None
        self._next_snapshot = 0.0  # of the stats history in work/<name>/stats/
        self._statsd: StatsdSender | None = None
        self._started_at = clock()
        self._schedule: dict[str, float] = {}  # recurring resource key -> next visit (wall clock)
        self._skim = 8 * recipe.concurrency  # jobs a dispatch round may put back (see _dispatch_gated)
        self.gate = Gate(recipe.delay, recipe.per_domain, recipe.max_delay, recipe.breaker_failures,
                         recipe.breaker_pause, hold=recipe.concurrency) if recipe.polite else None

    @property
    def _in_flight(self) -> int:
        return len(self._flying)

    # -- lifecycle ---------------------------------------------------------------------------

    def run(self) -> str:
        recipe = self.recipe
        run_dir = recipe.run_dir
        with ExitStack() as stack:
            stack.enter_context(RunLock(run_dir / "run.pid", recipe.name))
            state = stack.enter_context(StateDB(run_dir / "state"))
            parts = assemble(recipe, state, stack, self.clock)
            self.parts = parts
            totals = parts.queue.get_state("stats")
            self.stats = Stats(totals, self.monotonic)
            self._has_cache = any(getattr(store, "mode", "") == "cache" for _, store in parts.stores)
            self.bandwidth = Bandwidth(recipe.bandwidth_daily, recipe.bandwidth_monthly,
                                       parts.queue.get_state("bandwidth"))
            if recipe.statsd is not None:
                self._statsd = StatsdSender(recipe.statsd, recipe.name)
                stack.callback(self._statsd.close)
            self._install_signals(stack)
            threads = self._start_threads(parts)
            stack.callback(self._stop_threads, threads)
            log.info("started %s (pid %d, concurrency %d) from %s", recipe.name, os.getpid(),
                     recipe.concurrency, recipe.path, extra=CONSOLE)
            try:
                self._loop(parts)
            except BaseException:
                self._write_stats(running=False, fresh=False)  # the queue may be what failed
                raise
            self._write_stats(running=False)
            log.info("stopped: %s; this run finished %d requests at %.1f/s; %s", self.stop_reason,
                     self.stats.finished(), self.stats.average_rate(), self._progress_text(), extra=CONSOLE)
        return self.stop_reason or "done"

    def _install_signals(self, stack: ExitStack) -> None:
        if threading.current_thread() is not threading.main_thread():
            return

        def handler(signum: int, frame: FrameType | None) -> None:
            self._signals += 1
            if self.stop_reason is None:
                self.stop_reason = "signal"
            elif self._signals > 1:
                # Also out of a blocking call (beanstalkd down): like a crash, nothing is lost.
                raise ScrapekitError("stopped at once by a second signal; unfinished jobs stay queued")

        for signum in (signal.SIGTERM, signal.SIGINT):
            previous = signal.signal(signum, handler)
            stack.callback(signal.signal, signum, previous)

    def _start_threads(self, parts: Parts) -> list[threading.Thread]:
        threads = [
            threading.Thread(target=self._fetch_loop, args=(parts,), name=f"fetch-{i}", daemon=True)
            for i in range(self.recipe.concurrency)
        ]
        for thread in threads:
            thread.start()
        return threads

    def _stop_threads(self, threads: list[threading.Thread]) -> None:
        for _ in threads:
            self._work.put(None)

    # -- the loop ----------------------------------------------------------------------------

    def _loop(self, parts: Parts) -> None:
        started = self.monotonic()
        next_stats = started
        last_progress = (started, 0)
        stopping_since: float | None = None
        while True:
            self._check_limits(started)
            if self.stop_reason is None:
                self._feed(parts)
                if not self._bandwidth_paused():
                    self._dispatch(parts)
            else:
                now = self.monotonic()
                if stopping_since is None:
                    stopping_since = now
                    self._withdraw()
                if self._in_flight == 0 or self._signals > 1 or now - stopping_since > self.grace:
                    break
            outcomes = self._collect(idle=self._in_flight == 0)
            if outcomes:
                self._commit(parts, outcomes)
            elif self._in_flight == 0 and self.stop_reason is None and self._finished(parts):
                self.stop_reason = "done"
            now = self.monotonic()
            if now >= next_stats:
                next_stats = now + _STATS_EVERY
                self.stats.tick()
                self._write_stats(running=True)
                self._answer_commands(parts)
                self._touch(parts)
            done = self.stats.finished()
            if done - last_progress[1] >= self.recipe.progress_every or now - last_progress[0] >= self.recipe.progress_interval:
                last_progress = (now, done)
                log.info("progress: %s", self._progress_text(), extra=CONSOLE)

    def _check_limits(self, started: float) -> None:
        if self.stop_reason is not None:
            return
        if self.max_requests and self.stats.finished() >= self.max_requests:
            self.stop_reason = "max_requests"
        elif self.recipe.max_seconds and self.monotonic() - started >= self.recipe.max_seconds:
            self.stop_reason = "max_seconds"

    def _bandwidth_paused(self) -> bool:
        """True while a bandwidth limit is reached; says so once in the log when it starts and ends."""
        until = self.bandwidth.paused_until(self.clock())
        if until != self._paused_until:
            if until is not None:
                log.warning("bandwidth limit reached (%s): paused until %s", self._bandwidth_text(),
                            utc_text(until), extra=CONSOLE)
            else:
                log.warning("bandwidth: a new period began, resuming", extra=CONSOLE)
            self._paused_until = until
        return until is not None

    def _bandwidth_text(self) -> str:
        b = self.bandwidth
        return (f"{format_size(b.day_bytes)} today, limit {format_size(b.daily) if b.daily else 'none'}; "
                f"{format_size(b.month_bytes)} this month, limit {format_size(b.monthly) if b.monthly else 'none'}")

    def _finished(self, parts: Parts) -> bool:
        if not self._source_exhausted or self.recipe.worker is not None:
            return False  # a worker waits for its inbox until told to finish (see scrapekit.workers)
        counts = self._queue_counts(parts)
        return counts["ready"] == 0 and counts["delayed"] == 0

    def _feed(self, parts: Parts) -> None:
        """Top the queue up from the source, at most ``window`` live jobs ahead; a worker first
        takes in what other workers sent to its inbox."""
        now = self.monotonic()
        if now < self._next_feed:
            return
        self._next_feed = now + _FEED_EVERY
        if self.recipe.worker is not None:
            parts.queue.intake()  # type: ignore[attr-defined]  # a worker's queue is a BeanstalkQueue
        if self._source_exhausted:
            return
        counts = self._queue_counts(parts)
        room = self.recipe.window - counts["ready"] - counts["reserved"] - counts["delayed"]
        if room <= 0 or (room < min(_FEED_BATCH, self.recipe.window) // 2 and counts["ready"] > 0):
            return  # feed in batches, not one job per loop
        if self._requests is None:
            saved = parts.queue.get_state("source") or {}
            position = saved.get("position") if saved.get("spec") == self._source_id() else None
            requests = parts.source.requests(position)
            shard = self.recipe.worker
            if shard is not None:  # every worker reads the source and keeps its own shard's requests
                requests = ((r, p) for r, p in requests if shard.owns(r.url))
            self._requests = requests
        position = None
        skipped = 0
        with parts.queue.transaction() as tx:
            for _ in range(min(room, _FEED_BATCH)):
                try:
                    request, position = next(self._requests)
                except StopIteration:
                    self._source_exhausted = True
                    break
                skipped += not tx.put(request)
            if position is not None:
                tx.set_state("source", {"position": position, "spec": self._source_id()})
        if skipped:
            log.info("source: %d requests already queued or done, skipped", skipped)

    def _source_id(self) -> str:
        spec = self.recipe.source
        return f"{spec.type}:{sorted((k, str(v)) for k, v in spec.options.items())}"

    def _dispatch(self, parts: Parts) -> None:
        limit = 2 * self.recipe.concurrency
        if self.max_requests:
            limit = min(limit, self.max_requests - self.stats.finished())
        if self.gate is not None:
            self._dispatch_gated(parts, self.gate, limit)
            return
        while self._in_flight < limit:
            job = parts.queue.reserve()
            if job is None:
                return
            self._flying[job.id] = (job, self.monotonic())
            self._work.put(job)

    def _dispatch_gated(self, parts: Parts, gate: Gate, limit: int) -> None:
        """Start the held jobs whose domain is free, then reserve more: the gate holds a few per
        domain and the rest go back to the queue, delayed until about when their domain is free.

        Putting back is how a clump of one domain is skimmed to reach the others behind it. A
        round that reaches none makes the next round skim half as far (one job at the least), so
        a queue of one busy domain is not churned; a round that does restores the full reach.
        """
        now = self.monotonic()
        self._start_ready(gate, now, limit)
        put_back: list[tuple[Job, float]] = []
        reached = False
        while (self._in_flight - gate.held() < limit and gate.held() < limit
               and len(put_back) < self._skim):
            job = parts.queue.reserve()
            if job is None:
                break
            if gate.offer(job, now):
                self._flying[job.id] = (job, now)
                reached = reached or bool(put_back)
            else:
                put_back.append((job, gate.put_back_delay))
        if put_back:
            with parts.queue.transaction() as tx:
                for job, delay in put_back:
                    tx.retry(job, delay)
            self._skim = 4 * limit if reached else max(1, self._skim // 2)
        self._start_ready(gate, now, limit)

    def _start_ready(self, gate: Gate, now: float, limit: int) -> None:
        for job in gate.ready(now, limit - (self._in_flight - gate.held())):
            self._work.put(job)

    def _withdraw(self) -> None:
        """Take back jobs no thread has started; they stay queued on disk for the next run."""
        if self.gate is not None:
            for held in self.gate.withdraw():
                self._flying.pop(held.id, None)
        while True:
            try:
                job = self._work.get_nowait()
            except stdqueue.Empty:
                return
            if job is not None:
                self._flying.pop(job.id, None)

    def _collect(self, idle: bool) -> list[Outcome]:
        try:
            first = self._done.get(timeout=0.2 if idle else 0.05)
        except stdqueue.Empty:
            return []
        outcomes = [first]
        while len(outcomes) < _COMMIT_BATCH:
            try:
                outcomes.append(self._done.get_nowait())
            except stdqueue.Empty:
                break
        now = self.monotonic()
        for outcome in outcomes:
            self._flying.pop(outcome.job.id, None)
            if self.gate is not None:
                self.gate.finished(outcome.job, outcome.response, now, outcome.crawl_delay)
        return outcomes

    def _touch(self, parts: Parts) -> None:
        """Keep the leases of long fetches (beanstalkd TTR) from running out."""
        now = self.monotonic()
        for job_id, (job, since) in list(self._flying.items()):
            if now - since > parts.queue.ttr / 2:
                parts.queue.touch(job)
                self._flying[job_id] = (job, now)

    # -- fetch threads -----------------------------------------------------------------------

    def _fetch_loop(self, parts: Parts) -> None:
        while True:
            job = self._work.get()
            if job is None:
                return
            self._done.put(self._process(parts, job))

    def _process(self, parts: Parts, job: Job) -> Outcome:
        request = job.request
        try:
            for _, store in parts.stores:
                mode = getattr(store, "mode", "store")
                if mode == "conditional" and request.key in store:  # type: ignore[operator]
                    skipped = Response(request, 0, "already stored", fetched_at=self.clock())
                    return Outcome(job, skipped, [], [], lookup="skipped")
                if mode == "cache":
                    cached = store.cached(request, self.clock())  # type: ignore[attr-defined]
                    if cached is not None:
                        items, links = parts.parser.parse(cached) if parts.parser is not None else ([], [])
                        return Outcome(job, cached, items, links, lookup="hit")
            verdict = parts.robots.check(request.url) if parts.robots is not None else None
            crawl_delay = None if verdict is None else verdict.crawl_delay
            refusal = None if verdict is None or verdict.allowed else self._robots_refusal(request, verdict)
            if refusal is None and (parts.paginator is not None or parts.rescheduler is not None
                                    or "every" in request.meta):
                return self._visit(parts, job, crawl_delay)
            response = refusal or parts.fetcher.fetch(request)
            if response.error is not None:
                return Outcome(job, response, [], [], crawl_delay=crawl_delay)
            items, links = parts.parser.parse(response) if parts.parser is not None else ([], [])
            if parts.follow is None:
                return Outcome(job, response, items, links, crawl_delay=crawl_delay)
            found = parts.follow.follow_ups(response)
            digest = hashlib.sha1(response.body).hexdigest()
            return Outcome(job, response, items, links + found.requests, found.rejected, digest, crawl_delay)
        except Exception as exc:  # the part boundary: a bug in a part must not stop the run
            log.critical("part failed on %s: %s: %s", loggable(request.url), type(exc).__name__, exc, exc_info=True)
            response = Response(request, 0, "part_error", fetched_at=self.clock(), error="part_error")
            return Outcome(job, response, [], [])

    def _visit(self, parts: Parts, job: Job, crawl_delay: float | None) -> Outcome:
        """One visit of a resource: its pages, its new items, its state and when to come back."""
        request = job.request
        now = self.clock()
        state = ResourceState.from_dict(parts.queue.get_state(_resource_key(request.key)))
        if parts.paginator is not None:
            responses, visit = parts.paginator.visit(request, parts.fetcher.fetch, state, now)
            log.info("visit %s: %d pages, stopped: %s", loggable(request.url), len(responses), visit.stop)
        else:
            responses = [parts.fetcher.fetch(request)]
        first = responses[0]
        rescheduler = parts.rescheduler
        if rescheduler is None and "every" in request.meta:
            rescheduler = EveryRescheduler(parse_duration(request.meta["every"]))
        if first.error is not None:
            # The policy may retry it; once it gives up, a recurring resource keeps its state and
            # comes back after its last interval (a minute when it has none yet).
            again = max(1.0, state.next_visit - state.last_visit) if state.visits else _FIRST_RETRY
            return Outcome(job, first, [], [], crawl_delay=crawl_delay, pages=tuple(responses),
                           reschedule=again if rescheduler else None)
        items: list[Item] = []
        links: list[Request] = []
        for response in responses:
            if response.error is None and parts.parser is not None:
                found, more = parts.parser.parse(response)
                items += found
                links += more
        new = _new_items(items, state)
        delay = rescheduler.delay(state, len(new), now, loggable(request.url)) if rescheduler else None
        return Outcome(job, first, new, links, crawl_delay=crawl_delay, pages=tuple(responses),
                       resource=state.to_dict(), reschedule=delay)

    def _robots_refusal(self, request: Request, verdict: Verdict) -> Response:
        """A response standing for a fetch robots.txt does not allow."""
        now = self.clock()
        wait = None if verdict.retry_at is None else max(0.0, verdict.retry_at - now)
        kind = "robots_unavailable" if verdict.reason == "robots_unavailable" else "robots_disallowed"
        return Response(request, 0, verdict.reason, fetched_at=now, error=kind, retry_after=wait)

    # -- commit ------------------------------------------------------------------------------

    def _commit(self, parts: Parts, outcomes: list[Outcome]) -> None:
        """Write the outcomes' records, then ack them with the stores' checkpoints in one batch."""
        decisions = [decide(o.response, self.recipe.retries, self.recipe.backoff) for o in outcomes]
        outcomes = self._drop_duplicate_content(parts, outcomes, decisions)
        seen: set[str] = set()
        unique_keys: set[str] = set()  # marked in the same batch as the acks
        for i, (outcome, decision) in enumerate(zip(outcomes, decisions)):
            key = outcome.job.request.key
            if key in seen or (decision.action != "retry" and parts.queue.is_done(key)):
                # Delivered twice (beanstalkd is at-least-once): its record is already written.
                decisions[i] = Decision("duplicate")
                continue
            seen.add(key)
            if decision.action == "retry" or outcome.lookup == "skipped":
                continue
            for state_name, store in parts.stores:
                if store.records == "pages":
                    for response in outcome.responses:
                        store.write(response)
                elif getattr(store, "unique", False):
                    for item in outcome.items:
                        mark = _unique_key(state_name, item.key)
                        if mark not in unique_keys and parts.queue.get_state(mark) is None:
                            unique_keys.add(mark)
                            store.write(item)
                else:
                    for item in outcome.items:
                        store.write(item)
        checkpoints = []
        for state_name, store in parts.stores:
            store.flush()
            if isinstance(store, Checkpointed):
                checkpoints.append((state_name, store.checkpoint()))
        stats = self.stats
        now = self.clock()
        with parts.queue.transaction() as tx:
            for outcome, decision in zip(outcomes, decisions):
                response, job = outcome.response, outcome.job
                nbytes = sum(len(r.body) for r in outcome.responses)
                if outcome.lookup != "hit":  # every fetch counts, retried or not; the cache fetched nothing
                    self.bandwidth.add(nbytes, now)
                if decision.action == "duplicate":
                    tx.ack(job)
                    continue
                if decision.action == "retry":
                    log.info("retry in %.1fs (attempt %d): %s %s %s", decision.delay, job.request.attempt + 1,
                             loggable(job.request.url), response.status, response.error)
                    tx.retry(job, decision.delay, dataclasses.replace(job.request, attempt=job.request.attempt + 1))
                    stats.count("retries")
                    continue
                if decision.action == "bury":
                    tx.bury(job, response.error or "")
                    stats.count("buried")
                    if response.error == "part_error":
                        self._part_failed()
                else:
                    if outcome.reschedule is not None:
                        fresh = dataclasses.replace(job.request, attempt=0)
                        tx.retry(job, outcome.reschedule, fresh)  # stays queued: due again later
                        self._schedule[job.request.key] = self.clock() + outcome.reschedule
                    else:
                        tx.ack(job)
                    if outcome.resource is not None:
                        tx.set_state(_resource_key(job.request.key), outcome.resource)
                    self._queue_links(parts, tx, outcome)
                    if outcome.digest:
                        tx.set_state(_content_key(outcome), {"key": job.request.key})
                    stats.count("done" if response.error is None else "failed")
                    stats.count_domain(url_domain(job.request.url))
                    if response.error is not None:
                        log.info("failed: %s %s %s", loggable(job.request.url), response.status, response.error)
                if outcome.lookup:
                    stats.count({"hit": "cache_hits", "skipped": "skipped"}[outcome.lookup])
                elif self._has_cache:
                    stats.count("cache_misses")
                stats.count("items", len(outcome.items))
                stats.count("bytes", nbytes)
                stats.statuses[str(response.status)] += 1
                if response.error:
                    stats.errors[response.error] += 1
            for state_name, checkpoint in checkpoints:
                tx.set_state(state_name, checkpoint)
            for mark in unique_keys:
                tx.set_state(mark, {})
            tx.set_state("stats", stats.persistent())
            tx.set_state("bandwidth", self.bandwidth.state())
        for _, store in parts.stores:
            if isinstance(store, Checkpointed):
                store.committed()

    def _part_failed(self) -> None:
        """Count an unanticipated error; too many too fast stop the run (a broken part, not a
        broken page): stop reason ``circuit_breaker``, exit code 3."""
        most, per = self.recipe.part_errors
        if not most:
            return
        now = self.monotonic()
        errors = self._part_errors
        errors.append(now)
        while errors and errors[0] <= now - per:
            errors.popleft()
        if len(errors) >= most and self.stop_reason is None:
            self.stop_reason = "circuit_breaker"
            log.critical("stopping: %d unanticipated errors in %.0fs (limits.part_errors is %d/%.0fs); "
                         "tracebacks are in critical.log", len(errors), per, most, per, extra=CONSOLE)

    def _answer_commands(self, parts: Parts) -> None:
        """Dump, load and kick asked for by other processes (see scrapekit.control)."""
        for path, command in control.pending(self.recipe.run_dir):
            if command.get("command") == "finish":  # all workers are done (see scrapekit.workers)
                self.stop_reason = self.stop_reason or "done"
                result = {"ok": True}
            else:
                result = control.execute(parts.queue, command, self.recipe.run_dir)
            log.info("command %s: %s", command.get("command"), result, extra=CONSOLE)
            control.answer(path, result)

    def _queue_links(self, parts: Parts, tx: Transaction, outcome: Outcome) -> None:
        """Queue the follow-ups never seen before that the strategy admits; count the rest."""
        links = self.stats.links
        links.update(outcome.rejected)
        for link in outcome.links:
            if parts.queue.known(link.key):
                links["seen"] += 1
                continue
            reason = parts.follow.admit(link) if parts.follow is not None else None
            if reason is not None:
                links[reason] += 1
            elif tx.put(link, unseen=True):
                links["queued"] += 1
            else:
                links["seen"] += 1  # twice in this batch

    def _drop_duplicate_content(self, parts: Parts, outcomes: list[Outcome],
                                decisions: list[Decision]) -> list[Outcome]:
        """A page whose body was already stored for its site is recorded as a duplicate and its
        links are not followed again."""
        batch: set[str] = set()
        kept = []
        for outcome, decision in zip(outcomes, decisions):
            if outcome.digest and decision.action == "done":
                key = _content_key(outcome)
                if key in batch or parts.queue.get_state(key) is not None:
                    response = dataclasses.replace(outcome.response, reason="duplicate")
                    outcome = Outcome(outcome.job, response, outcome.items, [], outcome.rejected)
                    self.stats.links["duplicate_pages"] += 1
                batch.add(key)
            kept.append(outcome)
        return kept

    # -- reporting ---------------------------------------------------------------------------

    def _queue_counts(self, parts: Parts) -> dict[str, int]:
        self._counts = parts.queue.counts()
        return self._counts

    def _write_stats(self, running: bool, fresh: bool = True) -> None:
        parts = getattr(self, "parts", None)
        if parts is None:
            return
        snapshot = self.stats.snapshot(
            self._queue_counts(parts) if fresh else self._counts, name=self.recipe.name, pid=os.getpid(), running=running,
            updated_at=self.clock(), stop_reason=self.stop_reason, in_flight=self._in_flight,
            started_at=self._started_at, source_exhausted=self._source_exhausted,
            worker=None if self.recipe.worker is None else str(self.recipe.worker),
            tube=getattr(parts.queue, "tube", None),
            current_domains=sorted({url_domain(job.request.url) for job, _ in self._flying.values()})[:50],
            bandwidth={**self.bandwidth.state(), "daily_limit": self.bandwidth.daily,
                       "monthly_limit": self.bandwidth.monthly, "paused_until": self._paused_until},
            next_due=[{"key": key, "at": at} for key, at in sorted(self._schedule.items(), key=lambda kv: kv[1])[:10]],
            politeness=None if self.gate is None else {
                "held": self.gate.held(), "put_back": self.gate.put_back,
                "paused_domains": {d: round(left, 1) for d, left in self.gate.paused(self.monotonic()).items()}},
        )
        try:
            write_json_atomic(self.recipe.run_dir / "stats.json", snapshot)
            now = self.monotonic()
            if now >= self._next_snapshot or not running:
                self._next_snapshot = now + self.recipe.stats_interval
                append_snapshot(self.recipe.run_dir / "stats", snapshot)
        except OSError as exc:
            log.warning("cannot write stats.json: %s", exc)
        if self._statsd is not None:
            self._statsd.send(snapshot)
        if self.on_progress is not None:
            self.on_progress(snapshot)

    def _progress_text(self) -> str:
        stats = self.stats
        counts = self._counts
        return (
            f"done {stats.totals['done']} failed {stats.totals['failed']} buried {stats.totals['buried']} "
            f"items {stats.totals['items']} | {stats.rate():.1f}/s | queue {counts['ready']} "
            f"delayed {counts['delayed']} in flight {self._in_flight}"
        )


def _resource_key(key: str) -> str:
    return f"res/{key}"


def _new_items(items: list[Item], state: ResourceState) -> list[Item]:
    """The items not seen by earlier visits: an ``id`` above the highest seen, or a ``guid`` not
    among the last seen; items with neither are all new. Updates ``state.high`` and ``state.guids``."""
    new: list[Item] = []
    ids: list[int] = []
    seen_guids = set(state.guids)
    taken: set[str] = set()
    for item in items:
        ident = item.fields.get("id")
        guid = item.fields.get("guid")
        number = _int_or_none(ident)
        if number is not None:
            ids.append(number)
            if state.high is not None and number <= state.high:
                continue
        elif guid is not None:
            if str(guid) in seen_guids:
                continue
            seen_guids.add(str(guid))
            state.guids.append(str(guid))
        if item.key in taken:
            continue
        taken.add(item.key)
        new.append(item)
    if ids:
        state.high = max(ids + ([] if state.high is None else [state.high]))
    del state.guids[:-MAX_GUIDS]
    return new


def _int_or_none(value: Any) -> int | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _unique_key(state_name: str, key: str) -> str:
    return f"u/{state_name}/{hashlib.sha1(key.encode()).hexdigest()}"


def _content_key(outcome: Outcome) -> str:
    return f"h/{url_domain(outcome.job.request.url)}/{outcome.digest}"


def run_recipe(recipe: Recipe, **kwargs: Any) -> str:
    """Run ``recipe`` to its end; returns the stop reason (see Runner)."""
    return Runner(recipe, **kwargs).run()

