"""Every registered environment: check_env, determinism, pickling, oracle and random floors.

A new environment is covered by registering it.
"""

from __future__ import annotations

import asyncio
import json
import math
import pickle
import time
import warnings
from typing import Any

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

from llm_gym.errors import InvalidArgumentError
from llm_gym.gym import env_entry
from llm_gym.policies import PolicyRequest, RandomPolicy
from tests.conftest import ENV_IDS, play_text_episode


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_check_env(env_id: str) -> None:
    env = gym.make(env_id)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(env.unwrapped)
    assert [str(w.message) for w in caught] == []


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_same_seed_same_episode(env_id: str) -> None:
    env_a, env_b = gym.make(env_id), gym.make(env_id)
    for seed in (0, 1, 123):
        obs_a, info_a = env_a.reset(seed=seed)
        obs_b, info_b = env_b.reset(seed=seed)
        assert obs_a == obs_b and info_a["task"] == info_b["task"]
        for _ in range(3):
            action = env_a.unwrapped.oracle_action()
            step_a, step_b = env_a.step(action), env_b.step(action)
            assert step_a[:4] == step_b[:4]
            assert step_a[4]["messages"] == step_b[4]["messages"]
            if step_a[2] or step_a[3]:
                break


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_pickle_round_trip(env_id: str) -> None:
    env = gym.make(env_id)
    env.reset(seed=3)
    if any(env.step(env.unwrapped.oracle_action())[2:4]):  # a one-answer episode ended:
        env.reset(seed=3)  # pickle the next one live, before its first step
    clone = pickle.loads(pickle.dumps(env))
    action = env.unwrapped.oracle_action()
    assert clone.unwrapped.oracle_action() == action
    assert env.step(action)[:4] == clone.step(action)[:4]


@pytest.mark.parametrize(
    "env_id",
    # Code-v0 runs every val program in a sandbox: ~40 s on a 2-core AVX2 machine, so it runs
    # with the slow checks (CI runs them).
    [pytest.param(e, marks=pytest.mark.slow) if e == "Code-v0" else e for e in ENV_IDS],
)
def test_oracle_solves_every_val_task(env_id: str) -> None:
    env = gym.make(env_id)
    tasks = env.unwrapped.tasks("val")
    solved = 0
    for index in range(len(tasks)):
        reward, _info = play_text_episode(
            env,
            lambda e, o, i: e.unwrapped.oracle_action(),
            options={"split": "val", "index": index},
        )
        solved += reward == 1.0
    assert solved == len(tasks), f"oracle solved {solved}/{len(tasks)}"


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_random_policy_is_far_below(env_id: str) -> None:
    env = gym.make(env_id)
    fmt = env.unwrapped.action_format
    policy = RandomPolicy(seed=0)

    def act(e: gym.Env, observation: str, info: dict) -> str:
        request = PolicyRequest(info["messages"], info["tool_specs"], info["task"], fmt)
        return asyncio.run(policy.act([request]))[0].text

    tasks = env.unwrapped.tasks("val")
    successes = sum(
        play_text_episode(env, act, options={"split": "val", "index": i})[0] == 1.0
        for i in range(len(tasks))
    )
    assert successes / len(tasks) < 0.10


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_catalogue_entry(env_id: str) -> None:
    entry = env_entry(env_id)
    assert entry.description and entry.version
    assert gym.make(env_id).unwrapped.version == entry.version


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_every_env_has_a_per_turn_token_budget(env_id: str) -> None:
    """Each registered env declares (or inherits) the tokens one turn may sample: a positive
    int, which a built-in env chooses for its own actions."""
    from llm_gym.envs.builtin import BUILTIN_ENVS

    budget, source = env_entry(env_id).token_budget()
    assert type(budget) is int and budget >= 1
    if env_id in {row.id for row in BUILTIN_ENVS}:
        assert source == "env"


def test_token_budget_comes_from_registration_then_env_then_default() -> None:
    from llm_gym import InvalidArgumentError
    from llm_gym.core.env import DEFAULT_MAX_TOKENS_PER_TURN
    from llm_gym.core.registry import as_env_entry
    from llm_gym.envs.guess_number import GuessNumberEnv
    from llm_gym.envs.tool_use_game import ToolUseGameEnv
    from llm_gym.gym import register_env, unregister_env

    spec = "llm_gym.envs.guess_number:GuessNumberEnv"
    tasks = "llm_gym.envs.guess_number:get_tasks"
    try:
        entry = register_env("BudgetedGuess-v0", env=spec, tasks=tasks, max_tokens_per_turn=5)
        assert entry.token_budget() == (5, "registration")
        assert register_env("PlainGuess-v0", env=spec, tasks=tasks).token_budget() == (16, "env")
        for bad in (0, -1, True, 2.5, "16"):
            with pytest.raises(InvalidArgumentError, match="max_tokens_per_turn"):
                register_env("BadGuess-v0", env=spec, tasks=tasks, max_tokens_per_turn=bad)
    finally:
        for env_id in ("BudgetedGuess-v0", "PlainGuess-v0", "BadGuess-v0"):
            unregister_env(env_id)
    assert as_env_entry(GuessNumberEnv).token_budget() == (16, "env")

    class Undeclared(ToolUseGameEnv):
        max_tokens_per_turn = None

    class Broken(ToolUseGameEnv):
        max_tokens_per_turn = 0

    assert as_env_entry(Undeclared).token_budget() == (DEFAULT_MAX_TOKENS_PER_TURN, "default")
    with pytest.raises(InvalidArgumentError, match=r"Broken\.max_tokens_per_turn must be"):
        as_env_entry(Broken).token_budget()


# --- every environment, reset and step ------------------------------------------------------------


def _call(name: str, arguments: Any) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def hostile_actions(tool_specs: list[dict[str, Any]]) -> dict[str, str]:
    actions = {
        "empty": "",
        "whitespace": " \n\t ",
        "NaN": "NaN",
        "-inf": "-inf",
        "huge number": "9" * 5000,
        "1e999": "Answer: 1e999",
        "control characters": "\x00\x01\x1b[2J\x7f\u202e321\u202c",
        "full-width answer": "\uff21\uff2e\uff33\uff37\uff25\uff32: \uff11\uff12\uff13",
        "Arabic-Indic digits": "\u0663\u0664\u0665",
        "1 MB": "a" * 1_000_000,
        "deep JSON tool call": "<tool_call>" + "[" * 100_000 + "</tool_call>",
        "unknown tool": _call("__init__", {}),
        "huge tool name": _call("x" * 100_000, {}),
    }
    deep = json.loads("[" * 400 + "]" * 400)
    for spec in tool_specs:
        name = spec["function"]["name"]
        keys = list((spec["function"].get("parameters") or {}).get("properties") or {}) or ["x"]
        values = {"nan": math.nan, "inf": math.inf, "huge int": 10**300, "nested": deep,
                  "null": None, "long str": "x" * 100_000}  # fmt: skip
        for label, value in values.items():
            actions[f"{name}({label})"] = _call(name, dict.fromkeys(keys, value))
        actions[f"{name} x40"] = _call(name, dict.fromkeys(keys, "1")) * 40  # over the 32 cap
        actions[f"{name} look-alike"] = _call(
            name.replace("a", "\u0430").replace("o", "\u043e"), {}
        )
        actions[f"{name} arguments list"] = _call(name, [1, 2])
    return actions


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_every_env_survives_hostile_actions(env_id: str) -> None:
    env = gym.make(env_id)
    try:
        _, info = env.reset(seed=2**70)
        for label, action in hostile_actions(info["tool_specs"]).items():
            env.reset(seed=0)
            start = time.perf_counter()
            observation, reward, terminated, truncated, info = env.step(action)
            took = time.perf_counter() - start
            assert took < 3.0, f"{label}: {took:.1f} s"
            assert isinstance(reward, float) and math.isfinite(reward), label
            assert isinstance(observation, str), label
            json.dumps(info.get("messages", []), ensure_ascii=False).encode("utf-8")
    finally:
        env.close()


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_hostile_reset_arguments_are_named_errors(env_id: str) -> None:
    env = gym.make(env_id)
    try:
        env.reset(seed=2**70)  # a seed past 64 bits is fine
        for options in ({"index": 2**70}, {"index": 1.0}, {"split": "train\x00"}, {"zzz": 1}, [1]):
            with pytest.raises(InvalidArgumentError):
                env.reset(options=options)  # type: ignore[arg-type]
        with pytest.raises(gym.error.Error):
            env.reset(seed=-1)
    finally:
        env.close()
