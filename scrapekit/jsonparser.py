"""The ``json`` parser: items and links out of JSON documents by JSON path, and the two helpers
strategies share with it, ``decode_json`` (a response's document) and ``json_values`` (a compiled
path)."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Mapping
from typing import Any

from jsonpath_ng.exceptions import JSONPathError
from jsonpath_ng.ext.parser import parse as _parse_path

from .model import BadUrl, Item, Request, Response, canonical_url, loggable
from .parsers import Parsed

log = logging.getLogger(__name__)

JsonValues = Callable[[Any], list[Any]]
"""A compiled JSON path: decoded document -> the values it selects, in document order."""

_EVALUATION_ERRORS = (TypeError, ValueError, KeyError, IndexError, AttributeError, RecursionError, re.error)
"""What jsonpath-ng's extensions raise on documents they do not fit: sorting or comparing mixed
types, ``sub()`` on a number, a filter's bad regular expression, very deep ``..`` descents."""


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def decode_json(response: Response) -> Any | None:
    """The JSON document of ``response``'s body; None when the body is empty, not UTF-8 (a BOM
    is allowed), not JSON (truncated bodies included), nested too deeply to decode, or holds
    NaN or Infinity, which JSON lines could not store. A document that is only ``null`` gives
    None as well. Never raises."""
    try:
        return json.loads(response.body.decode("utf-8-sig"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError, RecursionError):  # ValueError covers JSONDecodeError
        return None


def json_values(path: str, where: str = "path") -> JsonValues:
    """``path`` compiled once into a function giving the values it selects in a decoded document
    (``[]`` when nothing matches or the document does not fit the path; it never raises).

    Paths use jsonpath-ng's extended syntax: ``$.items[*].id``, ``$..url``, filters
    ``$.items[?(@.score > 3)]``, ``[/id]`` sorting, ``len``. ``$`` is the document the function
    is given, so a path for a field is evaluated on the item it belongs to. Raises ValueError
    naming ``where`` (a recipe key, e.g. ``items.each``) for a path that does not compile.
    """
    try:
        compiled = _parse_path(path)
    except (JSONPathError, re.error, RecursionError) as exc:
        raise ValueError(f"{where}: bad JSON path {path!r}: {exc}") from None

    def values(document: Any) -> list[Any]:
        try:
            return [match.value for match in compiled.find(document)]
        except _EVALUATION_ERRORS:
            return []

    return values


def _compiled(value: Any, where: str) -> JsonValues:
    if not isinstance(value, str):
        raise ValueError(f"{where}: expected a JSON path string, got {value!r}")
    return json_values(value, where)


def _item_id(fields: Mapping[str, Any]) -> str | None:
    """The item's ``id`` field as key text, when it is a string or a whole number."""
    value = fields.get("id")
    if isinstance(value, bool) or not isinstance(value, (str, int)) or value == "":
        return None
    return str(value)


class JsonParser:
    """Items and links from a JSON body: ``items: {each: PATH, fields: {name: PATH}}``, ``links: PATH``.

    ``each`` selects the item values (default ``$``: the whole document is one item; without an
    ``items`` option too). Without ``fields`` a selected object is the item whole (any other
    value becomes ``{"value": v}``); with ``fields`` each field is a path evaluated relative to
    the selected value, giving its first match or None. An item's key is
    ``<request key>#<id>`` when it has a string or whole-number ``id`` field, else
    ``<request key>#<index>`` (its position among the selected values). ``links`` selects URLs
    to follow: strings only, resolved against the response's final URL, canonical, each once,
    as page requests one level deeper than the response's.

    Paths are compiled when the parser is built; a bad one raises ValueError naming its option.
    A body that is empty, not UTF-8 or not JSON gives no items and no links (logged at info).
    """

    def __init__(self, items: dict[str, Any] | None = None, links: str | None = None) -> None:
        spec = items or {}
        unknown = set(spec) - {"each", "fields"}
        if unknown:
            raise ValueError(f"items: unknown key {sorted(unknown)[0]!r}; known: each, fields")
        self._each = _compiled(spec.get("each", "$"), "items.each")
        fields = spec.get("fields")
        if fields is not None and not isinstance(fields, dict):
            raise ValueError("items.fields: expected a mapping of name: JSON path")
        self._fields = {str(name): _compiled(path, f"items.fields.{name}") for name, path in (fields or {}).items()}
        self._links = None if links is None else json_values(links, "links")

    def parse(self, response: Response) -> Parsed:
        """The items (in document order) and links of one response; never raises for its body."""
        document = decode_json(response)
        if document is None:
            log.info("no JSON document in %s (%d bytes%s)", loggable(response.final_url), len(response.body),
                     ", truncated" if response.truncated else "")
            return [], []
        return self._items(response, document), self._follow(response, document)

    def _items(self, response: Response, document: Any) -> list[Item]:
        request = response.request
        items = []
        for index, value in enumerate(self._each(document)):
            if self._fields:
                fields = {name: _first(path, value) for name, path in self._fields.items()}
            else:
                fields = value if isinstance(value, dict) else {"value": value}
            key = f"{request.key}#{_item_id(fields) or index}"
            items.append(Item(fields, request.url, key, response.fetched_at))
        return items

    def _follow(self, response: Response, document: Any) -> list[Request]:
        if self._links is None:
            return []
        parent = response.request
        found: dict[str, None] = {}
        for value in self._links(document):
            if isinstance(value, str):
                try:
                    found.setdefault(canonical_url(value, response.final_url))
                except BadUrl:
                    continue
        meta = {"parent": parent.key}
        return [Request(url, key=url, kind="page", depth=parent.depth + 1, meta=meta) for url in found]


def _first(path: JsonValues, value: Any) -> Any:
    matches = path(value)
    return matches[0] if matches else None
