"""Resolves a part's name to its class: built-in name, then entry point ``scrapekit.<kind>``,
then a dotted ``pkg.mod:Class`` path. Built-ins are ``module:Class`` strings, imported on use."""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points

from .errors import PartError

KINDS = ("sources", "queues", "fetchers", "parsers", "strategies", "paginators", "reschedulers", "stores")

BUILTINS: dict[str, dict[str, str]] = {
    "sources": {
        "flat_file": "scrapekit.sources.flatfile:FlatFileSource",
        "generator": "scrapekit.sources.generator:GeneratorSource",
        "periodic": "scrapekit.sources.flatfile:PeriodicSource",
    },
    "queues": {
        "leveldb": "scrapekit.sources.leveldb:LevelDbQueue",
        "beanstalk": "scrapekit.sources.beanstalk:BeanstalkQueue",
    },
    "fetchers": {
        "http": "scrapekit.fetchers:HttpFetcher",
        "head": "scrapekit.fetchers:HeadFetcher",
    },
    "parsers": {
        "html": "scrapekit.parsers:HtmlParser",
        "raw": "scrapekit.parsers:RawParser",
        "focus": "scrapekit.focus:FocusParser",
        "json": "scrapekit.jsonparser:JsonParser",
        "feed": "scrapekit.feedparse:FeedParser",
    },
    "strategies": {
        "follow_links": "scrapekit.crawl:FollowLinks",
    },
    "paginators": {
        "page": "scrapekit.paginate:PagePaginator",
        "max_id": "scrapekit.paginate:MaxIdPaginator",
        "next_link": "scrapekit.paginate:NextLinkPaginator",
        "cursor": "scrapekit.paginate:CursorPaginator",
    },
    "reschedulers": {
        "rate": "scrapekit.reschedule:RateRescheduler",
        "every": "scrapekit.reschedule:EveryRescheduler",
    },
    "stores": {
        "chunked_tsv": "scrapekit.stores.chunked:ChunkedTsvStore",
        "jsonl": "scrapekit.stores.chunked:JsonlStore",
        "leveldb": "scrapekit.stores.keyvalue:LevelDbStore",
    },
}


class UnknownPart(PartError):
    """No part of this kind has that name; ``known`` lists the names that exist."""

    def __init__(self, kind: str, name: str, known: list[str], detail: str = "") -> None:
        self.known = known
        listing = ", ".join(known) if known else "none"
        extra = f" ({detail})" if detail else ""
        super().__init__(f"unknown {kind[:-1]} {name!r}{extra}; known: {listing}, or a dotted path pkg.module:Class")


def _plugins(kind: str) -> dict[str, str]:
    return {ep.name: ep.value for ep in entry_points(group=f"scrapekit.{kind}")}


def known_names(kind: str) -> list[str]:
    """Every short name usable for ``kind``: built-ins first, then installed plugins."""
    names = list(BUILTINS[kind])
    names += sorted(name for name in _plugins(kind) if name not in BUILTINS[kind])
    return names


def _load(target: str) -> type:
    module_name, _, attr = target.partition(":")
    module = importlib.import_module(module_name)
    obj = module
    for part in attr.split("."):
        obj = getattr(obj, part)
    if not isinstance(obj, type):
        raise TypeError(f"{target} is not a class")
    return obj


def resolve(kind: str, name: str) -> type:
    """The class for ``name`` of ``kind``; UnknownPart (listing known names) when there is none."""
    target = BUILTINS[kind].get(name) or _plugins(kind).get(name)
    if target is None and ":" in name:
        target = name
    if target is None:
        raise UnknownPart(kind, name, known_names(kind))
    try:
        return _load(target)
    except (ImportError, AttributeError, TypeError, ValueError) as exc:
        raise UnknownPart(kind, name, known_names(kind), f"cannot load {target}: {exc}") from None
