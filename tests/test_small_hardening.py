"""Hostile values to the calculator, Code-v0's comparison and reset options: outcomes or clear
errors, never a raw OverflowError/RecursionError, and reset options are checked whole."""

from __future__ import annotations

import asyncio

import pytest

from llm_gym.envs.code.grading import values_equal
from llm_gym.errors import InvalidArgumentError, ToolArgumentError
from llm_gym.tools.calculator import CalculatorTool

DEEP = "[" * 100_000 + "]" * 100_000


def test_a_huge_integer_is_not_equal_to_a_float() -> None:
    assert values_equal(10**400, 1.5) is False
    assert values_equal([10**400], [1.5]) is False
    assert values_equal({"a": -(10**400)}, {"a": 2.0}) is False
    assert values_equal(2, 2.0) is True


@pytest.mark.parametrize(
    "arguments", [DEEP, '{"expression": ' + DEEP + "}", '{"expression": "1", "x": ' + DEEP + "}"]
)
def test_deeply_nested_calculator_arguments_are_a_tool_argument_error(arguments: str) -> None:
    with pytest.raises(ToolArgumentError, match="nested too deeply"):
        asyncio.run(CalculatorTool().execute(arguments))


def test_deeply_nested_json_in_a_refund_transcript_is_not_a_crash() -> None:
    from llm_gym.envs.refund.protocol import read_tool_results

    assert read_tool_results("<tool_result>" + DEEP + "</tool_result>") is None


def test_reset_options_are_checked_whole() -> None:
    import gymnasium as gym

    import llm_gym  # noqa: F401  (registers the envs)

    env = gym.make("ToolUseGame-v0")
    task = env.unwrapped.tasks("val")[0]
    with pytest.raises(InvalidArgumentError, match="split"):
        env.reset(options={"split": "bogus", "task": task})
    with pytest.raises(InvalidArgumentError, match="not both"):
        env.reset(options={"task": task, "index": 0})
    for index in (True, -1, 10**9, 1.0, "0"):
        with pytest.raises(InvalidArgumentError, match=r"\[0, "):
            env.reset(options={"index": index})
    import numpy as np

    observation, info = env.reset(options={"index": np.int64(1)})
    assert info["task"] == env.unwrapped.tasks("train")[1]
