"""What to do with a finished fetch: one table from error kind to action, and backoff by status.

A response whose status (``503``), status class (``5xx``) or error kind (``timeout``) is in the
backoff table is retried after ``base * 2**attempt`` seconds (Retry-After wins when longer) until
``retries`` attempts are spent. Anything else ends the request with the action of its kind.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from .model import Response

Action = Literal["done", "retry", "drop", "bury", "duplicate"]

FINAL_ACTIONS: dict[str, Action] = {
    "part_error": "bury",  # a bug in a part or plugin: keep the job for a look and a kick
}
"""Error kind -> action once a request is not retried; a kind not listed is dropped (its record
written, the job done, counted as failed)."""

MAX_DELAY = 86_400.0


@dataclass(frozen=True, slots=True)
class Decision:
    action: Action
    delay: float = 0.0


def decide(response: Response, retries: int, backoff: Mapping[str, float]) -> Decision:
    """The action for ``response`` given its request's attempt count."""
    if response.error is None:
        return Decision("done")
    status = response.status
    base = None
    if status:
        base = backoff.get(str(status), backoff.get(f"{status // 100}xx"))
    if base is None:
        base = backoff.get(response.error)
    if base is not None and response.request.attempt < retries:
        delay = base * 2 ** response.request.attempt
        if response.retry_after is not None:
            delay = max(delay, response.retry_after)
        return Decision("retry", min(delay, MAX_DELAY))
    return Decision(FINAL_ACTIONS.get(response.error, "drop"))
