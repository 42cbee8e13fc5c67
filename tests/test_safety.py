"""Fetch safety and proxies: non-public addresses refused after DNS (and on redirects) unless
allowed, credentials kept out of logs, each fetch slot pinned to one proxy, a failing proxy rested.
The proxies are real ones on loopback (tests/proxyserver.py)."""

from __future__ import annotations

import logging
import threading

import pytest

from scrapekit.demo.site import DemoSite
from scrapekit.fetchers import HttpFetcher, public_address
from scrapekit.model import Request, loggable

from .conftest import FakeClock
from .proxyserver import ProxyServer


@pytest.mark.parametrize(("address", "public"), [
    ("8.8.8.8", True), ("2606:4700:4700::1111", True),
    ("127.0.0.1", False), ("10.1.2.3", False), ("172.16.0.1", False), ("192.168.1.1", False),
    ("169.254.169.254", False), ("100.64.0.1", False), ("0.0.0.0", False), ("224.0.0.1", False),
    ("::1", False), ("fe80::1%eth0", False), ("fc00::1", False), ("::ffff:127.0.0.1", False),
])
def test_public_address(address: str, public: bool) -> None:
    assert public_address(address) is public


def hit_count(site: DemoSite) -> int:
    return sum(site.hits_snapshot().values())


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "127.1", "0x7f000001", "2130706433"])
def test_loopback_is_refused_by_default_however_it_is_spelt(site: DemoSite, host: str) -> None:
    before = hit_count(site)
    with HttpFetcher() as fetcher:
        response = fetcher.fetch(Request(f"http://{host}:{site.port}/page/1"))
    assert response.error == "private_address" and response.status == 0
    assert "allow_private" in response.reason
    assert hit_count(site) == before  # not one byte reached the site


def test_allow_private_lets_loopback_through(site: DemoSite) -> None:
    with HttpFetcher(allow_private=True) as fetcher:
        response = fetcher.fetch(Request(f"http://127.1:{site.port}/page/1"))
    assert response.error is None and response.status == 200


def test_a_redirect_to_a_private_address_is_refused_through_a_proxy(site: DemoSite) -> None:
    # Through a proxy the proxy resolves names, so "127.1" passes the first check; the redirect
    # to a literal private address is caught before it is followed.
    target = f"http://127.0.0.1:{site.port}/page/2"
    with ProxyServer(kind="http") as proxy, HttpFetcher(proxies=[proxy.url]) as fetcher:
        response = fetcher.fetch(Request(f"http://127.1:{site.port}/redirect?to={target}"))
    assert response.error == "private_address"
    assert site.hits_snapshot().get("/page/2", 0) == 0


def test_fetches_go_through_the_proxy_of_their_slot(site: DemoSite) -> None:
    with ProxyServer(kind="http") as one, ProxyServer(kind="http") as two:
        with HttpFetcher(proxies=[one.url, two.url], allow_private=True) as fetcher:
            results: dict[str, list[int]] = {}

            def slot(name: str) -> None:
                results[name] = [fetcher.fetch(Request(f"{site.url}/page/{name}{i}")).status for i in range(3)]

            threads = [threading.Thread(target=slot, args=(str(n),)) for n in range(2)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        assert results == {"0": [200] * 3, "1": [200] * 3}
        # Each thread kept to one proxy: a proxy saw all three pages of one slot and none of the other.
        seen = [{url.rsplit("/", 1)[1][:-1] for _, url in proxy.requests} for proxy in (one, two)]
        assert sorted(map(sorted, seen)) == [["0"], ["1"]]
        assert one.count == 3 and two.count == 3


def test_socks5h_proxy_with_credentials(site: DemoSite) -> None:
    with ProxyServer(kind="socks5", credentials=("scraper", "s3cret")) as proxy:
        assert "s3cret" in proxy.url
        with HttpFetcher(proxies=[proxy.url], allow_private=True) as fetcher:
            response = fetcher.fetch(Request(f"{site.url}/page/7"))
        assert response.status == 200 and b"Page 7" in response.body
        assert proxy.count == 1 and site.hits_snapshot().get("/page/7") == 1


def test_a_proxy_answering_503_is_rested_and_longer_each_time(site: DemoSite, clock: FakeClock,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    waits: list[float] = []

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        clock.advance(seconds)

    with ProxyServer(kind="http", credentials=("scraper", "s3cret")) as proxy:
        proxy.fail_with = 503
        with caplog.at_level(logging.INFO, logger="scrapekit"), \
                HttpFetcher(proxies=[proxy.url], allow_private=True, clock=clock, sleep=sleep) as fetcher:
            first = fetcher.fetch(Request(f"{site.url}/page/1"))
            second = fetcher.fetch(Request(f"{site.url}/page/2"))
            proxy.fail_with = None
            third = fetcher.fetch(Request(f"{site.url}/page/3"))
            fourth = fetcher.fetch(Request(f"{site.url}/page/4"))
    assert (first.status, second.status, third.status, fourth.status) == (503, 503, 200, 200)
    assert waits == [1.0, 2.0]  # rested 1 s after the first 503, 2 s after the second, not after a success
    assert "resting it" in caplog.text
    assert "s3cret" not in caplog.text and "scraper" not in caplog.text  # credentials never logged


def test_an_unreachable_proxy_is_a_proxy_error_without_its_password(clock: FakeClock) -> None:
    with ProxyServer(kind="http") as proxy:
        port = proxy.port
    with HttpFetcher(proxies=[f"http://me:hunter2@127.0.0.1:{port}"], clock=clock, sleep=clock.advance) as fetcher:
        response = fetcher.fetch(Request("http://example.invalid/"))
    assert response.error == "proxy_error"
    assert "hunter2" not in response.reason


def test_a_proxy_url_that_is_not_one_is_refused() -> None:
    with pytest.raises(ValueError, match="not an http, https or socks5h proxy URL"):
        HttpFetcher(proxies=["ftp://user:pw@host:21"])


def test_loggable_masks_credentials_and_escapes_control_characters() -> None:
    assert loggable("http://user:pw@host/a\nb") == "http://***@host/a\\nb"
    assert loggable("socks5h://u:p@127.0.0.1:9050") == "socks5h://***@127.0.0.1:9050"
    assert loggable("http://h/" + "x" * 1000).endswith("...") and len(loggable("http://h/" + "x" * 1000)) == 303
    assert loggable("http://h/\x1b[31mred") == "http://h/\\x1b[31mred"


def test_a_recipe_run_goes_through_its_proxies_and_logs_no_credentials(tmp_path, site: DemoSite) -> None:
    from scrapekit.recipe import load_recipe
    from scrapekit.runner import Runner

    with ProxyServer(kind="socks5", credentials=("scraper", "s3cret")) as socks, \
            ProxyServer(kind="http", credentials=("scraper", "s3cret")) as http:
        urls = [f"{site.url}/page/{n}" for n in range(20)]
        (tmp_path / "urls.txt").write_text("\n".join(urls) + "\n")
        path = tmp_path / "r.yaml"
        path.write_text("name: px\nwork_dir: work\nsource: {type: flat_file, path: urls.txt}\n"
                        f"fetch: {{concurrency: 4, proxies: ['{socks.url}', '{http.url}']}}\n"
                        "politeness: {allow_private: true, robots: false}\n")
        assert Runner(load_recipe(path)).run() == "done"
        assert socks.count >= 1 and http.count >= 1  # both proxies used, each by its own slots
        assert http.count + sum(site.hits_snapshot().get(f"/page/{n}", 0) for n in range(20)) >= 20
    stats = (tmp_path / "work" / "px" / "stats.json").read_text()
    assert '"done": 20' in stats
    logs = "".join(p.read_text() for p in (tmp_path / "work" / "px" / "log").glob("*.log"))
    assert "s3cret" not in logs
