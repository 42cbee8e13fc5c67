"""A small, real proxy server on 127.0.0.1 for the tests: an HTTP forward proxy (absolute-URI
requests and CONNECT tunnels) or a SOCKS5 server (RFC 1928, CONNECT only, with the RFC 1929
username/password method when credentials are set). Standard library only, one thread per client.

    with ProxyServer(kind="socks5", credentials=("user", "secret")) as proxy:
        requests.get(url, proxies={"http": proxy.url, "https": proxy.url})
        assert proxy.count == 1
"""

from __future__ import annotations

import base64
import hmac
import ipaddress
import select
import socket
import struct
import threading
from http import HTTPStatus
from typing import Literal
from urllib.parse import quote, urlsplit

_HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-connection", "proxy-authorization",
                         "proxy-authenticate", "te", "trailer", "upgrade"})
_SOCKS_OK, _SOCKS_FAILURE, _SOCKS_REFUSED, _SOCKS_BAD_COMMAND, _SOCKS_BAD_ADDRESS = 0, 1, 5, 7, 8


class _Conn:
    """A socket with a receive buffer, so a request head can be read without losing what follows it."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.port: int = sock.getpeername()[1]
        self.buffer = bytearray()

    def read_some(self, limit: int = 65536) -> bytes:
        """Up to ``limit`` bytes (buffered ones first); b"" at end of stream."""
        if not self.buffer:
            return self.sock.recv(limit)
        data = bytes(self.buffer[:limit])
        del self.buffer[:limit]
        return data

    def read_exact(self, size: int) -> bytes:
        """Exactly ``size`` bytes; ConnectionError if the peer hangs up first."""
        while len(self.buffer) < size:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("peer closed mid-message")
            self.buffer += data
        return self.read_some(size)

    def read_head(self) -> bytes | None:
        """An HTTP head up to (not including) the blank line; None if the peer closes before a byte."""
        while (end := self.buffer.find(b"\r\n\r\n")) < 0:
            if len(self.buffer) > 65536:
                raise ValueError("head too long")
            data = self.sock.recv(65536)
            if not data:
                if self.buffer:
                    raise ConnectionError("peer closed mid-head")
                return None
            self.buffer += data
        head = bytes(self.buffer[:end])
        del self.buffer[:end + 4]
        return head

    def copy_to(self, out: socket.socket, size: int | None) -> None:
        """Send ``size`` bytes (or everything up to end of stream when None) to ``out``."""
        while size is None or size > 0:
            data = self.read_some(65536 if size is None else min(size, 65536))
            if not data and size is None:
                return
            if not data:
                raise ConnectionError("peer closed mid-body")
            out.sendall(data)
            size = None if size is None else size - len(data)


def _parse_head(head: bytes) -> tuple[list[str], list[tuple[str, str]]]:
    """(first line split in three, [(name, value), ...]); ValueError if malformed."""
    first, *lines = head.decode("latin-1").split("\r\n")
    parts = first.split(" ", 2)
    if len(parts) != 3:
        raise ValueError(f"bad first line {first!r}")
    headers = []
    for line in lines:
        name, colon, value = line.partition(":")
        if not colon or not name.strip():
            raise ValueError(f"bad header line {line!r}")
        headers.append((name.strip(), value.strip()))
    return parts, headers


def _header(headers: list[tuple[str, str]], name: str) -> str | None:
    return next((value for key, value in headers if key.lower() == name), None)


class ProxyServer:
    """A proxy on 127.0.0.1 at a free port (bound on construction), served from background threads.

    ``kind`` is "http" or "socks5". With ``credentials=(user, password)`` the HTTP proxy answers 407
    unless ``Proxy-Authorization: Basic ...`` matches, and the SOCKS5 server offers only the RFC 1929
    method. ``fail_with`` (a status such as 503 or 429; may be set while running) makes the HTTP
    proxy answer every request with that status (plus ``Retry-After: 1`` for 429 and 503) without
    contacting the origin, and makes the SOCKS5 server refuse every CONNECT with reply 0x01
    (general failure). ``requests`` lists ``(client port, target)`` of every request that passed
    authentication, refused by ``fail_with`` or not: target is "host:port" for CONNECT and SOCKS5,
    the absolute URL for forwarded HTTP requests. Only ``http://`` URLs are forwarded; request
    bodies need a Content-Length.
    """

    def __init__(self, kind: Literal["http", "socks5"] = "http",
                 credentials: tuple[str, str] | None = None, fail_with: int | None = None) -> None:
        if kind not in ("http", "socks5"):
            raise ValueError(f"kind must be 'http' or 'socks5', not {kind!r}")
        self.kind = kind
        self.credentials = credentials
        self.fail_with = fail_with  # one attribute read per request: safe to set from another thread
        self.requests: list[tuple[int, str]] = []
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        self._closed = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.05)  # the accept loop polls _closed this often
        self.port: int = self._listener.getsockname()[1]
        auth = "" if credentials is None else f"{quote(credentials[0], safe='')}:{quote(credentials[1], safe='')}@"
        self.url = f"{'http' if kind == 'http' else 'socks5h'}://{auth}127.0.0.1:{self.port}"
        self._accepter = threading.Thread(target=self._accept_loop, name=f"proxy-{self.port}", daemon=True)

    @property
    def count(self) -> int:
        """How many requests have been recorded in ``requests``."""
        with self._lock:
            return len(self.requests)

    def start(self) -> ProxyServer:
        self._accepter.start()
        return self

    def close(self) -> None:
        """Stop accepting, hang up on every client and origin connection, join the threads; idempotent."""
        if self._closed.is_set():
            return
        self._closed.set()
        if self._accepter.is_alive():
            self._accepter.join()
        self._listener.close()
        with self._lock:
            sockets, threads = list(self._sockets), list(self._threads)
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # the peer already hung up
        for thread in threads:
            thread.join(timeout=5)

    def __enter__(self) -> ProxyServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- plumbing ------------------------------------------------------------------------------

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            thread = threading.Thread(target=self._handle, args=(client,), daemon=True)
            with self._lock:
                self._threads = [t for t in self._threads if t.is_alive()] + [thread]
            thread.start()

    def _handle(self, client: socket.socket) -> None:
        """Serve one client; a client that hangs up or talks nonsense only ends its own connection."""
        try:
            with client:
                self._track(client)
                client.settimeout(30)
                conn = _Conn(client)
                if self.kind == "http":
                    self._serve_http(conn)
                else:
                    self._serve_socks(conn)
        except (OSError, ValueError, UnicodeError):
            pass
        finally:
            with self._lock:
                self._sockets.discard(client)

    def _track(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.add(sock)
        if self._closed.is_set():  # close() may have taken its list before this socket was added
            sock.shutdown(socket.SHUT_RDWR)

    def _connect(self, host: str, port: int) -> socket.socket:
        upstream = socket.create_connection((host, port), timeout=10)
        self._track(upstream)
        return upstream

    def _record(self, client: _Conn, target: str) -> None:
        with self._lock:
            self.requests.append((client.port, target))

    def _relay(self, client: _Conn, upstream: socket.socket) -> None:
        """Copy bytes both ways until both sides have finished sending (or close() hangs up)."""
        if client.buffer:
            upstream.sendall(client.read_some(len(client.buffer)))
        peers = {client.sock: upstream, upstream: client.sock}
        while peers:
            readable, _, _ = select.select(list(peers), [], [], 1.0)
            for source in readable:
                data = source.recv(65536)
                if data:
                    peers[source].sendall(data)
                else:
                    peers.pop(source).shutdown(socket.SHUT_WR)

    # -- HTTP ------------------------------------------------------------------------------------

    def _serve_http(self, conn: _Conn) -> None:
        while (head := conn.read_head()) is not None:
            try:
                (method, target, version), headers = _parse_head(head)
                body = conn.read_exact(int(_header(headers, "content-length") or 0))
            except ValueError:
                return self._answer(conn, 400, b"bad request\n", close=True)
            if not self._http_authorized(headers):
                return self._answer(conn, 407, b"proxy authentication required\n", close=True,
                                    extra=[("Proxy-Authenticate", 'Basic realm="proxy"')])
            self._record(conn, target)
            tokens = f"{_header(headers, 'connection')},{_header(headers, 'proxy-connection')}".lower()
            keep_alive = version == "HTTP/1.1" and "close" not in tokens and method != "CONNECT"
            if (failing := self.fail_with) is not None:
                retry = [("Retry-After", "1")] if failing in (429, 503) else []
                self._answer(conn, failing, f"proxy failing with {failing}\n".encode(), not keep_alive, retry)
            elif method == "CONNECT":
                return self._tunnel(conn, target)
            else:
                keep_alive = self._forward(conn, method, target, headers, body, keep_alive)
            if not keep_alive:
                return

    def _http_authorized(self, headers: list[tuple[str, str]]) -> bool:
        if self.credentials is None:
            return True
        expected = "Basic " + base64.b64encode(":".join(self.credentials).encode()).decode()
        return hmac.compare_digest((_header(headers, "proxy-authorization") or "").encode(), expected.encode())

    def _answer(self, conn: _Conn, status: int, body: bytes, close: bool,
                extra: list[tuple[str, str]] | None = None) -> None:
        headers = [*(extra or []), ("Content-Type", "text/plain"), ("Content-Length", str(len(body))),
                   ("Connection", "close" if close else "keep-alive")]
        reason = next((known.phrase for known in HTTPStatus if known == status), "Error")
        lines = [f"HTTP/1.1 {status} {reason}", *(f"{k}: {v}" for k, v in headers)]
        conn.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)

    def _tunnel(self, conn: _Conn, target: str) -> None:
        host, _, port = target.rpartition(":")
        try:
            upstream = self._connect(host.strip("[]"), int(port))
        except (OSError, ValueError):
            return self._answer(conn, 502, b"cannot reach the target\n", close=True)
        with upstream:
            conn.sock.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            self._relay(conn, upstream)

    def _forward(self, conn: _Conn, method: str, url: str, headers: list[tuple[str, str]],
                 body: bytes, keep_alive: bool) -> bool:
        """Send one request to the origin and relay its answer; False if the client connection must close."""
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            self._answer(conn, 400, b"only absolute http:// URLs are forwarded\n", close=True)
            return False
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        sent = [(k, v) for k, v in headers if k.lower() not in _HOP_BY_HOP] + [("Connection", "close")]
        try:
            upstream = self._connect(parts.hostname, parts.port or 80)
        except OSError:
            self._answer(conn, 502, b"cannot reach the origin\n", close=not keep_alive)
            return keep_alive
        with upstream:
            lines = [f"{method} {path} HTTP/1.1", *(f"{k}: {v}" for k, v in sent)]
            upstream.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
            origin = _Conn(upstream)
            head = origin.read_head()
            if head is None:
                raise ConnectionError("the origin closed without answering")
            (_, status, _), answer = _parse_head(head)
            length = _header(answer, "content-length")
            no_body = method == "HEAD" or status in ("204", "304")
            keep_alive = keep_alive and (no_body or length is not None)
            kept = [(k, v) for k, v in answer if k.lower() not in _HOP_BY_HOP]
            kept.append(("Connection", "keep-alive" if keep_alive else "close"))
            first = head.split(b"\r\n", 1)[0].decode("latin-1")
            conn.sock.sendall(("\r\n".join([first, *(f"{k}: {v}" for k, v in kept)]) + "\r\n\r\n").encode("latin-1"))
            if not no_body:
                origin.copy_to(conn.sock, None if length is None else int(length))
        return keep_alive

    # -- SOCKS5 ----------------------------------------------------------------------------------

    def _serve_socks(self, conn: _Conn) -> None:
        version, count = conn.read_exact(2)
        if version != 5:
            return None
        methods = conn.read_exact(count)
        wanted = 0 if self.credentials is None else 2
        if wanted not in methods:
            return conn.sock.sendall(b"\x05\xff")
        conn.sock.sendall(bytes([5, wanted]))
        if self.credentials is not None:
            _, user_length = conn.read_exact(2)
            user = conn.read_exact(user_length)
            password = conn.read_exact(conn.read_exact(1)[0])
            expected = ":".join(self.credentials).encode()
            if not hmac.compare_digest(user + b":" + password, expected):
                return conn.sock.sendall(b"\x01\x01")
            conn.sock.sendall(b"\x01\x00")
        _, command, _, address_type = conn.read_exact(4)
        if address_type == 1:
            host = str(ipaddress.IPv4Address(conn.read_exact(4)))
        elif address_type == 3:
            host = conn.read_exact(conn.read_exact(1)[0]).decode("idna")
        elif address_type == 4:
            host = str(ipaddress.IPv6Address(conn.read_exact(16)))
        else:
            return self._socks_reply(conn, _SOCKS_BAD_ADDRESS)
        (port,) = struct.unpack("!H", conn.read_exact(2))
        if command != 1:
            return self._socks_reply(conn, _SOCKS_BAD_COMMAND)
        self._record(conn, f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
        if self.fail_with is not None:
            return self._socks_reply(conn, _SOCKS_FAILURE)
        try:
            upstream = self._connect(host, port)
        except ConnectionRefusedError:
            return self._socks_reply(conn, _SOCKS_REFUSED)
        except OSError:
            return self._socks_reply(conn, _SOCKS_FAILURE)
        with upstream:
            self._socks_reply(conn, _SOCKS_OK, upstream.getsockname())
            self._relay(conn, upstream)

    def _socks_reply(self, conn: _Conn, code: int, bound: tuple[str, int] | None = None) -> None:
        address = ipaddress.ip_address(bound[0] if bound else "0.0.0.0")
        kind = 1 if address.version == 4 else 4
        conn.sock.sendall(bytes([5, code, 0, kind]) + address.packed + struct.pack("!H", bound[1] if bound else 0))
