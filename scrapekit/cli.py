"""The command line: the only layer that parses arguments, configures logging, prints and exits."""

from __future__ import annotations

import inspect
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

import click

from . import __version__, control, logs
from .errors import CIRCUIT_BREAKER_EXIT, AlreadyRunning, RecipeError, ScrapekitError
from .recipe import PartSpec, Recipe, load_recipe, options_of
from .report import write_report
from .runner import Runner, build
from .state import RunLock, StateDB, running_pid
from .stats import read_json
from .units import format_size, utc_text

log = logging.getLogger("scrapekit.cli")


def _fail(exc: ScrapekitError) -> NoReturn:
    click.echo(str(exc) if isinstance(exc, RecipeError) else f"error: {exc}", err=True)
    sys.exit(exc.exit_code)


def _recipe(path: str) -> Recipe:
    try:
        recipe = load_recipe(path)
        for spec in (recipe.parse, recipe.follow):
            if spec is not None:
                build(spec, recipe)  # parsers and link followers check their expressions when built
        return recipe
    except ScrapekitError as exc:
        _fail(exc)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="scrapekit")
def main() -> None:
    """scrapekit: run a scrape described by a YAML recipe, for minutes or for weeks."""


# -- check ------------------------------------------------------------------------------------

def _describe(spec: PartSpec, extra: str = "") -> str:
    values = {name: p.default for name, p in options_of(spec.cls).items() if p.default is not inspect.Parameter.empty}
    values.update(spec.options)
    shown = " ".join(f"{k}={_short(v)}" for k, v in values.items())
    return f"{spec.section:<9} {spec.type:<12} {shown}{extra}"


def _short(value: Any) -> str:
    text = json.dumps(value, default=str, ensure_ascii=False) if not isinstance(value, str) else value
    return text if len(text) <= 60 else text[:57] + "..."


@main.command()
@click.argument("recipe")
def check(recipe: str) -> None:
    """Validate RECIPE; print its assembled parts (exit 0) or every error as path:line: key: message (exit 2)."""
    r = _recipe(recipe)
    lines = [
        f"recipe    {r.path} (name {r.name})",
        f"work      {r.run_dir}",
        _describe(r.source, f" (window {r.window})"),
        _describe(r.queue),
        _describe(r.fetch, f" (concurrency {r.concurrency}, retries {r.retries})"),
    ]
    lines += [_describe(spec) for spec in (r.parse, r.follow) if spec is not None]
    lines += [_describe(spec) for spec in r.stores]
    lines.append(f"limits    max_requests={r.max_requests} max_seconds={r.max_seconds:g}")
    click.echo("\n".join(lines))
    click.echo("ok")


# -- run --------------------------------------------------------------------------------------

class _LiveLine:
    """A one-line progress display on a terminal, redrawn in place."""

    def __init__(self) -> None:
        self.enabled = sys.stderr.isatty()

    def __call__(self, snapshot: dict[str, Any]) -> None:
        if not self.enabled:
            return
        queue = snapshot["queue"]
        text = (f"done {snapshot['done']}  failed {snapshot['failed']}  items {snapshot['items']}  "
                f"{snapshot['rate']:.1f}/s  queue {queue['ready']}  delayed {queue['delayed']}")
        sys.stderr.write("\r\x1b[K" + text)
        sys.stderr.flush()

    def clear(self) -> None:
        if self.enabled:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()


@main.command()
@click.argument("recipe")
@click.option("--detach", is_flag=True, help="Run in the background (like nohup); print the pid and return.")
@click.option("--max-requests", type=click.IntRange(min=0), default=None, help="Stop after N requests end.")
@click.option("--no-console", is_flag=True, hidden=True)
def run(recipe: str, detach: bool, max_requests: int | None, no_console: bool) -> None:
    """Run RECIPE in the foreground (progress on the terminal, logs under work/<name>/log/)."""
    r = _recipe(recipe)
    if detach:
        _detach(r, recipe, max_requests)
        return
    live = _LiveLine() if not no_console else None
    try:
        handlers = logs.configure(r.run_dir, to_stderr=not no_console)
    except OSError as exc:
        _fail(ScrapekitError(f"cannot write to the work directory {r.run_dir}: {exc.strerror or exc}"))
    try:
        reason = Runner(r, max_requests=max_requests, on_progress=live).run()
    except ScrapekitError as exc:
        log.error("%s", exc)
        if live:
            live.clear()
        _fail(exc)
    except Exception:
        log.critical("unexpected error, run stopped", exc_info=True)
        click.echo(f"error: unexpected; traceback in {logs.log_dir(r.run_dir) / 'critical.log'}", err=True)
        sys.exit(1)
    finally:
        if live:
            live.clear()
        logs.unconfigure(handlers)
    if not no_console:
        click.echo(f"stopped: {reason}\n  output: {r.run_dir / 'out'}\n  logs:   {logs.log_dir(r.run_dir)}", err=True)
    if reason == "circuit_breaker":
        sys.exit(CIRCUIT_BREAKER_EXIT)


def _detach(r: Recipe, recipe: str, max_requests: int | None) -> None:
    pid_file = r.run_dir / "run.pid"
    pid = running_pid(pid_file)
    if pid is not None:
        _fail(ScrapekitError(f"recipe {r.name!r} is already running (pid {pid})"))
    log_dir = logs.log_dir(r.run_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "scrapekit", "run", str(Path(recipe).resolve()), "--no-console"]
    if max_requests is not None:
        command += ["--max-requests", str(max_requests)]
    with open(log_dir / "detached.out", "ab") as out:
        child = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                 start_new_session=True)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and child.poll() is None and running_pid(pid_file) != child.pid:
        time.sleep(0.05)
    if child.poll() not in (None, 0):
        tail = (log_dir / "detached.out").read_text(errors="replace").strip().splitlines()[-1:]
        click.echo(f"error: the run exited with code {child.returncode}: {' '.join(tail)}", err=True)
        sys.exit(child.returncode or 1)
    click.echo(f"started {r.name} in the background, pid {child.pid}\n"
               f"  pid file: {pid_file}\n  logs:     {log_dir} (scrapekit tail {recipe})\n"
               f"  output:   {r.run_dir / 'out'}\n  stop:     kill {child.pid}")


# -- status -----------------------------------------------------------------------------------

def _status(r: Recipe) -> dict[str, Any]:
    pid = running_pid(r.run_dir / "run.pid")
    stats = read_json(r.run_dir / "stats.json") or {}
    queue = dict(stats.get("queue", {}))
    totals = {k: stats.get(k, 0) for k in ("done", "failed", "items", "retries", "bytes")}
    if pid is None and (r.run_dir / "state").is_dir():
        try:
            with RunLock(r.run_dir / "run.pid", r.name), StateDB(r.run_dir / "state") as state:
                q = build(r.queue, r, state=state, name=r.name)
                queue = q.counts()
                q.close()
                totals.update({k: v for k, v in (q.get_state("stats") or {}).items() if k in totals})
        except ScrapekitError:
            pid = running_pid(r.run_dir / "run.pid")
    reserved = int(queue.get("reserved", 0)) if pid else 0
    return {
        "name": r.name, "running": pid is not None, "pid": pid,
        "queued": int(queue.get("ready", 0)), "reserved": reserved, "delayed": int(queue.get("delayed", 0)),
        "buried": int(queue.get("buried", 0)), **totals,
        "rate": stats.get("rate", 0.0) if pid else 0.0, "rate_avg": stats.get("rate_avg", 0.0),
        "updated_at": stats.get("updated_at"), "stop_reason": None if pid else stats.get("stop_reason"),
        "bandwidth": stats.get("bandwidth"), "politeness": stats.get("politeness"),
        "next_due": stats.get("next_due") or [],
    }


@main.command()
@click.argument("recipe")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def status(recipe: str, as_json: bool) -> None:
    """Show RECIPE's queue and counters, whether or not it is running."""
    r = _recipe(recipe)
    s = _status(r)
    if as_json:
        click.echo(json.dumps(s, sort_keys=True))
        return
    state = f"running (pid {s['pid']})" if s["running"] else f"not running (last stop: {s['stop_reason'] or 'unknown'})"
    click.echo(f"{r.name}: {state}\n"
               f"  queued {s['queued']}  reserved {s['reserved']}  delayed {s['delayed']}  buried {s['buried']}\n"
               f"  done {s['done']}  failed {s['failed']}  items {s['items']}  retries {s['retries']}"
               + (f"\n  rate {s['rate']:.1f}/s  (average {s['rate_avg']:.1f}/s)" if s["running"]
                  else f"\n  last run's average rate {s['rate_avg']:.1f}/s")
               + _politeness_text(s))


def _politeness_text(s: dict[str, Any]) -> str:
    lines = []
    bandwidth = s.get("bandwidth") or {}
    if bandwidth.get("daily_limit") or bandwidth.get("monthly_limit"):
        def size(n: int) -> str:
            return format_size(n) if n else "none"

        lines.append(f"  bandwidth {format_size(bandwidth['day_bytes'])} today (limit {size(bandwidth['daily_limit'])}), "
                     f"{format_size(bandwidth['month_bytes'])} this month (limit {size(bandwidth['monthly_limit'])})")
    if s["running"] and bandwidth.get("paused_until"):
        until = utc_text(bandwidth["paused_until"])
        lines.append(f"  PAUSED: bandwidth limit reached, until {until}")
    if s["next_due"]:
        lines.append("  next due: " + ", ".join(
            f"{d['key']} at {utc_text(d['at'])}" for d in s["next_due"][:5]))
    paused = (s.get("politeness") or {}).get("paused_domains") or {}
    if s["running"] and paused:
        shown = ", ".join(f"{domain} ({left:.0f}s)" for domain, left in sorted(paused.items())[:10])
        lines.append(f"  domains paused after repeated failures: {shown}")
    return "".join(f"\n{line}" for line in lines)


# -- report -----------------------------------------------------------------------------------

@main.command()
@click.argument("recipe")
def report(recipe: str) -> None:
    """Write an HTML page of RECIPE's stats history (charts and tables) to work/<name>/report.html; print its path."""
    r = _recipe(recipe)
    try:
        path = write_report(r.run_dir, r.name)
    except OSError as exc:
        _fail(ScrapekitError(f"cannot write the report in {r.run_dir}: {exc.strerror or exc}"))
    click.echo(str(path))


# -- dump, load, kick -------------------------------------------------------------------------

def _queue_command(r: Recipe, command: dict[str, Any]) -> dict[str, Any]:
    """Carry out ``command`` on R's queue: through the running process if there is one."""
    pid_file = r.run_dir / "run.pid"
    if running_pid(pid_file) is None:
        try:
            with RunLock(pid_file, r.name), StateDB(r.run_dir / "state") as state:
                queue = build(r.queue, r, state=state, name=r.name)
                try:
                    result = control.execute(queue, command, r.run_dir)
                finally:
                    queue.close()
            if not result["ok"]:
                raise ScrapekitError(result["error"])
            return result
        except AlreadyRunning:
            pass  # started meanwhile: ask it
    return control.ask(r.run_dir, command)


@main.command()
@click.argument("recipe")
@click.argument("file", required=False)
def dump(recipe: str, file: str | None) -> None:
    """Copy RECIPE's whole queue to FILE (default work/<name>/seed/<timestamp>.jsonl), leaving it intact."""
    r = _recipe(recipe)
    command: dict[str, Any] = {"command": "dump", "path": str(Path(file).resolve()) if file else None}
    try:
        result = _queue_command(r, command)
    except ScrapekitError as exc:
        _fail(exc)
    click.echo(f"dumped {result['count']} jobs to {result['path']}")


@main.command()
@click.argument("recipe")
@click.argument("file")
def load(recipe: str, file: str) -> None:
    """Add the jobs of FILE (a dump or a URL file) to RECIPE's queue; keys queued or done are skipped."""
    r = _recipe(recipe)
    path = Path(file).resolve()
    if not path.is_file():
        _fail(ScrapekitError(f"file not found: {path}"))
    try:
        result = _queue_command(r, {"command": "load", "path": str(path)})
    except ScrapekitError as exc:
        _fail(exc)
    click.echo(f"loaded {path}: added {result['added']}, skipped {result['skipped']} already queued or done, "
               f"{result['bad']} bad lines")


@main.command()
@click.argument("recipe")
@click.argument("bound", type=click.IntRange(min=1), required=False, default=control.KICK_ALL)
def kick(recipe: str, bound: int) -> None:
    """Move up to BOUND buried jobs of RECIPE back to ready (default: all)."""
    r = _recipe(recipe)
    try:
        result = _queue_command(r, {"command": "kick", "bound": bound})
    except ScrapekitError as exc:
        _fail(exc)
    click.echo(f"kicked {result['kicked']} jobs")


# -- tail -------------------------------------------------------------------------------------

@main.command()
@click.argument("recipe")
@click.option("--log", "which", type=click.Choice(["console", "info", "critical"]), default="info", show_default=True)
@click.option("-n", "lines", type=int, default=20, show_default=True, help="Lines of history to show first.")
@click.option("--follow/--no-follow", default=True, show_default=True)
def tail(recipe: str, which: str, lines: int, follow: bool) -> None:
    """Show RECIPE's log and follow it (like tail -F); Ctrl-C to stop."""
    r = _recipe(recipe)
    path = logs.log_dir(r.run_dir) / f"{which}.log"
    try:
        _tail(path, lines, follow)
    except KeyboardInterrupt:
        pass


def _tail(path: Path, lines: int, follow: bool) -> None:
    while not path.exists():
        if not follow:
            raise click.ClickException(f"no log yet at {path}")
        time.sleep(0.5)
    handle = open(path, "rb")
    history = handle.read().splitlines(keepends=True)[-lines:] if lines > 0 else []
    for line in history:
        click.echo(line.decode("utf-8", "replace"), nl=False)
    while follow:
        chunk = handle.readline()
        if chunk:
            click.echo(chunk.decode("utf-8", "replace"), nl=False)
            continue
        time.sleep(0.3)
        try:
            if os.stat(path).st_ino != os.fstat(handle.fileno()).st_ino:
                handle.close()
                handle = open(path, "rb")  # rotated: follow the new file
        except FileNotFoundError:
            pass
    handle.close()


from .supervise import supervise as _supervise  # noqa: E402
main.add_command(_supervise)
