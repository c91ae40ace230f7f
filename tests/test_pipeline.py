"""train.py's pipeline: the held-out comparison math, config checks, and a run end to end."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace as NS

import pytest

from llm_gym.core.registry import env_entry
from llm_gym.errors import InvalidArgumentError
from trainers.pipeline.config import EvalSettings, PipelineConfig, load_config
from trainers.pipeline.eval import paired_gain, task_success

ROOT = Path(__file__).resolve().parents[1]


def _episode(prompt: str, success: bool) -> NS:
    return NS(task=NS(id=None, prompt=prompt), reward=float(success), metrics={})


def _report(outcomes: dict[str, list[int]]) -> NS:
    return NS(episodes=[_episode(t, bool(o)) for t, values in outcomes.items() for o in values])


def test_task_success_averages_each_tasks_samples() -> None:
    report = _report({"a": [1, 0, 1, 1], "b": [0, 0, 0, 0], "c": [1]})
    assert task_success(report.episodes) == {"a": 0.75, "b": 0.0, "c": 1.0}


def test_paired_gain_pairs_by_task_with_hand_computed_interval() -> None:
    before = _report({"a": [1, 0], "b": [0, 0], "c": [1, 1]})
    after = _report({"a": [1, 1], "b": [1, 0], "c": [1, 0], "d": [1, 1]})  # d: after only
    result = paired_gain(before, after)
    # per-task differences +0.5, +0.5, -0.5: mean 1/6, sample variance 1/3, SE 1/3
    assert result["tasks"] == 3
    assert result["episodes"] == 6  # d's two episodes have no partner
    assert result["success_before"] == pytest.approx(0.5)
    assert result["success_after"] == pytest.approx(2 / 3)
    assert result["gain"] == pytest.approx(1 / 6)
    half = 1.959964 / 3
    assert result["gain_ci"] == pytest.approx([1 / 6 - half, 1 / 6 + half])
    assert result["gain_significant"] is False


@pytest.mark.parametrize(
    ("field", "value"), [("episodes", 0), ("samples", -1), ("samples", 2.5), ("episodes", "200")]
)
def test_eval_settings_refuse_bad_values(field: str, value: object) -> None:
    with pytest.raises(InvalidArgumentError, match=f"evaluation.{field} must be"):
        EvalSettings(**{field: value})


CONFIGS = sorted(p.name for p in (ROOT / "configs").iterdir() if p.suffix in (".yaml", ".toml"))
ASYNC_FIELDS = ("max_steps_off_policy", "groups_in_flight", "weight_sync_type")


@pytest.mark.parametrize("name", CONFIGS)
def test_every_shipped_config_loads_and_builds_its_grpo_config(name: str, tmp_path) -> None:
    pytest.importorskip("trl")
    import dataclasses

    from trainers.pipeline.run import build_grpo_config

    config = load_config(ROOT / "configs" / name)
    assert config.grpo["episodes_per_task"] >= 2
    assert isinstance(config.grpo["learning_rate"], float)
    # train.py's own GRPOConfig, on CPU (bf16 GPU configs too); no model loads
    config = dataclasses.replace(config, output_dir=str(tmp_path))
    grpo = build_grpo_config(config, config.model, max_turns=None, use_cpu=True)
    assert grpo.max_steps == config.grpo["num_steps"] and grpo.max_turns is not None
    assert grpo.is_async == name.endswith("_async.yaml")
    for field in ASYNC_FIELDS:  # passed through as written
        if field in config.grpo:
            assert getattr(grpo, field) == config.grpo[field]


@pytest.mark.parametrize("name", [n for n in CONFIGS if n.endswith("_async.yaml")])
def test_each_async_config_is_its_lockstep_config_plus_the_async_fields(name: str) -> None:
    pytest.importorskip("trl")
    from trainers import WeightSyncType

    async_config = load_config(ROOT / "configs" / name)
    lockstep = load_config(ROOT / "configs" / name.replace("_async", ""))
    grpo = dict(async_config.grpo)
    assert grpo["max_steps_off_policy"] == 1
    assert grpo["groups_in_flight"] == 2 * grpo["batch_size"]
    assert WeightSyncType(grpo["weight_sync_type"]) is WeightSyncType.PIPELINE
    for field in ASYNC_FIELDS:
        del grpo[field]
    assert grpo == lockstep.grpo
    assert async_config.output_dir == lockstep.output_dir + "_async"
    rest = {"grpo", "output_dir"}
    assert {k: v for k, v in vars(async_config).items() if k not in rest} == {
        k: v for k, v in vars(lockstep).items() if k not in rest
    }


def test_there_is_an_async_recipe_for_the_main_job_and_the_qwen_gpu_config() -> None:
    assert {"tool_use_game_tiny_async.yaml", "tool_use_game_qwen_async.yaml"} <= set(CONFIGS)


def test_paired_gain_refuses_runs_without_a_common_task() -> None:
    with pytest.raises(InvalidArgumentError, match="share no task"):
        paired_gain(_report({"a": [1]}), _report({"b": [0]}))


def test_the_main_job_evaluates_sampled_too() -> None:
    config = load_config(ROOT / "configs" / "tool_use_game_tiny.yaml")
    assert config.evaluation is not None and config.evaluation.samples == 4


def test_the_main_job_keeps_its_best_validation_point() -> None:
    config = load_config(ROOT / "configs" / "tool_use_game_tiny.yaml")
    assert config.grpo["keep_best"] == "val/success_rate" and config.val_tasks > 0


@pytest.mark.parametrize(
    "overrides",
    [
        {"val_tasks": 0},
        {"val_tasks": 0, "envs": [{"id": "GuessNumber-v0"}, {"id": "Math-v0"}]},
        {"envs": [{"id": "GuessNumber-v0", "val_tasks": 0}, {"id": "Math-v0", "val_tasks": 0}]},
    ],
)
def test_keep_best_without_validation_tasks_is_refused_before_model_work(
    overrides, tmp_path
) -> None:
    from trainers.pipeline.run import check_pipeline

    config = load_config(
        ROOT / "configs" / "tool_use_game_tiny.yaml", {**overrides, "output_dir": str(tmp_path)}
    )
    needs = "grpo.keep_best chooses.*needs validation tasks.*set grpo.keep_best"
    with pytest.raises(InvalidArgumentError, match=needs):
        check_pipeline(config)


@pytest.mark.parametrize(
    "envs",
    [
        [{"id": "GuessNumber-v0"}, {"id": "Math-v0"}],  # the config's val_tasks
        [{"id": "GuessNumber-v0", "val_tasks": 4}, {"id": "Math-v0", "val_tasks": 0}],
    ],
)
def test_keep_best_with_a_mixture_that_validates_passes_the_checks(envs, tmp_path) -> None:
    from trainers.pipeline.run import check_pipeline

    overrides = {
        "envs": envs, "val_tasks": 0 if envs[0].get("val_tasks") else 8,
        "grpo.validation_interval": 5, "grpo.keep_best": "val/success_rate",
        "output_dir": str(tmp_path),
    }  # fmt: skip
    config = load_config(ROOT / "configs" / "suite_tiny.yaml", overrides)
    check_pipeline(config)


@pytest.mark.parametrize("samples", [0, 2])
def test_pipeline_runs_end_to_end(small_model_dir, tmp_path, samples: int) -> None:
    pytest.importorskip("trl")
    from trainers.pipeline.run import run_pipeline

    path = tmp_path / "job.yaml"
    path.write_text(
        f"""
env: ToolUseGame-v0
model: {small_model_dir}
output_dir: {tmp_path / "out"}
val_tasks: 1
grpo:
  batch_size: 2
  episodes_per_task: 2
  num_steps: 1
  max_turns: 2
  max_model_length: 1024
  max_tokens_per_turn: 8
  learning_rate: 1.0e-4
  validation_interval: 1
  keep_best: val/success_rate
  report_to: none
  save_strategy: "no"
evaluation:
  episodes: 3
  samples: {samples}
  max_new_tokens: 8
"""
    )
    summary = run_pipeline(load_config(path))
    evaluation = summary["evaluation"]
    assert evaluation["greedy"]["tasks"] == 3 and evaluation["greedy"]["episodes"] == 3
    out = tmp_path / "out"
    assert (out / "reward_curve.png").exists() and (out / "eval_before_grpo.json").exists()
    assert json.loads((out / "summary.json").read_text())["evaluation"]["split"] == "val"
    # the run report, and what it reads: the step log, the config, the episodes
    assert (out / "report.html").exists() and (out / "config.json").exists()
    assert summary["health"] == []  # nothing fired in one step
    precision = summary["precision"]  # dtype="auto": the choice and why (the probe's times)
    assert precision["reason"].startswith("auto on a") and precision["sampling"] in (
        "float32", "bfloat16")  # fmt: skip
    from llm_gym.eval.run_report import load_run

    run = load_run(out)
    assert [r["step"] for r in run["steps"] if "reward" in r] == [1]
    # keep_best: the point kept (of steps 0 and 1) in the summary, the step log and the report
    kept = run["summary"]["best_point"]
    assert kept["metric"] == "val/success_rate" and kept["final_step"] == 1
    assert kept == summary["best_point"] and kept["step"] in (0, 1)
    assert [r["best/step"] for r in run["steps"] if "best/step" in r] == [kept["step"]]
    after = run["episodes"]["after_grpo"]
    assert after["total"] == 3 and len(run["evaluations"]) == (2 if samples == 0 else 4)
    spans = [span for e in after["shown"] for sample in e["samples"] for span in sample]
    assert 1 in {mask for _, mask in spans} <= {0, 1}  # the sampled tokens, decoded, by mask
    if samples == 0:
        assert "sampled" not in evaluation
        assert not (out / "eval_after_grpo_sampled.json").exists()
        return
    assert evaluation["sampled"]["tasks"] == 3 and evaluation["sampled"]["episodes"] == 6
    assert evaluation["sampled"]["samples_per_task"] == 2
    # each run covers the 3 tasks, the sampled ones twice each
    records = [
        json.loads((out / f"eval_{when}_grpo{mode}.json").read_text())
        for when in ("before", "after")
        for mode in ("", "_sampled")
    ]
    assert [r["k"] for r in records] == [1, 2, 1, 2]
    assert [r["tasks"] for r in records] == [3, 3, 3, 3]


def test_pipeline_trains_on_varied_worlds_and_reports_a_new_world(
    small_model_dir, tmp_path
) -> None:
    pytest.importorskip("trl")
    from trainers.pipeline.run import run_pipeline
    from trainers.pipeline.sft import sft_tasks

    path = tmp_path / "job.yaml"
    path.write_text(
        f"""
env: ToolUseGame-v0
model: {small_model_dir}
output_dir: {tmp_path / "out"}
val_tasks: 0
task_options: {{world_seed: varied}}
task_repeats: {{lookup: 3}}
sft:
  episodes: 16
  batch_size: 4
  max_steps: 1
  short_context_steps: 1
  short_context_oracle: llm_gym.envs.tool_use_game:oracle_action
  oracle: llm_gym.envs.tool_use_game:HastyOracle
  oracle_options: {{guess_rate: 0.5}}
  only_successful: false
grpo:
  batch_size: 2
  episodes_per_task: 2
  num_steps: 1
  max_turns: 2
  max_model_length: 1024
  max_tokens_per_turn: 8
  report_to: none
  save_strategy: "no"
evaluation:
  episodes: 2
  samples: 2
  split: test
  max_new_tokens: 8
  variants: {{new_world: {{world_seed: 1}}}}
"""
    )
    config = load_config(path)
    sft_tasks = sft_tasks(env_entry("ToolUseGame-v0"), 16, 0, config.task_options)
    assert len({t.metadata["world_seed"] for t in sft_tasks}) == 16
    summary = run_pipeline(config)
    kinds = [t.metadata["type"] for t in env_entry("ToolUseGame-v0").tasks("train")]
    assert summary["grpo_tasks"] == len(kinds) + 2 * kinds.count("lookup")
    variant = summary["evaluation"]["variants"]["new_world"]
    assert variant["task_options"] == {"world_seed": 1}
    assert variant["greedy"]["tasks"] == 2 and variant["sampled"]["episodes"] == 4
    report = json.loads((tmp_path / "out" / "eval_after_grpo_new_world.json").read_text())
    assert report["split"] == "test"
    assert summary["evaluation"]["greedy"]["tasks"] == 2
    assert set(summary["evaluation_seconds"]) == {"before", "after"}
    assert all(s > 0 for s in summary["evaluation_seconds"].values())
    assert (
        summary["total_seconds"] > summary["grpo_seconds"] + summary["evaluation_seconds"]["after"]
    )


def test_heldout_task_options_reach_validation_and_evaluation(
    small_model_dir, tmp_path, monkeypatch
) -> None:
    """A recipe narrowed by task options is validated and evaluated on the same narrowing."""
    pytest.importorskip("trl")
    pytest.importorskip("reasoning_gym")
    from trainers.pipeline import run as pipeline_run

    narrow = {"config": {"max_terms": 2, "max_digits": 2}}
    wide = {"config": {"max_terms": 3, "max_digits": 2}}
    config = PipelineConfig(
        env="RG-ChainSum-v0",
        model=str(small_model_dir),
        output_dir=str(tmp_path / "out"),
        val_tasks=2,
        task_options=narrow,
        heldout_task_options=narrow,
        grpo={"batch_size": 2, "episodes_per_task": 2, "num_steps": 1, "max_turns": 1,
              "max_tokens_per_turn": 4, "report_to": "none", "save_strategy": "no",
              "validation_interval": 1},
        evaluation=EvalSettings(episodes=2, split="test", max_new_tokens=4,
                                variants={"wide": wide}),
    )  # fmt: skip
    seen: dict[str, list] = {}
    evaluate_model = pipeline_run.evaluate_model

    def recording(path, entry, settings, *, label, tasks=None, **kwargs):
        seen[label] = list(tasks or [])
        return evaluate_model(path, entry, settings, label=label, tasks=tasks, **kwargs)

    import trainers

    real_train = trainers.train_multi_turn

    def recording_train(config, **kwargs):
        seen["val"] = list(kwargs["val_tasks"])
        return real_train(config, **kwargs)

    monkeypatch.setattr(pipeline_run, "evaluate_model", recording)
    monkeypatch.setattr(trainers, "train_multi_turn", recording_train)
    pipeline_run.run_pipeline(config)
    entry = env_entry("RG-ChainSum-v0")

    def prompts(tasks):
        return [t.prompt for t in tasks]

    assert prompts(seen["val"]) == prompts(entry.tasks("val", **narrow)[:2])
    assert prompts(seen["before_grpo"]) == prompts(entry.tasks("test", **narrow))
    assert prompts(seen["after_grpo_wide"]) == prompts(entry.tasks("test", **wide))
    for task in seen["before_grpo"] + seen["val"]:
        assert task.metadata["config"] == narrow["config"]


def test_sft_tasks_can_ask_each_question_in_several_worlds() -> None:
    from trainers.pipeline.sft import sft_tasks

    entry = env_entry("ToolUseGame-v0")
    tasks = sft_tasks(entry, 16, 0, {"world_seed": "varied"}, {"worlds_per_question": 4})
    assert len(tasks) == 16 and len({t.prompt for t in tasks}) == 4
    assert len({(t.prompt, t.metadata["world_seed"]) for t in tasks}) == 16
    held_out = {t.prompt for split in ("train", "val", "test") for t in entry.tasks(split)}
    assert not held_out & {t.prompt for t in tasks}
    with pytest.raises(InvalidArgumentError, match="needs a task generator"):
        sft_tasks(env_entry("RG-ChainSum-v0"), 4, 0, None, {"worlds_per_question": 4})


def test_config_refuses_bad_variants_and_an_unknowndemonstrator(tmp_path) -> None:
    with pytest.raises(InvalidArgumentError, match="evaluation.variants must map"):
        EvalSettings(variants={"new_world": 1})
    with pytest.raises(InvalidArgumentError, match="task_options must be a mapping"):
        PipelineConfig(task_options=["world_seed"])
    from llm_gym.core.factories import resolve

    with pytest.raises(InvalidArgumentError, match="has no attribute 'nope'"):
        resolve("llm_gym.envs.tool_use_game:nope")
    from trainers.pipeline.sft import demonstrator

    with pytest.raises(InvalidArgumentError, match="options need the demonstrator"):
        demonstrator(None, {"guess_rate": 0.5}, resolve)
    hasty = demonstrator("llm_gym.envs.tool_use_game:HastyOracle", {"guess_rate": 0.5}, resolve)
    assert hasty.guess_rate == 0.5
    with pytest.raises(InvalidArgumentError, match="guess_rate must be a number in"):
        demonstrator("llm_gym.envs.tool_use_game:HastyOracle", {"guess_rate": 2}, resolve)


def test_repeat_by_kind_repeats_the_named_kinds_in_place() -> None:
    from llm_gym import Task
    from trainers.pipeline.run import repeat_by_kind

    tasks = [
        Task(prompt="a", metadata={"type": "lookup"}),
        Task(prompt="b", metadata={"type": "compare"}),
        Task(prompt="c"),  # no kind: once
        Task(prompt="d", metadata={"type": ["not", "hashable"]}),  # not a kind: once
        Task(prompt="e", metadata={"type": "lookup"}),
    ]
    assert [t.prompt for t in repeat_by_kind(tasks, {})] == ["a", "b", "c", "d", "e"]
    repeated = repeat_by_kind(tasks, {"lookup": 3, "compare": 1})
    assert [t.prompt for t in repeated] == ["a", "a", "a", "b", "c", "d", "e", "e", "e"]
    with pytest.raises(InvalidArgumentError, match=r"names kind\(s\) \['lookups'\].*'compare'"):
        repeat_by_kind(tasks, {"lookups": 2})


@pytest.mark.parametrize("value", [{"lookup": 0}, {"lookup": True}, {"lookup": 2.0}, {1: 2}, [1]])
def test_config_refuses_bad_task_repeats(value: object) -> None:
    with pytest.raises(InvalidArgumentError, match="task_repeats must map task kinds"):
        PipelineConfig(task_repeats=value)  # type: ignore[arg-type]


def test_a_task_repeats_naming_no_kind_fails_before_any_training(tmp_path) -> None:
    from trainers.pipeline.run import run_pipeline

    config = PipelineConfig(output_dir=str(tmp_path / "out"), task_repeats={"lookups": 4})
    with pytest.raises(InvalidArgumentError, match="'lookup_arith'"):
        run_pipeline(config)
    assert list((tmp_path / "out").iterdir()) == []  # no model built, nothing trained


def test_train_py_keeps_every_set_override() -> None:
    """``--set a=1 --set b=2`` keeps both (argparse's default kept only the last ``--set``)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("train_script", ROOT / "train.py")
    train_script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train_script)
    args = train_script.parse_args(
        ["--config", "c.yaml", "--set", "output_dir=/x", "--set", "a=1", "b=2"]
    )
    assert args.set == ["output_dir=/x", "a=1", "b=2"]


def test_the_pipeline_names_a_grpo_typo_before_any_model_work(tmp_path) -> None:
    pytest.importorskip("trl")
    from trainers.pipeline.run import build_grpo_config

    config = PipelineConfig(output_dir=str(tmp_path), grpo={"max_turnz": 3})
    with pytest.raises(InvalidArgumentError, match="Did you mean 'max_turns'"):
        build_grpo_config(config, "tiny", max_turns=3, use_cpu=True)
    config = PipelineConfig(output_dir=str(tmp_path), grpo={"output_dir": "x"})
    with pytest.raises(InvalidArgumentError, match="grpo may not set"):
        build_grpo_config(config, "tiny", max_turns=3, use_cpu=True)
    source = (Path(__file__).parents[1] / "trainers" / "pipeline" / "run.py").read_text()
    early = source.index("build_grpo_config(config, config.model")
    assert early < source.index("build_tiny_model(")  # checked before the model is built
