"""ToolUseGame-v0: splits, the generator, the tools, the reward."""

from __future__ import annotations

import asyncio

import pytest

from llm_gym import ToolArgumentError
from llm_gym.envs.tool_use_game import (
    FACTS,
    TOOL_USE_GAME_TASKS,
    ToolUseGameEnv,
    generate_tasks,
    get_tasks,
    list_fact_keys,
    lookup,
    oracle_action,
)
from llm_gym.envs.tool_use_game.env import SPLIT_SIZES


def test_splits_are_disjoint_and_large_enough() -> None:
    splits = {name: get_tasks(name) for name in SPLIT_SIZES}
    prompts = {name: {t.prompt for t in tasks} for name, tasks in splits.items()}
    assert sum(len(p) for p in prompts.values()) >= 1000
    assert all(len(prompts[n]) == len(splits[n]) == SPLIT_SIZES[n] for n in SPLIT_SIZES)
    assert not prompts["train"] & prompts["val"]
    assert not prompts["train"] & prompts["test"]
    assert not prompts["val"] & prompts["test"]
    assert list(TOOL_USE_GAME_TASKS) == list(splits["train"])
    assert len({t.id for tasks in splits.values() for t in tasks}) == 1400


def test_every_task_type_is_present() -> None:
    types = {t.metadata["type"] for t in get_tasks("val")}
    assert {"lookup", "lookup_arith", "compare"} <= types
    assert any(t.startswith("chain_") for t in types)


def test_generator_is_a_pure_function_of_its_seed() -> None:
    assert generate_tasks(5, 50) == generate_tasks(5, 50)
    assert generate_tasks(5, 50) != generate_tasks(6, 50)


def test_lookup_and_list_tools() -> None:
    assert lookup("Velmora.population") == str(FACTS["Velmora.population"])
    assert lookup(" velmora.POPULATION ") == str(FACTS["Velmora.population"])
    with pytest.raises(ToolArgumentError, match="Did you mean 'Velmora.population'"):
        lookup("velmora.populaton")
    keys = list_fact_keys("tarsk.")
    assert keys.splitlines() == [k for k in FACTS if k.startswith("Tarsk.")]
    assert list_fact_keys("zzz") == "no keys start with 'zzz'"
    assert len(list_fact_keys().splitlines()) == len(FACTS)


def test_keys_can_be_copied_from_the_question() -> None:
    for task in get_tasks("val"):
        for key in task.metadata["keys"]:
            town, attribute = key.split(".")
            assert town in task.prompt and attribute.split("_")[0] in task.prompt


def test_reward_on_hand_made_transcripts() -> None:
    task = next(t for t in get_tasks("val") if t.metadata["type"] == "lookup_arith")

    async def episode(final_answer: str) -> float:
        env = ToolUseGameEnv()
        messages = await env.reset(task)
        result = await env.step(oracle_action(task, messages))
        result = await env.step({"role": "assistant", "content": final_answer})
        return result.reward

    assert asyncio.run(episode(str(task.target))) == 1.0
    assert asyncio.run(episode(f"{task.target:,}")) == 1.0
    assert asyncio.run(episode(str(task.target + 1))) == 0.0
    assert asyncio.run(episode("I think it is " + str(task.target))) == 0.0


def test_oracle_reads_tool_results_not_the_target() -> None:
    task = next(t for t in get_tasks("val") if t.metadata["type"] == "lookup")
    messages = [
        {"role": "system", "content": ""},
        {"role": "user", "content": task.prompt},
        {"role": "assistant", "content": "", "tool_calls": []},
        {"role": "tool", "name": "lookup", "content": "12345", "tool_call_id": "x"},
    ]
    assert oracle_action(task, messages)["content"] == "12345"


def test_hostile_tool_arguments_are_tool_errors() -> None:
    async def run() -> list[str]:
        env = ToolUseGameEnv()
        await env.reset(get_tasks("val")[0])
        calls = [
            ("lookup", '{"key": "' + "x" * 100_000 + '"}'),
            ("calculator", '{"expression": "9**9**9**9"}'),
            ("calculator", '{"expression": "__import__(\\"os\\")"}'),
            ("lookup", '{"key": ["a"]}'),
            ("nope", "{}"),
        ]
        result = await env.step(
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"id": str(i), "type": "function", "function": {"name": n, "arguments": a}}
                    for i, (n, a) in enumerate(calls)
                ],
            }
        )
        return [m["content"] for m in result.messages if m["role"] == "tool"]

    contents = asyncio.run(run())
    assert len(contents) == 5 and all(c.startswith("tool_error") for c in contents)
    assert all(len(c) < 500 for c in contents)


def test_an_integer_answer_must_be_exact() -> None:
    from llm_gym.core import Task

    env = ToolUseGameEnv()
    task = Task(
        prompt="What is the total population of Velmora, Tarsk and Elderby?", target=3164840
    )
    assert env.score("3164841", task) == 0.0  # within 1e-6 relative, yet a wrong count
    assert env.score("3164839", task) == 0.0
    assert env.score("3164840.5", task) == 0.0
    for spelling in ("3164840", "3,164,840", "3164840.", " 3164840.0 "):
        assert env.score(spelling, task) == 1.0, spelling
    numeric = [t.target for t in get_tasks("val") if not isinstance(t.target, str)]
    assert numeric and all(type(target) is int for target in numeric)  # exact throughout
