"""The episode loop: groups, waves, truncation causes, env errors (scripted policies, no model)."""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence

import pytest

from llm_gym import Env, StepResult, Task, TruncationCause
from llm_gym.envs.tool_use_game import ToolUseGameEnv, get_tasks, oracle_action
from llm_gym.errors import InvalidArgumentError
from llm_gym.policies import Generation, OraclePolicy, Policy, PolicyError, PolicyRequest
from llm_gym.rollout import RolloutSettings, RolloutStats, collect_groups


class EchoEnv(Env):
    """Never terminates by itself: answers every action with a user message; counts closes."""

    closed = 0

    def __init__(self) -> None:
        self._messages: list = []

    async def reset(self, task: Task) -> list:
        self._messages = [{"role": "user", "content": task.prompt}]
        return list(self._messages)

    async def step(self, message) -> StepResult:
        self._messages += [message, {"role": "user", "content": "go on"}]
        return StepResult(False, False, list(self._messages))

    @property
    def tool_specs(self) -> list:
        return []

    @property
    def messages(self) -> list:
        return list(self._messages)

    async def close(self) -> None:
        EchoEnv.closed += 1


class Scripted(Policy):
    """Replies with fixed texts, turn by turn (the same for every episode)."""

    def __init__(self, texts: Sequence[str]) -> None:
        self.texts = list(texts)

    async def act(self, requests: Sequence[PolicyRequest]) -> list[Generation]:
        out = []
        for r in requests:
            turn = sum(1 for m in r.messages if m["role"] == "assistant")
            out.append(Generation(text=self.texts[min(turn, len(self.texts) - 1)]))
        return out


def test_groups_shape_and_same_task_per_group() -> None:
    tasks = list(get_tasks("val")[:5])
    groups = collect_groups(
        ToolUseGameEnv,
        tasks,
        OraclePolicy(),
        episodes_per_task=3,
        max_turns=6,
        oracle=oracle_action,
    )
    assert [len(g) for g in groups] == [3] * 5
    for task, group in zip(tasks, groups, strict=True):
        assert all(e.task == task and e.reward == 1.0 and e.terminated for e in group)
        assert [e.index for e in group] == [0, 1, 2]
        first = group[0].messages[:2]
        assert all(e.messages[:2] == first for e in group)  # the same initial state


def test_waves_batch_every_waiting_episode() -> None:
    EchoEnv.closed = 0
    groups = collect_groups(
        EchoEnv,
        [Task(f"t{i}") for i in range(8)],
        Scripted(["hi"]),
        episodes_per_task=4,
        max_turns=3,
    )
    assert isinstance(groups.stats, RolloutStats)
    assert groups.stats.policy_calls == 3 and groups.stats.batch_sizes == [32, 32, 32]
    episodes = [e for g in groups for e in g]
    assert all(
        e.truncation_cause is TruncationCause.MAX_TURNS and e.num_turns == 3 for e in episodes
    )
    assert EchoEnv.closed == 32  # close() for every episode, also when the loop truncates


def test_parse_failure_ends_with_the_penalty() -> None:
    groups = collect_groups(
        EchoEnv,
        [Task("x")],
        Scripted(['<tool_call>{"name": </tool_call>']),
        episodes_per_task=2,
        max_turns=3,
        failed_parse_reward=-0.25,
    )
    for e in groups[0]:
        assert e.truncation_cause is TruncationCause.PARSE_FAILURE and e.reward == -0.25
        assert e.turns[0].parse_error and "invalid JSON" in e.turns[0].parse_error


class FlakyEnv(EchoEnv):
    """Raises in step for one environment in five; otherwise ends at once with reward 1."""

    ids = itertools.count()

    def __init__(self) -> None:
        super().__init__()
        self.raises = next(FlakyEnv.ids) % 5 == 0

    async def step(self, message) -> StepResult:
        if self.raises:
            raise RuntimeError("flaky backend")
        return StepResult(True, False, [*self._messages, message], reward=1.0)


def test_env_errors_are_contained() -> None:
    FlakyEnv.ids = itertools.count()
    groups = collect_groups(
        FlakyEnv,
        [Task(f"t{i}") for i in range(16)],
        Scripted(["done"]),
        episodes_per_task=4,
        max_turns=2,
    )
    episodes = [e for g in groups for e in g]
    assert len(episodes) == 64
    broken = [e for e in episodes if e.error is not None]
    assert len(broken) == 13  # ids 0, 5, ..., 60
    assert all(e.truncation_cause is TruncationCause.ENV and e.reward == 0.0 for e in broken)
    assert all("flaky backend" in e.error for e in broken)
    healthy = [e for e in episodes if e.error is None]
    assert all(e.terminated and e.reward == 1.0 for e in healthy)


class EnvTruncates(EchoEnv):
    async def step(self, message) -> StepResult:
        return StepResult(False, True, [*self._messages, message], reward=0.5, metrics={"k": 1})


def test_env_truncation_keeps_reward_and_metrics() -> None:
    (episode,) = collect_groups(EnvTruncates, [Task("x")], Scripted(["a"]), max_turns=4)[0]
    assert episode.truncation_cause is TruncationCause.ENV and episode.reward == 0.5
    assert episode.metrics == {"k": 1} and episode.error is None


class BrokenPolicy(Policy):
    async def act(self, requests: Sequence[PolicyRequest]) -> list[Generation]:
        raise ConnectionError("server down")


def test_a_failing_policy_stops_the_collection_loudly() -> None:
    with pytest.raises(PolicyError, match="server down"):
        collect_groups(EchoEnv, [Task("x")], BrokenPolicy(), episodes_per_task=2, max_turns=2)


class PerTurnEnv(EchoEnv):
    async def step(self, message) -> StepResult:
        self._messages.append(message)
        turns = sum(1 for m in self._messages if m["role"] == "assistant")
        if turns < 3:
            return StepResult(False, False, list(self._messages))
        rewards = [0.0, 0.5, 1.0] if "good" in message["content"] else [0.0, 1.0]
        return StepResult(
            True, False, list(self._messages), reward=1.0, metrics={"per_turn_rewards": rewards}
        )


def test_per_turn_rewards_reach_the_turns_or_are_ignored_with_a_warning() -> None:
    (episode,) = collect_groups(PerTurnEnv, [Task("x")], Scripted(["good"]), max_turns=5)[0]
    assert [t.reward for t in episode.turns] == [0.0, 0.5, 1.0]
    assert episode.per_turn_rewards == [0.0, 0.5, 1.0]
    with pytest.warns(UserWarning, match="per_turn_rewards"):
        (bad,) = collect_groups(PerTurnEnv, [Task("x")], Scripted(["bad"]), max_turns=5)[0]
    assert bad.per_turn_rewards is None and bad.metrics["per_turn_rewards_invalid"] == 1


def test_tool_calls_and_errors_are_counted_per_turn() -> None:
    call = {"name": "lookup", "arguments": {"key": "nowhere.population"}}
    text = f"<tool_call>{json.dumps(call)}</tool_call>"
    (episode,) = collect_groups(
        ToolUseGameEnv, [get_tasks("val")[0]], Scripted([text, "1"]), max_turns=4
    )[0]
    assert episode.turns[0].tool_calls == 1 and episode.turns[0].tool_errors == 1
    assert episode.tool_calls == 1 and episode.num_turns == 2 and episode.terminated


def test_settings_are_one_record_and_fields_by_keyword_set_over_it() -> None:
    settings = RolloutSettings(max_turns=1, failed_parse_reward=-0.5)
    garbled = Scripted(['<tool_call>{"name": </tool_call>'])
    [[episode]] = collect_groups(EchoEnv, [Task("x")], garbled, settings)
    assert episode.reward == -0.5 and episode.num_turns == 1
    [[episode]] = collect_groups(EchoEnv, [Task("x")], garbled, settings, failed_parse_reward=-1.0)
    assert episode.reward == -1.0
    with pytest.raises(InvalidArgumentError, match="max_turn'.*Did you mean 'max_turns'"):
        collect_groups(EchoEnv, [Task("x")], garbled, max_turn=3)
    with pytest.raises(InvalidArgumentError, match="needs max_turns"):
        collect_groups(EchoEnv, [Task("x")], garbled)
