"""benchmarks.suite_tiny without a model: the unit costs read from a probe run's files and the
report's rows at zero, on hand-made outputs."""

from __future__ import annotations

import json

import pytest

from benchmarks.common import Conditions
from benchmarks.suite_tiny import estimate_seconds, report, unit_costs


def test_unit_costs_come_from_the_probes_files_by_hand(tmp_path) -> None:
    for phase, seconds, steps in (("sft_short_context", 12.0, 24), ("sft", 6.0, 4)):
        (tmp_path / phase).mkdir()
        info = {"train_seconds": seconds, "steps": steps}
        (tmp_path / phase / "sft_info.json").write_text(json.dumps(info))
    summary = {
        "envs": {"a": {}, "b": {}},
        "sft_seconds": 20.0,  # 18 s of training: 2 s for 100 demonstrations
        "grpo_seconds": 30.0,
        "evaluation_seconds": {"after-sft": 4.0, "after-grpo": 4.0},
        "build_seconds": 1.5,
    }
    recipe = {"episodes": 100, "short_steps": 24, "full_steps": 4, "grpo_steps": 2,
              "eval_episodes": 4}  # fmt: skip
    costs = unit_costs(summary, tmp_path, recipe)
    assert costs == pytest.approx({
        "demonstration": 0.02, "short_step": 0.5, "full_step": 1.5, "grpo_step": 15.0,
        "eval_episode": 0.5,  # 8 s over 2 evaluations x 2 envs x 4 episodes
        "build": 1.5,
    })  # fmt: skip
    # the probe's own recipe is estimated back to its measured seconds (build aside)
    assert estimate_seconds(costs, recipe, envs=2)["total"] == pytest.approx(20 + 30 + 8)


def test_the_report_names_the_rows_that_stay_at_zero() -> None:
    conditions = Conditions.start("suite_tiny", threads={"torch_threads": 1}).finish()
    rate = {"a/after-sft": 0.5, "a/after-grpo": 0.0, "b/after-sft": 0.0, "b/after-grpo": 0.0}
    summary = {
        "envs": {"a": {"weight": 2}, "b": {"weight": 1}},
        "sft_rows": {"a": 4, "b": 2},
        "sft_seconds": 10.0,
        "grpo_seconds": 5.0,
        "evaluation_seconds": {"after-sft": 1.0, "after-grpo": 1.0},
        "total_seconds": 120.0,
        "evaluation": {k: {"success_rate": v, "success_ci": [0, 1]} for k, v in rate.items()},
    }
    result = {"conditions": conditions.as_json(), "config": "configs/suite_tiny.yaml",
              "summary": summary, "table": "# title\n\n| environment |\n"}  # fmt: skip
    text = report(result)
    assert "Stays at 0.000 after SFT and after GRPO: b." in text
    assert "**2.0 min** in all" in text and "SFT rows by environment: a 4, b 2" in text


def test_the_report_shows_validation_and_the_kept_step() -> None:
    conditions = Conditions.start("suite_tiny", threads={"torch_threads": 1}).finish()
    history = [
        {"step": 0, "env": "a", "success_rate": 0.5}, {"step": 0, "env": "b", "success_rate": 0.0},
        {"step": 5, "env": "a", "success_rate": 1.0},  # b not validated: no mean
        {"step": 10, "env": "a", "success_rate": 0.5},
        {"step": 10, "env": "b", "success_rate": 0.5},
    ]  # fmt: skip
    summary = {
        "envs": {"a": {"weight": 2}, "b": {"weight": 1}}, "sft_rows": {}, "grpo_seconds": 5.0,
        "evaluation_seconds": {}, "total_seconds": 60.0, "evaluation": {},
        "validation_history": history,
        "best_point": {"metric": "val/success_rate", "step": 10, "value": 0.5, "final_step": 10,
                       "final_value": 0.5},
    }  # fmt: skip
    result = {"conditions": conditions.as_json(), "config": "configs/suite_tiny.yaml",
              "summary": summary, "table": "# title\n\n| environment |\n"}  # fmt: skip
    text = report(result)
    assert "| 0 | 0.500 | 0.000 | 0.250 |" in text
    assert "| 5 | 1.000 |  |  |" in text
    assert "| 10 | 0.500 | 0.500 | **0.500** (kept) |" in text
    assert "holds the weights of step 10" in text


def test_the_tuning_table_ranks_each_runs_best_point_and_skips_a_recorded_run(tmp_path) -> None:
    import json

    from benchmarks.suite_tiny_tuning import main, parse_overrides, run_key

    points = [
        {"step": 0, "success": {"a": 0.5, "b": 0.0}, "mean": 0.25},
        {"step": 5, "success": {"a": 1.0}, "mean": None},
        {"step": 10, "success": {"a": 0.5, "b": 0.5}, "mean": 0.5},
        {"step": 20, "success": {"a": 0.5, "b": 0.5}, "mean": 0.5},
    ]
    overrides = parse_overrides(["grpo.learning_rate=2e-5"])
    key = run_key(overrides, "0123456789ab")
    record = {"overrides": overrides, "curve": points, "best_point": None, "grpo_seconds": 60.0}
    (tmp_path / "suite_tiny_tuning.json").write_text(json.dumps({"runs": {key: record}}))
    main(["--render", "--out-dir", str(tmp_path)])
    text = (tmp_path / "suite_tiny_tuning.md").read_text()
    assert "| grpo.learning_rate=2e-05 | 0.500 (10) | 0.500 (20) |" in text  # ties: earliest
    assert "| 5 | 1.000 |  |  |" in text
    with pytest.raises(SystemExit, match="KEY=VALUE"):
        parse_overrides(["grpo.learning_rate"])
