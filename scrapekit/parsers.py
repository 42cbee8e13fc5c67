"""Parsers turn a response into items and links: ``html`` (items by XPath or CSS fields) and
``raw`` (one item describing the response)."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any, Protocol

import lxml.html
from lxml import etree

from .model import Item, Request, Response

Parsed = tuple[list[Item], list[Request]]


class Parser(Protocol):
    """``parse(response)`` gives the items and the links found in one successful response.

    The runner calls it from fetch threads, only for responses without an error. An
    unparseable page gives no items; an exception is a bug in the parser and buries the job.
    """

    def parse(self, response: Response) -> Parsed: ...


def compile_expression(expression: str, where: str) -> etree.XPath:
    """An XPath, or a CSS selector when ``expression`` starts with ``css:``; ValueError naming
    ``where`` and the expression when it does not compile."""
    try:
        if expression.startswith("css:"):
            from lxml.cssselect import CSSSelector

            return CSSSelector(expression[4:].strip())
        return etree.XPath(expression)
    except (etree.XPathError, ImportError, ValueError, SyntaxError) as exc:
        raise ValueError(f"{where}: bad {'CSS' if expression.startswith('css:') else 'XPath'} {expression!r}: {exc}") from None


def _charset(headers: Mapping[str, str]) -> str | None:
    for part in headers.get("content-type", "").split(";")[1:]:
        name, _, value = part.strip().partition("=")
        if name.lower() == "charset" and value:
            return value.strip("\"' ")
    return None


_last = threading.local()  # the parser and the link follower of one thread share one parse


def html_root(response: Response) -> etree._Element | None:
    """The parsed document, trusting the charset header only when the body decodes with it;
    otherwise lxml reads the page's own meta charset. None for an empty or unparseable body.
    The last document parsed in this thread is reused for the same Response object."""
    if getattr(_last, "response", None) is response:
        root: etree._Element | None = _last.root
        return root
    root = _parse_html(response)
    _last.response, _last.root = response, root
    return root


def _parse_html(response: Response) -> etree._Element | None:
    body = response.body
    if not body.strip():
        return None
    charset = _charset(response.headers)
    text: str | None = None
    if charset:
        try:
            text = body.decode(charset)
        except (LookupError, UnicodeDecodeError):
            text = None
    parser = getattr(_last, "parser", None)
    if parser is None:  # one per thread: lxml parsers are not to be shared between threads
        parser = _last.parser = lxml.html.HTMLParser(no_network=True, huge_tree=False)
    try:
        if text is not None:
            return lxml.html.document_fromstring(text, parser=parser)
        return lxml.html.document_fromstring(body, parser=parser)
    except (etree.ParserError, ValueError):
        return None


def _first(result: Any) -> Any:
    if isinstance(result, list):
        if not result:
            return None
        result = result[0]
    if isinstance(result, etree._Element):
        return "".join(str(text) for text in result.itertext()).strip()
    if isinstance(result, str):
        return result.strip()
    return result


class HtmlParser:
    """Items from HTML: ``items: {each: XPATH, fields: {name: XPATH}}``.

    ``each`` selects one element per item; each field is evaluated relative to it and gives
    its first match as stripped text (None when nothing matches). Prefix an expression with
    ``css:`` to use a CSS selector instead of XPath.
    """

    def __init__(self, items: dict[str, Any] | None = None) -> None:
        spec = items or {}
        unknown = set(spec) - {"each", "fields"}
        if unknown:
            raise ValueError(f"items: unknown key {sorted(unknown)[0]!r}; known: each, fields")
        self._each = compile_expression(str(spec.get("each", "/html")), "items.each")
        fields = spec.get("fields") or {}
        if not isinstance(fields, dict):
            raise ValueError("items.fields: expected a mapping of name: expression")
        self._fields = {name: compile_expression(str(expr), f"items.fields.{name}") for name, expr in fields.items()}

    def parse(self, response: Response) -> Parsed:
        root = html_root(response)
        if root is None or not self._fields:
            return [], []
        request = response.request
        items = []
        selected = self._each(root)
        for element in selected if isinstance(selected, list) else []:
            if not isinstance(element, etree._Element):
                continue
            fields = {name: _first(xpath(element)) for name, xpath in self._fields.items()}
            items.append(Item(fields, request.url, request.key, response.fetched_at))
        return items, []


class RawParser:
    """One item per response: status, content type, length and final URL."""

    def parse(self, response: Response) -> Parsed:
        fields = {
            "status": response.status,
            "content_type": response.headers.get("content-type", ""),
            "length": len(response.body),
            "final_url": response.final_url,
        }
        request = response.request
        return [Item(fields, request.url, request.key, response.fetched_at)], []
