"""Loads a YAML recipe (safe tags only, line numbers kept) and validates it once into a frozen
Recipe. A part's options are checked against its class's constructor signature, so built-in
parts and plugins are validated the same way; every error names file, line and key."""

from __future__ import annotations

import builtins
import dataclasses
import difflib
import inspect
import re
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import yaml

from .errors import PartError, RecipeError, RecipeErrors
from .registry import resolve
from .shards import Shard, worker_dir
from .statsd import parse_address
from .units import Bytes, Seconds, parse_duration, parse_size

INJECTED = frozenset({"state", "clock", "sleep", "out_dir", "name", "on_open", "work_dir", "concurrency", "window",
                      "allow_private", "shard"})
"""Constructor parameters the runner passes itself; a recipe cannot set them (but for
``concurrency``, a ``fetch`` key, ``window``, a ``source`` key, and ``allow_private``, a
``politeness`` key)."""

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")
_MAX_NODES = 100_000
_PLAIN_TAGS = frozenset({"2002:map", "2002:seq", "2002:str", "2002:int", "2002:float", "2002:bool", "2002:null"})
_POLITENESS_KEYS = ["robots", "robots_expiry", "delay", "max_delay", "per_domain", "breaker_failures",
                    "breaker_pause", "bandwidth", "allow_private"]
DEFAULT_BACKOFF: dict[str, float] = {
    "timeout": 2.0, "refused": 5.0, "broken_body": 2.0, "robots_unavailable": 3600.0,
    "400": 5.0, "403": 4.0, "429": 30.0, "503": 2.0, "5xx": 2.0,
}


# -- YAML with line numbers -------------------------------------------------------------------

class Node:
    """A YAML value with the line it starts on (1-based)."""

    __slots__ = ("value", "line")

    def __init__(self, value: Any, line: int) -> None:
        self.value = value
        self.line = line


def load_yaml(path: Path) -> Node:
    """Parse ``path`` with the safe loader into Nodes; RecipeError on syntax errors and traps."""
    name = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RecipeError(name, 0, "recipe", "file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise RecipeError(name, 0, "recipe", f"cannot read: {exc}") from None
    loader = yaml.SafeLoader(text)
    try:
        root = loader.get_single_node()
        if root is None:
            raise RecipeError(name, 1, "recipe", "the file is empty; a recipe needs at least a 'source'")
        return _convert(loader, root, name, "recipe", [0])
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else 0
        raise RecipeError(name, line, "yaml", f"{exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:
        raise RecipeError(name, 0, "yaml", str(exc).splitlines()[0]) from None
    finally:
        loader.dispose()


def _convert(loader: yaml.SafeLoader, node: yaml.Node, path: str, key: str, count: list[int]) -> Node:
    count[0] += 1
    if count[0] > _MAX_NODES:
        raise RecipeError(path, node.start_mark.line + 1, key, f"more than {_MAX_NODES} values (alias expansion?)")
    line = node.start_mark.line + 1
    if node.tag.removeprefix("tag:yaml.org,") not in _PLAIN_TAGS:
        raise RecipeError(path, line, key, f"yaml: tag {node.tag!r} is not allowed in a recipe")
    if isinstance(node, yaml.MappingNode):
        out: dict[str, Node] = {}
        for key_node, value_node in node.value:
            k = loader.construct_object(key_node)
            if isinstance(k, int) and not isinstance(k, bool):
                k = str(k)  # status codes as keys, e.g. backoff: {503: 2s}
            if not isinstance(k, str):
                raise RecipeError(path, key_node.start_mark.line + 1, key, f"keys must be names, got {k!r}")
            child = f"{key}.{k}" if key != "recipe" else k
            if k in out:
                raise RecipeError(path, key_node.start_mark.line + 1, child, "duplicate key (YAML would keep only the last)")
            out[k] = _convert(loader, value_node, path, child, count)
        return Node(out, line)
    if isinstance(node, yaml.SequenceNode):
        return Node([_convert(loader, item, path, f"{key}[{i}]", count) for i, item in enumerate(node.value)], line)
    value = loader.construct_object(node)
    if isinstance(node, yaml.ScalarNode) and node.style is None and isinstance(value, int):
        if re.fullmatch(r"[-+]?0[0-9_]+", node.value):
            raise RecipeError(path, line, key, f"{node.value} reads as octal in YAML; write it without the leading 0 or quote it")
    return Node(value, line)


def plain(node: Node) -> Any:
    """The Node tree as plain Python values."""
    if isinstance(node.value, dict):
        return {k: plain(v) for k, v in node.value.items()}
    if isinstance(node.value, list):
        return [plain(v) for v in node.value]
    return node.value


# -- the validated tree -----------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class PartSpec:
    """One part as the recipe names it: its kind, type name, class, converted options and line."""

    section: str
    kind: str
    type: str
    cls: builtins.type
    options: Mapping[str, Any]
    line: int


@dataclass(frozen=True, slots=True)
class Recipe:
    """A validated recipe. Build it only with ``load_recipe``."""

    path: Path
    name: str
    work_dir: Path
    source: PartSpec
    queue: PartSpec
    fetch: PartSpec
    parse: PartSpec | None
    stores: tuple[PartSpec, ...]
    follow: PartSpec | None = None
    paginate: PartSpec | None = None
    reschedule: PartSpec | None = None
    window: int = 10_000
    concurrency: int = 16
    retries: int = 3
    backoff: Mapping[str, float] = field(default_factory=lambda: types.MappingProxyType(dict(DEFAULT_BACKOFF)))
    max_requests: int = 0
    max_seconds: float = 0.0
    progress_every: int = 100
    progress_interval: float = 30.0
    stats_interval: float = 60.0
    statsd: tuple[str, int] | None = None
    robots: bool = False
    robots_expiry: float = 86_400.0
    polite: bool = False  # a politeness section: requests pass the per-domain gate
    delay: float = 0.0
    max_delay: float = 3600.0
    per_domain: int = 8
    breaker_failures: int = 10
    breaker_pause: float = 600.0
    bandwidth_daily: int = 0
    bandwidth_monthly: int = 0
    allow_private: bool = False
    part_errors: tuple[int, float] = (10, 60.0)
    worker: Shard | None = None  # set by ``for_worker``: this process is one worker of many

    @property
    def run_dir(self) -> Path:
        """Where this process keeps its state, logs and stats: work/<name>, or a worker's own
        directory under it."""
        if self.worker is not None:
            return worker_dir(self.home, self.worker.index)
        return self.home

    @property
    def home(self) -> Path:
        """work/<name>: the recipe's directory, whether it runs as one process or many workers."""
        return self.work_dir / self.name

    @property
    def out_dir(self) -> Path:
        """Output of every worker of the recipe (chunk names tell the workers apart)."""
        return self.home / "out"

    def for_worker(self, shard: Shard) -> Recipe:
        """This recipe as run by worker ``shard``; its queue must be on beanstalkd."""
        if self.queue.type != "beanstalk":
            raise RecipeError(str(self.path), self.queue.line, "queue",
                              f"workers share their queue on beanstalkd: set queue: {{type: beanstalk, url: ...}} "
                              f"(this recipe's queue is {self.queue.type})")
        return dataclasses.replace(self, worker=shard)


class _Checker:
    """Collects every error of one recipe, so ``check`` shows them all at once."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.errors: list[RecipeError] = []

    def error(self, line: int, key: str, message: str) -> None:
        self.errors.append(RecipeError(str(self.path), line, key, message))

    def keys(self, node: Node, key: str, known: list[str]) -> dict[str, Node]:
        """The mapping in ``node``, with every unknown key reported (with the nearest known)."""
        if not isinstance(node.value, dict):
            self.error(node.line, key, f"expected a mapping of {', '.join(known)}, got {_what(node.value)}")
            return {}
        for k, child in node.value.items():
            if k not in known:
                self.error(child.line, _join(key, k), f"unknown key{_nearest(k, known)}; known: {', '.join(known)}")
        return {k: v for k, v in node.value.items() if k in known}

    def convert(self, node: Node, key: str, hint: Any, base: Path) -> Any:
        try:
            return _convert_value(node, hint, base)
        except ValueError as exc:
            self.error(node.line, key, str(exc))
            return None


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def _nearest(word: str, known: list[str]) -> str:
    close = difflib.get_close_matches(word, known, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _what(value: Any) -> str:
    if value is None:
        return "nothing"
    return {bool: "true/false", dict: "a mapping", list: "a list", str: "a string"}.get(type(value), type(value).__name__)


# -- converting one value by its annotation ---------------------------------------------------

def _convert_value(node: Node, hint: Any, base: Path) -> Any:
    value = node.value
    origin = get_origin(hint)
    if hint is Any or hint is inspect.Parameter.empty:
        return plain(node)
    if origin in (Union, types.UnionType):
        options = [a for a in get_args(hint) if a is not type(None)]
        if value is None and len(options) < len(get_args(hint)):
            return None
        errors = []
        for option in options:
            try:
                return _convert_value(node, option, base)
            except ValueError as exc:
                errors.append(str(exc))
        raise ValueError(" or ".join(errors))
    if origin is Literal:
        choices = get_args(hint)
        if value not in choices:
            raise ValueError(f"expected one of {', '.join(map(str, choices))}, got {value!r}")
        return value
    converter = _SCALARS.get(hint)
    if converter is not None:
        return converter(value)
    if callable(getattr(hint, "from_recipe", None)):
        return hint.from_recipe(value)  # a part's own option type, e.g. BeanstalkUrl
    if hint is Path:
        return _input_path(value, base)
    if origin in (list, tuple) or hint in (list, tuple):
        if not isinstance(value, list):
            raise ValueError(f"expected a list, got {_what(value)}")
        (item_hint,) = get_args(hint)[:1] or (Any,)
        return [_convert_value(item, item_hint, base) for item in value]
    if origin in (dict, Mapping) or hint in (dict, Mapping) or origin is typing.Mapping:
        if not isinstance(value, dict):
            raise ValueError(f"expected a mapping, got {_what(value)}")
        args = get_args(hint)
        value_hint = args[1] if len(args) == 2 else Any
        return {k: _convert_value(v, value_hint, base) for k, v in value.items()}
    return plain(node)


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"expected a whole number, got {_what(value)} {value!r}")
    return value


def _float(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"expected a number, got {_what(value)} {value!r}")
    return float(value)


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"expected true or false, got {value!r}")
    return value


def _str(value: Any) -> str:
    if isinstance(value, bool):
        raise ValueError(f"expected a string, got {str(value).lower()} (YAML reads yes/no/on/off as true/false: quote it)")
    if isinstance(value, (int, float)):
        return str(value)
    if not isinstance(value, str):
        raise ValueError(f"expected a string, got {_what(value)}")
    return value


def _input_path(value: Any, base: Path) -> Path:
    path = (base / _str(value)).resolve()
    if not path.is_file():
        raise ValueError(f"file not found: {path}")
    return path


_SCALARS: dict[Any, Callable[[Any], Any]] = {
    Seconds: parse_duration,
    Bytes: parse_size,
    bool: _bool,
    int: _int,
    float: _float,
    str: _str,
}


# -- parts ------------------------------------------------------------------------------------

def options_of(cls: type) -> dict[str, inspect.Parameter]:
    """The recipe options of a part: its constructor's parameters, less the injected services."""
    params = inspect.signature(cls).parameters
    return {
        name: p for name, p in params.items()
        if name not in INJECTED and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    }


def _hints(cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(getattr(cls, "__init__"))
    except (NameError, TypeError):
        return {}


def _part(
    check: _Checker, node: Node | None, section: str, kind: str, default_type: str | None,
    base: Path, extra: dict[str, Any] | None = None,
) -> tuple[PartSpec | None, dict[str, Node]]:
    """Validate one part section; returns its spec and the section-level keys in ``extra``."""
    extra = extra or {}
    if node is None:
        if default_type is None:
            return None, {}
        node = Node({}, 0)
    if not isinstance(node.value, dict):
        check.error(node.line, section, f"expected a mapping with 'type' and its options, got {_what(node.value)}")
        return None, {}
    type_node = node.value.get("type")
    type_name = default_type if type_node is None else type_node.value
    line = node.line if type_node is None else type_node.line
    if not isinstance(type_name, str):
        check.error(line, _join(section, "type"), f"a {kind[:-1]} type is required")
        return None, {}
    try:
        cls = resolve(kind, type_name)
    except PartError as exc:
        check.error(line, _join(section, "type"), str(exc))
        return None, {}
    params = options_of(cls)
    hints = _hints(cls)
    known = ["type", *params, *(k for k in extra if k not in params)]
    given = check.keys(node, section, known)
    options: dict[str, Any] = {}
    section_keys: dict[str, Node] = {}
    for key, child in given.items():
        if key == "type":
            continue
        if key in extra:
            section_keys[key] = child
            if key not in params:
                continue
        options[key] = check.convert(child, _join(section, key), hints.get(key, Any), base)
    for key, param in params.items():
        if param.default is inspect.Parameter.empty and key not in given:
            check.error(node.line, _join(section, key), f"required option of {type_name} is missing")
    spec = PartSpec(section, kind, type_name, cls, types.MappingProxyType(options), line)
    return spec, section_keys


def load_recipe(path: str | Path) -> Recipe:
    """Read and validate a recipe; RecipeErrors lists every problem with file, line and key."""
    path = Path(path)
    root = load_yaml(path)
    check = _Checker(path)
    base = path.resolve().parent
    top = ["name", "work_dir", "source", "queue", "fetch", "parse", "follow", "paginate", "reschedule", "politeness",
           "store", "limits", "log"]
    given = check.keys(root, "", top)

    name = path.stem
    if "name" in given:
        name = check.convert(given["name"], "name", str, base) or name
    if not _NAME.fullmatch(name):
        check.error(given["name"].line if "name" in given else 1, "name",
                    f"{name!r} is not a usable name: letters, digits, '_', '.', '-' only")
    work_dir = Path("work").resolve()
    if "work_dir" in given:
        work_dir = (base / (check.convert(given["work_dir"], "work_dir", str, base) or "work")).resolve()

    if "source" not in given:
        check.error(1, "source", "required section is missing (e.g. source: {type: flat_file, path: urls.txt})")
    source, source_keys = _part(check, given.get("source"), "source", "sources", None, base, {"window": 10_000})
    queue, _ = _part(check, given.get("queue"), "queue", "queues", "leveldb", base)
    fetch_extra = {"concurrency": 16, "retries": 3, "backoff": None}
    fetch, fetch_keys = _part(check, given.get("fetch"), "fetch", "fetchers", "http", base, fetch_extra)
    parse, _ = _part(check, given.get("parse"), "parse", "parsers", None, base)
    follow, _ = _part(check, given.get("follow"), "follow", "strategies",
                      "follow_links" if "follow" in given else None, base)
    paginate, _ = _part(check, given.get("paginate"), "paginate", "paginators", None, base)
    reschedule, _ = _part(check, given.get("reschedule"), "reschedule", "reschedulers", None, base)

    stores: list[PartSpec] = []
    store_node = given.get("store")
    store_nodes = store_node.value if store_node is not None and isinstance(store_node.value, list) else [store_node]
    for i, node in enumerate(store_nodes):
        label = "store" if len(store_nodes) == 1 else f"store[{i}]"
        spec, _ = _part(check, node, label, "stores", "chunked_tsv", base)
        if spec is not None:
            stores.append(spec)

    settings: dict[str, Any] = {}
    if "window" in source_keys:
        settings["window"] = check.convert(source_keys["window"], "source.window", int, base)
    concurrency = fetch_keys.get("concurrency")
    if concurrency is not None:
        settings["concurrency"] = check.convert(concurrency, "fetch.concurrency", int, base)
        if isinstance(settings["concurrency"], int) and not 1 <= settings["concurrency"] <= 1024:
            check.error(concurrency.line, "fetch.concurrency", "expected a number from 1 to 1024")
    if "retries" in fetch_keys:
        settings["retries"] = check.convert(fetch_keys["retries"], "fetch.retries", int, base)
    if "backoff" in fetch_keys:
        settings["backoff"] = _backoff(check, fetch_keys["backoff"])
    if "limits" in given:
        limits = check.keys(given["limits"], "limits", ["max_requests", "max_seconds", "part_errors"])
        if "max_requests" in limits:
            settings["max_requests"] = check.convert(limits["max_requests"], "limits.max_requests", int, base)
        if "max_seconds" in limits:
            settings["max_seconds"] = check.convert(limits["max_seconds"], "limits.max_seconds", Seconds, base)
        if "part_errors" in limits:
            settings["part_errors"] = _rate(check, limits["part_errors"], "limits.part_errors")
    if "politeness" in given:
        settings.update(_politeness(check, given["politeness"], base))
    if "log" in given:
        logs = check.keys(given["log"], "log", ["progress_every", "progress_interval", "stats_interval", "statsd"])
        if "progress_every" in logs:
            settings["progress_every"] = check.convert(logs["progress_every"], "log.progress_every", int, base)
        if "progress_interval" in logs:
            settings["progress_interval"] = check.convert(logs["progress_interval"], "log.progress_interval", Seconds, base)
        if "stats_interval" in logs:
            settings["stats_interval"] = check.convert(logs["stats_interval"], "log.stats_interval", Seconds, base)
        if "statsd" in logs:
            try:
                settings["statsd"] = parse_address(logs["statsd"].value)
            except ValueError as exc:
                check.error(logs["statsd"].line, "log.statsd", str(exc))

    if check.errors:
        raise RecipeErrors(check.errors)
    assert source is not None and queue is not None and fetch is not None
    return Recipe(path=path, name=name, work_dir=work_dir, source=source, queue=queue, fetch=fetch,
                  parse=parse, stores=tuple(stores), follow=follow, paginate=paginate, reschedule=reschedule,
                  **settings)


def _politeness(check: _Checker, node: Node, base: Path) -> dict[str, Any]:
    polite = check.keys(node, "politeness", _POLITENESS_KEYS)
    # A politeness section obeys robots.txt and passes the per-domain gate unless it says otherwise.
    settings: dict[str, Any] = {"polite": True, "robots": True}
    for key, kind in (("robots", bool), ("robots_expiry", Seconds), ("delay", Seconds), ("max_delay", Seconds),
                      ("per_domain", int), ("breaker_failures", int), ("breaker_pause", Seconds),
                      ("allow_private", bool)):
        if key in polite:
            value = settings[key] = check.convert(polite[key], f"politeness.{key}", kind, base)
            if kind is int and isinstance(value, int) and value < 0:
                check.error(polite[key].line, f"politeness.{key}", "expected 0 (no limit) or more")
    if "bandwidth" in polite:
        limits = check.keys(polite["bandwidth"], "politeness.bandwidth", ["daily", "monthly"])
        for period in ("daily", "monthly"):
            if period in limits:
                settings[f"bandwidth_{period}"] = check.convert(limits[period], f"politeness.bandwidth.{period}", Bytes, base)
    return settings


def _rate(check: _Checker, node: Node, key: str) -> tuple[int, float]:
    """``10/1m``: at most 10 in any minute; ``0`` for no limit."""
    text = str(node.value).strip()
    count, _, per = text.partition("/")
    try:
        if text == "0":
            return (0, 0.0)
        if not count.isdigit() or int(count) < 1:
            raise ValueError
        return (int(count), parse_duration(per))
    except ValueError:
        check.error(node.line, key, f"expected a count per duration like 10/1m, or 0 for no limit, got {text!r}")
        return (0, 0.0)


def _backoff(check: _Checker, node: Node) -> Mapping[str, float]:
    table = dict(DEFAULT_BACKOFF)
    if not isinstance(node.value, dict):
        check.error(node.line, "fetch.backoff", "expected a mapping like {503: 2s, 5xx: 2s, timeout: 5s}")
        return types.MappingProxyType(table)
    for key, child in node.value.items():
        if not re.fullmatch(r"[1-5]\d\d|[1-5]xx|timeout|refused|broken_body|dns|robots_unavailable|proxy_error", str(key)):
            check.error(child.line, f"fetch.backoff.{key}", "expected an HTTP status (503), a class (5xx) or an error kind (timeout, refused, broken_body, dns, proxy_error)")
            continue
        try:
            table[str(key)] = parse_duration(child.value)
        except ValueError as exc:
            check.error(child.line, f"fetch.backoff.{key}", str(exc))
    return types.MappingProxyType(table)
