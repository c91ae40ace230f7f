"""ToolUseGame's worlds: re-seeded fact tables, the same questions, the imperfect demonstrator."""

from __future__ import annotations

import asyncio
import pickle

import gymnasium as gym
import pytest

from llm_gym import InvalidArgumentError
from llm_gym.core.registry import env_entry
from llm_gym.envs.tool_use_game import (
    DEFAULT_WORLD_SEED,
    FACTS,
    NEW_WORLD_SEED,
    ToolUseGameEnv,
    generate_tasks,
    get_tasks,
    hasty_oracle_action,
    oracle_action,
    task_world,
    world_facts,
)
from llm_gym.envs.tool_use_game.demonstrators import HASTY_GUESS_RATE
from llm_gym.envs.tool_use_game.env import TRAINING_WORLD_SEEDS
from llm_gym.policies import OraclePolicy
from llm_gym.rollout import collect_groups


def _play(task, oracle=oracle_action):
    """One oracle episode through the env: (reward, messages)."""
    env = ToolUseGameEnv()

    async def run():
        messages = await env.reset(task)
        for _ in range(8):
            result = await env.step(oracle(task, messages))
            messages = result.messages
            if result.terminated:
                return result.reward, messages
        raise AssertionError("the oracle did not finish")

    return asyncio.run(run())


def test_the_default_world_is_the_historical_table() -> None:
    assert world_facts(DEFAULT_WORLD_SEED) == FACTS
    assert FACTS["Velmora.population"] == world_facts(7)["Velmora.population"]
    assert all("world_seed" not in t.metadata for t in get_tasks("test"))
    assert get_tasks("test", world_seed=DEFAULT_WORLD_SEED) == get_tasks("test")


def test_another_world_asks_the_same_questions_with_other_answers() -> None:
    default, new = get_tasks("test"), get_tasks("test", world_seed=NEW_WORLD_SEED)
    assert [t.prompt for t in default] == [t.prompt for t in new]
    assert {task_world(t) for t in new} == {NEW_WORLD_SEED}
    numeric = [(a, b) for a, b in zip(default, new, strict=True) if a.metadata["type"] != "compare"]
    assert sum(a.target != b.target for a, b in numeric) >= 0.9 * len(numeric)
    assert not {t.id for t in default} & {t.id for t in new}  # ids name the world
    facts = world_facts(NEW_WORLD_SEED)
    assert facts.keys() == FACTS.keys() and facts != FACTS


def test_new_worlds_have_no_ties_so_every_comparison_has_one_answer() -> None:
    for seed in (1, 2, 1234):
        facts = world_facts(seed)
        for attribute in ("bridges", "schools"):
            column = [v for k, v in facts.items() if k.endswith("." + attribute)]
            assert len(set(column)) == len(column)


def test_the_env_looks_facts_up_in_the_tasks_world_and_the_oracle_succeeds() -> None:
    for task in [*get_tasks("test", world_seed=NEW_WORLD_SEED)[:20], *get_tasks("val")[:5]]:
        reward, messages = _play(task)
        assert reward == 1.0
        looked_up = [m["content"] for m in messages if m.get("name") == "lookup"]
        facts = world_facts(task_world(task))
        assert looked_up == [str(facts[k]) for k in task.metadata["keys"]]


def test_varied_worlds_put_each_task_in_a_training_world() -> None:
    varied = get_tasks("train", world_seed="varied")
    worlds = [task_world(t) for t in varied]
    assert len(set(worlds)) > 990
    assert all(w in TRAINING_WORLD_SEEDS for w in worlds)
    assert NEW_WORLD_SEED not in TRAINING_WORLD_SEEDS and DEFAULT_WORLD_SEED not in worlds
    assert [t.prompt for t in varied] == [t.prompt for t in get_tasks("train")]
    assert generate_tasks(3, 40, "varied") == generate_tasks(3, 40, "varied")


def test_worlds_per_question_asks_each_question_in_fresh_worlds() -> None:
    tasks = generate_tasks(7, 12, "varied", worlds_per_question=4)
    runs = [tasks[i : i + 4] for i in range(0, 12, 4)]
    assert len(tasks) == 12 and len({run[0].prompt for run in runs}) == 3
    for run in runs:
        assert {t.prompt for t in run} == {run[0].prompt}
        assert len({t.metadata["world_seed"] for t in run}) == 4
        assert all(t.metadata["world_seed"] in TRAINING_WORLD_SEEDS for t in run)
    # each is a task of its own world: its target is that world's, which the oracle reaches
    assert [_play(t)[0] for t in tasks] == [1.0] * 12
    assert any(len({t.target for t in run}) > 1 for run in runs)
    again = generate_tasks(7, 12, "varied", worlds_per_question=4)
    assert [(t.prompt, t.target, t.metadata) for t in again] == [
        (t.prompt, t.target, t.metadata) for t in tasks
    ]
    assert generate_tasks(7, 5, "varied", worlds_per_question=4)[4].prompt == runs[1][0].prompt


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "2"])
def test_a_bad_worlds_per_question_is_a_clear_error(bad) -> None:
    with pytest.raises(InvalidArgumentError, match="worlds_per_question must be an int >= 1"):
        generate_tasks(0, 4, "varied", worlds_per_question=bad)


def test_repeating_a_question_needs_varied_worlds() -> None:
    with pytest.raises(InvalidArgumentError, match="only with world_seed='varied'"):
        generate_tasks(0, 4, NEW_WORLD_SEED, worlds_per_question=2)


@pytest.mark.parametrize("bad", [-1, "elsewhere", 1.5, True, None])
def test_a_bad_world_seed_is_a_clear_error(bad) -> None:
    with pytest.raises(InvalidArgumentError, match="world_seed"):
        get_tasks("test", world_seed=bad)


def test_a_task_with_a_bad_world_fails_at_reset() -> None:
    task = get_tasks("val")[0]
    hostile = type(task)(task.prompt, task.target, {**task.metadata, "world_seed": "x"})
    with pytest.raises(InvalidArgumentError, match="world_seed"):
        asyncio.run(ToolUseGameEnv().reset(hostile))


def test_gym_make_and_the_registry_take_the_world_as_a_task_option() -> None:
    env = gym.make("ToolUseGame-v0", task_options={"world_seed": NEW_WORLD_SEED})
    _, info = env.reset(seed=0, options={"split": "test", "index": 0})
    assert task_world(info["task"]) == NEW_WORLD_SEED
    assert env_entry("ToolUseGame-v0").tasks("test", world_seed=NEW_WORLD_SEED)[0] == info["task"]
    with pytest.raises(InvalidArgumentError, match="takes no option"):
        gym.make("GuessNumber-v0", task_options={"world_seed": 1})
    with pytest.raises(InvalidArgumentError, match="takes no option"):
        env_entry("ToolUseGame-v0").tasks("test", planet=3)


def test_an_env_instance_pickles_with_its_world() -> None:
    task = get_tasks("test", world_seed=NEW_WORLD_SEED)[0]
    env = ToolUseGameEnv()
    asyncio.run(env.reset(task))
    clone = pickle.loads(pickle.dumps(env))
    assert clone._tools["lookup"].world_seed == NEW_WORLD_SEED
    assert [s["function"]["name"] for s in clone.tool_specs] == [
        "list_fact_keys",
        "lookup",
        "calculator",
    ]


def test_the_hasty_demonstrator_guesses_skips_the_calculator_or_acts_as_the_oracle() -> None:
    tasks = generate_tasks(11, 400, "varied")
    groups = collect_groups(
        ToolUseGameEnv,
        tasks,
        OraclePolicy(hasty_oracle_action),
        max_turns=8,
        oracle=hasty_oracle_action,
    )
    episodes = [e for g in groups for e in g]
    assert all(not e.error for e in episodes)
    first_turn_answers = [
        e
        for e in episodes
        if not next(m for m in e.messages if m["role"] == "assistant").get("tool_calls")
    ]
    share = len(first_turn_answers) / len(episodes)
    assert abs(share - HASTY_GUESS_RATE) < 0.07
    mental = [
        e
        for e in episodes
        if e.task.metadata["expression"]
        and not any(m.get("name") == "calculator" for m in e.messages)
        and e not in first_turn_answers
    ]
    assert mental and all(e.reward == 1.0 for e in mental)  # right, but without the tool
    assert 0.25 < sum(e.reward for e in episodes) / len(episodes) < 0.85
    assert [hasty_oracle_action(t, []) for t in tasks[:30]] == [
        hasty_oracle_action(t, []) for t in tasks[:30]
    ]


# --- task options: world_seed ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ([1], "[1]"),  # TypeError: unhashable type: 'list' (a traceback from llm-gym eval)
        ({"a": 1}, "{'a': 1}"),
        ("x" * 1_000_000, "'xxx"),  # the message shows a prefix
        (10**5000, "an int of 16610 bits"),  # ValueError from the registry's cache key
        (2**64, "18446744073709551616"),
        (-1, "-1"),
    ],
    ids=["list", "dict", "1 MB text", "5,000 digits", "2**64", "negative"],
)
def test_world_seed_is_checked_before_any_cache(value: object, shown: str) -> None:
    from llm_gym import InvalidArgumentError
    from llm_gym.core.registry import env_entry

    with pytest.raises(InvalidArgumentError, match="world_seed must be an int in") as info:
        env_entry("ToolUseGame-v0").tasks("val", world_seed=value)
    assert shown in str(info.value) and len(str(info.value)) < 200
    assert len(env_entry("ToolUseGame-v0").tasks("val", world_seed=2**64 - 1)) == 200
