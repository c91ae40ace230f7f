"""``ToolEnv``: a generic tool-using environment to subclass instead of writing ``step`` by hand.

The seeds' ``MathEnv`` becomes::

    class MathEnv(ToolEnv):
        system_prompt = "Use the calculator tool, then reply with only the final number."
        tools = [CalculatorTool()]

A reply without tool calls is the final answer, scored by :meth:`ToolEnv.score`; tool calls run
concurrently-safe one after the other, a raising tool becomes a ``tool_error: ...`` message, and a
tool whose result asks to stop ends the episode. Tool results and error messages are made valid
UTF-8 (:func:`~llm_gym.core.text.clean_text`) and cut at :data:`MAX_TOOL_RESULT_CHARS`.
"""

from __future__ import annotations

import asyncio
import math
import re
import sys
from collections.abc import Sequence
from fractions import Fraction
from typing import Any, ClassVar

from llm_gym.core.env import Env, StepResult
from llm_gym.core.task import Task
from llm_gym.core.text import clean_text
from llm_gym.core.tool import Tool, run_tool, tool_to_spec
from llm_gym.core.types import Message, ToolSpec
from llm_gym.errors import InvalidArgumentError, did_you_mean

__all__ = [
    "MAX_TOOL_RESULT_CHARS",
    "ToolEnv",
    "answers_match",
    "bound_tool_text",
    "extract_answer",
    "tool_error_text",
]

MAX_TOOL_RESULT_CHARS = 8_000
"""Tool results longer than this are cut (with a note) so one call cannot flood the context."""

_THINK_OPEN = "<think>"
_THINK_CLOSE = "</think>"
_NUMBER = re.compile(r"[-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?")
_INTEGER = re.compile(r"[-+]?\d+")
_EXACT_FLOAT_INT = 2**53
"""Every int up to this magnitude is a float exactly."""


def extract_answer(content: str) -> str:
    """The answer part of a final reply: ``<think>`` blocks removed, whitespace stripped.

    Each ``<think>`` is closed by the next ``</think>`` (a ``<think>`` with no ``</think>``
    after it is kept as text); when a ``</think>`` is left over (the template opened the block
    in the prompt), the answer is what follows the last one. Linear in the length of the text
    (``str.find`` scans; a non-greedy regular expression took quadratic time on many openers).

    Example:
        >>> extract_answer("<think>hmm</think> 42 ")
        '42'
        >>> extract_answer("reasoning the template opened</think>\\n7")
        '7'
    """
    if _THINK_CLOSE not in content:
        return content.strip()
    kept: list[str] = []
    pos = 0
    while (start := content.find(_THINK_OPEN, pos)) != -1:
        end = content.find(_THINK_CLOSE, start + len(_THINK_OPEN))
        if end == -1:  # no block closes after here: the rest stays as it is
            break
        kept.append(content[pos:start])
        pos = end + len(_THINK_CLOSE)
    kept.append(content[pos:])
    text = "".join(kept)
    if _THINK_CLOSE in text:  # an opened-but-unclosed think block was closed by the template
        text = text.rsplit(_THINK_CLOSE, 1)[1]
    return text.strip()


def _number_chars(target: int | float) -> int:
    """How many characters a reply may take to write ``target``: 64, or its integer part's
    digits and 24 more (a target of 10**70 is 71 digits), up to what Python reads as an int
    (``sys.get_int_max_str_digits()``, 4,300 by default; 0 means no limit)."""
    size = abs(target)
    digits = size.bit_length() * math.log10(2) if type(size) is int else math.log10(size or 1)
    wanted = max(64, int(digits) + 25)
    return min(wanted, sys.get_int_max_str_digits() or wanted)


def _as_number(text: str, max_chars: int = 64) -> int | float | None:
    """The number ``text`` writes: an ``int`` for an integer (exact at any size), else a finite
    ``float``; None for anything else (at most ``max_chars`` characters are read as a number:
    converting a long one is slow)."""
    cleaned = text.strip().rstrip(".").replace(",", "").replace("_", "")
    if len(cleaned) > max_chars or not _NUMBER.fullmatch(cleaned):
        return None
    try:
        if _INTEGER.fullmatch(cleaned):
            return int(cleaned)
        value = float(cleaned)
    except ValueError:  # more digits than the interpreter converts
        return None
    return value if math.isfinite(value) else None


def _close(value: int | float, target: int | float, rel_tol: float, abs_tol: float) -> bool:
    """``math.isclose``, exact when a float cannot hold one of the numbers as it is: an int past
    2**53 (it would be rounded, so a wrong answer could match) or past the float range (where
    ``math.isclose`` raises OverflowError)."""
    if not any(type(x) is int and abs(x) > _EXACT_FLOAT_INT for x in (value, target)):
        return math.isclose(value, target, rel_tol=rel_tol, abs_tol=abs_tol)
    value, target = Fraction(value), Fraction(target)  # ints and finite floats: exact
    difference = abs(value - target)
    return difference <= Fraction(abs_tol) or difference <= Fraction(rel_tol) * max(
        abs(value), abs(target)
    )


def answers_match(
    answer: str, target: Any, *, rel_tol: float = 1e-6, abs_tol: float = 1e-6
) -> bool:
    """Whether a reply matches a target.

    An integer target (an ``int``) is matched exactly, at any size: the reply must write that
    integer (``"3164840"``, ``"3,164,840"``, ``"3164840.0"``), however close another number is.
    A float target matches a number within ``rel_tol`` (relative) or ``abs_tol`` (absolute).
    Thousands separators and a trailing period are ignored (a reply is read as a number up to 64
    characters, or the target's digits and 24 more). Anything else matches case-insensitively
    after stripping whitespace and a trailing period.

    Example:
        >>> answers_match("3164841", 3164840), answers_match("3,164,840", 3164840)
        (False, True)
        >>> answers_match("2.5000001", 2.5)
        True
    """
    if isinstance(target, bool) or not isinstance(target, int | float):
        expected = str(target).strip().rstrip(".").casefold()
        return answer.strip().rstrip(".").casefold() == expected
    if isinstance(target, float) and not math.isfinite(target):
        return False
    value = _as_number(answer, _number_chars(target))
    if value is None:
        return False
    if type(target) is int:  # an integer is exact: a tolerance would reward a wrong count
        return value == target  # int == int, and int == float, are exact in Python
    return _close(value, target, rel_tol, abs_tol)


def _describe(exc: BaseException) -> str:
    """An exception's message for the model (its repr when the message is empty; its type when
    even that fails: an exception's ``__str__`` is code too)."""
    for describe in (str, repr):
        try:
            text = describe(exc)
        except Exception:
            continue
        if text:
            return text
    return type(exc).__name__


def tool_error_text(exc: BaseException) -> str:
    """The tool message a failed call gives the model: ``tool_error: `` and the error's message.

    Example:
        >>> tool_error_text(ValueError("no such city"))
        'tool_error: no such city'
    """
    return f"tool_error: {_describe(exc)}"


def bound_tool_text(content: str) -> str:
    """A tool result as the model sees it: valid UTF-8 (:func:`~llm_gym.core.text.clean_text`)
    and cut at :data:`MAX_TOOL_RESULT_CHARS` with a note.

    Example:
        >>> bound_tool_text("x" * 9000).endswith("[cut at 8000 chars]")
        True
    """
    content = clean_text(content)  # a tool or its error may quote undecodable bytes
    if len(content) > MAX_TOOL_RESULT_CHARS:
        content = content[:MAX_TOOL_RESULT_CHARS] + f"\n[cut at {MAX_TOOL_RESULT_CHARS} chars]"
    return content


_TOOL_ATTRIBUTES = ("name", "description", "parameters_schema", "execute")


class ToolEnv(Env):
    """A tool-using environment: system prompt, tools, final-answer scorer.

    Set the class attributes (or pass them to ``__init__``) and override :meth:`score` for a
    custom reward; override :meth:`initial_messages` for a custom opening.
    """

    system_prompt: ClassVar[str] = ""
    """The system message of every episode (empty: no system message)."""
    tools: ClassVar[Sequence[Tool]] = ()
    """The tools the model may call."""

    def __init__(
        self,
        tools: Sequence[Tool] | None = None,
        system_prompt: str | None = None,
        *,
        tool_latency_s: float = 0.0,
    ) -> None:
        if (
            isinstance(tool_latency_s, bool)
            or not isinstance(tool_latency_s, int | float)
            or not 0 <= tool_latency_s <= 3600
        ):
            raise InvalidArgumentError(
                f"tool_latency_s must be a number of seconds in [0, 3600], actual value: "
                f"{tool_latency_s!r}."
            )
        self.tool_latency_s = float(tool_latency_s)
        """Simulated latency of every tool call in seconds (0: none): each call awaits it
        before running, as a remote service or sandbox would (episodes wait concurrently)."""
        tool_list = list(self.tools if tools is None else tools)
        self._tools: dict[str, Tool] = {}
        for t in tool_list:
            if not all(hasattr(t, a) for a in _TOOL_ATTRIBUTES):
                raise InvalidArgumentError(
                    f"Expected Tool objects (name, description, parameters_schema, execute), "
                    f"actual value: {t!r}."
                )
            if t.name in self._tools:
                raise InvalidArgumentError(f"Two tools are named {t.name!r}; names must be unique.")
            self._tools[t.name] = t
        self._system_prompt = self.system_prompt if system_prompt is None else system_prompt
        self._messages: list[Message] = []
        self._task: Task | None = None
        self._specs = [tool_to_spec(t) for t in self._tools.values()]

    @property
    def task(self) -> Task:
        """The current episode's task."""
        if self._task is None:
            raise RuntimeError("No episode is running: call reset(task) first.")
        return self._task

    def initial_messages(self, task: Task) -> list[Message]:
        """The opening messages: the system prompt (if any) and the task's prompt."""
        opening: list[Message] = []
        if self._system_prompt:
            opening.append(Message(role="system", content=self._system_prompt))
        opening.append(Message(role="user", content=task.prompt))
        return opening

    def score(self, answer: str, task: Task) -> float:
        """The reward of a final answer: 1.0 when it matches ``task.target``, else 0.0."""
        return 1.0 if answers_match(answer, task.target) else 0.0

    def metrics(self, answer: str | None, task: Task) -> dict[str, Any]:
        """Diagnostics of the finished episode (added to the final step's metrics)."""
        return {}

    async def reset(self, task: Task) -> list[Message]:
        self._task = task
        self._messages = self.initial_messages(task)
        self._tool_calls = 0
        self._tool_errors = 0
        return list(self._messages)

    def _finish(self, answer: str | None, reward: float) -> StepResult:
        metrics = {"tool_calls": self._tool_calls, "tool_errors": self._tool_errors}
        metrics.update(self.metrics(answer, self.task))
        return StepResult(
            terminated=True,
            truncated=False,
            messages=list(self._messages),
            reward=reward,
            metrics=metrics,
        )

    async def call_tool(self, name: str, arguments: str) -> tuple[str, bool]:
        """Run one tool call; return (content, should_stop). Errors become ``tool_error: ...``."""
        found = self._tools.get(name)
        if found is None:
            self._tool_errors += 1
            hint = did_you_mean(name, self._tools)
            return (
                f"tool_error: unknown tool {str(name)[:80]!r}; available tools: "
                f"{sorted(self._tools)}.{hint}",
                False,
            )
        if self.tool_latency_s:
            await asyncio.sleep(self.tool_latency_s)
        try:
            result = await run_tool(found, arguments)
            content, stop = str(result.content), bool(result.should_stop)
        except Exception as exc:  # a bad call is an episode outcome, never a crash
            self._tool_errors += 1
            content, stop = tool_error_text(exc), False
        return bound_tool_text(content), stop

    async def step(self, message: Message) -> StepResult:
        task = self.task
        self._messages.append(message)
        tool_calls = message.get("tool_calls") or []
        if not tool_calls:
            answer = extract_answer(message.get("content") or "")
            return self._finish(answer, self.score(answer, task))
        stop = False
        for call in tool_calls:
            function = call.get("function") or {}
            name = function.get("name", "")
            self._tool_calls += 1
            content, should_stop = await self.call_tool(name, function.get("arguments", "{}"))
            stop = stop or should_stop
            self._messages.append(
                Message(role="tool", content=content, tool_call_id=call.get("id", ""), name=name)
            )
        if stop:
            return self._finish(None, self.stop_reward(task))
        return StepResult(terminated=False, truncated=False, messages=list(self._messages))

    def stop_reward(self, task: Task) -> float:
        """The reward when a tool ends the episode (default 0.0)."""
        return 0.0

    @property
    def synchronous(self) -> bool:
        """True when every tool declares ``synchronous = True`` (``@tool`` on a plain function)
        and no latency is simulated."""
        return not self.tool_latency_s and all(
            getattr(t, "synchronous", False) for t in self._tools.values()
        )

    @property
    def tool_specs(self) -> list[ToolSpec]:
        return [dict(spec) for spec in self._specs]  # type: ignore[misc]

    @property
    def messages(self) -> list[Message]:
        return list(self._messages)
