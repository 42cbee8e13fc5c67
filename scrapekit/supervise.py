"""Workers under supervisord: one supervisord per work directory, its conf, socket, pid file and
logs kept there, started by ``scrapekit supervise`` and driven over XML-RPC on its unix socket."""

from __future__ import annotations

import datetime
import fcntl
import http.client
import json
import os
import shlex
import socket
import subprocess
import sys
import time
import xmlrpc.client
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from .errors import ScrapekitError
from .recipe import Recipe
from .shards import Shard, read_layout

ACTIONS = ("status", "stop", "restart")
STARTSECS = 10  # a worker that exits sooner failed to start: retried with backoff, then FATAL
STARTRETRIES = 5
STOPWAITSECS = 30  # a worker's own grace is 10 s; past this supervisord kills its process group
NOT_ALL_RUNNING_EXIT = 3  # like supervisorctl status
_RPC_TIMEOUT = 10.0
_UP_TIMEOUT = 15.0
_GONE_TIMEOUT = STOPWAITSECS + 30.0
_RESTART_TIMEOUT = _GONE_TIMEOUT + 600.0  # the start waits out every worker's startsecs
_SOCKET_PATH_MAX = 107  # sun_path is 108 bytes with the final NUL
_UNREACHABLE = (OSError, http.client.HTTPException, xmlrpc.client.Error)


class AlreadySupervised(ScrapekitError):
    """A supervisord already runs for the work directory."""

    exit_code = 2


@dataclass(frozen=True, slots=True)
class Files:
    """Where the supervisord of ``work_dir`` keeps its files."""

    work_dir: Path

    @property
    def conf(self) -> Path:
        return self.work_dir / "supervisord.conf"

    @property
    def socket(self) -> Path:
        return self.work_dir / "supervisord.sock"

    @property
    def pid(self) -> Path:
        return self.work_dir / "supervisord.pid"

    @property
    def lock(self) -> Path:
        return self.work_dir / "supervise.lock"

    @property
    def log_dir(self) -> Path:
        return self.work_dir / "supervisor"

    @property
    def log(self) -> Path:
        return self.log_dir / "supervisord.log"

    @property
    def out(self) -> Path:
        return self.log_dir / "supervisord.out"  # what supervisord prints before it daemonizes


# -- talking to supervisord -------------------------------------------------------------------

class _UnixConnection(http.client.HTTPConnection):
    """HTTP over a unix socket, with a timeout so a wedged supervisord cannot hang a caller."""

    def __init__(self, path: Path, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(str(self.path))
        except OSError:
            sock.close()
            raise
        self.sock = sock


class _UnixTransport(xmlrpc.client.Transport):
    """XML-RPC over supervisord's unix socket (the role of supervisor.xmlrpc.SupervisorTransport,
    which has no timeout and no type information)."""

    def __init__(self, path: Path, timeout: float) -> None:
        super().__init__()
        self.path = path
        self.timeout = timeout
        self._unix: _UnixConnection | None = None

    def make_connection(self, host: object) -> http.client.HTTPConnection:
        if self._unix is None:
            self._unix = _UnixConnection(self.path, self.timeout)
        return self._unix

    def close(self) -> None:
        if self._unix is not None:
            self._unix.close()
            self._unix = None
        super().close()


def _server(work_dir: Path, timeout: float = _RPC_TIMEOUT) -> xmlrpc.client.ServerProxy:
    return xmlrpc.client.ServerProxy("http://localhost", transport=_UnixTransport(Files(work_dir).socket, timeout))


def _pid(server: xmlrpc.client.ServerProxy) -> int:
    pid = server.supervisor.getPID()
    if not isinstance(pid, int):
        raise xmlrpc.client.ResponseError(f"getPID answered {pid!r}")
    return pid


def _is_supervisord(pid: int) -> bool:
    """Whether ``pid`` is a live supervisord (not a zombie, not a process that reused the pid)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return b"supervisord" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return not Path("/proc/self").exists()  # no /proc to ask: trust the signal
    except OSError:
        return True


def _pid_file_pid(files: Files) -> int | None:
    try:
        text = files.pid.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def running_pid(work_dir: Path) -> int | None:
    """The pid of the supervisord of ``work_dir``: the one answering on its socket, else a live
    supervisord its pid file names; None when neither (stale files left by a dead one don't count)."""
    try:
        with _server(work_dir) as server:
            return _pid(server)
    except _UNREACHABLE:
        pass
    pid = _pid_file_pid(Files(work_dir))
    return pid if pid is not None and _is_supervisord(pid) else None


def supervised(work_dir: Path) -> list[dict[str, Any]] | None:
    """Every process of the supervisord of ``work_dir``, or None when none answers there.

    Each is ``{"name": "t_0", "group": "t", "worker": 0, "state": "RUNNING", "pid": 1234 or None,
    "start": epoch seconds or 0, "uptime": seconds or None, "description": supervisord's (e.g.
    "Exited too quickly (process log may have details)" in BACKOFF and FATAL), "exit_status": int}``.
    """
    try:
        with _server(work_dir) as server:
            infos = server.supervisor.getAllProcessInfo()
    except _UNREACHABLE:
        return None
    return [_process(info) for info in infos] if isinstance(infos, list) else None


def _process(info: dict[str, Any]) -> dict[str, Any]:
    running = info["statename"] == "RUNNING"
    _, _, num = str(info["name"]).rpartition("_")
    return {
        "name": info["name"], "group": info["group"], "worker": int(num) if num.isdigit() else None,
        "state": info["statename"], "pid": info["pid"] or None, "start": info["start"],
        "uptime": max(0, info["now"] - info["start"]) if running else None,
        "description": info["description"], "exit_status": info["exitstatus"],
    }


# -- starting ---------------------------------------------------------------------------------

def worker_command(recipe: Recipe, workers: int) -> str:
    """The conf's command for the workers of ``recipe``: supervisord puts each one's index for
    %(process_num)d (so a literal % in a path is doubled)."""
    words = [sys.executable, "-m", "scrapekit", "run", str(recipe.path.resolve()), "--no-console"]
    return _value(" ".join(map(shlex.quote, words))) + f" --worker %(process_num)d/{workers}"


def check_recipes(recipes: Sequence[Recipe]) -> Path:
    """The one work directory of ``recipes``; RecipeError or ScrapekitError when they cannot run
    together as workers (another queue than beanstalk, two work directories, a name twice)."""
    for recipe in recipes:
        recipe.for_worker(Shard(0, 1))  # RecipeError unless its queue is on beanstalkd
    work_dirs = sorted({str(r.work_dir) for r in recipes})
    if len(work_dirs) > 1:
        raise ScrapekitError("the recipes must share one work_dir (one supervisord per work directory); they use "
                             + ", ".join(work_dirs))
    names = [r.name for r in recipes]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ScrapekitError(f"two recipes are named {', '.join(twice)}: names must differ in one work directory")
    socket_path = Files(recipes[0].work_dir).socket
    if len(os.fsencode(socket_path)) > _SOCKET_PATH_MAX:
        raise ScrapekitError(f"the socket path {socket_path} is too long for a unix socket "
                             f"({_SOCKET_PATH_MAX} bytes at most): use a shorter work_dir")
    return recipes[0].work_dir


def _value(path: Path | str) -> str:
    return str(path).replace("%", "%%")  # supervisord expands %(name)s in every value


def conf_text(files: Files, recipes: Sequence[Recipe], workers: int, directory: Path,
              startsecs: int = STARTSECS, startretries: int = STARTRETRIES) -> str:
    """supervisord.conf for ``workers`` workers of each recipe, run in ``directory`` (where the
    recipes were loaded, so a default work_dir resolves the same in the workers)."""
    sections = [
        f"[unix_http_server]\nfile={_value(files.socket)}\nchmod=0700\n",
        f"[supervisord]\nlogfile={_value(files.log)}\nlogfile_maxbytes=10MB\nlogfile_backups=3\n"
        f"pidfile={_value(files.pid)}\nchildlogdir={_value(files.log_dir)}\nnodaemon=false\n",
        "[rpcinterface:supervisor]\nsupervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface\n",
        f"[supervisorctl]\nserverurl=unix://{_value(files.socket)}\n",
    ]
    for recipe in recipes:
        sections.append(
            f"[program:{recipe.name}]\ncommand={worker_command(recipe, workers)}\nnumprocs={workers}\n"
            f"process_name=%(program_name)s_%(process_num)d\ndirectory={_value(directory)}\n"
            f"autostart=true\nautorestart=unexpected\nexitcodes=0\n"
            f"startsecs={startsecs}\nstartretries={startretries}\n"
            f"stopsignal=TERM\nstopwaitsecs={STOPWAITSECS}\nstopasgroup=true\nkillasgroup=true\n"
            f"redirect_stderr=true\nstdout_logfile={_value(files.log_dir / recipe.name)}_%(process_num)d.log\n"
            f"stdout_logfile_maxbytes=50MB\nstdout_logfile_backups=5\n")
    return "\n".join(sections)


@contextmanager
def _locked(files: Files) -> Iterator[None]:
    """An exclusive flock on supervise.lock: two supervise commands check and start one at a time."""
    files.work_dir.mkdir(parents=True, exist_ok=True)
    with open(files.lock, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _refuse_if_running(files: Files) -> None:
    pid = running_pid(files.work_dir)
    if pid is not None:
        raise AlreadySupervised(
            f"supervisord already runs for {files.work_dir} (pid {pid}): see 'scrapekit supervise status|stop|restart "
            f"--work-dir {shlex.quote(str(files.work_dir))}'")


def _supervisord() -> list[str]:
    script = Path(sys.executable).parent / "supervisord"
    return [str(script)] if script.exists() else [sys.executable, "-m", "supervisor.supervisord"]


def start(recipes: Sequence[Recipe], workers: int, directory: Path,
          startsecs: int = STARTSECS, startretries: int = STARTRETRIES) -> int:
    """Write the work directory's supervisord.conf and start supervisord on it; its pid.

    AlreadySupervised when one runs there; ScrapekitError when it does not come up."""
    files = Files(check_recipes(recipes))
    with _locked(files):
        _refuse_if_running(files)
        files.log_dir.mkdir(parents=True, exist_ok=True)
        text = conf_text(files, recipes, workers, directory, startsecs, startretries)
        tmp = files.conf.with_name(f".supervisord.conf.{os.getpid()}")
        tmp.write_text(text)
        os.replace(tmp, files.conf)
        return _launch(files)


def _launch(files: Files) -> int:
    with open(files.out, "wb") as out:
        # the parent returns once supervisord has forked into the background
        code = subprocess.run([*_supervisord(), "-c", str(files.conf)], stdin=subprocess.DEVNULL,
                              stdout=out, stderr=subprocess.STDOUT, timeout=_UP_TIMEOUT).returncode
    if code != 0:
        said = " ".join(files.out.read_text(errors="replace").split())
        raise ScrapekitError(f"supervisord did not start (exit {code}): {said or 'no message'}; see {files.log}")
    deadline = time.monotonic() + _UP_TIMEOUT
    while time.monotonic() < deadline:
        try:
            with _server(files.work_dir) as server:
                return _pid(server)
        except _UNREACHABLE:
            time.sleep(0.1)
    raise ScrapekitError(f"supervisord did not answer on {files.socket} within {_UP_TIMEOUT:.0f}s; see {files.log}")


# -- stopping, restarting ---------------------------------------------------------------------

def _no_supervisord(work_dir: Path) -> ScrapekitError:
    return ScrapekitError(f"no supervisord runs for {work_dir} (nothing answers on {Files(work_dir).socket}); "
                          "start one with 'scrapekit supervise RECIPE... --workers N'")


def stop(work_dir: Path) -> int:
    """Stop every process (each gets SIGTERM and STOPWAITSECS), shut supervisord down and wait
    until it is gone; its pid. ScrapekitError when none runs there."""
    files = Files(work_dir)
    with _locked(files):
        try:
            with _server(work_dir, timeout=_GONE_TIMEOUT) as server:
                pid = _pid(server)
                server.supervisor.stopAllProcesses(True)
                server.supervisor.shutdown()
        except _UNREACHABLE:
            raise _no_supervisord(work_dir) from None
        deadline = time.monotonic() + _GONE_TIMEOUT
        while _is_supervisord(pid):
            if time.monotonic() > deadline:
                raise ScrapekitError(
                    f"supervisord (pid {pid}) did not exit within {_GONE_TIMEOUT:.0f}s; see {files.log}")
            time.sleep(0.1)
    return pid


def restart(work_dir: Path) -> list[dict[str, Any]]:
    """Stop every process, then start them all again and wait until each is running or failed;
    the processes as ``supervised`` gives them. ScrapekitError when no supervisord runs there."""
    try:
        with _server(work_dir, timeout=_RESTART_TIMEOUT) as server:
            server.supervisor.stopAllProcesses(True)
            server.supervisor.startAllProcesses(True)
    except _UNREACHABLE:
        raise _no_supervisord(work_dir) from None
    processes = supervised(work_dir)
    if processes is None:
        raise _no_supervisord(work_dir)
    return processes


# -- the command ------------------------------------------------------------------------------

def _process_line(p: dict[str, Any]) -> str:
    name = f"{p['group']}:{p['name']}"
    if p["state"] == "RUNNING":
        return f"{name:<24} {p['state']:<9} pid {p['pid']:<8} uptime {datetime.timedelta(seconds=int(p['uptime']))}"
    return f"{name:<24} {p['state']:<9} {p['description']}".rstrip()


def _target_dir(args: Sequence[str], work_dir: Path | None) -> Path:
    if len(args) > 1:
        raise click.UsageError("give at most one RECIPE (or --work-dir) after the action")
    if args and work_dir is not None:
        raise click.UsageError("give either RECIPE or --work-dir, not both")
    if args:
        from .cli import _recipe  # cli imports this module at its end

        return _recipe(args[0]).work_dir
    return (work_dir or Path("work")).resolve()


def _act(action: str, work_dir: Path, as_json: bool) -> None:
    if action == "status":
        processes = supervised(work_dir)
        if processes is None:
            raise _no_supervisord(work_dir)
        click.echo(json.dumps(processes, sort_keys=True) if as_json else "\n".join(map(_process_line, processes)))
        if any(p["state"] != "RUNNING" for p in processes):
            sys.exit(NOT_ALL_RUNNING_EXIT)
    elif action == "stop":
        pid = stop(work_dir)
        click.echo(f"stopped supervisord (pid {pid}) and its processes for {work_dir}")
    else:
        click.echo("\n".join(map(_process_line, restart(work_dir))))


def _start(paths: Sequence[str], workers: int, startsecs: int) -> None:
    from .cli import _recipe  # cli imports this module at its end

    recipes = [_recipe(path) for path in paths]
    for recipe in recipes:
        laid_out = read_layout(recipe.home)
        if laid_out not in (None, workers):
            raise ScrapekitError(f"{recipe.name} is laid out for {laid_out} workers, not {workers}: supervise it with "
                                 f"--workers {laid_out}, or first 'scrapekit reshard {recipe.path} --workers {workers}'")
    directory = Path.cwd()
    pid = start(recipes, workers, directory, startsecs)
    files = Files(recipes[0].work_dir)
    where = shlex.quote(str(files.work_dir))
    lines = [f"started supervisord (pid {pid}) for {files.work_dir}"]
    lines += [f"  {r.name}: {workers} worker{'s' if workers > 1 else ''} "
              f"({', '.join(f'{r.name}_{i}' for i in range(workers))})" for r in recipes]
    lines += [f"  conf:   {files.conf}", f"  logs:   {files.log_dir}/",
              f"  check:  scrapekit supervise status --work-dir {where}",
              f"  stop:   scrapekit supervise stop --work-dir {where}"]
    click.echo("\n".join(lines))


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("args", nargs=-1, required=True, metavar="RECIPE... | status|stop|restart [RECIPE]")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="Workers per recipe when starting (default 1).")
@click.option("--startsecs", type=click.IntRange(min=0), default=None,
              help=f"Seconds a worker must stay up to count as started; one that dies sooner is retried with "
                   f"backoff {STARTRETRIES} times, then left FATAL (default {STARTSECS}).")
@click.option("--work-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="status, stop, restart: the work directory (default ./work).")
@click.option("--json", "as_json", is_flag=True, help="status: print a JSON list.")
def supervise(args: tuple[str, ...], workers: int | None, startsecs: int | None, work_dir: Path | None,
              as_json: bool) -> None:
    """Run the workers of recipes under supervisord (restarted when they die), or act on it.

    \b
    scrapekit supervise R1.yaml [R2.yaml ...] --workers N   start N workers of each recipe
    scrapekit supervise status [--json] [RECIPE | --work-dir DIR]
    scrapekit supervise stop [RECIPE | --work-dir DIR]      stop the workers, then supervisord
    scrapekit supervise restart [RECIPE | --work-dir DIR]   stop and start every worker

    The recipes share one work_dir and a beanstalk queue. supervisord keeps its conf, socket and
    pid file in the work directory and its logs (one per worker) in supervisor/ under it. For the
    actions the work directory is that of RECIPE, or --work-dir, or ./work. status exits 3 when a
    process is not RUNNING (a crash loop shows as BACKOFF, then FATAL), 1 when no supervisord runs.
    """
    from .cli import _fail  # cli imports this module at its end

    action = args[0] if args[0] in ACTIONS and not Path(args[0]).is_file() else None
    if action is not None and (workers, startsecs) != (None, None):
        raise click.UsageError("--workers and --startsecs are for starting: stop, then supervise again to change them")
    if action != "status" and as_json:
        raise click.UsageError("--json is for status")
    if action is None and work_dir is not None:
        raise click.UsageError("--work-dir is for status, stop and restart; the recipes name their work_dir")
    try:
        if action is None:
            _start(args, workers or 1, STARTSECS if startsecs is None else startsecs)
        else:
            _act(action, _target_dir(args[1:], work_dir), as_json)
    except ScrapekitError as exc:
        _fail(exc)
