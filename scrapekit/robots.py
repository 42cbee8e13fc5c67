"""robots.txt per host: fetched once through the recipe's own fetcher, kept in the recipe's LevelDB
with an expiry, parsed with protego and held in a small in-memory LRU so a check costs no parse."""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlsplit

from protego import Protego

from .fetchers import status_error
from .model import BadUrl, Request, Response, canonical_url

log = logging.getLogger(__name__)

KEY_PREFIX = b"r:"
"""Every key this module writes to the shared LevelDB starts with this, followed by the host key."""

Rule = Literal["parse", "allow_all", "unavailable"]

STATUS_CLASS_RULES: dict[int, Rule] = {
    2: "parse",
    # a 3xx reaches us only when the fetcher could not follow it (no Location): RFC 9309 2.3.1.2
    # counts that as "unavailable" in its sense, which lets the crawler go anywhere
    3: "allow_all",
    4: "allow_all",
    5: "unavailable",
}
"""HTTP status // 100 -> what a robots.txt answer means. A class not listed is ``unavailable``."""

ERROR_RULES: dict[str, Rule] = {
    # RFC 9309 2.3.1.2: past the redirect limit the crawler MAY treat robots.txt as absent
    "too_many_redirects": "allow_all",
}
"""Fetch error kind (one that is not just the HTTP status) -> rule. A kind not listed (timeout,
refused, dns, broken body, ...) is ``unavailable``: disallow everything for ``error_wait``, then retry."""

REASONS: dict[Rule, str] = {"parse": "allowed", "allow_all": "no_robots", "unavailable": "robots_unavailable"}
"""The Verdict reason of each rule when it decides alone; a parsed file that forbids the URL says
``disallowed``."""

_MAX_HOSTS = 10_000


@dataclass(frozen=True, slots=True)
class Verdict:
    """Whether robots.txt lets our user agent fetch a URL.

    ``reason`` is ``allowed`` or ``disallowed`` (the host's robots.txt said so), ``no_robots`` (the
    host has none: 3xx/4xx, so everything is allowed), ``robots_unavailable`` (5xx or a fetch error:
    nothing is allowed until ``retry_at``) or ``bad_url``. ``crawl_delay`` is the seconds between
    requests the host asks of us, None when it asks nothing.
    """

    allowed: bool
    reason: str
    crawl_delay: float | None = None
    retry_at: float | None = None


@dataclass(frozen=True, slots=True)
class _Entry:
    """One host's robots.txt as cached: the rule its answer gave and, for ``parse``, the parser."""

    rule: Rule
    status: int
    fetched_at: float
    until: float
    text: str | None
    parser: Protego | None

    def fresh(self, now: float, expiry: float) -> bool:
        return now < self.until and now - self.fetched_at < expiry

    def to_json(self) -> bytes:
        return json.dumps({"fetched_at": self.fetched_at, "status": self.status, "text": self.text,
                           "until": self.until, "rule": self.rule}, ensure_ascii=False).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> _Entry | None:
        """The entry stored in ``raw``; None when it is unreadable (then the host is fetched again)."""
        try:
            data = json.loads(raw)
            rule = data["rule"]
            text = data["text"]
            entry = cls(rule, int(data["status"]), float(data["fetched_at"]), float(data["until"]),
                        text, None)
        except (ValueError, KeyError, TypeError):
            return None
        if rule not in REASONS or (rule == "parse") != isinstance(text, str):
            return None
        return entry.parsed()

    def parsed(self) -> _Entry:
        return _Entry(self.rule, self.status, self.fetched_at, self.until, self.text,
                      Protego.parse(self.text) if self.text is not None else None)


def host_key(url: str) -> str:
    """``scheme://host:port`` of an http(s) URL, lower-case, the port always written; BadUrl otherwise."""
    parts = urlsplit(canonical_url(url))
    port = parts.port or (443 if parts.scheme == "https" else 80)
    host = parts.hostname or ""
    return f"{parts.scheme}://{f'[{host}]' if ':' in host else host}:{port}"


def rule_for(response: Response) -> Rule:
    """What a robots.txt response means, from STATUS_CLASS_RULES or ERROR_RULES."""
    if response.error == status_error(response.status):  # the server answered (error None or from status)
        return STATUS_CLASS_RULES.get(response.status // 100, "unavailable")
    return ERROR_RULES.get(response.error or "", "unavailable")


def product_token(user_agent: str) -> str:
    """The name robots.txt groups are matched against: ``scrapekit`` in ``scrapekit/0.1 (+https://...)``.

    RFC 9309 matches groups on the product token; matching the whole header would let a
    ``User-agent: bot`` group catch us through the ``/bot`` in our contact URL. Digits are kept
    (RFC 9309 has none) so that ``sk2/1.0`` is not taken for ``sk``.
    """
    token = ""
    for ch in user_agent.strip():
        if not (ch.isascii() and (ch.isalnum() or ch in "-_")):
            break
        token += ch
    return token or user_agent


class RobotsCache:
    """robots.txt rules per host (``scheme://host:port``) for one user agent.

    The caller may rely on: ``check`` is safe from many threads at once; a host's robots.txt is
    fetched at most once per expiry however many threads ask at the same moment, while checks on
    other hosts go on; ``check`` never raises for a failed robots fetch (see STATUS_CLASS_RULES
    and ERROR_RULES), only if ``fetch`` itself raises. Entries are stored in ``db`` under
    ``KEY_PREFIX + host_key`` as JSON and reused by a later RobotsCache on the same db until
    ``expiry`` seconds after the fetch (``error_wait`` for an unavailable robots.txt). At most
    ``max_bytes`` of a robots.txt are read; a cut file loses its last partial line.
    ``stats`` counts ``fetched``, ``cache_hits`` (checks answered without a fetch), ``disallowed``
    (checks answered "not allowed", for any reason) and ``errors`` (fetches that left robots.txt
    unavailable).
    """

    def __init__(
        self,
        db: Any,
        fetch: Callable[[Request], Response],
        user_agent: str,
        expiry: float = 86_400.0,
        error_wait: float = 3_600.0,
        max_bytes: int = 500_000,
        clock: Callable[[], float] = time.time,
        max_hosts: int = _MAX_HOSTS,
    ) -> None:
        self._db = db
        self._fetch = fetch
        self.user_agent = user_agent
        self.expiry = expiry
        self.error_wait = error_wait
        self.max_bytes = max_bytes
        self.clock = clock
        self.max_hosts = max_hosts
        self.stats: Counter[str] = Counter()
        self._token = product_token(user_agent)
        self._lock = threading.Lock()  # guards _memory, _in_flight and stats
        self._memory: OrderedDict[str, _Entry] = OrderedDict()
        self._in_flight: dict[str, threading.Event] = {}

    def check(self, url: str) -> Verdict:
        """May our user agent fetch ``url``? Fetches the host's robots.txt first if it is not cached
        or has expired; a URL that is not http(s) gets ``Verdict(False, "bad_url")``."""
        try:
            key = host_key(url)
        except BadUrl:
            return Verdict(False, "bad_url")
        entry = self._entry(key)
        verdict = self._judge(entry, url)
        if not verdict.allowed:
            with self._lock:
                self.stats["disallowed"] += 1
        return verdict

    def _judge(self, entry: _Entry, url: str) -> Verdict:
        if entry.rule == "unavailable":
            return Verdict(False, REASONS["unavailable"], retry_at=entry.until)
        if entry.parser is None:
            return Verdict(True, REASONS[entry.rule])
        allowed = entry.parser.can_fetch(url, self._token)
        return Verdict(allowed, "allowed" if allowed else "disallowed", _crawl_delay(entry.parser, self._token))

    def _entry(self, key: str) -> _Entry:
        """The fresh entry of ``key``: from memory, else loaded by this thread, or by the thread
        already loading it, which the others wait for before reading memory again."""
        while True:
            with self._lock:
                entry = self._memory.get(key)
                if entry is not None and entry.fresh(self.clock(), self.expiry):
                    self._memory.move_to_end(key)
                    self.stats["cache_hits"] += 1
                    return entry
                loading = self._in_flight.get(key)
                if loading is None:
                    self._in_flight[key] = threading.Event()
            if loading is None:
                return self._load_once(key)
            loading.wait()

    def _load_once(self, key: str) -> _Entry:
        """Load ``key`` into memory as the one thread in flight for it, then wake its waiters."""
        try:
            entry = self._load(key)
            with self._lock:
                self._memory[key] = entry
                self._memory.move_to_end(key)
                while len(self._memory) > self.max_hosts:
                    self._memory.popitem(last=False)
            return entry
        finally:
            # also when fetch raised: the waiters must not hang; the next of them loads instead
            with self._lock:
                self._in_flight.pop(key).set()

    def _load(self, key: str) -> _Entry:
        """The entry of ``key`` from the db if it is fresh there, else fetched and stored."""
        raw = self._db.get(KEY_PREFIX + key.encode())
        stored = _Entry.from_json(raw) if raw is not None else None
        if stored is not None and stored.fresh(self.clock(), self.expiry):
            with self._lock:
                self.stats["cache_hits"] += 1
            return stored
        entry = self._fetch_robots(key)
        self._db.put(KEY_PREFIX + key.encode(), entry.to_json())
        return entry

    def _fetch_robots(self, key: str) -> _Entry:
        response = self._fetch(Request(f"{key}/robots.txt", kind="resource"))
        rule = rule_for(response)
        now = self.clock()
        text = _text(response, self.max_bytes) if rule == "parse" else None
        until = now + (self.error_wait if rule == "unavailable" else self.expiry)
        with self._lock:
            self.stats["fetched"] += 1
            if rule == "unavailable":
                self.stats["errors"] += 1
        log.info("robots.txt of %r: %s (status %d, error %s)", key, rule, response.status, response.error)
        return _Entry(rule, response.status, now, until, text, None).parsed()


def _text(response: Response, max_bytes: int) -> str:
    """The body as text, cut at ``max_bytes``. A cut body loses its last partial line, which could
    otherwise turn ``Disallow: /private-area`` into a broader ``Disallow: /p``."""
    body = response.body
    if response.truncated or len(body) > max_bytes:
        body = body[:max_bytes]
        body = body[:body.rfind(b"\n") + 1]
    # utf-8-sig: protego does not skip a byte order mark and would miss the first line's group
    return body.decode("utf-8-sig", errors="replace")


def _crawl_delay(parser: Protego, token: str) -> float | None:
    """The larger of Crawl-delay and Request-rate (as seconds per request) for ``token``; None when
    neither is set."""
    delays = []
    delay = parser.crawl_delay(token)
    if delay is not None and math.isfinite(delay) and delay >= 0:
        delays.append(delay)
    rate = parser.request_rate(token)
    if rate is not None and rate.requests > 0:
        delays.append(rate.seconds / rate.requests)
    return max(delays, default=None)
