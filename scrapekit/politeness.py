"""The politeness gate: per registered domain, at most ``per_domain`` requests at once and at least
``delay`` between two starts, raised by crawl-delay and by 429/503 answers, and a circuit breaker
that rests a domain failing again and again.

The gate is a domain-aware ready queue. The runner offers it the jobs it reserves; the gate keeps
a few per domain and hands them back when their domain may take them, and tells the runner to
put the rest back in the durable queue, delayed until about when their domain will be free. So
thousands of URLs of one big domain (domain clumping) wait in the queue, not in front of the
other domains, and nothing the gate holds is lost by a crash: a held job is still reserved.
"""

from __future__ import annotations

import calendar
import heapq
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from .links import url_domain
from .model import Job, Response

log = logging.getLogger(__name__)

SLOW_DOWN_STATUSES = frozenset({429, 503})
"""Answers that mean "too fast": the domain's delay is doubled (at least 1 s, or the Retry-After)."""

BREAKER_ERRORS = frozenset({"timeout", "refused", "dns", "broken_body", "ssl", "server_error", "bad_gateway",
                            "unavailable", "gateway_timeout", "rate_limited"})
"""Failures that count towards a domain's circuit breaker; any other outcome resets its count."""

_MIN_SPACING = 0.001  # seconds between the return times of jobs put back for one domain
_MIN_PUT_BACK = 0.1  # a job put back returns no sooner than this (and not in the same dispatch round)
_HOLD_AHEAD = 2.0  # a domain's jobs are held if they can start within this many seconds
_SMOOTHING = 0.2  # weight of the newest fetch time in a domain's average
_SPEED_UP = 0.9  # after a success a raised delay falls back towards the base by this factor


@dataclass
class _Domain:
    name: str
    delay: float  # current spacing between starts: the base, raised by crawl-delay or 429/503
    crawl_delay: float = 0.0
    active: int = 0
    next_start: float = 0.0
    held: deque[Job] = field(default_factory=deque)
    failures: int = 0
    paused_until: float = 0.0
    horizon: float = 0.0  # when the last job put back for this domain comes back
    elapsed: float = 0.0  # average seconds a fetch takes


class Gate:
    """Decides when each job may start; the runner's main thread is its only user.

    ``offer(job, now)`` takes a reserved job: True when the gate holds it, False when the runner
    should put it back in the queue for ``put_back_delay`` seconds. ``ready(now, most)`` gives
    held jobs that may start now, counting them as started. ``finished(job, response, now)`` is told
    every outcome. ``wake_at()`` is when the next held job may start.
    """

    def __init__(self, delay: float = 0.0, per_domain: int = 8, max_delay: float = 3600.0,
                 breaker_failures: int = 10, breaker_pause: float = 600.0, hold: int = 0) -> None:
        self.delay = delay
        self.per_domain = per_domain
        self.max_delay = max(max_delay, delay)
        self.breaker_failures = breaker_failures
        self.breaker_pause = breaker_pause
        self.hold = max(hold, 2 * per_domain, 1)  # held jobs per domain beyond which jobs go back
        self.put_back_delay = 0.0
        self._domains: dict[str, _Domain] = {}
        self._due: list[tuple[float, str]] = []  # (when a held job of the domain may start, domain)
        self._job_domains: dict[str, str] = {}
        self.put_back = 0

    def _domain(self, name: str) -> _Domain:
        domain = self._domains.get(name)
        if domain is None:
            domain = self._domains[name] = _Domain(name, self.delay)
        return domain

    def _start_time(self, domain: _Domain) -> float:
        return max(domain.next_start, domain.paused_until)

    def _can_start(self, domain: _Domain, now: float) -> bool:
        return self._start_time(domain) <= now and (self.per_domain == 0 or domain.active < self.per_domain)

    def _spacing(self, domain: _Domain) -> float:
        """About how far apart the domain's jobs can start: its delay, or its fetch time shared
        by its concurrent slots."""
        share = domain.elapsed / self.per_domain if self.per_domain else 0.0
        return max(domain.delay, share, _MIN_SPACING)

    def offer(self, job: Job, now: float) -> bool:
        domain = self._domain(url_domain(job.request.url))
        self._job_domains[job.id] = domain.name
        spacing = self._spacing(domain)
        expected = max(now, self._start_time(domain)) + len(domain.held) * spacing
        if len(domain.held) < self.hold and expected - now < _HOLD_AHEAD:
            domain.held.append(job)
            heapq.heappush(self._due, (max(now, self._start_time(domain)), domain.name))
            return True
        # Back to the queue, due about when the domain can take it: one clump of one domain is
        # spread out behind the others instead of standing in front of them.
        domain.horizon = max(domain.horizon + spacing, expected, now + _MIN_PUT_BACK)
        self.put_back_delay = domain.horizon - now
        self.put_back += 1
        del self._job_domains[job.id]
        return False

    def ready(self, now: float, most: int) -> list[Job]:
        """Up to ``most`` held jobs whose domain may start one now, each counted as started."""
        later: list[tuple[float, str]] = []
        started: list[Job] = []
        while self._due and self._due[0][0] <= now and len(started) < most:
            _, name = heapq.heappop(self._due)
            domain = self._domains.get(name)
            if domain is None or not domain.held:
                continue
            if not self._can_start(domain, now):
                if domain.active < self.per_domain or self.per_domain == 0:
                    later.append((self._start_time(domain), name))
                # else: a finish re-queues the domain
                continue
            job = domain.held.popleft()
            domain.active += 1
            domain.next_start = now + domain.delay
            if domain.held:
                later.append((max(now, self._start_time(domain)), name))
            started.append(job)
        for entry in later:
            heapq.heappush(self._due, entry)
        return started

    def finished(self, job: Job, response: Response, now: float, crawl_delay: float | None = None) -> None:
        """Free the slot of a started job and learn from its outcome."""
        name = self._job_domains.pop(job.id, None)
        domain = None if name is None else self._domains.get(name)
        if domain is None:
            return
        domain.active = max(0, domain.active - 1)
        domain.elapsed += _SMOOTHING * (response.elapsed - domain.elapsed)
        if crawl_delay is not None:
            domain.crawl_delay = min(crawl_delay, self.max_delay)
        base = max(self.delay, domain.crawl_delay)
        if response.status in SLOW_DOWN_STATUSES:
            raised = max(domain.delay * 2, base, 1.0, response.retry_after or 0.0)
            domain.delay = min(self.max_delay, raised)
            log.info("%s answered %d: %.1fs between its requests from now on", name, response.status, domain.delay)
        else:
            domain.delay = max(base, domain.delay * _SPEED_UP)
        domain.next_start = max(domain.next_start, now + (domain.delay if response.status in SLOW_DOWN_STATUSES else 0.0))
        self._breaker(domain, response, now)
        if domain.held:
            heapq.heappush(self._due, (max(now, self._start_time(domain)), domain.name))
        elif (domain.active == 0 and domain.delay <= self.delay and not domain.failures
              and max(domain.next_start, domain.horizon) <= now):
            del self._domains[domain.name]  # nothing to remember: memory stays bounded by the busy domains

    def _breaker(self, domain: _Domain, response: Response, now: float) -> None:
        if not self.breaker_failures or response.error not in BREAKER_ERRORS:
            domain.failures = 0
            return
        domain.failures += 1
        if domain.failures >= self.breaker_failures:
            domain.paused_until = now + self.breaker_pause
            domain.failures = self.breaker_failures - 1  # half open: one more failure after the pause trips it again
            log.warning("%s failed %d times in a row: paused for %.0fs", domain.name, self.breaker_failures,
                        self.breaker_pause)

    def withdraw(self) -> list[Job]:
        """Every held job, taken out of the gate (the run is stopping)."""
        jobs = [job for domain in self._domains.values() for job in domain.held]
        for domain in self._domains.values():
            domain.held.clear()
        for job in jobs:
            self._job_domains.pop(job.id, None)
        self._due.clear()
        return jobs

    def wake_at(self) -> float | None:
        return self._due[0][0] if self._due else None

    def held(self) -> int:
        return sum(len(domain.held) for domain in self._domains.values())

    def paused(self, now: float) -> dict[str, float]:
        """Domains resting after repeated failures, with the seconds left."""
        return {d.name: d.paused_until - now for d in self._domains.values() if d.paused_until > now}


class Bandwidth:
    """Body bytes fetched per UTC day and month against the recipe's limits (0: none).

    ``add`` counts; ``state``/``saved`` go through the queue's state in the batch of the acks,
    so the counts survive restarts exactly. ``paused_until(now)`` is the start of the next period
    while a limit is reached, None otherwise. Jobs already in flight finish, so a limit can be
    passed by at most their bodies (``fetch.max_bytes`` each).
    """

    def __init__(self, daily: int = 0, monthly: int = 0, saved: dict[str, Any] | None = None) -> None:
        self.daily = daily
        self.monthly = monthly
        saved = saved or {}
        self.day = str(saved.get("day", ""))
        self.month = str(saved.get("month", ""))
        self.day_bytes = int(saved.get("day_bytes", 0))
        self.month_bytes = int(saved.get("month_bytes", 0))

    def _roll(self, now: float) -> None:
        day = time.strftime("%Y-%m-%d", time.gmtime(now))
        if day != self.day:
            self.day, self.day_bytes = day, 0
        if day[:7] != self.month:
            self.month, self.month_bytes = day[:7], 0

    def add(self, nbytes: int, now: float) -> None:
        self._roll(now)
        self.day_bytes += nbytes
        self.month_bytes += nbytes

    def state(self) -> dict[str, Any]:
        return {"day": self.day, "day_bytes": self.day_bytes, "month": self.month, "month_bytes": self.month_bytes}

    def paused_until(self, now: float) -> float | None:
        self._roll(now)
        if self.monthly and self.month_bytes >= self.monthly:
            year, month = int(self.month[:4]), int(self.month[5:7])
            return calendar.timegm((year + month // 12, month % 12 + 1, 1, 0, 0, 0))
        if self.daily and self.day_bytes >= self.daily:
            return calendar.timegm(time.strptime(self.day, "%Y-%m-%d")) + 86_400.0
        return None
