"""Logging of a run to work/<name>/log/: console.log (what a person watching needs: start, progress,
stop, warnings), info.log (every event, one line each) and critical.log (unanticipated errors with
tracebacks). Files are reopened when moved, so logrotate and ``tail -F`` work."""

from __future__ import annotations

import logging
import logging.handlers
import sys
import time
from pathlib import Path
from typing import TextIO

CONSOLE = {"console": True}
"""Pass as ``extra=`` to send an info line to the console log too (progress, start, stop)."""

_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class _OneLine(logging.Formatter):
    """UTC timestamps; newlines in messages escaped so every event stays on one line."""

    def __init__(self, tracebacks: bool) -> None:
        super().__init__(_FORMAT, "%Y-%m-%dT%H:%M:%SZ")
        self.converter = time.gmtime
        self.tracebacks = tracebacks

    def format(self, record: logging.LogRecord) -> str:
        line = super().formatMessage(self._prepare(record))
        line = line.replace("\r", "\\r").replace("\n", "\\n")
        if self.tracebacks and record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line

    def _prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        record.message = record.getMessage()
        record.asctime = self.formatTime(record, self.datefmt)
        return record


class _TerminalHandler(logging.StreamHandler[TextIO]):
    """Clears a live progress line before each log line, so the two never share a line."""

    def emit(self, record: logging.LogRecord) -> None:
        self.stream.write("\r\x1b[K")
        super().emit(record)


def _console_filter(record: logging.LogRecord) -> bool:
    return record.levelno >= logging.WARNING or bool(getattr(record, "console", False))


def log_dir(run_dir: Path) -> Path:
    return run_dir / "log"


def configure(run_dir: Path, to_stderr: bool) -> list[logging.Handler]:
    """Attach the run's handlers to the ``scrapekit`` logger; returns them for ``unconfigure``."""
    directory = log_dir(run_dir)
    directory.mkdir(parents=True, exist_ok=True)
    handlers: list[logging.Handler] = []

    def add(handler: logging.Handler, level: int, tracebacks: bool, console_only: bool) -> None:
        handler.setLevel(level)
        handler.setFormatter(_OneLine(tracebacks))
        if console_only:
            handler.addFilter(_console_filter)
        handlers.append(handler)

    add(logging.handlers.WatchedFileHandler(directory / "console.log", encoding="utf-8"), logging.INFO, False, True)
    add(logging.handlers.WatchedFileHandler(directory / "info.log", encoding="utf-8"), logging.INFO, False, False)
    add(logging.handlers.WatchedFileHandler(directory / "critical.log", encoding="utf-8"), logging.ERROR, True, False)
    if to_stderr:
        terminal = _TerminalHandler(sys.stderr) if sys.stderr.isatty() else logging.StreamHandler(sys.stderr)
        add(terminal, logging.INFO, False, True)
    root = logging.getLogger("scrapekit")
    root.setLevel(logging.INFO)
    root.propagate = False
    for handler in handlers:
        root.addHandler(handler)
    return handlers


def unconfigure(handlers: list[logging.Handler]) -> None:
    root = logging.getLogger("scrapekit")
    for handler in handlers:
        root.removeHandler(handler)
        handler.close()
