"""The bundled local site: a bookshop for the demo recipe, plus the hostile routes the tests need
(slow, huge, gzip bomb, redirect loop, error statuses with Retry-After, wrong charset).
Loopback only; ``python -m scrapekit.demo.site --port 8765`` serves it until stopped."""

from __future__ import annotations

import argparse
import json
import signal
import struct
import sys
import threading
import time
import zlib
from collections import Counter
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from ipaddress import ip_address
from types import FrameType
from typing import Any
from urllib.parse import parse_qs, urlsplit

CATALOGUE_PAGES = 50
BOOKS_PER_PAGE = 20
BOOKS = CATALOGUE_PAGES * BOOKS_PER_PAGE
_WORDS = ("river stone cloud engine harbor paper signal orbit garden silver copper window forest "
          "valley summit bridge quiet rapid golden hidden").split()
_NAMES = ("Ada Byron", "Alan Turing", "Grace Hopper", "Edsger Dijkstra", "Barbara Liskov", "Donald Knuth")
_BOMB_SIZE = 1 << 30
_bomb: bytes | None = None
_bomb_lock = threading.Lock()

Route = Callable[["_Handler", list[str], dict[str, list[str]]], tuple[int, dict[str, str], bytes]]


def gzip_bomb() -> bytes:
    """1 GiB of zeros, gzipped (about 1 MB), built once without holding the 1 GiB: one deflate
    segment of 1 MiB of zeros, ended by a full flush so it can be repeated as is."""
    global _bomb
    with _bomb_lock:
        if _bomb is None:
            zeros = bytes(1 << 20)
            packer = zlib.compressobj(9, zlib.DEFLATED, -15)
            segment = packer.compress(zeros) + packer.flush(zlib.Z_FULL_FLUSH)
            crc = 0
            for _ in range(_BOMB_SIZE >> 20):
                crc = zlib.crc32(zeros, crc)
            header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"
            trailer = b"\x03\x00" + struct.pack("<II", crc, _BOMB_SIZE & 0xFFFFFFFF)
            _bomb = header + segment * (_BOMB_SIZE >> 20) + trailer
        return _bomb


def _title(book: int) -> str:
    return f"The {_WORDS[book % len(_WORDS)].title()} of {_WORDS[(book * 7) % len(_WORDS)].title()} {book}"


def _price(book: int) -> str:
    return f"£{(book * 37) % 5000 / 100 + 5:.2f}"


def _page(title: str, body: str) -> bytes:
    return (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{title}</title></head>"
            f"<body><h1>{title}</h1>\n{body}\n</body></html>\n").encode()


def _html(body: bytes, status: int = 200) -> tuple[int, dict[str, str], bytes]:
    return status, {"Content-Type": "text/html; charset=utf-8"}, body


def _not_found() -> tuple[int, dict[str, str], bytes]:
    return _html(_page("Not found", "<p>No such page.</p>"), 404)


def _int(text: str) -> int | None:
    return int(text) if text.isdigit() else None


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: the site counts hits instead of logging each request."""

    def do_GET(self) -> None:
        self._serve(head=False)

    def do_HEAD(self) -> None:
        self._serve(head=True)

    def _serve(self, head: bool) -> None:
        parts = urlsplit(self.path)
        self.server.site.record(self.command, self.path, parts.path, dict(self.headers.items()), self.client_address[1])
        segments = [s for s in parts.path.split("/") if s]
        route = ROUTES.get(segments[0] if segments else "")
        query = parse_qs(parts.query)
        status, headers, body = route(self, segments, query) if route else _not_found()
        if status == -1:
            return  # the route wrote its own response
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            try:
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True

    # -- routes ------------------------------------------------------------------------------

    def index(self, segments: list[str], query: dict[str, list[str]]) -> tuple[int, dict[str, str], bytes]:
        links = "".join(f'<li><a href="/catalogue/page-{n}.html">Page {n}</a></li>' for n in range(1, CATALOGUE_PAGES + 1))
        return _html(_page("Bookshop", f"<ul>{links}</ul>"))

    def catalogue(self, segments: list[str], query: dict[str, list[str]]) -> tuple[int, dict[str, str], bytes]:
        name = segments[1] if len(segments) == 2 else ""
        n = _int(name.removeprefix("page-").removesuffix(".html")) if name.startswith("page-") else None
        if n is None or not 1 <= n <= CATALOGUE_PAGES:
            return _not_found()
        books = []
        for i in range(1, BOOKS_PER_PAGE + 1):
            book = (n - 1) * BOOKS_PER_PAGE + i
            books.append(f'<article class="book"><h2><a href="/book/{book}.html">{_title(book)}</a></h2>'
                         f'<p class="price">{_price(book)}</p><p class="author">{_NAMES[book % len(_NAMES)]}</p></article>')
        if n < CATALOGUE_PAGES:
            books.append(f'<a class="next" href="/catalogue/page-{n + 1}.html">next</a>')
        return _html(_page(f"Catalogue page {n}", "\n".join(books)))

    def book(self, segments: list[str], query: dict[str, list[str]]) -> tuple[int, dict[str, str], bytes]:
        book = _int(segments[1].removesuffix(".html")) if len(segments) == 2 else None
        if book is None or not 1 <= book <= BOOKS:
            return _not_found()
        page = (book - 1) // BOOKS_PER_PAGE + 1
        body = (f'<p class="price">{_price(book)}</p><p class="author">{_NAMES[book % len(_NAMES)]}</p>'
                f'<p class="description">{" ".join(_WORDS[(book + i) % len(_WORDS)] for i in range(60))}</p>'
                f'<a href="/catalogue/page-{page}.html">back</a>')
        return _html(_page(_title(book), body))

    def robots(self, segments: list[str], query: dict[str, list[str]]) -> tuple[int, dict[str, str], bytes]:
        return 200, {"Content-Type": "text/plain"}, b"User-agent: *\nDisallow:\n"

    def numbered(self, segments: list[str], query: dict[str, list[str]]) -> tuple[int, dict[str, str], bytes]:
        n = _int(segments[1]) if len(segments) == 2 else None
        if n is None:
            return _not_found()
        links = "".join(f'<a href="/page/{(n * 31 + i * 17) % 100_000}">link {i}</a> ' for i in range(5))
        text = " ".join(_WORDS[(n + i) % len(_WORDS)] for i in range(250))
        return _html(_page(f"Page {n}", f"<p>{text}</p><p>{links}</p>"))

    def slow(self, segments: list[str], query: dict[str, list[str]]) -> tuple[int, dict[str, str], bytes]:
        time.sleep(float(query.get("seconds", ["1"])[0]))
        return _html(_page("Slow", "<p>finally</p>"))

    def huge(self, segments: list[str], query: dict[str, list[str]]) -> tuple[int, dict[str, str], bytes]:
        size = int(query.get("bytes", [str(50_000_000)])[0])
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(size))
        self.end_headers()
        if self.command == "HEAD":
            return -1, {}, b""
        block = b"x" * 65536
        try:
            while size > 0:
                self.wfile.write(block[:size])
                size -= len(block)
        except (BrokenPipeError, ConnectionResetError):
            pass
        self.close_connection = True
        return -1, {}, b""

    def bomb(self, segments: list[str], query: dict[str, list[str]]) -> tuple[int, dict[str, str], bytes]:
        return 200, {"Content-Type": "text/html", "Content-Encoding": "gzip"}, gzip_bomb()

    def redirect_loop(self, segments: list[str], query: dict[str, list[str]]) -> tuple[int, dict[str, str], bytes]:
        n = _int(segments[1]) if len(segments) == 2 else 0
        return 302, {"Location": f"/redirect-loop/{(n or 0) + 1}"}, b""

    def redirect(self, segments: list[str], query: dict[str, list[str]]) -> tuple[int, dict[str, str], bytes]:
        return 302, {"Location": query.get("to", ["/"])[0]}, b""

    def head_redirect(self, segments: list[str], query: dict[str, list[str]]) -> tuple[int, dict[str, str], bytes]:
        return 301, {"Location": "/page/1"}, b""

    def status(self, segments: list[str], query: dict[str, list[str]]) -> tuple[int, dict[str, str], bytes]:
        code = _int(segments[1]) if len(segments) == 2 else None
        if code is None or not 200 <= code <= 599:
            return _not_found()
        headers = {"Content-Type": "text/plain"}
        if "retry_after" in query:
            headers["Retry-After"] = query["retry_after"][0]
        return code, headers, f"status {code}\n".encode()

    def bad_encoding(self, segments: list[str], query: dict[str, list[str]]) -> tuple[int, dict[str, str], bytes]:
        body = ('<html><head><meta charset="iso-8859-1"><title>caf\xe9</title></head>'
                '<body><p>caf\xe9 cr\xe8me br\xfbl\xe9e</p></body></html>').encode("latin-1")
        return 200, {"Content-Type": "text/html; charset=utf-8"}, body

    def echo_headers(self, segments: list[str], query: dict[str, list[str]]) -> tuple[int, dict[str, str], bytes]:
        return 200, {"Content-Type": "application/json"}, json.dumps(dict(self.headers.items())).encode()

    def hits(self, segments: list[str], query: dict[str, list[str]]) -> tuple[int, dict[str, str], bytes]:
        return 200, {"Content-Type": "application/json"}, json.dumps(self.server.site.hits_snapshot()).encode()


ROUTES: dict[str, Route] = {
    "": _Handler.index,
    "catalogue": _Handler.catalogue,
    "book": _Handler.book,
    "robots.txt": _Handler.robots,
    "page": _Handler.numbered,
    "slow": _Handler.slow,
    "huge": _Handler.huge,
    "gzip-bomb": _Handler.bomb,
    "redirect-loop": _Handler.redirect_loop,
    "redirect": _Handler.redirect,
    "head-redirect": _Handler.head_redirect,
    "status": _Handler.status,
    "bad-encoding": _Handler.bad_encoding,
    "echo-headers": _Handler.echo_headers,
    "__hits": _Handler.hits,
}


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    site: DemoSite

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Quiet about clients that hang up (a capped fetch does it on purpose)."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class DemoSite:
    """The site on ``host:port`` (0 = a free port) in a background thread; a context manager."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        if not ip_address(host).is_loopback:
            raise ValueError(f"the demo site serves loopback only, not {host}")
        self.host = host
        self.hits: Counter[str] = Counter()
        self.requests_log: list[tuple[str, str, dict[str, str], int]] = []
        """(method, path with query, headers, client port) of every request, in order."""
        self._lock = threading.Lock()
        self._server = _Server((host, port), _Handler)
        self._server.site = self
        self.port = self._server.server_address[1]
        self.url = f"http://{host}:{self.port}"
        self._thread: threading.Thread | None = None

    def record(self, method: str, path_with_query: str, path: str, headers: dict[str, str], port: int) -> None:
        with self._lock:
            self.hits[path] += 1
            self.requests_log.append((method, path_with_query, headers, port))

    def hits_snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self.hits)

    def start(self) -> DemoSite:
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), name="demo-site",
                                        daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> DemoSite:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Serve the scrapekit demo site on loopback.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    args = parser.parse_args(argv)
    site = DemoSite(args.host, args.port).start()
    print(f"demo site at {site.url}", flush=True)
    stop = threading.Event()

    def handler(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    stop.wait()
    site.close()


if __name__ == "__main__":
    main()
