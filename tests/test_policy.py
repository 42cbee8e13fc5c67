"""The retry policy table: which responses are retried, after how long, and what ends them."""

from __future__ import annotations

import pytest

from scrapekit import Request, Response
from scrapekit.policy import decide
from scrapekit.recipe import DEFAULT_BACKOFF


def outcome(status: int, error: str | None, attempt: int = 0, retry_after: float | None = None) -> Response:
    return Response(Request("http://a.test/", attempt=attempt), status, error=error, retry_after=retry_after)


@pytest.mark.parametrize(("status", "error", "attempt", "action", "delay"), [
    (200, None, 0, "done", 0.0),
    (400, "bad_request", 0, "retry", 5.0),
    (403, "forbidden", 1, "retry", 8.0),
    (500, "server_error", 0, "retry", 2.0),
    (502, "bad_gateway", 2, "retry", 8.0),
    (503, "unavailable", 3, "drop", 0.0),
    (404, "not_found", 0, "drop", 0.0),
    (0, "timeout", 0, "retry", 2.0),
    (0, "refused", 1, "retry", 10.0),
    (0, "dns", 0, "drop", 0.0),
    (0, "part_error", 0, "bury", 0.0),
])
def test_decisions(status: int, error: str | None, attempt: int, action: str, delay: float) -> None:
    decision = decide(outcome(status, error, attempt), 3, DEFAULT_BACKOFF)
    assert (decision.action, decision.delay) == (action, delay)


def test_retry_after_wins_when_longer() -> None:
    assert decide(outcome(503, "unavailable", retry_after=120), 3, DEFAULT_BACKOFF).delay == 120
    assert decide(outcome(429, "rate_limited", retry_after=1), 3, DEFAULT_BACKOFF).delay == 30


def test_backoff_is_capped_at_a_day() -> None:
    assert decide(outcome(500, "server_error", attempt=30), 99, DEFAULT_BACKOFF).delay == 86_400
