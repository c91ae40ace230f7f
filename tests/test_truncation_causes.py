"""Golden tests of how an episode is cut short, for both seed styles: an environment's own
``truncated=True`` is ``ENV`` (no overlong penalty) at whatever turn, its declared cap too;
``MAX_TURNS`` (penalised) is only the loop's limit: the run's ``max_turns``, or the cap an env asks
the loop to enforce (``Env.max_turns``, document 002's ``max_episode_turns``)."""

from __future__ import annotations

import asyncio

import pytest

from llm_gym import Env, StepResult, Task, TruncationCause
from llm_gym.core.env import step_within_cap
from llm_gym.environments import (
    EnvironmentMultiTurn,
    EnvironmentStepResult,
    MultiTurnEnvFactory,
    RewardResult,
)
from llm_gym.errors import InvalidArgumentError
from llm_gym.policies import Generation, Policy
from llm_gym.rollout import collect_groups
from trainers.grpo.advantages import shaped_reward

TASK = Task(prompt="Keep going.", target=0, id="t")
PENALTY = {"max_model_length": None, "overlong_buffer": 16}


def shaped(episode) -> float:
    return shaped_reward(
        episode.reward,
        episode.truncation_cause,
        episode.total_tokens,
        **PENALTY,
        overlong_penalty_factor=1.0,
    )


class Stopper(Env):
    """Seed 001's style: never terminates; truncates itself at turn ``stop_at`` (reward 0.25)
    and declares ``max_turns=cap``."""

    def __init__(self, stop_at: int | None, cap: int | None = None) -> None:
        self.stop_at, self.max_turns, self.turn = stop_at, cap, 0
        self._messages: list = []

    async def reset(self, task: Task) -> list:
        self._messages, self.turn = [{"role": "user", "content": task.prompt}], 0
        return list(self._messages)

    async def step(self, message) -> StepResult:
        self.turn += 1
        self._messages += [message, {"role": "user", "content": "more"}]
        stopped = self.turn == self.stop_at
        return StepResult(False, stopped, list(self._messages), 0.25 if stopped else 0.0)

    @property
    def tool_specs(self) -> list:
        return []

    @property
    def messages(self) -> list:
        return list(self._messages)


class Go(Policy):
    """Always says ``go``."""

    async def act(self, requests) -> list[Generation]:
        return [Generation(text="go") for _ in requests]


def run(factory, max_turns: int):
    [[episode]] = collect_groups(factory, [TASK], Go(), episodes_per_task=1, max_turns=max_turns)
    return episode


@pytest.mark.parametrize(
    ("stop_at", "cap", "turns"),
    [(2, None, 2), (3, 3, 3), (1, 5, 1)],  # before any cap, at its own declared cap, early
)
def test_an_env_that_truncates_itself_is_env_and_unpenalised(stop_at, cap, turns) -> None:
    episode = run(lambda task: Stopper(stop_at, cap), max_turns=8)
    assert episode.truncation_cause is TruncationCause.ENV and episode.num_turns == turns
    assert episode.reward == 0.25 == shaped(episode)


@pytest.mark.parametrize(("cap", "max_turns"), [(None, 3), (3, 8), (5, 3)])
def test_the_loops_limit_is_max_turns_and_penalised(cap, max_turns) -> None:
    episode = run(lambda task: Stopper(None, cap), max_turns=max_turns)
    assert episode.truncation_cause is TruncationCause.MAX_TURNS
    assert episode.num_turns == min(cap or max_turns, max_turns)
    assert (episode.reward, shaped(episode)) == (0.0, -1.0)


class Counting(EnvironmentMultiTurn):
    """Document 002's style: never done; scored by the actions taken."""

    def __init__(self, cap: int) -> None:
        self.cap = cap

    def max_episode_turns(self, example):
        return self.cap

    def step_episode(self, example, messages, assistant_response):
        return EnvironmentStepResult(done=False, messages=({"role": "user", "content": "go"},))

    def score_episode(self, example, episode):
        actions = sum(m["role"] == "assistant" for m in episode.messages)
        return RewardResult(score=float(actions))


@pytest.mark.parametrize(("cap", "max_turns", "turns"), [(2, 8, 2), (6, 3, 3)])
def test_document_002s_turn_cap_is_the_loops_limit(cap, max_turns, turns) -> None:
    episode = run(MultiTurnEnvFactory(Counting(cap)), max_turns=max_turns)
    assert episode.truncation_cause is TruncationCause.MAX_TURNS and episode.num_turns == turns
    assert episode.reward == float(turns) and shaped(episode) == turns - 1.0  # scored, penalised
    assert episode.metrics["turn_cap_reached"] == 1


def test_a_caller_that_steps_a_002_env_itself_ends_it_at_its_cap() -> None:
    env = MultiTurnEnvFactory(Counting(2))(TASK)

    async def play() -> list[StepResult]:
        await env.reset(TASK)
        action = {"role": "assistant", "content": "go"}
        steps = [await step_within_cap(env, action, turn) for turn in (1, 2)]
        plain = MultiTurnEnvFactory(Counting(2))(TASK)  # stepped without the cap's ending
        await plain.reset(TASK)
        await plain.step(action)
        await plain.step(action)
        with pytest.raises(InvalidArgumentError, match="max_episode_turns=2"):
            await plain.step(action)  # past the cap: refused, never run over silently
        return steps

    first, last = asyncio.run(play())
    assert not (first.terminated or first.truncated)
    assert last.truncated and last.reward == 2.0 and last.metrics["turn_cap_reached"] == 1
    assert env.environment_episode.metadata["ended_by"] == "max_episode_turns"


def test_step_within_cap_leaves_an_env_without_a_cap_alone() -> None:
    env = Stopper(None)

    async def play() -> StepResult:
        await env.reset(TASK)
        return await step_within_cap(env, {"role": "assistant", "content": "go"}, 99)

    result = asyncio.run(play())
    assert not (result.terminated or result.truncated)
