"""Generation deadlines (document 002): a turn that misses its deadline is aborted and retried
once; timed-out output never reaches the environment; a second miss ends the episode as
``DEADLINE`` and the collection goes on."""

from __future__ import annotations

import asyncio

import pytest

from llm_gym.core.env import TruncationCause
from llm_gym.envs.tool_use_game import ToolUseGameEnv, get_tasks
from llm_gym.policies import Generation, Policy
from llm_gym.rollout import collect_groups
from llm_gym.rollout.loop import generation_deadline

TASK = get_tasks("val")[0]


class Stalling(Policy):
    """Answers ``answer``; the calls whose index is in ``stall`` never finish in time."""

    name = "stalling"

    def __init__(self, stall: set[int], answer: str = "12") -> None:
        self.stall, self.answer, self.calls = stall, answer, 0

    async def act(self, requests):
        index, self.calls = self.calls, self.calls + 1
        if index in self.stall:
            await asyncio.sleep(30)
            return [Generation(text="TIMED OUT OUTPUT")] * len(requests)
        return [Generation(text=self.answer)] * len(requests)


class Recording(ToolUseGameEnv):
    seen: list[str] = []

    async def step(self, message):
        Recording.seen.append(message.get("content") or "")
        return await super().step(message)


def test_the_deadline_grows_with_the_context() -> None:
    assert generation_deadline(0, 2048, 600, 3600) == 600
    assert generation_deadline(1024, 2048, 600, 3600) == 2100
    assert generation_deadline(9999, 2048, 600, 3600) == 3600  # capped at the longest
    assert generation_deadline(500, None, 600, 3600) == 600


def test_a_missed_deadline_is_retried_once_and_its_output_never_reaches_the_env() -> None:
    Recording.seen = []
    policy = Stalling(stall={0})
    [[episode]] = collect_groups(
        Recording, [TASK], policy, max_turns=2, generation_deadline_s=(0.2, 0.2)
    )
    assert policy.calls == 2 and Recording.seen == ["12"]
    assert episode.terminated and episode.truncation_cause is None


def test_a_second_miss_ends_the_episode_as_deadline_and_the_others_go_on() -> None:
    Recording.seen = []
    policy = Stalling(stall={0, 1})  # the first wave and its retry stall
    groups = collect_groups(
        Recording,
        [TASK],
        policy,
        episodes_per_task=1,
        max_turns=2,
        generation_deadline_s=(0.2, 0.2),
    )
    [[episode]] = groups
    assert episode.truncation_cause is TruncationCause.DEADLINE and episode.reward == 0.0
    assert episode.turns == [] and Recording.seen == []  # nothing reached the env


def test_the_trainer_goes_on_when_every_turn_misses_its_deadline(small_model_dir, tmp_path):
    """The HF engine path: each timed-out turn's row is released, retried under a new key,
    then the episode ends as DEADLINE; the step still trains (on nothing) and logs it."""
    pytest.importorskip("trl")
    from trainers import GRPOConfig
    from trainers.grpo.trainer import MultiTurnGRPOTrainer

    args = GRPOConfig(
        output_dir=str(tmp_path),
        model=str(small_model_dir),
        batch_size=1,
        episodes_per_task=2,
        num_steps=1,
        max_turns=2,
        max_model_length=1024,
        max_tokens_per_turn=16,
        use_cpu=True,
        save_strategy="no",
        report_to="none",
        logging_steps=1,
        generation_deadline_min_s=1e-4,
        generation_deadline_max_s=1e-4,
    )
    trainer = MultiTurnGRPOTrainer(
        args=args, env_factory=ToolUseGameEnv, tasks=list(get_tasks("train")[:2])
    )
    trainer.train()
    [record] = [r for r in trainer.state.log_history if "episodes/deadline_ratio" in r]
    assert record["episodes/deadline_ratio"] == 1.0


def test_deadline_settings_are_checked(tmp_path) -> None:
    pytest.importorskip("trl")
    from llm_gym.errors import InvalidArgumentError
    from trainers import GRPOConfig

    config = GRPOConfig(output_dir=str(tmp_path), max_turns=2)
    assert config.rollout_settings(2).generation_deadline_s == (600.0, 3600.0)
    off = GRPOConfig(output_dir=str(tmp_path), max_turns=2, generation_deadline_min_s=None)
    assert off.rollout_settings(2).generation_deadline_s is None
    with pytest.raises(InvalidArgumentError, match="generation_deadline_max_s"):
        GRPOConfig(
            output_dir=str(tmp_path),
            max_turns=2,
            generation_deadline_min_s=60,
            generation_deadline_max_s=10,
        )


def test_env_timeout_reaches_the_trainers_rollouts(tmp_path) -> None:
    pytest.importorskip("trl")
    from llm_gym.errors import InvalidArgumentError
    from trainers import GRPOConfig

    config = GRPOConfig(output_dir=str(tmp_path), max_turns=2, batch_size=2, env_timeout_s=5.0)
    assert config.rollout_settings(2).env_timeout_s == 5.0
    assert GRPOConfig(output_dir=str(tmp_path), max_turns=2, batch_size=2).env_timeout_s is None
    for bad in (0, -1.0, True, "5"):
        with pytest.raises(InvalidArgumentError, match="env_timeout_s"):
            GRPOConfig(output_dir=str(tmp_path), max_turns=2, batch_size=2, env_timeout_s=bad)
