"""Recipe loading and validation: every error names file, line and key."""

from __future__ import annotations

from pathlib import Path

import pytest

from scrapekit import RecipeError
from scrapekit.recipe import load_recipe
from scrapekit.units import parse_duration, parse_size


def write(tmp_path: Path, text: str, seeds: bool = True) -> Path:
    if seeds:
        (tmp_path / "urls.txt").write_text("http://127.0.0.1:1/x\n")
    path = tmp_path / "r.yaml"
    path.write_text(text)
    return path


def errors_of(path: Path) -> list[str]:
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    return str(info.value).splitlines()


@pytest.mark.parametrize(("text", "seconds"), [("500ms", 0.5), ("30s", 30), ("10m", 600), ("4h", 14400), ("1d", 86400), (12, 12.0), ("1.5h", 5400)])
def test_durations(text: object, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(("text", "size"), [("200KB", 200_000), ("10GB", 10**10), ("64KiB", 65536), (512, 512), ("1MiB", 1 << 20)])
def test_sizes(text: object, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("bad", ["30 parsecs", "-5s", "soon", True, [1]])
def test_bad_duration_says_what_is_expected(bad: object) -> None:
    with pytest.raises(ValueError, match="expected a duration"):
        parse_duration(bad)


def test_a_good_recipe_is_a_frozen_tree_with_defaults(tmp_path: Path) -> None:
    path = write(tmp_path, "source: {type: flat_file, path: urls.txt}\nfetch: {timeout: 5s, max_bytes: 1MB, concurrency: 4}\n")
    recipe = load_recipe(path)
    assert recipe.name == "r"
    assert recipe.source.options["path"] == (tmp_path / "urls.txt").resolve()
    assert recipe.fetch.type == "http" and recipe.fetch.options == {"timeout": 5.0, "max_bytes": 1_000_000}
    assert recipe.concurrency == 4
    assert recipe.queue.type == "leveldb"
    assert [s.type for s in recipe.stores] == ["chunked_tsv"]
    with pytest.raises(AttributeError):
        recipe.name = "other"  # type: ignore[misc]


def test_unknown_key_suggests_the_nearest(tmp_path: Path) -> None:
    path = write(tmp_path, "source:\n  type: flat_file\n  path: urls.txt\nfetch:\n  timeuot: 5s\n")
    (line,) = errors_of(path)
    assert line.startswith(f"{path}:5: fetch.timeuot: unknown key (did you mean 'timeout'?)")


def test_wrong_type_and_bad_duration_are_both_reported(tmp_path: Path) -> None:
    path = write(tmp_path, "source: {type: flat_file, path: urls.txt}\nfetch:\n  concurrency: many\n  timeout: soon\n")
    lines = errors_of(path)
    assert lines[0].startswith(f"{path}:3: fetch.concurrency: expected a whole number")
    assert lines[1].startswith(f"{path}:4: fetch.timeout: expected a duration like 500ms")


def test_unknown_part_lists_the_known_names(tmp_path: Path) -> None:
    path = write(tmp_path, "source: {type: flat_file, path: urls.txt}\nstore:\n  type: parquet\n")
    (line,) = errors_of(path)
    assert line.startswith(f"{path}:3: store.type: unknown store 'parquet'")
    assert "chunked_tsv, jsonl" in line


def test_missing_seed_file(tmp_path: Path) -> None:
    path = write(tmp_path, "source:\n  type: flat_file\n  path: nowhere.txt\n", seeds=False)
    (line,) = errors_of(path)
    assert line.startswith(f"{path}:3: source.path: file not found:")


def test_missing_source_and_missing_required_option(tmp_path: Path) -> None:
    assert errors_of(write(tmp_path, "fetch: {timeout: 1s}\n"))[0].endswith("source: required section is missing (e.g. source: {type: flat_file, path: urls.txt})")
    assert "source.path: required option of flat_file is missing" in errors_of(write(tmp_path, "source: {type: flat_file}\n"))[0]


def test_yaml_syntax_error_has_its_line(tmp_path: Path) -> None:
    path = write(tmp_path, "source:\n  type: flat_file\n  path: [urls.txt\n")
    (line,) = errors_of(path)
    assert line.startswith(f"{path}:") and ": yaml: " in line


@pytest.mark.parametrize(("text", "fragment"), [
    ("source: {type: flat_file, path: urls.txt}\nsource: {type: flat_file, path: urls.txt}\n", "2: source: duplicate key"),
    ("source: {type: flat_file, path: urls.txt}\nfetch: {user_agent: no}\n", "2: fetch.user_agent: expected a string, got false (YAML reads yes/no/on/off"),
    ("source: {type: flat_file, path: urls.txt}\nfetch: {concurrency: 010}\n", "2: fetch.concurrency: 010 reads as octal"),
    ("source: {type: flat_file, path: urls.txt}\npaginate: {type: pages}\n", "2: paginate.type: "),
    ("source: {type: flat_file, path: urls.txt}\npoliteness: {delay: soon}\n", "2: politeness.delay: "),
    ("source: {type: flat_file, path: urls.txt}\npoliteness: {per_domain: -1}\n", "2: politeness.per_domain: expected 0 (no limit) or more"),
    ("source: {type: flat_file, path: urls.txt}\npoliteness: {bandwidth: {dayly: 1GB}}\n", "2: politeness.bandwidth.dayly: unknown key (did you mean 'daily'?)"),
    ("source: {type: flat_file, path: urls.txt}\nlimits: {part_errors: lots}\n", "2: limits.part_errors: expected a count per duration like 10/1m"),
    ("source: {type: flat_file, path: urls.txt}\nfollow: {max_dept: 2}\n", "2: follow.max_dept: unknown key (did you mean 'max_depth'?)"),
    ("source: {type: flat_file, path: urls.txt}\nsource_x: 1\n", "2: source_x: unknown key (did you mean 'source'?)"),
    ("source: !!python/object/apply:os.system ['true']\n", ": yaml: "),
    ("source: {type: flat_file, path: urls.txt, kind: pages}\n", "1: source.kind: expected one of page, resource"),
    ("name: ../evil\nsource: {type: flat_file, path: urls.txt}\n", "1: name: '../evil' is not a usable name"),
])
def test_yaml_traps_are_errors(tmp_path: Path, text: str, fragment: str) -> None:
    lines = errors_of(write(tmp_path, text))
    assert any(fragment in line for line in lines), lines


def test_empty_file(tmp_path: Path) -> None:
    (line,) = errors_of(write(tmp_path, ""))
    assert "the file is empty" in line


def test_recipe_not_found(tmp_path: Path) -> None:
    with pytest.raises(RecipeError, match="nope.yaml:0: recipe: file not found"):
        load_recipe(tmp_path / "nope.yaml")


def test_store_list_and_backoff_table(tmp_path: Path) -> None:
    path = write(tmp_path, "source: {type: flat_file, path: urls.txt}\nfetch:\n  backoff: {503: 1m, 5xx: 3s}\n"
                 "store:\n  - {type: chunked_tsv, rotate: 1h, size: 10MB}\n  - {type: jsonl, records: items}\n")
    recipe = load_recipe(path)
    assert recipe.backoff["503"] == 60.0 and recipe.backoff["5xx"] == 3.0 and recipe.backoff["400"] == 5.0
    assert [(s.section, dict(s.options)) for s in recipe.stores] == [
        ("store[0]", {"rotate": 3600.0, "size": 10_000_000}), ("store[1]", {"records": "items"})]


def test_bad_backoff_key(tmp_path: Path) -> None:
    path = write(tmp_path, "source: {type: flat_file, path: urls.txt}\nfetch:\n  backoff: {teapot: 1s}\n")
    (line,) = errors_of(path)
    assert line.startswith(f"{path}:3: fetch.backoff.teapot: expected an HTTP status")


def test_politeness_section_obeys_robots_by_default(tmp_path: Path) -> None:
    assert not load_recipe(write(tmp_path, "source: {type: flat_file, path: urls.txt}\n")).robots
    assert load_recipe(write(tmp_path, "source: {type: flat_file, path: urls.txt}\npoliteness: {}\n")).robots
    recipe = load_recipe(write(tmp_path, "source: {type: flat_file, path: urls.txt}\npoliteness: {robots: false, robots_expiry: 1h}\n"))
    assert (recipe.robots, recipe.robots_expiry) == (False, 3600.0)


@pytest.mark.parametrize(("text", "fragment"), [
    ("paginate: {type: max_id, id_path: '$[['}\n", ":2: paginate: id_path: bad JSON path"),
    ("reschedule: {type: rate, target_items: 0}\n", ":2: reschedule: target_items must be 1 or more"),
    ("reschedule: {type: rate, min_delay: 1d, max_delay: 1h}\n", ":2: reschedule: expected 0 < min_delay <= max_delay"),
])
def test_bad_pagination_and_rescheduling_options_name_file_line_and_key(tmp_path: Path, text: str, fragment: str) -> None:
    from scrapekit.runner import build

    recipe = load_recipe(write(tmp_path, "source: {type: flat_file, path: urls.txt}\n" + text))
    spec = recipe.paginate or recipe.reschedule
    assert spec is not None
    with pytest.raises(RecipeError) as info:
        build(spec, recipe)
    assert fragment in str(info.value)
