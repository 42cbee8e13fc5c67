"""The test proxy server (tests/proxyserver.py), driven by python-requests and http.client against
the local demo site: forwarding, keep-alive, CONNECT, SOCKS5 address types, credentials,
``fail_with``, the request record, and clients that hang up."""

from __future__ import annotations

import base64
import http.client
import socket
import struct
import threading
from collections.abc import Iterator

import pytest
import requests

from scrapekit.demo.site import DemoSite
from tests.proxyserver import ProxyServer


@pytest.fixture
def session() -> Iterator[requests.Session]:
    with requests.Session() as running:
        running.trust_env = False  # no proxies from the environment
        yield running


def via(proxy: ProxyServer | str) -> dict[str, str]:
    url = proxy if isinstance(proxy, str) else proxy.url
    return {"http": url, "https": url}


def test_a_get_is_forwarded_through_the_http_proxy(site: DemoSite, session: requests.Session) -> None:
    with ProxyServer(kind="http") as proxy:
        response = session.get(f"{site.url}/page/1", proxies=via(proxy), timeout=5)
        assert response.status_code == 200 and "<title>Page 1</title>" in response.text
        assert site.hits_snapshot() == {"/page/1": 1}
        assert proxy.count == 1 and proxy.requests[0][1] == f"{site.url}/page/1"


def test_one_session_sends_sequential_requests_over_one_kept_alive_connection(
        site: DemoSite, session: requests.Session) -> None:
    with ProxyServer(kind="http") as proxy:
        statuses = []
        for n in range(1, 5):
            response = session.get(f"{site.url}/page/{n}", proxies=via(proxy), timeout=5)
            statuses.append((response.status_code, f"<title>Page {n}</title>" in response.text))
        head = session.head(f"{site.url}/page/9", proxies=via(proxy), timeout=5)
        after_head = session.get(f"{site.url}/status/404", proxies=via(proxy), timeout=5)
        assert statuses == [(200, True)] * 4
        assert head.status_code == 200 and head.content == b"" and int(head.headers["Content-Length"]) > 0
        assert after_head.status_code == 404 and after_head.text == "status 404\n"
        assert [target for _, target in proxy.requests] == [
            *(f"{site.url}/page/{n}" for n in range(1, 5)), f"{site.url}/page/9", f"{site.url}/status/404"]
        assert len({port for port, _ in proxy.requests}) == 1  # keep-alive: one client connection


def test_connect_opens_a_tunnel_to_the_target(site: DemoSite) -> None:
    with ProxyServer(kind="http") as proxy:
        conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=5)
        conn.set_tunnel("127.0.0.1", site.port)
        try:
            conn.request("GET", "/page/3")
            response = conn.getresponse()
            body = response.read()
        finally:
            conn.close()
        assert response.status == 200 and b"<title>Page 3</title>" in body
        assert [target for _, target in proxy.requests] == [f"127.0.0.1:{site.port}"]
        assert site.hits_snapshot() == {"/page/3": 1}


def test_socks5h_sends_the_host_name_for_the_proxy_to_resolve(site: DemoSite, session: requests.Session) -> None:
    with ProxyServer(kind="socks5") as proxy:
        assert proxy.url == f"socks5h://127.0.0.1:{proxy.port}"
        for n in (1, 2):
            response = session.get(f"http://localhost:{site.port}/page/{n}", proxies=via(proxy), timeout=5)
            assert response.status_code == 200 and f"<title>Page {n}</title>" in response.text
        assert site.hits_snapshot() == {"/page/1": 1, "/page/2": 1}
        assert [target for _, target in proxy.requests] == [f"localhost:{site.port}"]  # one tunnel, kept alive


def test_socks5_without_h_sends_an_ipv4_address(site: DemoSite, session: requests.Session) -> None:
    with ProxyServer(kind="socks5") as proxy:
        local_dns = proxy.url.replace("socks5h://", "socks5://")
        response = session.get(f"http://localhost:{site.port}/page/4", proxies=via(local_dns), timeout=5)
        assert response.status_code == 200 and "<title>Page 4</title>" in response.text
        assert proxy.requests[0][1] == f"127.0.0.1:{site.port}"


def test_socks5_connects_to_an_ipv6_address() -> None:
    try:
        origin = socket.create_server(("::1", 0), family=socket.AF_INET6)
    except OSError:
        pytest.skip("no IPv6 loopback here")
    origin_port = origin.getsockname()[1]
    greeted = threading.Thread(target=lambda: origin.accept()[0].sendall(b"hello over ipv6"), daemon=True)
    greeted.start()
    with origin, ProxyServer(kind="socks5") as proxy, socket.create_connection(("127.0.0.1", proxy.port), 5) as client:
        client.sendall(b"\x05\x01\x00")
        assert client.recv(2) == b"\x05\x00"
        client.sendall(b"\x05\x01\x00\x04" + socket.inet_pton(socket.AF_INET6, "::1") + struct.pack("!H", origin_port))
        reply = recv_exactly(client, 22)  # VER REP RSV ATYP=4, 16 address bytes, port
        assert reply[:4] == b"\x05\x00\x00\x04"
        assert recv_exactly(client, 15) == b"hello over ipv6"
        assert proxy.requests[0][1] == f"[::1]:{origin_port}"
    greeted.join(5)


def recv_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size and (chunk := sock.recv(size - len(data))):
        data += chunk
    return data


def test_the_http_proxy_requires_its_credentials(site: DemoSite, session: requests.Session) -> None:
    with ProxyServer(kind="http", credentials=("user", "s3cr:t")) as proxy:
        assert proxy.url == f"http://user:s3cr%3At@127.0.0.1:{proxy.port}"
        accepted = session.get(f"{site.url}/page/1", proxies=via(proxy), timeout=5)
        anonymous = session.get(f"{site.url}/page/2", proxies=via(f"http://127.0.0.1:{proxy.port}"), timeout=5)
        wrong = session.get(f"{site.url}/page/3", proxies=via(f"http://user:nope@127.0.0.1:{proxy.port}"), timeout=5)
        assert accepted.status_code == 200 and "<title>Page 1</title>" in accepted.text
        assert anonymous.status_code == 407 and anonymous.headers["Proxy-Authenticate"].startswith("Basic")
        assert wrong.status_code == 407
        assert site.hits_snapshot() == {"/page/1": 1}
        assert [target for _, target in proxy.requests] == [f"{site.url}/page/1"]
        assert "Proxy-Authorization" not in site.requests_log[0][2]  # the credentials stop at the proxy


def test_connect_requires_the_credentials_too(site: DemoSite) -> None:
    with ProxyServer(kind="http", credentials=("user", "secret")) as proxy:
        authorization = {"Proxy-Authorization": "Basic " + base64.b64encode(b"user:secret").decode()}
        for headers, expected in (({}, 407), (authorization, 200)):
            conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=5)
            conn.set_tunnel("127.0.0.1", site.port, headers=headers)
            try:
                conn.request("GET", "/page/5")
                status = conn.getresponse().status
            except OSError as exc:  # http.client reports a refused tunnel as "Tunnel connection failed: 407"
                status = 407 if "407" in str(exc) else -1
            finally:
                conn.close()
            assert status == expected
        assert site.hits_snapshot() == {"/page/5": 1}


def test_the_socks5_proxy_requires_its_credentials(site: DemoSite, session: requests.Session) -> None:
    with ProxyServer(kind="socks5", credentials=("user", "secret")) as proxy:
        assert proxy.url == f"socks5h://user:secret@127.0.0.1:{proxy.port}"
        accepted = session.get(f"{site.url}/page/1", proxies=via(proxy), timeout=5)
        assert accepted.status_code == 200 and "<title>Page 1</title>" in accepted.text
        for refused in (f"socks5h://127.0.0.1:{proxy.port}", f"socks5h://user:nope@127.0.0.1:{proxy.port}"):
            with pytest.raises(requests.exceptions.ConnectionError):
                session.get(f"{site.url}/page/2", proxies=via(refused), timeout=5)
        assert site.hits_snapshot() == {"/page/1": 1}
        assert [target for _, target in proxy.requests] == [f"127.0.0.1:{site.port}"]


@pytest.mark.parametrize("status", [503, 429])
def test_fail_with_answers_without_contacting_the_origin(
        site: DemoSite, session: requests.Session, status: int) -> None:
    with ProxyServer(kind="http", fail_with=status) as proxy:
        failed = session.get(f"{site.url}/page/1", proxies=via(proxy), timeout=5)
        assert failed.status_code == status and failed.headers["Retry-After"] == "1"
        assert site.hits_snapshot() == {}
        proxy.fail_with = None  # recovers while running
        recovered = session.get(f"{site.url}/page/1", proxies=via(proxy), timeout=5)
        assert recovered.status_code == 200 and site.hits_snapshot() == {"/page/1": 1}
        assert [target for _, target in proxy.requests] == [f"{site.url}/page/1"] * 2


def test_the_origins_own_503_is_relayed(site: DemoSite, session: requests.Session) -> None:
    with ProxyServer(kind="http") as proxy:
        response = session.get(f"{site.url}/status/503?retry_after=7", proxies=via(proxy), timeout=5)
        assert response.status_code == 503 and response.headers["Retry-After"] == "7"
        assert site.hits_snapshot() == {"/status/503": 1}


def test_fail_with_makes_socks5_refuse_the_connect(site: DemoSite, session: requests.Session) -> None:
    with ProxyServer(kind="socks5") as proxy:
        proxy.fail_with = 503
        with pytest.raises(requests.exceptions.ConnectionError):
            session.get(f"{site.url}/page/1", proxies=via(proxy), timeout=5)
        assert site.hits_snapshot() == {}
        assert [target for _, target in proxy.requests] == [f"127.0.0.1:{site.port}"]
        proxy.fail_with = None
        assert session.get(f"{site.url}/page/1", proxies=via(proxy), timeout=5).status_code == 200


@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")  # a traceback in a thread
@pytest.mark.parametrize("kind", ["http", "socks5"])
def test_clients_that_hang_up_do_not_break_the_server(
        site: DemoSite, session: requests.Session, capfd: pytest.CaptureFixture[str], kind: str) -> None:
    with ProxyServer(kind=kind) as proxy:  # type: ignore[arg-type]
        partial = b"GET http://127.0.0.1/ HTTP/1.1\r\nHo" if kind == "http" else b"\x05\x01\x00\x05\x01\x00\x03\x09loc"
        for sent in (b"", partial, b"\x00" * 10):
            with socket.create_connection(("127.0.0.1", proxy.port), 5) as rude:
                rude.sendall(sent)
        for n in (1, 2):
            response = session.get(f"{site.url}/page/{n}", proxies=via(proxy), timeout=5)
            assert response.status_code == 200 and f"<title>Page {n}</title>" in response.text
    out, err = capfd.readouterr()
    assert err == "" and "Traceback" not in out


def test_close_hangs_up_on_open_clients_and_frees_the_port(site: DemoSite) -> None:
    proxy = ProxyServer(kind="http").start()
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=5)
    try:
        conn.request("GET", f"{site.url}/page/1")
        assert conn.getresponse().read().startswith(b"<!DOCTYPE html>")
        assert conn.sock is not None  # kept alive, idle in the proxy
        proxy.close()
        assert conn.sock.recv(1) == b""  # hung up by the proxy, not a 5 s timeout
    finally:
        conn.close()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", proxy.port), 1).close()
    proxy.close()  # idempotent
