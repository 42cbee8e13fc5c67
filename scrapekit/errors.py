"""The one exception tree of scrapekit.

    ScrapekitError                 exit code 1 unless a subclass says otherwise
    ├── RecipeError                a bad recipe or argument: path:line: key: message (exit 2)
    │   └── RecipeErrors           several RecipeErrors found in one pass
    ├── AlreadyRunning             another process holds the recipe's state (exit 2)
    ├── QueueError                 the durable queue could not be read or written
    ├── StoreError                 a store could not write (disk full, unwritable directory)
    └── PartError                  a part or plugin could not be built or loaded

Anticipated failures of a fetch (timeouts, bad status, too large) are not exceptions: they are
data on the Response (see scrapekit.model). A run that the circuit breaker stops (unanticipated
errors coming faster than ``limits.part_errors``) is not an exception either: it ends with stop
reason ``circuit_breaker`` and the command exits with CIRCUIT_BREAKER_EXIT.
"""

from __future__ import annotations

from collections.abc import Sequence

CIRCUIT_BREAKER_EXIT = 3


class ScrapekitError(Exception):
    """Root of every error scrapekit raises on purpose."""

    exit_code = 1


class RecipeError(ScrapekitError):
    """A recipe problem, shown as ``path:line: key: message``."""

    exit_code = 2

    def __init__(self, path: str, line: int, key: str, message: str) -> None:
        self.path = path
        self.line = line
        self.key = key
        self.message = message
        super().__init__(f"{path}:{line}: {key}: {message}")


class RecipeErrors(RecipeError):
    """Every problem found while validating one recipe, in file order."""

    def __init__(self, errors: Sequence[RecipeError]) -> None:
        self.errors = sorted(errors, key=lambda e: (e.path, e.line, e.key))
        first = self.errors[0]
        super().__init__(first.path, first.line, first.key, first.message)

    def __str__(self) -> str:
        return "\n".join(str(Exception.__str__(e)) for e in self.errors)


class AlreadyRunning(ScrapekitError):
    """The recipe's state is held by another live process."""

    exit_code = 2

    def __init__(self, name: str, pid: int | None) -> None:
        self.pid = pid
        who = f"pid {pid}" if pid else "pid unknown"
        super().__init__(f"recipe {name!r} is already running ({who})")


class QueueError(ScrapekitError):
    """The durable queue failed; its content on disk is left as it was."""


class StoreError(ScrapekitError):
    """A store failed to write; nothing acknowledged depends on the failed write."""


class PartError(ScrapekitError):
    """A part or plugin could not be loaded or built."""
