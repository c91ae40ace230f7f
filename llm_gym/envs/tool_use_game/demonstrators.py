"""ToolUseGame's demonstrators: the oracle, and imperfect ones for warm starts that RL corrects."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from typing import Any

from llm_gym.core.task import Task
from llm_gym.core.types import Message, ToolCall
from llm_gym.envs.tool_use_game.env import ATTRIBUTES, evaluate_plan, task_world
from llm_gym.errors import InvalidArgumentError
from llm_gym.tools.arithmetic import format_number

__all__ = [
    "HASTY_GUESS_RATE",
    "HASTY_MENTAL_RATE",
    "HastyOracle",
    "hasty_oracle_action",
    "oracle_action",
]

HASTY_GUESS_RATE = 0.3
"""The default share of tasks on which :class:`HastyOracle` answers without looking anything up."""
HASTY_MENTAL_RATE = 0.4
"""The default share of the other tasks needing arithmetic on which it skips the calculator."""


def _call(index: int, name: str, arguments: dict[str, Any]) -> ToolCall:
    return {
        "id": f"oracle_{index}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }


def oracle_action(task: Task, messages: Sequence[Message]) -> Message:
    """The expert's next assistant message: look up every fact, compute, answer.

    Reads the values from the tool results in ``messages`` (never from the task's target).
    """
    keys: list[str] = list(task.metadata["keys"])
    expression: str | None = task.metadata.get("expression")
    looked_up = [
        m["content"] for m in messages if m.get("role") == "tool" and m.get("name") == "lookup"
    ]
    computed = [
        m["content"] for m in messages if m.get("role") == "tool" and m.get("name") == "calculator"
    ]
    if len(looked_up) < len(keys):
        calls = [_call(i, "lookup", {"key": key}) for i, key in enumerate(keys)]
        return Message(role="assistant", content="", tool_calls=calls)
    values = [int(v) for v in looked_up[-len(keys) :]]
    if task.metadata["type"] == "compare":
        a_town, b_town = (k.split(".")[0] for k in keys)
        answer = a_town if values[0] > values[1] else b_town
        return Message(role="assistant", content=answer)
    if expression is not None and not computed:
        calls = [_call(0, "calculator", {"expression": expression.format(*values)})]
        return Message(role="assistant", content="", tool_calls=calls)
    answer = computed[-1] if computed else format_number(values[0])
    return Message(role="assistant", content=answer)


class HastyOracle:
    """An imperfect demonstrator, for warm starts that RL then corrects.

    On ``guess_rate`` of the tasks (drawn per task, so deterministic) it answers at once with a
    plausible guess (a value in the attribute's range, or one of the two towns); on
    ``mental_rate`` of the rest that need arithmetic it looks the facts up and then does the
    arithmetic in its head (the right number, without the calculator, which a small model cannot
    imitate reliably). Otherwise it acts as :func:`oracle_action`. Picklable; equal rates give
    the same demonstrations.

    Example:
        >>> from llm_gym.envs.tool_use_game import get_tasks
        >>> demonstrator = HastyOracle(guess_rate=1.0)
        >>> task = get_tasks("val")[0]
        >>> demonstrator(task, []).get("tool_calls") is None  # it answers without a lookup
        True
    """

    def __init__(
        self, guess_rate: float = HASTY_GUESS_RATE, mental_rate: float = HASTY_MENTAL_RATE
    ) -> None:
        for name, value in (("guess_rate", guess_rate), ("mental_rate", mental_rate)):
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
                raise InvalidArgumentError(
                    f"{name} must be a number in [0, 1], actual value: {value!r}."
                )
        self.guess_rate = float(guess_rate)
        self.mental_rate = float(mental_rate)

    def __repr__(self) -> str:
        return f"HastyOracle(guess_rate={self.guess_rate}, mental_rate={self.mental_rate})"

    def __call__(self, task: Task, messages: Sequence[Message]) -> Message:
        draw = random.Random(f"hasty/{task_world(task)}/{task.prompt}")
        habit = draw.random()
        keys: list[str] = list(task.metadata["keys"])
        if habit < self.guess_rate:
            return Message(role="assistant", content=_guess(task, keys, draw))
        expression = task.metadata.get("expression")
        looked_up = [m for m in messages if m.get("role") == "tool" and m.get("name") == "lookup"]
        mental = habit < self.guess_rate + (1 - self.guess_rate) * self.mental_rate
        if mental and expression is not None and len(looked_up) >= len(keys):
            values = [int(m["content"]) for m in looked_up[-len(keys) :]]
            answer = format_number(evaluate_plan(expression, values))
            return Message(role="assistant", content=answer)
        return oracle_action(task, messages)


def _guess(task: Task, keys: list[str], draw: random.Random) -> str:
    """A plausible answer made up without looking anything up."""
    if task.metadata["type"] == "compare":
        return draw.choice([k.split(".")[0] for k in keys])
    guesses = [draw.randint(*ATTRIBUTES[k.split(".")[1]][1:]) for k in keys]
    expression = task.metadata.get("expression")
    return format_number(evaluate_plan(expression, guesses) if expression else guesses[0])


hasty_oracle_action = HastyOracle()
"""The :class:`HastyOracle` at the default rates."""
