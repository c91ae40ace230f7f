"""Every registered environment: check_env, determinism, pickling, oracle and random floors.

A new environment is covered by registering it.
"""

from __future__ import annotations

import asyncio
import pickle
import warnings

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

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
