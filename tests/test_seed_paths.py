"""The seeds' training code runs with ``post_training_cookbook`` replaced by ``llm_gym`` or
``trainers`` and nothing else changed: ``trainers.grpo.config.GRPOConfig``,
``trainers.grpo.train.train_multi_turn`` and ``llm_gym.envs.tool_use_game`` are real paths.

The blocks below are document 001's training example and async config, verbatim but for the
package name. ``train_multi_turn`` is replaced by a recorder before the block runs (the example
names a 27B model), so the test checks what the block builds and hands over, not a training run
(``tests/test_async_slow.py`` trains the seeds' async config).
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("trl")

import trainers.grpo.train

SEEDS = Path(__file__).resolve().parents[2] / "shared" / "seeds"

TRAINING_EXAMPLE = """\
from post_training_cookbook.envs.tool_use_game import (
    TOOL_USE_GAME_TASKS,
    ToolUseGameEnv,
)
from post_training_cookbook.grpo.config import GRPOConfig
from post_training_cookbook.grpo.train import train_multi_turn

tasks = list(TOOL_USE_GAME_TASKS)

config = GRPOConfig(
    model="Qwen/Qwen3.8-27B",
    batch_size=4,
    episodes_per_task=8,
    num_steps=200,
    validation_interval=10,
    max_turns=6,
    max_model_length=2048,
    learning_rate=2e-5,
    wandb_project="grpo-tool-use-game",
    sequential_validation=True,
    max_sampling_attempts=2,
)

train_multi_turn(
    config,
    tasks=tasks,
    env_factory=lambda task: ToolUseGameEnv(),
    val_tasks=tasks,
)
"""

ASYNC_CONFIG = """\
from post_training_cookbook.grpo.config import GRPOConfig

config = GRPOConfig(
    model="Qwen/Qwen3.6-35B-A3B",
    max_turns=6,
    batch_size=4,
    episodes_per_task=8,
    max_steps_off_policy=1,
    groups_in_flight=8,
    num_generator_replicas=2,
)
"""


def ported(code: str) -> str:
    """The seeds' code here: the envs from ``llm_gym``, the trainer from ``trainers``."""
    return code.replace("post_training_cookbook.envs", "llm_gym.envs").replace(
        "post_training_cookbook.grpo", "trainers.grpo"
    )


@pytest.fixture
def calls(monkeypatch, tmp_path) -> list[tuple[tuple, dict]]:
    monkeypatch.chdir(tmp_path)  # the config's default output_dir
    monkeypatch.setenv("WANDB_MODE", "offline")
    recorded: list[tuple[tuple, dict]] = []
    monkeypatch.setattr(
        trainers.grpo.train, "train_multi_turn", lambda *a, **k: recorded.append((a, k))
    )
    return recorded


def test_the_training_example_builds_its_config_and_hands_it_over(calls) -> None:
    from llm_gym.envs.tool_use_game import ToolUseGameEnv
    from trainers import MultiTurnGRPOConfig

    namespace: dict = {}
    exec(compile(ported(TRAINING_EXAMPLE), "training_example", "exec"), namespace)

    [(args, kwargs)] = calls
    config = args[0]
    assert isinstance(config, MultiTurnGRPOConfig)
    assert config.model == "Qwen/Qwen3.8-27B" and config.max_turns == 6
    assert (config.batch_size, config.episodes_per_task, config.num_steps) == (4, 8, 200)
    assert config.max_sampling_attempts == 2 and config.sequential_validation
    assert len(kwargs["tasks"]) == len(kwargs["val_tasks"]) == 1000
    assert isinstance(kwargs["env_factory"](kwargs["tasks"][0]), ToolUseGameEnv)


def test_the_async_config_is_read_at_the_seeds_path(calls) -> None:
    from trainers import WeightSyncType

    namespace: dict = {}
    exec(compile(ported(ASYNC_CONFIG), "async_config", "exec"), namespace)
    config = namespace["config"]
    assert config.is_async and config.resolved_groups_in_flight == 8
    assert config.weight_sync_type == WeightSyncType.SYNCHRONOUS.value


def test_the_seeds_paths_are_the_public_names() -> None:
    import trainers
    import trainers.grpo.config

    assert trainers.grpo.config.GRPOConfig is trainers.GRPOConfig
    assert trainers.grpo.train.train_multi_turn is trainers.train_multi_turn


@pytest.mark.skipif(not SEEDS.is_dir(), reason="the seed documents sit beside the checkout")
@pytest.mark.parametrize("block", [TRAINING_EXAMPLE, ASYNC_CONFIG], ids=["training", "async"])
def test_the_blocks_are_the_seeds_verbatim(block: str) -> None:
    document = (SEEDS / "001_1e7c3bdf2fc1f1f3.txt").read_text()
    assert block in document
