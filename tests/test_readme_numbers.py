"""benchmarks.readme_numbers: README.md and docs/guides/benchmarks.md say what the committed result
files say, and a result that changes, a region that goes missing or a marker without a renderer is
caught."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import pytest

from benchmarks.readme_numbers import PAGES, REGIONS, Results, check, render_page
from llm_gym.errors import InvalidArgumentError

ROOT = Path(__file__).resolve().parents[1]


def test_the_pages_say_what_the_result_files_say() -> None:
    assert check() == []


def test_every_region_is_on_a_page_once() -> None:
    text = "\n".join((ROOT / page).read_text() for page in PAGES)
    assert all(text.count(f"<!-- numbers:{name} -->") == 1 for name in REGIONS)


@pytest.mark.parametrize(
    ("result", "path", "value", "region", "shown"),
    [
        ("main_job", ("test_split", "per_seed", 0, "sampled", "gain"), 0.5, "main_result",
         "**+0.500** [+0.378, +0.492]"),
        ("main_job", ("job", "total_minutes"), 14.4, "main_job_time", "about 14 min"),
        ("main_job", ("new_world", "over_seeds", "greedy", "seeds_with_interval_above_zero"), 2,
         "main_result_seeds", "intervals are above zero in 2 to 3 of 3 seeds"),
        ("leaderboard", ("records", 1, "success_rate"), 0.01, "environments",
         "| 1.000 | 0.010 |"),
        ("async", ("speedup_with_latency", "median"), 1.93, "async_with_latency",
         "1.93x [1.91, 2.23]"),
        ("async", ("speedup_with_latency", "median"), 1.93, "headlines",
         "1.93x [1.91, 2.23] lockstep's steps/hour"),
    ],
)  # fmt: skip
def test_a_changed_result_is_named_with_its_region(result, path, value, region, shown) -> None:
    results = Results()
    data = copy.deepcopy(results[result])
    node = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    results.read[result] = data
    problems = check(results=results)
    assert any(f"region {region!r}" in p and shown in p for p in problems), problems


def test_rewriting_restores_a_stale_page() -> None:
    page = (ROOT / "README.md").read_text()
    stale = page.replace("| **+0.435** [+0.378, +0.492] |", "| **+0.400** [+0.300, +0.500] |", 1)
    assert stale != page and render_page(stale, Results()) == page


def test_a_region_no_page_holds_is_reported(tmp_path) -> None:
    for page in PAGES:
        (tmp_path / page).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / page, tmp_path / page)
    readme = tmp_path / "README.md"
    readme.write_text(
        readme.read_text()
        .replace("<!-- numbers:main_job_time -->", "")
        .replace("<!-- /numbers:main_job_time -->", "")
    )
    problems = check(tmp_path, Results(ROOT / "benchmarks" / "results"))
    assert problems == ["no page has the region 'main_job_time'"]


def test_a_marker_without_a_renderer_is_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="region 'speed' has no renderer.*remove its"):
        render_page("x <!-- numbers:speed -->2x<!-- /numbers:speed --> y", Results(), "page.md")
