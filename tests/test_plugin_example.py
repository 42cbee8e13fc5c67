"""The example plugin package (examples/scrapekit-sitemap) installed with pip and used from a
recipe by its short names, its options checked like built-in ones."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("site-packages")
    source = tmp_path_factory.mktemp("src") / "scrapekit-sitemap"
    shutil.copytree(ROOT / "examples" / "scrapekit-sitemap", source)  # builds leave files behind
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                    "--no-build-isolation", "--target", str(target), str(source)],
                   check=True, capture_output=True)
    assert (target / "scrapekit_sitemap").is_dir()
    assert list(target.glob("scrapekit_sitemap-*.dist-info/entry_points.txt"))
    return target


def scrapekit(installed: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{installed}"}
    return subprocess.run([sys.executable, "-m", "scrapekit", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


def sitemap(urls: list[str], extra: str = "") -> str:
    locs = "".join(f"<url><loc>{u}</loc></url>" for u in urls)
    return (f'<?xml version="1.0"?>{extra}<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
            f"{locs}</urlset>")


def test_sitemap_source_and_sqlite_store_by_short_name(installed: Path, tmp_path: Path, site) -> None:
    urls = [f"{site.url}/page/{n}" for n in range(5)] + [f"{site.url}/status/404"]
    (tmp_path / "sitemap.xml").write_text(sitemap(urls))
    (tmp_path / "r.yaml").write_text("name: sm\nsource: {type: sitemap, path: sitemap.xml}\npoliteness: {allow_private: true, robots: false}\n"
                                     "store: {type: sqlite, table: pages}\n")
    checked = scrapekit(installed, "check", "r.yaml", cwd=tmp_path)
    assert checked.returncode == 0 and "sitemap" in checked.stdout and "sqlite" in checked.stdout
    result = scrapekit(installed, "run", "r.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    with sqlite3.connect(tmp_path / "work" / "sm" / "out" / "sm.sqlite") as db:
        rows = db.execute("SELECT url, status, reason FROM pages ORDER BY url").fetchall()
    assert sorted(rows) == sorted([(u, 200, "OK") for u in urls[:5]] + [(urls[5], 404, "not_found")])


def test_a_typo_in_a_plugin_option_is_a_file_line_key_error(installed: Path, tmp_path: Path) -> None:
    (tmp_path / "sitemap.xml").write_text(sitemap(["http://127.0.0.1:1/x"]))
    (tmp_path / "r.yaml").write_text("source: {type: sitemap, path: sitemap.xml}\nstore:\n  type: sqlite\n  tabel: x\n")
    result = scrapekit(installed, "check", "r.yaml", cwd=tmp_path)
    assert result.returncode == 2
    assert "r.yaml:4: store.tabel: unknown key (did you mean 'table'?)" in result.stderr


def test_a_hostile_sitemap_reads_no_local_file(installed: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("http://127.0.0.1:1/stolen")
    doctype = f'<!DOCTYPE urlset [<!ENTITY x SYSTEM "file://{secret}">]>'
    (tmp_path / "sitemap.xml").write_text(sitemap(["&x;", "http://127.0.0.1:1/fine"], doctype))
    code = ("from pathlib import Path; from scrapekit_sitemap import SitemapSource; "
            "print([r.url for r, _ in SitemapSource(Path('sitemap.xml')).requests(None)])")
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{installed}"}
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert "stolen" not in out.stdout and "http://127.0.0.1:1/fine" in out.stdout
