"""Link following end to end: the demo bookshop crawled from its index, each page once."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from scrapekit.recipe import load_recipe
from scrapekit.runner import Runner
from scrapekit.stores.chunked import read_tsv


def crawl(tmp_path: Path, start: list[str], follow: str, extra: str = "") -> list:
    (tmp_path / "start.txt").write_text("\n".join(start) + "\n")
    path = tmp_path / "r.yaml"
    path.write_text(f"name: c\nwork_dir: work\nsource: {{type: flat_file, path: start.txt}}\npoliteness: {{allow_private: true, robots: false}}\n"
                    f"fetch: {{concurrency: 8}}\nfollow: {follow}\n{extra}")
    assert Runner(load_recipe(path)).run() == "done"
    out = tmp_path / "work" / "c" / "out"
    return [row for chunk in out.glob("*/*.tsv") for row in read_tsv(chunk)]


def stats(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "work" / "c" / "stats.json").read_text())


def test_the_bookshop_is_crawled_whole_and_each_page_once(tmp_path: Path, site) -> None:
    rows = crawl(tmp_path, [f"{site.url}/"], "{allow: ['/catalogue/', '/book/']}")
    urls = Counter(r.url for r in rows)
    assert max(urls.values()) == 1
    assert len(urls) == 1 + 50 + 1000  # index, catalogue pages, books
    assert all(r.status == 200 for r in rows)
    depths = {r.url.removeprefix(site.url): r.meta["depth"] for r in rows}
    assert depths["/"] == 0 and depths["/catalogue/page-3.html"] == 1 and depths["/book/45.html"] == 2
    assert all(hits == 1 for path, hits in site.hits.items() if path.startswith(("/book/", "/catalogue/")))
    links = stats(tmp_path)["links"]
    assert links == {"queued": 1050, "seen": 49 + 1000}  # next links, and every book back to its page


def test_max_depth_and_same_domain(tmp_path: Path, site) -> None:
    rows = crawl(tmp_path, [f"{site.url}/catalogue/page-1.html"], "{same_domain: true, max_depth: 2, allow: ['/catalogue/']}")
    assert max(r.meta["depth"] for r in rows) == 2
    assert sorted(r.url.removeprefix(site.url) for r in rows) == [f"/catalogue/page-{n}.html" for n in (1, 2, 3)]
    assert stats(tmp_path)["links"]["too_deep"] >= 1


def test_a_page_seen_before_by_content_is_a_duplicate_and_its_links_are_not_followed(tmp_path: Path, site) -> None:
    # /page/7 and /page/7?copy have the same body: the second is a duplicate, so only one of
    # them has its links followed (max_depth 1 keeps the crawl small)
    rows = crawl(tmp_path, [f"{site.url}/page/7", f"{site.url}/page/7?copy=1"], "{max_depth: 1, allow: ['/page/']}")
    by_url = {r.url.removeprefix(site.url): r for r in rows}
    reasons = sorted(by_url[u].reason for u in ("/page/7", "/page/7?copy=1"))
    assert reasons == ["OK", "duplicate"]
    assert len(rows) == 2 + 5  # the two seeds and the 5 links of the one that was followed
    assert stats(tmp_path)["links"]["duplicate_pages"] == 1


def test_robots_txt_is_obeyed_and_fetched_once(tmp_path: Path) -> None:
    from .test_robots import Answer, _serve
    server = next(_serve())
    try:
        server.robots("User-agent: *\nDisallow: /private\n")
        for path in ("/public/1", "/public/2"):
            server.answers[path] = Answer(200, b"<html><body>ok</body></html>", headers={"Content-Type": "text/html"})
        urls = [f"{server.url}{p}" for p in ("/public/1", "/private/a", "/public/2", "/private/b")]
        (tmp_path / "urls.txt").write_text("\n".join(urls) + "\n")
        path = tmp_path / "r.yaml"
        path.write_text("name: c\nwork_dir: work\nsource: {type: flat_file, path: urls.txt}\npoliteness: {robots: true, allow_private: true}\n")
        assert Runner(load_recipe(path)).run() == "done"
        rows = {r.url.removeprefix(server.url): (r.status, r.reason) for chunk in
                (tmp_path / "work" / "c" / "out").glob("*/*.tsv") for r in read_tsv(chunk)}
        assert rows == {"/public/1": (200, "OK"), "/public/2": (200, "OK"),
                        "/private/a": (0, "robots_disallowed"), "/private/b": (0, "robots_disallowed")}
        assert server.hits["/robots.txt"] == 1 and server.hits["/private/a"] == 0
        assert stats(tmp_path)["errors"]["robots_disallowed"] == 2
    finally:
        server.shutdown()
        server.server_close()
