"""Rescheduling: when a resource is visited again. ``rate`` revisits each resource when about
``target_items`` new items are expected from its observed item rate; ``every`` at a fixed interval.

The per-resource state is a small JSON record (``ResourceState``) that the runner keeps in the
queue's state under ``res/<key>``, written in the batch that reschedules the job, so it survives
kill -9 together with the queue.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from .units import Seconds

log = logging.getLogger(__name__)

RISING_WEIGHT = 1.0
FALLING_WEIGHT = 0.35
"""A newly observed rate above the smoothed one counts fully; one below it moves the smoothed rate
by this share only (so a quiet spell does not push the next visit out too far at once)."""

MAX_GUIDS = 1000  # seen GUIDs kept per feed


@dataclass
class ResourceState:
    """What is remembered of one recurring resource between visits."""

    high: int | None = None  # highest item id seen so far (max_id pagination)
    guids: list[str] = field(default_factory=list)  # newest last, at most MAX_GUIDS (feeds)
    rate: float = 0.0  # smoothed new items per second
    items: int = 0  # new items seen over all visits
    visits: int = 0
    last_visit: float = 0.0
    next_visit: float = 0.0

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> ResourceState:
        if not data:
            return cls()
        try:
            return cls(high=None if data.get("high") is None else int(data["high"]),
                       guids=[str(g) for g in data.get("guids", [])][-MAX_GUIDS:],
                       rate=float(data.get("rate", 0.0)), items=int(data.get("items", 0)),
                       visits=int(data.get("visits", 0)), last_visit=float(data.get("last_visit", 0.0)),
                       next_visit=float(data.get("next_visit", 0.0)))
        except (TypeError, ValueError):
            log.warning("resource state %r unreadable; starting afresh", data)
            return cls()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Rescheduler(Protocol):
    """``delay(state, new_items, now)``: seconds until the next visit, after updating ``state``
    (rate, items, visits, last and next visit) with a visit that found ``new_items``."""

    def delay(self, state: ResourceState, new_items: int, now: float, key: str) -> float: ...


class RateRescheduler:
    """Revisit when about ``target_items`` new items are expected.

    The observed rate of a visit is its new items over the time since the last visit. It is
    smoothed (RISING_WEIGHT, FALLING_WEIGHT) and the next delay is ``target_items / rate``,
    clamped to [min_delay, max_delay]. Rates well below one item per second work (a float, never
    truncated). The first visit waits min_delay; a visit with no time since the last one, or a
    clock that went backwards, keeps the smoothed rate. A resource that never had a new item
    waits twice its last interval each time (from min_delay up to max_delay).
    """

    def __init__(self, target_items: int = 1000, min_delay: Seconds = Seconds(5.0),
                 max_delay: Seconds = Seconds(86_400.0)) -> None:
        if target_items < 1:
            raise ValueError("target_items must be 1 or more")
        if not 0 < min_delay <= max_delay:
            raise ValueError("expected 0 < min_delay <= max_delay")
        self.target_items = target_items
        self.min_delay = min_delay
        self.max_delay = max_delay

    def delay(self, state: ResourceState, new_items: int, now: float, key: str) -> float:
        span = now - state.last_visit if state.visits else 0.0
        if span < 0:
            log.warning("resched %s: the clock went back %.0fs since the last visit; rate kept", key, -span)
        if span > 0:
            observed = new_items / span
            weight = RISING_WEIGHT if observed >= state.rate else FALLING_WEIGHT
            state.rate += weight * (observed - state.rate)
        if state.rate > 0:
            wait = self.target_items / state.rate
        elif state.visits:  # nothing new ever seen: back off, twice the last interval
            wait = 2 * (state.next_visit - state.last_visit)
        else:
            wait = self.min_delay
        wait = min(self.max_delay, max(self.min_delay, wait))
        state.items += new_items
        state.visits += 1
        state.last_visit = now
        state.next_visit = now + wait
        log.info("resched %s: %d new items in %.0fs, rate %.4g/s, next visit in %.0fs", key, new_items,
                 max(span, 0.0), state.rate, wait)
        return wait


class EveryRescheduler:
    """Revisit at a fixed interval, ``every`` (a request's ``meta.every`` wins when it has one)."""

    def __init__(self, every: Seconds = Seconds(3600.0)) -> None:
        if every <= 0:
            raise ValueError("every must be more than 0s")
        self.every = every

    def delay(self, state: ResourceState, new_items: int, now: float, key: str) -> float:
        state.items += new_items
        state.visits += 1
        state.last_visit = now
        state.next_visit = now + self.every
        return self.every
