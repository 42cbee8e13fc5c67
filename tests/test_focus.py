"""The focus parser on responses made by hand and on the demo blog, and its recipe options."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from scrapekit import RecipeError, Request, Response
from scrapekit.demo.site import DemoSite
from scrapekit.fetchers import HttpFetcher
from scrapekit.focus import DEFAULT_SOCIAL, FocusParser, account_of
from scrapekit.recipe import load_recipe
from scrapekit.runner import Runner

ROOT = Path(__file__).resolve().parent.parent
PAGE_URL = "http://www.shop.example.co.uk/dir/page.html"


def page(body: str | bytes, content_type: str = "text/html; charset=utf-8", url: str = PAGE_URL,
         final_url: str = "") -> Response:
    data = body.encode() if isinstance(body, str) else body
    headers = {"content-type": content_type} if content_type else {}
    return Response(Request(url), 200, "OK", headers, data, url=final_url, fetched_at=1_800_000_000.0)


def finds(parser: FocusParser, response: Response) -> list[tuple[str, str, str, str]]:
    """(kind, network, url, account) of each item, in order."""
    items, links = parser.parse(response)
    assert links == []
    return [(i.fields["kind"], i.fields["network"], i.fields["url"], i.fields["account"]) for i in items]


def socials(html: str, parser: FocusParser | None = None) -> list[tuple[str, str]]:
    """(network, account) of each social item found in ``html``."""
    return [(network, account) for kind, network, _, account in finds(parser or FocusParser(), page(html))
            if kind == "social"]


def test_feeds_of_each_type_are_found_by_rel_alternate_and_type() -> None:
    html = ('<html><head>'
            '<link rel="alternate" type="application/rss+xml" href="/feed.xml">'
            '<link rel="alternate" type="application/atom+xml" href="https://feeds.example.net/atom">'
            '<link rel="Alternate Home" type="APPLICATION/FEED+JSON; charset=utf-8" href="/feed.json">'
            '<link rel="alternate" type="application/json" href="/wp-json/wp/v2/pages/7">'
            '<link rel="alternate" hreflang="fr" href="/fr/">'
            '<link rel="stylesheet" type="application/rss+xml" href="/not-a-feed.xml">'
            '</head><body><a rel="alternate" type="application/rss+xml" href="/a-feed-link.xml">feed</a></body></html>')
    assert finds(FocusParser(), page(html)) == [
        ("feed", "rss", "http://www.shop.example.co.uk/feed.xml", ""),
        ("feed", "atom", "https://feeds.example.net/atom", ""),
        ("feed", "json", "http://www.shop.example.co.uk/feed.json", ""),
    ]


def test_an_item_names_its_site_page_and_key() -> None:
    html = '<link rel="alternate" type="application/rss+xml" href="feed.xml"><a href="https://twitter.com/shop">t</a>'
    feed, social = FocusParser().parse(page(html))[0]
    assert dict(feed.fields) == {"site": "example.co.uk", "kind": "feed", "network": "rss",
                                 "url": "http://www.shop.example.co.uk/dir/feed.xml", "account": "",
                                 "found_on": PAGE_URL}
    assert feed.key == "example.co.uk feed http://www.shop.example.co.uk/dir/feed.xml"
    assert social.key == "example.co.uk social https://twitter.com/shop"
    assert (social.url, social.scraped_at) == (PAGE_URL, 1_800_000_000.0)


def test_relative_hrefs_resolve_against_the_final_url_and_the_base_element() -> None:
    html = '<link rel="alternate" type="application/rss+xml" href="feed.xml">'
    moved = page(html, final_url="https://blog.other.org/2024/post")
    ((feed,), _) = FocusParser().parse(moved)
    assert (feed.fields["url"], feed.fields["site"], feed.fields["found_on"]) == (
        "https://blog.other.org/2024/feed.xml", "other.org", "https://blog.other.org/2024/post")
    based = page('<base href="/news/">' + html)
    assert finds(FocusParser(), based) == [("feed", "rss", "http://www.shop.example.co.uk/news/feed.xml", "")]


def test_listed_hosts_match_with_www_m_and_mobile_subdomains_in_any_case() -> None:
    html = ('<a href="https://www.facebook.com/shop">f</a><a href="https://m.facebook.com/shop.m">f</a>'
            '<a href="https://mobile.twitter.com/shop">t</a><a href="HTTPS://WWW.GITHUB.COM/Shop">g</a>'
            '<a href="https://mastodon.social/@shop">m</a>')
    assert socials(html) == [("facebook", "shop"), ("facebook", "shop.m"), ("twitter", "shop"),
                             ("github", "Shop"), ("mastodon", "@shop")]


@pytest.mark.parametrize("href", [
    "https://help.twitter.com/shop", "https://gist.github.com/shop", "https://nottwitter.com/shop",
    "https://twitter.com.evil.test/shop", "https://twitter.co/shop", "https://example.com/twitter.com/shop",
])
def test_other_hosts_and_other_subdomains_are_not_accounts(href: str) -> None:
    assert socials(f'<a href="{href}">x</a>') == []


@pytest.mark.parametrize("href", [
    "https://twitter.com/intent/tweet?url=http%3A%2F%2Fshop.example%2F", "https://twitter.com/share?text=hi",
    "https://www.facebook.com/sharer.php?u=x", "https://www.facebook.com/sharer/sharer.php?u=x",
    "https://www.facebook.com/dialog/share?app_id=1", "https://www.linkedin.com/shareArticle?mini=true&url=x",
    "https://www.linkedin.com/sharing/share-offsite/?url=x", "https://pinterest.com/pin/create/button/?url=x",
    "https://twitter.com/login", "https://twitter.com/home", "https://github.com/Login", "https://twitter.com",
    "https://www.instagram.com/", "https://www.youtube.com/watch?v=abc", "https://x.com/i/flow/signup",
    "https://www.linkedin.com/company/", "https://www.youtube.com/channel/",
])
def test_share_intent_login_and_bare_host_links_are_not_accounts(href: str) -> None:
    assert socials(f'<a href="{href}">x</a>') == []


@pytest.mark.parametrize(("url", "host", "account"), [
    ("https://twitter.com/shop/status/123", "twitter.com", "shop"),
    ("https://www.linkedin.com/company/acme-ltd/about/", "linkedin.com", "company/acme-ltd"),
    ("https://linkedin.com/in/jane-doe", "linkedin.com", "in/jane-doe"),
    ("https://www.youtube.com/@shop/videos", "youtube.com", "@shop"),
    ("https://www.youtube.com/channel/UC123", "youtube.com", "channel/UC123"),
    ("https://www.youtube.com/c/Shop", "youtube.com", "c/Shop"),
    ("https://www.youtube.com/user/shop", "youtube.com", "user/shop"),
    ("https://github.com/c", "github.com", "c"),  # two segments only where the host uses them
    ("https://github.com/", "github.com", None),
    ("https://twitter.com/intent/follow?screen_name=shop", "twitter.com", None),
])
def test_the_account_is_the_first_path_segment_or_two_where_the_host_says(url: str, host: str,
                                                                           account: str | None) -> None:
    assert account_of(url, host) == account


def test_a_recipe_table_replaces_the_default_one() -> None:
    html = ('<a href="https://twitter.com/shop">t</a><a href="https://fosstodon.org/@shop">m</a>'
            '<a href="https://www.example.social/people/shop">e</a>')
    custom = FocusParser(social={"mastodon": "fosstodon.org", "example": "WWW.Example.Social"})
    assert socials(html, custom) == [("mastodon", "@shop"), ("example", "people")]
    assert socials(html) == [("twitter", "shop")]
    assert "twitter" in DEFAULT_SOCIAL and "fosstodon.org" not in DEFAULT_SOCIAL.values()


def test_an_empty_table_and_feeds_false_turn_each_kind_off() -> None:
    html = '<link rel="alternate" type="application/rss+xml" href="/f.xml"><a href="https://twitter.com/shop">t</a>'
    assert [f[0] for f in finds(FocusParser(social={}), page(html))] == ["feed"]
    assert [f[0] for f in finds(FocusParser(feeds=False), page(html))] == ["social"]
    assert finds(FocusParser(feeds=False, social={}), page(html)) == []


@pytest.mark.parametrize("host", ["https://twitter.com", "twitter.com/shop", "", "twit ter.com", "a@b.com",
                                  "twitter.com:8080"])
def test_a_table_value_that_is_not_a_host_is_refused(host: str) -> None:
    with pytest.raises(ValueError, match="social.tw: expected a host like twitter.com"):
        FocusParser(social={"tw": host})


def test_odd_schemes_and_broken_links_are_skipped_without_raising() -> None:
    broken = ["javascript:window.open('https://twitter.com/shop')", "mailto:shop@twitter.com",
              "tel:+441234", "data:text/html,<a>", "https://twitter.com:99999/shop", "http://[::1/feed",
              "https://twïtter.com/shop", "http://a..b/feed", "https://twit ter.com/shop", "http://%zz/",
              "http://twit%ter.com/shop", "//", ""]
    html = "".join(f'<a href="{href}">x</a><link rel="alternate" type="application/rss+xml" href="{href}">'
                   for href in broken)
    good = '<a href="https://twitter.com/shop%zz">t</a><a href="https://github.com/%7Eshop">g</a>'
    assert finds(FocusParser(), page(html + good)) == [
        ("feed", "rss", "https://xn--twtter-jwa.com/shop", ""),  # an IDN is a host like any other, not twitter
        ("social", "twitter", "https://twitter.com/shop%25zz", "shop%25zz"),
        ("social", "github", "https://github.com/~shop", "~shop"),
    ]


def test_each_key_is_given_once_per_page() -> None:
    html = ('<link rel="alternate" type="application/rss+xml" href="/feed.xml">'
            '<link rel="alternate" type="application/atom+xml" href="/feed.xml#atom">'
            '<a href="https://twitter.com/shop">t</a><a href="https://twitter.com/shop#top">t</a>'
            '<a href="HTTPS://TWITTER.COM:443/shop">t</a><a href="https://www.twitter.com/shop">www</a>')
    items, _ = FocusParser().parse(page(html))
    assert [i.key for i in items] == ["example.co.uk feed http://www.shop.example.co.uk/feed.xml",
                                      "example.co.uk social https://twitter.com/shop",
                                      "example.co.uk social https://www.twitter.com/shop"]
    assert items[0].fields["network"] == "rss"  # the first find of a key wins


@pytest.mark.parametrize(("body", "content_type"), [
    (b'<link rel="alternate" type="application/rss+xml" href="/f"><a href="https://twitter.com/x">x</a>',
     "application/rss+xml"),
    (b'{"href": "https://twitter.com/x"}', "application/json"),
    (b'<a href="https://twitter.com/x">x</a>', "text/plain"),
    (b"", "text/html"), (b"  \n ", "text/html"), (b"\x00\xff\xfe", "text/html"), (b"<<<>>>", ""),
])
def test_non_html_and_empty_bodies_give_nothing(body: bytes, content_type: str) -> None:
    assert FocusParser().parse(page(body, content_type)) == ([], [])


def test_the_demo_blog_gives_its_feeds_and_accounts_but_no_share_links(site: DemoSite) -> None:
    index_url, post_url = f"{site.url}/blog/", f"{site.url}/blog/post/2"
    parser = FocusParser()
    with HttpFetcher(allow_private=True) as fetcher:
        responses = [fetcher.fetch(Request(url)) for url in (index_url, post_url, f"{site.url}/blog/feed.xml")]
    assert [r.error for r in responses] == [None, None, None]
    index, post, feed = (parser.parse(r)[0] for r in responses)
    accounts = [("social", "twitter", "https://twitter.com/demoblog", "demoblog"),
                ("social", "facebook", "https://www.facebook.com/demoblog", "demoblog"),
                ("social", "github", "https://github.com/demoblog", "demoblog"),
                ("social", "linkedin", "https://www.linkedin.com/company/demoblog", "company/demoblog")]
    assert [(i.fields["kind"], i.fields["network"], i.fields["url"], i.fields["account"]) for i in index] == [
        ("feed", "rss", f"{site.url}/blog/feed.xml", ""), ("feed", "atom", f"{site.url}/blog/atom.xml", ""),
        *accounts]
    assert [(i.fields["kind"], i.fields["network"], i.fields["url"]) for i in post][:2] == [
        ("feed", "rss", f"{site.url}/blog/feed.xml"), accounts[0][:3]]
    assert {i.fields["site"] for i in index + post} == {"127.0.0.1"}
    assert {i.fields["found_on"] for i in post} == {post_url}
    assert {i.key for i in post} < {i.key for i in index}  # a store keeping one record per key gains nothing
    assert feed == []


def test_a_recipe_sets_the_focus_options_by_name(tmp_path: Path) -> None:
    (tmp_path / "urls.txt").write_text("http://127.0.0.1:1/blog/\n")
    path = tmp_path / "r.yaml"
    path.write_text("source: {type: flat_file, path: urls.txt}\n"
                    "parse: {type: focus, social: {mastodon: mastodon.social}}\n")
    recipe = load_recipe(path)
    assert recipe.parse is not None and recipe.parse.cls is FocusParser
    assert dict(recipe.parse.options) == {"social": {"mastodon": "mastodon.social"}}


@pytest.mark.parametrize(("option", "message"), [
    ("  socail: {mastodon: mastodon.social}", "parse.socail: unknown key (did you mean 'social'?)"),
    ("  feeds: sometimes", "parse.feeds: expected true or false"),
    ("  social: [twitter.com]", "parse.social: expected a mapping"),
])
def test_a_bad_focus_option_names_file_line_and_key(tmp_path: Path, option: str, message: str) -> None:
    (tmp_path / "urls.txt").write_text("http://127.0.0.1:1/blog/\n")
    path = tmp_path / "r.yaml"
    path.write_text(f"source: {{type: flat_file, path: urls.txt}}\nparse:\n  type: focus\n{option}\n")
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    assert str(info.value).splitlines()[0].startswith(f"{path}:4: {message}")


def test_the_example_recipe_collects_each_feed_and_account_once(tmp_path: Path, site: DemoSite) -> None:
    (tmp_path / "focus.yaml").write_text("work_dir: work\n" + (ROOT / "recipes" / "focus.yaml").read_text())
    seeds = (ROOT / "recipes" / "focus-urls.txt").read_text()
    assert "http://127.0.0.1:8765/blog/" in seeds
    (tmp_path / "focus-urls.txt").write_text(seeds.replace("http://127.0.0.1:8765", site.url))
    recipe = load_recipe(tmp_path / "focus.yaml")
    assert Runner(recipe).run() == "done"
    records = [json.loads(line) for chunk in sorted((recipe.run_dir / "out").glob("*/*.jsonl"))
               for line in chunk.read_text().splitlines()]
    found = sorted((r["kind"], r["network"], r["url"]) for r in records)
    assert found == sorted({(r["kind"], r["network"], r["url"]) for r in records})  # one record per key
    assert {(kind, network) for kind, network, _ in found} == {
        ("feed", "rss"), ("feed", "atom"), ("social", "twitter"), ("social", "facebook"),
        ("social", "github"), ("social", "linkedin")}
    assert all(r["site"] == "127.0.0.1" and r["_key"].startswith("127.0.0.1 ") for r in records)
    assert not any("intent" in r["url"] or "sharer" in r["url"] for r in records)
    pages = [p for p in site.hits_snapshot() if p.startswith("/blog/post/")]
    assert len(pages) == 5  # the crawl reached every post

    # A later crawl of the same site stores nothing again: the keys are kept in the state.
    (tmp_path / "again.txt").write_text(f"{site.url}/blog/post/3?again=1\n")
    again = tmp_path / "focus.yaml"
    again.write_text(again.read_text().replace("path: focus-urls.txt", "path: again.txt"))
    done = json.loads((recipe.run_dir / "stats.json").read_text())["done"]
    assert Runner(load_recipe(again)).run() == "done"
    assert json.loads((recipe.run_dir / "stats.json").read_text())["done"] == done + 1  # it was fetched
    lines = sum(len(chunk.read_text().splitlines()) for chunk in (recipe.run_dir / "out").glob("*/*.jsonl"))
    assert lines == len(records)
