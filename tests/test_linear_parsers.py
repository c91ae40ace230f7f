"""Every parser of model (or environment) text is linear.

Each parser runs on about 1 MB of adversarial text (repeated openers, unclosed tags, nested
braces, long digit runs, surrogates...) and must return within a loose bound: a linear parser
takes milliseconds, a quadratic one seconds to minutes (the ``<think>`` stripping took 5.8 s on
112 KB). A timer interrupts a call long past its bound, so a regression fails fast instead of
hanging the suite. The rewritten scanners are checked against the regular expressions they
replace, on small random inputs.
"""

from __future__ import annotations

import json
import re
import signal
import time
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any

import gymnasium as gym
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llm_gym.actions import get_action_format
from llm_gym.core import registered_envs
from llm_gym.core.text import clean_text
from llm_gym.core.tool_env import answers_match, extract_answer
from llm_gym.environments.multi_turn import parse_chatml
from llm_gym.envs.code.grading import extract_code, fenced_blocks
from llm_gym.envs.guess_number.env import parse_guess as parse_number_guess
from llm_gym.envs.refund.protocol import parse_action, read_tool_results
from llm_gym.envs.sql.env import strip_answer
from llm_gym.envs.wordle.env import parse_guess as parse_word_guess
from llm_gym.envs.wordle.env import read_feedback

SIZE = 1_000_000
BOUND_S = 0.5
"""Per call on ``SIZE`` characters: generous for a linear scan (milliseconds), far below what a
quadratic one needs. Timings on a shared machine are noisy: this is a bound, not a benchmark."""

FRAGMENTS = [
    "<think>", "</think>", "```", "```python\n", "``` \t", "<tool_call>", "</tool_call>",
    "<tool_response>", "<tool_result>", "</tool_result>", "<|im_start|>", "<|im_start|>a\n",
    "<|im_end|>", "{", "}", "[", "]", '{"name": "', '{"a":', '"', "\\", ":", ",", "9", "123,",
    "1,", "-", "-1", ".", "e", "1e", " ", "\n", "\t", "a", "[x]", "**", "`", "'", "$",
    "\ud800", "\x00", "\U0001f600", "Guess 1 of 6: ", "You are at row 1, column ",
]  # fmt: skip


def repeated(fragment: str, size: int = SIZE) -> str:
    return (fragment * (size // len(fragment) + 1))[:size]


def adversarial(size: int = SIZE) -> dict[str, str]:
    """Named texts of about ``size`` characters that break backtracking parsers."""
    texts = {f"{fragment!r} * n": repeated(fragment, size) for fragment in FRAGMENTS}
    half = size // 2
    texts.update(
        {
            "openers then fences": repeated("<think>", half) + repeated("```", half),
            "think opened, never closed": "<think>" + repeated("a", size),
            "one close at the end": repeated("<think>", size) + "</think>",
            "tool call with nested braces": "<tool_call>" + repeated("{", size),
            "tool call with a long number": '<tool_call>{"name": "f", "arguments": {"a": '
            + repeated("9", size)
            + "}}</tool_call>",
            "json list of openers": repeated('[{"name": "f", "arguments": ', size),
            "thousands groups": repeated("123,", size) + "1234",
            "chatml blocks never closed": repeated("<|im_start|>user\n", half)
            + repeated("x", half),
            "fence then a long line": "```" + repeated("p", size),
        }
    )
    return texts


class TooSlow(Exception):
    pass


@contextmanager
def interrupted_after(seconds: float):
    """Raise :class:`TooSlow` in the main thread after ``seconds`` (regular expressions check
    for signals, so even a runaway match stops)."""
    if not hasattr(signal, "setitimer"):  # pragma: no cover - not POSIX
        yield
        return

    def alarm(signum: int, frame: Any) -> None:
        raise TooSlow(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def check_linear(parse: Callable[[str], Any], texts: dict[str, str], bound: float) -> None:
    """``parse`` handles each text within ``bound`` seconds (and is stopped at ten times it)."""
    slow = {}
    for name, text in texts.items():
        started = time.perf_counter()
        try:
            with interrupted_after(10 * bound):
                parse(text)
        except TooSlow:
            pass
        took = time.perf_counter() - started
        if took > bound:
            slow[name] = round(took, 3)
    assert not slow, f"slower than {bound} s on {len(next(iter(texts.values())))} chars: {slow}"


HERMES, JSON = get_action_format("hermes"), get_action_format("json")
PARSERS: dict[str, Callable[[str], Any]] = {
    "hermes.parse": HERMES.parse,
    "json.parse": JSON.parse,
    "extract_answer": extract_answer,
    "answers_match (text target)": lambda text: answers_match(text, "Oslo"),
    "answers_match (number target)": lambda text: answers_match(text, 12.5),
    "Code-v0 extract_code": extract_code,
    "GuessNumber-v0 parse_guess": parse_number_guess,
    "Wordle-v0 parse_guess": parse_word_guess,
    "Wordle-v0 read_feedback": lambda text: read_feedback([{"role": "user", "content": text}]),
    "Refund-v0 parse_action": parse_action,
    "Refund-v0 read_tool_results": read_tool_results,
    "SQL-v0 strip_answer": strip_answer,
    "document 002 parse_chatml": parse_chatml,
    "clean_text": clean_text,
}


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_every_parser_is_linear_on_adversarial_text(name: str) -> None:
    check_linear(PARSERS[name], adversarial(), BOUND_S)


def test_the_maze_oracle_reads_positions_in_linear_time() -> None:
    from llm_gym.envs.maze import get_tasks, oracle_action

    task = get_tasks("val")[0]
    check_linear(
        lambda t: oracle_action(task, [{"role": "tool", "content": t}]), adversarial(), BOUND_S
    )


# --- every registered environment, end to end ---------------------------------------------------

ENV_SIZE = 250_000
ENV_BOUND_S = 1.0
"""A whole ``TextEnv.step`` (parse, env, info) on ``ENV_SIZE`` characters; a quadratic parser
would need tens of seconds on it."""


def tool_call_actions(tool_specs: list[dict[str, Any]], size: int) -> dict[str, str]:
    """A call of each tool with every string argument ``size`` characters of hostile text."""
    actions = {}
    for spec in tool_specs:
        function = spec["function"]
        properties = (function.get("parameters") or {}).get("properties") or {}
        for fragment in ("1+", "(", "<think>", "'", "%", "9"):
            arguments = {
                key: repeated(fragment, size // max(1, len(properties))) for key in properties
            }
            call = json.dumps({"name": function["name"], "arguments": arguments})
            actions[f"{function['name']}({fragment!r} * n)"] = f"<tool_call>{call}</tool_call>"
    return actions


@pytest.mark.parametrize("env_id", [entry.id for entry in registered_envs()])
def test_every_env_steps_in_linear_time_on_adversarial_actions(env_id: str) -> None:
    env = gym.make(env_id)
    _, info = env.reset(seed=0)
    actions = adversarial(ENV_SIZE)
    actions.update(tool_call_actions(info["tool_specs"], ENV_SIZE))

    def step(action: str) -> None:
        env.reset(seed=0)
        env.step(action)

    try:
        check_linear(step, actions, ENV_BOUND_S)
    finally:
        env.close()


# --- the scanners agree with the regular expressions they replace ----------------------------

_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)


def reference_extract_answer(content: str) -> str:
    text = _THINK.sub("", content)
    if "</think>" in text:
        text = text.rsplit("</think>", 1)[1]
    return text.strip()


def pieces(*fragments: str) -> st.SearchStrategy[str]:
    return st.lists(st.sampled_from(fragments) | st.text(max_size=3), max_size=12).map("".join)


@settings(max_examples=1500, deadline=None)
@given(text=pieces("<think>", "</think>", "<think", "think>", "a", " ", "\n"))
def test_extract_answer_matches_the_regular_expression(text: str) -> None:
    assert extract_answer(text) == reference_extract_answer(text)


@settings(max_examples=1500, deadline=None)
@given(text=pieces("```", "```python", "``` py x", "`", "\n", " ", "\t", "py", "+-", "a"))
def test_fenced_blocks_match_the_regular_expression(text: str) -> None:
    assert fenced_blocks(text) == [(m.group(1), m.group(2)) for m in _FENCE.finditer(text)]
