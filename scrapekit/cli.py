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
from .seed import dump_path
from .shards import Shard, claim_layout, read_layout, worker_dir, workers_dir
from .state import RunLock, StateDB, running_pid
from .stats import read_json
from .units import format_size, utc_text
from .workers import WorkerPool, dump_workers
from .workers import reshard as reshard_run
from .workers import status as workers_status

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
@click.option("--max-requests", type=click.IntRange(min=0), default=None,
              help="Stop after N requests end (with workers: N per worker).")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="Run N worker processes sharing the recipe's beanstalkd queue, each owning the domains of one shard.")
@click.option("--worker", "shard", default=None, metavar="I/N",
              help="Run only worker I of N (from 0); how workers on other machines join a run.")
@click.option("--no-console", is_flag=True, hidden=True)
def run(recipe: str, detach: bool, max_requests: int | None, workers: int | None, shard: str | None,
        no_console: bool) -> None:
    """Run RECIPE in the foreground (progress on the terminal, logs under work/<name>/log/)."""
    r = _recipe(recipe)
    if workers is not None:
        if detach or shard:
            _fail(ScrapekitError("--workers runs in the foreground; for the background use "
                                 "'scrapekit supervise RECIPE --workers N', and --worker I/N for one worker"))
        _run_workers(r, recipe, workers, max_requests)
        return
    try:
        if shard is not None:
            worker = Shard.parse(shard)
            r = r.for_worker(worker)
            claim_layout(r.home, r.name, worker.count)
        elif (laid_out := read_layout(r.home)) is not None:
            raise ScrapekitError(f"{r.name} is laid out for {laid_out} workers: run it with --workers {laid_out} "
                                 f"(or --worker I/{laid_out})")
    except ValueError as exc:
        _fail(ScrapekitError(f"--worker: {exc}"))
    except ScrapekitError as exc:
        _fail(exc)
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
        click.echo(f"stopped: {reason}\n  output: {r.out_dir}\n  logs:   {logs.log_dir(r.run_dir)}", err=True)
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
    if r.worker is not None:
        command += ["--worker", str(r.worker)]
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
               f"  output:   {r.out_dir}\n  stop:     kill {child.pid}")


def _run_workers(r: Recipe, recipe: str, count: int, max_requests: int | None) -> None:
    try:
        r.for_worker(Shard(0, count))  # a beanstalk queue, or a clear error
        handlers = logs.configure(workers_dir(r.home), to_stderr=True)
    except ScrapekitError as exc:
        _fail(exc)
    except OSError as exc:
        _fail(ScrapekitError(f"cannot write to the work directory {r.home}: {exc.strerror or exc}"))
    try:
        code = WorkerPool(r, Path(recipe).resolve(), count, max_requests).run()
    except ScrapekitError as exc:
        _fail(exc)
    finally:
        logs.unconfigure(handlers)
    s = workers_status(r, count)
    click.echo(f"stopped: {count} workers, done {s['done']} failed {s['failed']} items {s['items']}\n"
               f"  output: {r.out_dir}\n  logs:   {workers_dir(r.home)}/<i>/log/", err=True)
    sys.exit(code)


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
    try:
        count = read_layout(r.home)
    except ScrapekitError as exc:
        _fail(exc)
    if count is not None:
        _workers_status(r, count, as_json)
        return
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


def _workers_status(r: Recipe, count: int, as_json: bool) -> None:
    s = workers_status(r, count)
    if as_json:
        click.echo(json.dumps(s, sort_keys=True))
        return
    lines = [f"{r.name}: {s['running']} of {count} workers running, {s['rate']:.1f}/s",
             f"  done {s['done']}  failed {s['failed']}  buried {s['buried']}  items {s['items']}  "
             f"retries {s['retries']}"]
    for w in s["workers"]:
        if w["running"]:
            state = f"pid {w['pid']}  up {_duration(w['uptime'])}  {w['rate']:.1f}/s"
        else:
            state = f"stopped ({w['stop_reason'] or 'unknown'})"
        errors = sum(w["errors"].values())
        line = f"  worker {w['worker']}: {state}  done {w['done']}  failed {w['failed']}  errors {errors}"
        if w.get("supervisor"):
            line += f"  [supervisord: {w['supervisor']['state']}" + (
                f", {w['supervisor']['description']}]" if w["supervisor"]["state"] != "RUNNING" else "]")
        if w["current_domains"]:
            line += "  now: " + ", ".join(w["current_domains"][:5]) + (" ..." if len(w["current_domains"]) > 5 else "")
        lines.append(line)
    if s["beanstalkd_error"]:
        lines.append(f"  queue: {s['beanstalkd_error']}")
    for tube, counts in s["tubes"].items():
        lines.append(f"  tube {tube}: ready {counts['ready']}  reserved {counts['reserved']}  "
                     f"delayed {counts['delayed']}  buried {counts['buried']}")
    click.echo("\n".join(lines))


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


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
        count = read_layout(r.home) or 0
        path = write_report(r.home, r.name, [worker_dir(r.home, i) for i in range(count)])
    except ScrapekitError as exc:
        _fail(exc)
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
                queue = build(r.queue, r, state=state, name=r.name, shard=r.worker)
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


def _each_worker(r: Recipe) -> list[Recipe]:
    """The recipe as each of its workers, or just the recipe when it runs as one process."""
    count = read_layout(r.home)
    return [r] if count is None else [r.for_worker(Shard(i, count)) for i in range(count)]


@main.command()
@click.argument("recipe")
@click.argument("file", required=False)
def dump(recipe: str, file: str | None) -> None:
    """Copy RECIPE's whole queue to FILE (default work/<name>/seed/<timestamp>.jsonl), leaving it intact."""
    r = _recipe(recipe)
    path = Path(file).resolve() if file else dump_path(r.home)
    try:
        workers = read_layout(r.home)
        if workers is None:
            result = _queue_command(r, {"command": "dump", "path": str(path)})
        else:
            count = dump_workers(workers, path, lambda shard, part: int(
                _queue_command(r.for_worker(shard), {"command": "dump", "path": str(part)})["count"]))
            result = {"count": count, "path": str(path)}
    except ScrapekitError as exc:
        _fail(exc)
    except OSError as exc:
        _fail(ScrapekitError(f"cannot write {path}: {exc.strerror or exc}"))
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
        # With workers, worker 0 loads: it sends each job of another shard to that shard's inbox.
        result = _queue_command(_each_worker(r)[0], {"command": "load", "path": str(path)})
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
        kicked = 0
        for w in _each_worker(r):
            kicked += _queue_command(w, {"command": "kick", "bound": bound - kicked})["kicked"]
            if kicked >= bound:
                break
    except ScrapekitError as exc:
        _fail(exc)
    click.echo(f"kicked {kicked} jobs")


@main.command()
@click.argument("recipe")
@click.option("--workers", type=click.IntRange(min=1), required=True, help="The new number of workers.")
def reshard(recipe: str, workers: int) -> None:
    """Change the number of workers of RECIPE while none runs: dump every worker's queue, clear
    the old tubes, share the seen-set, load the dump into the new shards."""
    r = _recipe(recipe)
    try:
        r.for_worker(Shard(0, workers))
        result = reshard_run(r, workers)
    except ScrapekitError as exc:
        _fail(exc)
    click.echo(f"resharded {r.name} from {result['from']} to {result['to']} workers: {result['jobs']} jobs "
               f"dumped to {result['dump']} and loaded ({result['added']} queued, {result['skipped']} already "
               f"done); run it with --workers {workers}")


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
