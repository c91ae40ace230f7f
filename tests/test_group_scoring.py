"""Document 002's group scoring: ``score_episodes(example, episodes)`` receives each GRPO group
whole, once all its episodes have ended, and every episode the loop ran is scored, also when the
run (its turn limit, the context budget, a generation deadline) rather than the env ended it."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from llm_gym import Task
from llm_gym.core.env import TruncationCause
from llm_gym.environments import (
    EnvironmentMultiTurn,
    EnvironmentStepResult,
    MultiTurnEnvFactory,
    RewardResult,
)
from llm_gym.policies import Generation, Policy, PolicyRequest
from llm_gym.rollout import collect_groups

TASKS = [Task(prompt="Count.", target=0, id="a"), Task(prompt="Count again.", target=0, id="b")]


class Planned(EnvironmentMultiTurn):
    """The first action says how many actions the episode lasts (``plan:N``); every episode is
    scored by the number of actions it took. Records the size of every ``score_episodes`` call
    and what each scored episode looked like."""

    def __init__(self, cap: int = 8) -> None:
        self.cap = cap
        self.calls: list[int] = []
        self.scored: list[dict] = []

    def max_episode_turns(self, example):
        return self.cap

    def step_episode(self, example, messages, assistant_response):
        actions = [m["content"] for m in messages if m["role"] == "assistant"]
        planned = int(actions[0].split(":")[1])
        if len(actions) >= planned:
            return EnvironmentStepResult(done=True)
        return EnvironmentStepResult(done=False, messages=({"role": "user", "content": "go"},))

    def score_episodes(self, example, episodes):
        self.calls.append(len(episodes))
        results = []
        for episode in episodes:
            actions = sum(m["role"] == "assistant" for m in episode.messages)
            self.scored.append(dict(episode.metadata, actions=actions))
            results.append(RewardResult(score=float(actions), threshold=3.0))
        return results


class Planner(Policy):
    """Opens each episode with the next plan of ``plans`` (cycling), then says ``go``."""

    def __init__(self, plans: Sequence[int]) -> None:
        self.plans = list(plans)
        self.opened = 0

    async def act(self, requests: Sequence[PolicyRequest]) -> list[Generation]:
        out = []
        for request in requests:
            if not any(m["role"] == "assistant" for m in request.messages):
                plan = self.plans[self.opened % len(self.plans)]
                self.opened += 1
                out.append(Generation(text=f"plan:{plan}"))
            else:
                out.append(Generation(text="go"))
        return out


def test_a_group_ending_at_different_turns_is_scored_in_one_call() -> None:
    # A group of 4 ending at turns 1, 3, 5, 1: one call of size 4 (was 2, 1, 1 by wave).
    env = Planned()
    groups = collect_groups(env, TASKS[:1], Planner([1, 3, 5, 1]), episodes_per_task=4, max_turns=8)
    assert env.calls == [4]
    assert [e.reward for e in groups[0]] == [1.0, 3.0, 5.0, 1.0]
    assert [e.metrics["success"] for e in groups[0]] == [False, True, True, False]
    assert all(e.terminated for e in groups[0])
    # two groups: one call each, never mixed
    env = Planned()
    collect_groups(env, TASKS, Planner([2, 1, 4]), episodes_per_task=3, max_turns=8)
    assert env.calls == [3, 3]


def test_one_call_per_episode_without_batch_scoring() -> None:
    env = Planned()
    factory = MultiTurnEnvFactory(env, batch_scoring=False)
    groups = collect_groups(
        factory, TASKS[:1], Planner([1, 3, 2]), episodes_per_task=3, max_turns=8
    )
    assert env.calls == [1, 1, 1]
    assert [e.reward for e in groups[0]] == [1.0, 3.0, 2.0]


def test_episodes_the_run_cuts_short_are_scored() -> None:
    # The run's turn limit (2) is below the env's (8): the episodes it cuts are still scored,
    # as MAX_TURNS, with the transcript they have.
    env = Planned(cap=8)
    groups = collect_groups(env, TASKS[:1], Planner([1, 5]), episodes_per_task=2, max_turns=2)
    assert env.calls == [2]
    first, cut = groups[0]
    assert (first.reward, first.terminated) == (1.0, True)
    assert (cut.reward, cut.truncation_cause) == (2.0, TruncationCause.MAX_TURNS)
    assert cut.metrics["turn_cap_reached"] == 1 and cut.metrics["score"] == 2.0
    assert [s["ended_by"] for s in env.scored] == ["environment", "max_turns"]
    # the env's own cap (3) below the run's (8): MAX_TURNS too, scored
    env = Planned(cap=3)
    [[episode]] = collect_groups(env, TASKS[:1], Planner([5]), episodes_per_task=1, max_turns=8)
    assert (episode.reward, episode.truncation_cause) == (3.0, TruncationCause.MAX_TURNS)
    assert env.scored[0]["ended_by"] == "max_episode_turns"


class Stalls(Policy):
    """Answers the first turn, then never again within the deadline."""

    async def act(self, requests: Sequence[PolicyRequest]) -> list[Generation]:
        if any(m["role"] == "assistant" for m in requests[0].messages):
            await asyncio.sleep(10)
        return [Generation(text="plan:4") for _ in requests]


def test_an_episode_ended_by_a_missed_deadline_is_scored_with_its_transcript() -> None:
    env = Planned()
    groups = collect_groups(
        env, TASKS[:1], Stalls(), episodes_per_task=2, max_turns=8,
        generation_deadline_s=(0.05, 0.05),
    )  # fmt: skip
    assert env.calls == [2]
    assert [e.truncation_cause for e in groups[0]] == [TruncationCause.DEADLINE] * 2
    assert [e.reward for e in groups[0]] == [1.0, 1.0]  # one action each, the stalled one never
    assert [s["ended_by"] for s in env.scored] == ["deadline", "deadline"]


class Crashes(Planned):
    def step_episode(self, example, messages, assistant_response):
        if assistant_response == "plan:9":
            raise RuntimeError("the service is down")
        return super().step_episode(example, messages, assistant_response)


def test_an_episode_whose_env_fails_leaves_the_rest_of_its_group_scored() -> None:
    env = Crashes()
    groups = collect_groups(env, TASKS[:1], Planner([2, 9, 1]), episodes_per_task=3, max_turns=8)
    assert env.calls == [2]  # the failed episode was never scored, and nothing waited for it
    assert [e.reward for e in groups[0]] == [2.0, 0.0, 1.0]
    assert groups[0][1].truncation_cause is TruncationCause.ENV
    assert "the service is down" in groups[0][1].error


class BrokenScorer(Planned):
    def score_episodes(self, example, episodes):
        raise ValueError("grader offline")


def test_a_failing_score_episodes_fails_its_group_only() -> None:
    groups = collect_groups(
        BrokenScorer(), TASKS, Planner([1, 2]), episodes_per_task=2, max_turns=8
    )
    for episode in (e for g in groups for e in g):
        assert episode.truncation_cause is TruncationCause.ENV
        assert "grader offline" in episode.error


@pytest.mark.parametrize("group_size", [1, 5])
def test_the_default_score_episodes_runs_within_max_score_concurrency(group_size: int) -> None:
    class Slow(Planned):
        max_score_concurrency = 2
        score_episodes = EnvironmentMultiTurn.score_episodes

        def __init__(self) -> None:
            super().__init__()
            self.live = 0
            self.peak = 0

        async def score_episode(self, example, episode):
            self.live += 1
            self.peak = max(self.peak, self.live)
            await asyncio.sleep(0.01)
            self.live -= 1
            return RewardResult(score=1.0)

    env = Slow()
    groups = collect_groups(env, TASKS[:1], Planner([1]), episodes_per_task=group_size, max_turns=8)
    assert [e.reward for e in groups[0]] == [1.0] * group_size
    assert env.peak == min(2, group_size)
