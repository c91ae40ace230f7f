"""The episode driver (:mod:`llm_gym.rollout.driver`) against an environment that returns
nonsense: a step result of the wrong type or with a non-finite, non-numeric reward, malformed
metrics or messages, a reset that returns no message list, and messages nested past any recursion
limit or holding themselves. Each ends its episode as ``TruncationCause.ENV`` with an error that
names the method and the field, through ``collect_groups`` and ``TextEnv`` alike, never a raised
exception; finite odd numbers (``True``, ``-0.0``, ``1e308``) still pass as rewards.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from llm_gym import Env, StepResult, Task, TruncationCause
from llm_gym.errors import InvalidArgumentError
from llm_gym.gym import TextEnv
from llm_gym.policies import Generation, Policy
from llm_gym.rollout import collect_groups

# --- step results of the wrong shape or with non-finite numbers -----------------------------------


class Say(Policy):
    async def act(self, requests):
        return [Generation(text="hello") for _ in requests]


def hostile_env(field: str, value: Any) -> type[Env]:
    """An env whose first step returns ``value`` as ``field`` of its StepResult (or as the
    whole result)."""

    class Hostile(Env):
        def __init__(self, task: Task | None = None) -> None:
            self._messages = [{"role": "user", "content": "hi"}]

        async def reset(self, task: Task) -> list:
            return list(self._messages)

        async def step(self, message: Any) -> Any:
            if field == "result":
                return value
            result = StepResult(True, False, [*self._messages, message], reward=1.0)
            setattr(result, field, value)
            return result

        tool_specs = []  # type: ignore[assignment]

        @property
        def messages(self) -> list:
            return list(self._messages)

    return Hostile


BAD_RESULTS = {
    "reward NaN": ("reward", math.nan, "reward=nan"),
    "reward inf": ("reward", math.inf, "reward=inf"),
    "reward -inf": ("reward", -math.inf, "reward=-inf"),
    "reward text": ("reward", "1.5", "reward='1.5'"),
    "reward None": ("reward", None, "reward=None"),
    "reward huge int": ("reward", 10**400, "a reward must be a finite number"),
    "reward complex": ("reward", 1j, "reward=1j"),
    "metrics None": ("metrics", None, "metrics=None"),
    "metrics list": ("metrics", [1, 2], "metrics=[1, 2]"),
    "messages None": ("messages", None, "with a list of message dicts"),
    "messages text": ("messages", "abc", "with a list of message dicts"),
    "messages of text": ("messages", ["a", "b"], "messages[1]='b'"),
    "result None": ("result", None, "actual value: None"),
    "gymnasium tuple": ("result", ("obs", 1.0, True, False, {}), "actual value: ('obs'"),
}


@pytest.mark.parametrize("name", list(BAD_RESULTS))
def test_a_malformed_step_result_ends_its_episode_as_env(name: str) -> None:
    field, value, message = BAD_RESULTS[name]
    env = hostile_env(field, value)
    groups = collect_groups(env, [Task("x")], Say(), episodes_per_task=2, max_turns=2)
    for episode in groups[0]:
        assert episode.truncation_cause is TruncationCause.ENV and episode.reward == 0.0
        assert "Hostile.step" in episode.error and message in episode.error
    text_env = TextEnv(env, tasks=[Task("x")])
    text_env.reset(seed=0)
    _, reward, terminated, truncated, info = text_env.step("hello")
    assert (reward, terminated, truncated) == (0.0, False, True)
    assert info["truncation_cause"] == "env"


def test_finite_rewards_and_odd_numbers_still_pass() -> None:
    for value, expected in ((True, 1.0), (3, 3.0), (1e308, 1e308), (-0.0, 0.0)):
        [[episode]] = collect_groups(hostile_env("reward", value), [Task("x")], Say(), max_turns=2)
        assert episode.terminated and episode.reward == expected


def test_a_nan_failed_parse_reward_is_refused() -> None:
    from llm_gym.rollout.driver import EpisodeDriver

    with pytest.raises(InvalidArgumentError, match="failed_parse_reward=nan"):
        EpisodeDriver(hostile_env("reward", 1.0), failed_parse_reward=math.nan)


# --- messages an environment returns --------------------------------------------------------------


def odd_env(opening: Any = None, reply: Any = None) -> type[Env]:
    """An env whose reset returns ``opening`` (when given) and whose step appends ``reply``."""

    class Odd(Env):
        def __init__(self, task: Task | None = None) -> None:
            self._messages: list[Any] = [{"role": "user", "content": "hi"}]

        async def reset(self, task: Task) -> Any:
            return opening if opening is not None else list(self._messages)

        async def step(self, message: Any) -> StepResult:
            self._messages = [*self._messages, message, reply]
            return StepResult(False, False, list(self._messages))

        tool_specs = []  # type: ignore[assignment]

        @property
        def messages(self) -> list:
            return list(self._messages)

    return Odd


def nested_lists(depth: int) -> list[Any]:
    """``[[[...]]]`` ``depth`` levels deep, built without recursion."""
    value: list[Any] = []
    for _ in range(depth - 1):
        value = [value]
    return value


def _cycle() -> dict[str, Any]:
    message: dict[str, Any] = {"role": "tool", "content": "x\ud800"}
    message["self"] = message
    return message


BAD_REPLIES = {
    "nested 950 deep": (
        {"role": "tool", "content": "x", "extra": nested_lists(950)},
        None,
    ),
    "a cycle": (_cycle(), "contains itself"),
    "no role, two keys": ({"content": "x", "name": "y"}, "a string 'role'"),
    "a numeric role": ({"role": 1, "content": "x"}, "a string 'role'"),
}


@pytest.mark.parametrize("name", list(BAD_REPLIES))
def test_an_odd_env_message_ends_the_episode_or_passes_never_raises(name: str) -> None:
    reply, error = BAD_REPLIES[name]
    text_env = TextEnv(odd_env(reply=reply), tasks=[Task("x")])
    text_env.reset(seed=0)
    _, reward, terminated, truncated, info = text_env.step("hello")
    assert reward == 0.0 and not terminated
    assert truncated == (error is not None)
    json.dumps(info["messages"][:2])
    [[episode]] = collect_groups(odd_env(reply=reply), [Task("x")], Say(), max_turns=2)
    if error is not None:
        assert episode.truncation_cause is TruncationCause.ENV and error in episode.error


@pytest.mark.parametrize("opening", ["hello", ["hi"], 5, [{"content": "x"}], {"role": "u"}])
def test_a_reset_that_returns_no_message_list_is_named(opening: Any) -> None:
    with pytest.raises(InvalidArgumentError, match=r"Odd\.reset"):
        TextEnv(odd_env(opening=opening), tasks=[Task("x")]).reset(seed=0)
    [[episode]] = collect_groups(odd_env(opening=opening), [Task("x")], Say(), max_turns=2)
    assert episode.truncation_cause is TruncationCause.ENV and "Odd.reset" in episode.error
