"""The example recipes of recipes/, run end to end against the demo site on a fake clock."""

from __future__ import annotations

import shutil
from pathlib import Path

from scrapekit.recipe import load_recipe
from scrapekit.runner import Runner
from scrapekit.stores.chunked import read_tsv

from .conftest import FakeClock

ROOT = Path(__file__).resolve().parents[1]
DEMO = "http://127.0.0.1:8765"


def copy_recipe(tmp_path: Path, name: str, seeds: str, site_url: str) -> Path:
    shutil.copy(ROOT / "recipes" / f"{name}.yaml", tmp_path)
    text = (ROOT / "recipes" / seeds).read_text()
    assert DEMO in text or "{id}" in (ROOT / "recipes" / f"{name}.yaml").read_text()
    (tmp_path / seeds).write_text(text.replace(DEMO, site_url))
    recipe_text = (tmp_path / f"{name}.yaml").read_text().replace(DEMO, site_url)
    (tmp_path / f"{name}.yaml").write_text(recipe_text)
    return tmp_path / f"{name}.yaml"


def test_the_spider_follows_five_generations_and_no_more(tmp_path: Path, site) -> None:
    recipe = load_recipe(copy_recipe(tmp_path, "spider", "spider-urls.txt", site.url))
    assert Runner(recipe, clock=FakeClock()).run() == "done"
    rows = [row for chunk in (recipe.run_dir / "out").glob("*/*.tsv") for row in read_tsv(chunk)]
    depths = {row.url: row.meta.get("depth", 0) for row in rows}
    assert max(depths.values()) == 5 and min(depths.values()) == 0
    # /page/N links to N+1, N+2, N+3, N+17, N+1000: generation g reaches at most N = 1000 * g.
    numbers = {int(url.rsplit("/", 1)[1]) for url in depths}
    assert max(numbers) == 5000 and len(rows) == len(depths)  # one row per page
    generation_one = {url for url, depth in depths.items() if depth == 1}
    assert {int(u.rsplit("/", 1)[1]) for u in generation_one} == {1, 2, 3, 17, 1000}
