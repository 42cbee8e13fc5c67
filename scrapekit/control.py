"""Asking a running process to act on its own queue (dump, load, kick): LevelDB has one owner,
so commands go through request files in work/<name>/control/ that the runner answers."""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .errors import ScrapekitError
from .seed import dump_path, load_into, write_dump

_RESULT = ".result"


def control_dir(run_dir: Path) -> Path:
    return run_dir / "control"


def send(run_dir: Path, command: dict[str, Any]) -> Path:
    """Leave ``command`` for the running process; returns the path its answer will have."""
    directory = control_dir(run_dir)
    directory.mkdir(parents=True, exist_ok=True)
    name = uuid.uuid4().hex
    tmp = directory / f".{name}.tmp"
    tmp.write_text(json.dumps(command))
    os.replace(tmp, directory / f"{name}.json")
    return directory / f"{name}{_RESULT}"


def ask(run_dir: Path, command: dict[str, Any], timeout: float = 600.0) -> dict[str, Any]:
    """Leave ``command`` for the running process and wait for its answer."""
    result = send(run_dir, command)
    directory, name = result.parent, result.name.removesuffix(_RESULT)
    deadline = time.monotonic() + timeout
    while not result.exists():
        if time.monotonic() > deadline:
            (directory / f"{name}.json").unlink(missing_ok=True)
            raise ScrapekitError(f"the running process did not answer within {timeout:.0f}s")
        time.sleep(0.05)
    answer = dict(json.loads(result.read_text()))
    result.unlink()
    if not answer.get("ok"):
        raise ScrapekitError(str(answer.get("error", "the running process refused the command")))
    return answer


def pending(run_dir: Path) -> list[tuple[Path, dict[str, Any]]]:
    """Commands waiting for an answer, oldest first."""
    directory = control_dir(run_dir)
    if not directory.is_dir():
        return []
    found = []
    for path in sorted(directory.glob("*.json"), key=lambda p: p.stat().st_mtime):
        try:
            found.append((path, dict(json.loads(path.read_text()))))
        except (OSError, ValueError):
            path.unlink(missing_ok=True)
    return found


def answer(path: Path, result: dict[str, Any]) -> None:
    target = path.with_name(path.stem + _RESULT)
    tmp = path.with_name(f".{path.stem}.answer")
    tmp.write_text(json.dumps(result))
    os.replace(tmp, target)
    path.unlink(missing_ok=True)


def _dump(queue: Any, command: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    path = Path(command["path"]) if command.get("path") else dump_path(run_dir)
    return {"count": write_dump(queue, path), "path": str(path)}


def _load(queue: Any, command: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    return load_into(queue, Path(command["path"]))


def _kick(queue: Any, command: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    return {"kicked": int(queue.kick(int(command.get("bound", KICK_ALL))))}


KICK_ALL = 2**31 - 1
COMMANDS: dict[str, Callable[[Any, dict[str, Any], Path], dict[str, Any]]] = {
    "dump": _dump,
    "load": _load,
    "kick": _kick,
}
"""Command name -> what it does to a queue; the answer is ``{"ok": true, ...}``."""


def execute(queue: Any, command: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    """Carry out one command on ``queue``; failures come back as ``{"ok": false, "error": ...}``."""
    handler = COMMANDS.get(str(command.get("command")))
    if handler is None:
        return {"ok": False, "error": f"unknown command {command.get('command')!r}; known: {', '.join(COMMANDS)}"}
    try:
        return {"ok": True, **handler(queue, command, run_dir)}
    except (ScrapekitError, OSError, KeyError, ValueError) as exc:
        return {"ok": False, "error": str(exc)}
