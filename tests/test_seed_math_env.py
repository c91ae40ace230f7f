"""The seeds' MathEnv runs on llm_gym with only its imports changed: through TextEnv, through the
async loop, and as a ~15-line ToolEnv."""

from __future__ import annotations

import json
from collections.abc import Sequence

from llm_gym import ToolEnv
from llm_gym.envs import Task
from llm_gym.gym import TextEnv
from llm_gym.policies import Generation, Policy, PolicyRequest
from llm_gym.rollout import collect_groups
from llm_gym.tools import CalculatorTool
from tests.seeds.math_env import SYSTEM_PROMPT, MathEnv

TASKS = [
    Task(prompt="What is 6 times 7?", target=42, metadata={"expression": "6 * 7"}),
    Task(prompt="What is 2 to the 10th?", target=1024, metadata={"expression": "2 ** 10"}),
    Task(prompt="What is 7 divided by 2?", target=3.5, metadata={"expression": "7 / 2"}),
]


class ScriptedMath(Policy):
    """Calls the calculator once, then replies with its result."""

    async def act(self, requests: Sequence[PolicyRequest]) -> list[Generation]:
        out = []
        for r in requests:
            results = [m["content"] for m in r.messages if m["role"] == "tool"]
            if results:
                out.append(Generation(text=results[-1]))
            else:
                call = {
                    "name": "calculator",
                    "arguments": {"expression": r.task.metadata["expression"]},
                }
                out.append(Generation(text=f"<tool_call>{json.dumps(call)}</tool_call>"))
        return out


def test_math_env_through_text_env() -> None:
    env = TextEnv(MathEnv, TASKS, max_turns=4)
    for index, task in enumerate(TASKS):
        observation, info = env.reset(seed=0, options={"index": index})
        assert SYSTEM_PROMPT in observation and task.prompt in observation
        assert '"name": "calculator"' in observation  # the tool spec is rendered for the model
        call = {"name": "calculator", "arguments": {"expression": task.metadata["expression"]}}
        observation, reward, terminated, truncated, info = env.step(
            f"<tool_call>{json.dumps(call)}</tool_call>"
        )
        assert (reward, terminated, truncated) == (0.0, False, False)
        assert str(task.target) in observation
        observation, reward, terminated, truncated, info = env.step(str(task.target))
        assert (reward, terminated, truncated) == (1.0, True, False)
        assert [m["role"] for m in info["messages"]] == [
            "system",
            "user",
            "assistant",
            "tool",
            "assistant",
        ]


def test_math_env_tool_error_is_a_message_not_a_crash() -> None:
    env = TextEnv(MathEnv, TASKS, max_turns=4)
    env.reset(seed=0, options={"index": 0})
    call = {"name": "calculator", "arguments": {"expression": "__import__('os').system('ls')"}}
    observation, reward, terminated, truncated, info = env.step(
        f"<tool_call>{json.dumps(call)}</tool_call>"
    )
    assert not terminated and not truncated
    assert "tool_error" in info["messages"][-1]["content"]
    _observation, reward, terminated, truncated, info = env.step("41")
    assert (reward, terminated) == (0.0, True)


def test_math_env_through_the_async_loop() -> None:
    groups = collect_groups(
        lambda task: MathEnv(), TASKS, ScriptedMath(), episodes_per_task=2, max_turns=4
    )
    assert [[e.reward for e in group] for group in groups] == [[1.0, 1.0]] * 3
    assert all(e.terminated and e.num_turns == 2 for group in groups for e in group)


class ShortMathEnv(ToolEnv):
    """The seeds' MathEnv as a ToolEnv: the same behaviour in a few lines."""

    system_prompt = SYSTEM_PROMPT
    tools = (CalculatorTool(),)


def test_tool_env_version_behaves_the_same() -> None:
    long = collect_groups(MathEnv, TASKS, ScriptedMath(), episodes_per_task=1, max_turns=4)
    short = collect_groups(ShortMathEnv, TASKS, ScriptedMath(), episodes_per_task=1, max_turns=4)
    for a, b in zip(long, short, strict=True):
        assert a[0].reward == b[0].reward == 1.0
        assert [m["role"] for m in a[0].messages] == [m["role"] for m in b[0].messages]
        assert a[0].messages[3]["content"] == b[0].messages[3]["content"]
