"""The docstring examples of the pure modules run as tests."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "llm_gym.errors",
    "llm_gym.serving.responses_protocol",
    "trainers.wandb_setup",
    "trainers.sft.command",
    "trainers.sft.settings",
    "benchmarks.agent_training",
    "benchmarks.before_after",
    "benchmarks.readme_numbers",
    "benchmarks.suite_tiny",
    "benchmarks.suite_tiny_tuning",
    "llm_gym.core.factories",
    "llm_gym.core.references",
    "llm_gym.core.input_files",
    "llm_gym.core.registry",
    "llm_gym.policies.registry",
    "llm_gym.policies.kv_budget",
    "llm_gym.policies.openai_reply",
    "llm_gym.policies.template_history",
    "llm_gym.rollout.episode",
    "llm_gym.rollout.records",
    "llm_gym.eval.metrics",
    "llm_gym.eval.episode_records",
    "llm_gym.core.tool",
    "llm_gym.gym.spaces",
    "llm_gym.core.env",
    "llm_gym.core.task",
    "llm_gym.core.text",
    "llm_gym.core.tool_env",
    "llm_gym.envs.code.grading",
    "llm_gym.environments.multi_turn",
    "llm_gym.environments.records",
    "llm_gym.environments.replay",
    "llm_gym.envs.guess_number.env",
    "llm_gym.envs.tool_use_game.demonstrators",
    "llm_gym.envs.wordle.env",
    "llm_gym.envs.wordle.rules",
    "llm_gym.envs.wordle.solver",
    "llm_gym.envs.refund.api",
    "llm_gym.envs.refund.protocol",
    "llm_gym.envs.refund.reward",
    "llm_gym.envs.refund.tasks",
    "llm_gym.envs.refund.world",
    "llm_gym.envs.sql.database",
    "llm_gym.envs.sql.expansion",
    "llm_gym.scaffold",
]
# Not here: the registration modules' examples register ids as a side effect.


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name))
    assert result.failed == 0 and result.attempted > 0


@pytest.mark.parametrize(
    "name",
    [
        "trainers.grpo.advantages",
        "trainers.grpo.batch",
        "trainers.grpo.best_point",
        "trainers.grpo.checkpoints",
        "trainers.grpo.health",
        "trainers.grpo.length_chunks",
        "trainers.mixture.sft",
        "trainers.grpo.metrics",
        "trainers.grpo.shared_prefix",
        "trainers.pipeline.config",
        "trainers.pipeline.run",
        "trainers.pipeline.eval",
        "trainers.pipeline.train_table",
        "llm_gym.policies.loading",
    ],
)
def test_trainer_examples(name: str) -> None:
    pytest.importorskip("trl")
    result = doctest.testmod(importlib.import_module(name))
    assert result.failed == 0 and result.attempted > 0
