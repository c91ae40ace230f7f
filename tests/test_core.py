"""The environment contract: Task, @tool schemas and validation, ToolEnv behaviour, scoring."""

from __future__ import annotations

import asyncio
import math
import time
from typing import Literal

import gymnasium as gym
import pytest

from llm_gym import (
    InvalidArgumentError,
    Task,
    Tool,
    ToolArgumentError,
    ToolEnv,
    ToolResult,
    TruncationCause,
    tool,
    tool_to_spec,
)
from llm_gym.core import answers_match, extract_answer


@tool
def lookup_word(word: str, limit: int = 3, mode: Literal["exact", "prefix"] = "exact") -> str:
    """Look a word up in the dictionary.

    Args:
        word: The word to look up.
        limit: How many senses to return,
            at most ten.
        mode: How to match.

    Returns:
        The senses.
    """
    return f"{word}:{limit}:{mode}"


@tool(name="slow_add")
async def add(a: float, b: float | None = None) -> float:
    """Add two numbers."""
    await asyncio.sleep(0)
    return a + (b or 0)


@tool
def stopper() -> ToolResult:
    """End the episode."""
    return ToolResult("stopping", should_stop=True)


@tool
def broken(x: int) -> str:
    """Always fails."""
    raise RuntimeError(f"cannot handle {x}")


def test_tool_schema_from_signature_and_docstring() -> None:
    spec = tool_to_spec(lookup_word)
    assert spec["type"] == "function"
    fn = spec["function"]
    assert fn["name"] == "lookup_word"
    assert fn["description"] == "Look a word up in the dictionary."
    assert fn["parameters"] == {
        "type": "object",
        "properties": {
            "word": {"type": "string", "description": "The word to look up."},
            "limit": {"type": "integer", "description": "How many senses to return, at most ten."},
            "mode": {"enum": ["exact", "prefix"], "type": "string", "description": "How to match."},
        },
        "required": ["word"],
    }
    assert isinstance(lookup_word, Tool)
    assert tool_to_spec(add)["function"]["name"] == "slow_add"
    assert tool_to_spec(add)["function"]["parameters"]["properties"]["b"] == {"type": "number"}


def test_tool_validates_arguments() -> None:
    run = asyncio.run
    assert run(lookup_word.execute('{"word": "cat"}')).content == "cat:3:exact"
    assert run(lookup_word.execute('{"word": "cat", "limit": 2.0}')).content == "cat:2:exact"
    assert run(add.execute('{"a": 1, "b": 2.5}')).content == "3.5"
    for bad, reason in [
        ("not json", "not valid JSON"),
        ("[1]", "must be a JSON object"),
        ('{"limit": 1}', "missing required argument"),
        ('{"word": 3}', "'word' must be of type string"),
        ('{"word": "a", "mode": "fuzzy"}', "must be one of"),
        ('{"word": "a", "extra": 1}', "unknown argument"),
        ('{"word": "a", "limit": true}', "must be of type integer"),
    ]:
        with pytest.raises(ToolArgumentError, match=reason):
            run(lookup_word.execute(bad))


def test_tool_rejects_untyped_varargs() -> None:
    with pytest.raises(InvalidArgumentError, match="named parameters"):

        @tool
        def bad(*args: int) -> int:
            return 0


class DemoEnv(ToolEnv):
    system_prompt = "Demo."
    tools = (lookup_word, add, stopper, broken)


def _call(name: str, arguments: str, i: int = 0) -> dict:
    return {"id": f"c{i}", "type": "function", "function": {"name": name, "arguments": arguments}}


def test_tool_env_runs_calls_and_reports_errors() -> None:
    async def play() -> None:
        env = DemoEnv()
        opening = await env.reset(Task("Add 1 and 2", target=3))
        assert [m["role"] for m in opening] == ["system", "user"]
        result = await env.step(
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    _call("slow_add", '{"a": 1, "b": 2}', 0),
                    _call("brokn", "{}", 1),
                    _call("broken", '{"x": 5}', 2),
                    _call("lookup_word", "garbage", 3),
                ],
            }
        )
        assert not result.terminated
        tool_messages = result.messages[-4:]
        assert [m["tool_call_id"] for m in tool_messages] == ["c0", "c1", "c2", "c3"]
        assert tool_messages[0]["content"] == "3"
        assert "unknown tool 'brokn'" in tool_messages[1]["content"]
        assert "Did you mean 'broken'?" in tool_messages[1]["content"]
        assert tool_messages[2]["content"] == "tool_error: cannot handle 5"
        assert tool_messages[3]["content"].startswith("tool_error: arguments are not valid JSON")
        final = await env.step({"role": "assistant", "content": "<think>1+2</think> 3"})
        assert final.terminated and final.reward == 1.0
        assert final.metrics == {"tool_calls": 4, "tool_errors": 3}

    asyncio.run(play())


def test_tool_env_honours_should_stop() -> None:
    async def play() -> None:
        env = DemoEnv()
        await env.reset(Task("stop", target=1))
        result = await env.step(
            {"role": "assistant", "content": "", "tool_calls": [_call("stopper", "{}")]}
        )
        assert result.terminated and result.reward == 0.0

    asyncio.run(play())


def test_tool_env_rejects_duplicate_and_non_tools() -> None:
    with pytest.raises(InvalidArgumentError, match="unique"):
        ToolEnv(tools=[lookup_word, lookup_word])
    with pytest.raises(InvalidArgumentError, match="Expected Tool objects"):
        ToolEnv(tools=[object()])  # type: ignore[list-item]


@pytest.mark.parametrize(
    ("answer", "target", "expected"),
    [
        ("42", 42, True),
        (" 42. ", 42, True),
        ("1,234", 1234, True),
        ("42.0", 42, True),
        ("42.0000001", 42, False),  # an integer target is exact: no tolerance
        ("3164841", 3164840, False),
        ("42.001", 42, False),
        ("3.5000001", 3.5, True),  # a float target keeps the tolerance
        ("3.5", 3.5, True),
        ("forty-two", 42, False),
        ("1e400", 42, False),
        ("Velmora", "Velmora", True),
        ("velmora.", "Velmora", True),
        ("Tarsk", "Velmora", False),
        ("", 0, False),
    ],
)
def test_answers_match(answer: str, target: object, expected: bool) -> None:
    assert answers_match(answer, target) is expected


def test_extract_answer_strips_think_blocks() -> None:
    assert extract_answer("<think>hmm</think>\n 7 ") == "7"
    assert extract_answer("reasoning...</think>7") == "7"


def test_task_round_trips_and_validates() -> None:
    task = Task("p", target=3, metadata={"k": 1}, id="t1")
    assert Task.from_dict(task.to_dict()) == task
    assert Task.from_dict({"input": "q", "output": "a"}) == Task("q", "a")
    with pytest.raises(InvalidArgumentError, match="allowed keys"):
        Task.from_dict({"promt": "x"})
    with pytest.raises(InvalidArgumentError, match="Task.prompt must be a str"):
        Task(prompt=3)  # type: ignore[arg-type]


def test_truncation_causes() -> None:
    penalised = {c for c in TruncationCause if c.gets_overlong_penalty}
    assert penalised == {TruncationCause.CONTEXT_OVERFLOW, TruncationCause.MAX_TURNS}
    assert TruncationCause("parse_failure") is TruncationCause.PARSE_FAILURE


# --- scoring: numbers a float cannot hold ---------------------------------------------------------


def test_answers_match_compares_big_integers_exactly() -> None:
    assert not answers_match("5", 10**400)  # raised OverflowError
    assert answers_match(str(10**60 + 1), 10**60 + 1, rel_tol=0.0)
    assert not answers_match(str(10**60), 10**60 + 1, rel_tol=0.0)
    assert not answers_match("2.5", -(10**400))
    assert not answers_match(str(10**20), 10**20 + 1, rel_tol=0.0)  # ints compare exactly
    assert not answers_match("9007199254740993", 2**53, rel_tol=0.0)
    assert answers_match("1e20", 10**20, rel_tol=0.0)
    assert answers_match("42.0000001", 42.0) and not answers_match("42.0000001", 42)
    assert not answers_match("3", math.nan)


@pytest.mark.parametrize("env_id", ["Math-v0", "ToolUseGame-v0"])
def test_a_huge_target_scores_zero_instead_of_ending_as_env(env_id: str) -> None:
    env = gym.make(env_id)
    try:
        env.reset(options={"task": Task("How many?", target=10**400)})
        _, reward, terminated, truncated, info = env.step("5")
        assert (reward, terminated, truncated) == (0.0, True, False), info
    finally:
        env.close()


def test_an_integer_target_of_any_length_can_be_matched() -> None:
    for target in (10**70, -(10**200) + 7, 10**4000):
        assert answers_match(str(target), target)
        assert not answers_match(str(target + 1), target, rel_tol=0.0, abs_tol=0.0)
        assert answers_match(f"{target:,}", target)
    assert answers_match("1" + "0" * 300, 1e300)
    start = time.perf_counter()
    assert not answers_match("9" * 1_000_000, 5)  # a long reply is still not converted
    assert not answers_match("9" * 5_000, 10**4000)  # past the target's digits and 24
    assert time.perf_counter() - start < 0.1
