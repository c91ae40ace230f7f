"""``sft.source: sft_completion`` (trainers.pipeline.sft): document 002's SFT rows in train.py,
``env.start_episode(example, prompt_text) + env.sft_completion(example)``, refused before any
model work for an environment without them; and a document-002 TOML config run end to end."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from llm_gym.core.registry import as_env_entry, env_entry
from llm_gym.datasets import TaskExample
from llm_gym.environments import (
    EnvironmentMultiTurn,
    EnvironmentStepResult,
    MultiTurnEnvFactory,
    RewardResult,
)
from llm_gym.errors import InvalidArgumentError
from trainers.pipeline.config import PipelineConfig, SFTSettings

ROOT = Path(__file__).resolve().parents[1]

pytest.importorskip("datasets")


class EchoEnv(EnvironmentMultiTurn):
    """A document-002 environment with the default ``sft_completion`` (``example.output``)."""

    dataset = [
        {"input": "Look up 7.", "output": "<|im_start|>assistant\n<tool_call>7</tool_call>"
         "<|im_end|>\n<|im_start|>user\n<tool_result>49</tool_result><|im_end|>\n"
         "<|im_start|>assistant\n49<|im_end|>"},
        {"input": "Say hi.", "output": "hi"},
    ]  # fmt: skip

    def max_episode_turns(self, example: TaskExample) -> int:
        return 2

    def step_episode(self, example, messages, assistant_response) -> EnvironmentStepResult:
        return EnvironmentStepResult(done=True, final_response_text=assistant_response)

    def score_episode(self, example, episode) -> RewardResult:
        return RewardResult(score=0.0)


def _plain(messages: list[dict]) -> list[dict]:
    return [{"role": m["role"], "content": m["content"]} for m in messages]


def test_the_rows_are_start_episode_plus_sft_completion_from_example_output() -> None:
    from trainers.pipeline.sft import sft_completion_dataset

    entry = as_env_entry(MultiTurnEnvFactory(EchoEnv, prompt_text="Be brief."))
    tasks = entry.env_factory().tasks("train")
    rows = sft_completion_dataset(entry, tasks)
    assert _plain(rows[0]["messages"]) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Look up 7."},
        {"role": "assistant", "content": "<tool_call>7</tool_call>"},
        {"role": "user", "content": "<tool_result>49</tool_result>"},
        {"role": "assistant", "content": "49"},
    ]
    assert _plain(rows[1]["messages"])[1:] == [
        {"role": "user", "content": "Say hi."},
        {"role": "assistant", "content": "hi"},  # a scalar target: one assistant turn
    ]
    assert rows[0]["tools"] == "[]"  # the plain-text protocol declares no tool specs


def test_the_rows_follow_an_environments_own_sft_completion() -> None:
    from trainers.pipeline.sft import multi_turn_environment, sft_completion_dataset, sft_tasks

    entry = env_entry("Refund-v0")
    environment, prompt_text = multi_turn_environment(entry)
    tasks = sft_tasks(entry, 3, seed=0)
    rows = sft_completion_dataset(entry, tasks)
    assert len(rows) == 3
    for task, row in zip(tasks, rows, strict=True):
        example = TaskExample.coerce(task)
        expected = environment.start_episode(example, prompt_text)
        expected += environment.sft_completion(example)  # RefundEnv's: its oracle's transcript
        assert _plain(row["messages"]) == _plain(expected)
        assert [m["role"] for m in row["messages"]].count("assistant") >= 2
    assert json.loads(rows[0]["tools"]) == list(environment.tool_specs)


def test_sft_completion_refuses_an_environment_without_it_before_any_model_work() -> None:
    pytest.importorskip("trl")
    from trainers.pipeline.run import check_pipeline

    config = PipelineConfig(sft=SFTSettings(source="sft_completion"))
    with pytest.raises(InvalidArgumentError) as info:
        check_pipeline(config)  # what run_pipeline checks first; ToolUseGame-v0 is an Env
    text = str(info.value)
    assert "ToolUseGame-v0 is not one" in text and "set sft.source to 'oracle'" in text


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("oracle", "llm_gym.envs.tool_use_game:HastyOracle"),
        ("oracle_options", {"guess_rate": 0.5}),
        ("short_context_oracle", "llm_gym.envs.refund:oracle_action"),
        ("short_context_oracle_options", {}),
    ],
)
def test_a_demonstrator_beside_sft_completion_is_refused(field: str, value: object) -> None:
    from trainers.pipeline.sft import check_sft_source

    refund = env_entry("Refund-v0")
    check_sft_source(SFTSettings(source="sft_completion"), refund)
    check_sft_source(SFTSettings(**{field: value}), refund)  # the oracle source takes them
    with pytest.raises(InvalidArgumentError, match=f"sft.{field} sets a demonstrator"):
        check_sft_source(SFTSettings(source="sft_completion", **{field: value}), refund)
    with pytest.raises(InvalidArgumentError, match="sft.source must be 'oracle', 'sft_completion'"):
        SFTSettings(source="completion")


@pytest.mark.slow
def test_train_py_runs_a_document_002_toml_config_end_to_end(small_model_dir, tmp_path) -> None:
    pytest.importorskip("trl")
    spec = importlib.util.spec_from_file_location("train_script", ROOT / "train.py")
    train_script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train_script)
    out = tmp_path / "out"
    overrides = {
        "model": str(small_model_dir), "output_dir": str(out), "val_tasks": 0,
        "train.group_size": 2, "train.max_completion_tokens": 8,
        "sft.episodes": 8, "sft.batch_size": 4, "sft.max_steps": 2, "sft.warmup_steps": 0,
        "grpo.batch_size": 2, "grpo.num_steps": 1, "grpo.max_turns": 2,
        "evaluation.episodes": 2, "evaluation.max_new_tokens": 8,
    }  # fmt: skip
    argv = ["--config", str(ROOT / "configs" / "flash_example.toml")]
    argv += ["--set", *(f"{key}={value}" for key, value in overrides.items())]
    summary = train_script.main(argv)
    assert summary["env"] == "Refund-v0" and summary["start_model"].endswith("sft")
    assert (out / "final").is_dir() and (out / "summary.json").exists()
