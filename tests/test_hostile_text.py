"""Hostile text between environments and policies (:mod:`llm_gym.core.text`, the action formats,
the episode driver).

Every string that reaches a policy or an environment encodes to UTF-8 (surrogates become
U+FFFD; NUL and other control characters are kept), and an action longer than the limit is a
parse failure that the environment never sees."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import pytest

from llm_gym import Env, StepResult, Task, ToolEnv, TruncationCause, tool
from llm_gym.actions import get_action_format
from llm_gym.core import FrozenMessage, clean_json, clean_message, clean_text, freeze_message
from llm_gym.core.text import clean_messages
from llm_gym.errors import InvalidArgumentError
from llm_gym.gym import TextEnv
from llm_gym.policies import Generation, Policy, PolicyRequest
from llm_gym.rollout import collect_groups
from llm_gym.rollout.driver import MAX_ACTION_CHARS, EpisodeDriver

BAD = "bad \ud800 and \udcff, pair \ud83d\ude00"
CLEAN = "bad \ufffd and \ufffd, pair \ufffd\ufffd"


def encodes(value: object) -> bool:
    """Whether ``value`` goes through a strict JSON-to-UTF-8 encoder (what an HTTP client does)."""
    json.dumps(value, ensure_ascii=False).encode("utf-8")
    return True


# --- the helpers ----------------------------------------------------------------------------------


def test_clean_text_replaces_each_surrogate_and_keeps_everything_else() -> None:
    assert clean_text(BAD) == CLEAN
    valid = "NUL \x00, bell \x07, é, 中, \U0001f600"
    assert clean_text(valid) is valid  # no copy when nothing changes
    assert clean_text("\ud800" * 3) == "\ufffd" * 3


def test_clean_message_walks_every_field_and_keeps_frozen_messages_frozen() -> None:
    message = {
        "role": "assistant",
        "content": BAD,
        "tool_calls": [
            {"id": "c\udc80", "type": "function", "function": {"name": "f", "arguments": BAD}}
        ],
    }
    cleaned = clean_message(message)
    assert encodes(cleaned) and cleaned["content"] == CLEAN
    assert cleaned["tool_calls"][0]["id"] == "c\ufffd"
    assert message["content"] == BAD  # the original is untouched
    ok = {"role": "user", "content": "fine"}
    assert clean_message(ok) is ok
    frozen = clean_message(FrozenMessage({"role": "tool", "content": BAD}))
    assert type(frozen) is FrozenMessage and frozen["content"] == CLEAN
    assert clean_json({"k\ud800": [1, None, ("x\ud800",)]}) == {"k\ufffd": [1, None, ("x\ufffd",)]}


def test_clean_messages_copies_only_when_needed() -> None:
    messages = [{"role": "user", "content": BAD}, {"role": "user", "content": "ok"}]
    assert clean_messages(messages, start=1) is None  # the bad one is before start
    cleaned = clean_messages(messages)
    assert cleaned is not None and cleaned[1] is messages[1] and encodes(cleaned)


# --- environments that write invalid text ---------------------------------------------------------


class Dirty(Env):
    """Writes surrogates everywhere it can: the opening, its tool specs, its replies (including
    one it adds to its own list in place), and records what it was given."""

    def __init__(self) -> None:
        self._messages: list = []
        self.seen: list[str] = []

    async def reset(self, task):
        self._messages = [{"role": "system", "content": "sys " + BAD}]
        self._messages.append({"role": "user", "content": task.prompt})
        return self._messages

    async def step(self, message):
        self.seen.append(message["content"])
        self._messages.append(message)
        self._messages.append({"role": "user", "content": "reply " + BAD + " NUL \x00"})
        done = len(self.seen) >= 2
        return StepResult(done, False, self._messages, reward=1.0 if done else 0.0)

    @property
    def tool_specs(self):
        return [{"type": "function", "function": {"name": "f", "description": BAD}}]

    @property
    def messages(self):
        return list(self._messages)


class Strict(Policy):
    """Encodes each request as an HTTP client would (strict UTF-8) and replies with surrogates."""

    def __init__(self) -> None:
        self.requests = 0

    async def act(self, requests: Sequence[PolicyRequest]) -> list[Generation]:
        for request in requests:
            encodes({"messages": request.messages, "tools": request.tool_specs})
            self.requests += 1
        return [Generation(text="model says \udc80") for _ in requests]


def test_invalid_env_text_never_reaches_the_policy_and_model_text_never_the_env() -> None:
    envs: list[Dirty] = []

    def factory(task):
        envs.append(Dirty())
        return envs[-1]

    policy = Strict()
    [[episode]] = collect_groups(factory, [Task("prompt \ud800")], policy, max_turns=3)
    assert episode.terminated and policy.requests == 2
    assert envs[0].seen == ["model says \ufffd"] * 2
    assert encodes(episode.messages) and encodes(episode.tool_specs)
    assert all(turn.text == "model says \ufffd" for turn in episode.turns)
    assert "NUL \x00" in episode.messages[-1]["content"]  # NUL is valid UTF-8: kept
    assert envs[0]._messages[-1]["content"].startswith("reply bad \ud800")  # its list: untouched


def test_text_env_observations_and_info_are_valid() -> None:
    env = TextEnv(Dirty, [Task("prompt \ud800")])
    observation, info = env.reset(seed=0)
    assert encodes(observation) and encodes(info["messages"]) and encodes(info["tool_specs"])
    observation, _, _, _, info = env.step("hello \ud800")
    assert encodes(observation) and encodes(info["messages"])
    assert env.inner_env.seen == ["hello \ufffd"]
    env.close()


@tool
def shout(text: str) -> str:
    """Shout.

    Args:
        text: What to shout.
    """
    raise ValueError(f"cannot shout {text}\udcff")


@tool
def echo_bytes(n: int) -> str:
    """Decode bytes the lenient way.

    Args:
        n: How many.
    """
    return bytes(range(0x80, 0x80 + n)).decode("utf-8", "surrogateescape")


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no message for you")


@tool
def hostile(size: int) -> str:
    """Raise something hostile.

    Args:
        size: 0 for an exception without a printable message, else a message this long.
    """
    if size == 0:
        raise Unprintable()
    raise ValueError("x" * size)


class Tools(ToolEnv):
    tools = [shout, echo_bytes, hostile]


def _call(env: ToolEnv, name: str, arguments: dict) -> str:
    import asyncio

    async def go() -> str:
        await env.reset(Task("t"))
        content, _ = await env.call_tool(name, json.dumps(arguments))
        return content

    return asyncio.run(go())


def test_tool_results_and_tool_errors_are_valid_and_bounded() -> None:
    from llm_gym.core.tool_env import MAX_TOOL_RESULT_CHARS

    env = Tools()
    assert _call(env, "shout", {"text": "hi"}) == "tool_error: cannot shout hi\ufffd"
    assert _call(env, "echo_bytes", {"n": 3}) == "\ufffd" * 3
    assert _call(env, "hostile", {"size": 0}).startswith("tool_error: Unprintable")
    long = _call(env, "hostile", {"size": 10 * MAX_TOOL_RESULT_CHARS})
    assert len(long) < MAX_TOOL_RESULT_CHARS + 100 and long.endswith("chars]")


# --- the action length limit ----------------------------------------------------------------------


class Counting(ToolEnv):
    steps = 0

    async def step(self, message):
        Counting.steps += 1
        return await super().step(message)


def test_text_env_enforces_its_action_length_limit() -> None:
    Counting.steps = 0
    env = TextEnv(Counting, [Task("q", target="a")], max_action_chars=100)
    env.reset(seed=0)
    _, reward, terminated, truncated, info = env.step("a" * 101)
    assert truncated and not terminated and reward == env.failed_parse_reward
    assert info["truncation_cause"] is TruncationCause.PARSE_FAILURE
    assert "101 characters, over max_action_chars=100" in info["parse_error"]
    assert Counting.steps == 0  # the env never saw it
    env.reset(seed=0)
    assert env.step("a" * 100)[2]  # at the limit: a final answer like any other
    env.close()


def test_a_ten_megabyte_action_is_a_parse_failure_by_default() -> None:
    env = gym.make("ToolUseGame-v0")
    env.reset(seed=0)
    _, _, _, truncated, info = env.step("x" * 10_000_000)
    assert truncated and info["truncation_cause"] is TruncationCause.PARSE_FAILURE
    assert f"max_action_chars={MAX_ACTION_CHARS:,}" in info["parse_error"]
    env.close()


class Verbose(Policy):
    async def act(self, requests):
        return [Generation(text="y" * (MAX_ACTION_CHARS + 1)) for _ in requests]


def test_the_loop_enforces_the_same_limit() -> None:
    Counting.steps = 0
    [[episode]] = collect_groups(Counting, [Task("q", target="a")], Verbose(), max_turns=2)
    assert episode.truncation_cause is TruncationCause.PARSE_FAILURE and Counting.steps == 0
    assert "max_action_chars" in episode.turns[0].parse_error


def test_max_action_chars_is_checked() -> None:
    from llm_gym.errors import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match="max_action_chars"):
        EpisodeDriver(lambda task: Counting(), max_action_chars=0)


# --- surrogates the model writes as JSON escapes --------------------------------------------------

ESCAPED = '"\\ud800 x \\udfff"'  # valid ASCII text that decodes to lone surrogates


@pytest.mark.parametrize(
    ("format_name", "text"),
    [
        (
            "hermes",
            '<tool_call>{"name": ' + ESCAPED + ', "arguments": {"q": ' + ESCAPED + "}}</tool_call>",
        ),
        (
            "hermes",
            '<tool_call>{"name": "f", "arguments": {'
            + ESCAPED
            + ": ["
            + ESCAPED
            + "]}}</tool_call>",
        ),
        ("json", '{"name": ' + ESCAPED + ', "arguments": {"q": ' + ESCAPED + "}}"),
        ("json", '{"answer": ' + ESCAPED + "}"),
        ("json", '{"answer": {"k": ' + ESCAPED + "}}"),
    ],
)
def test_parsed_actions_decode_escaped_surrogates_to_valid_text(
    format_name: str, text: str
) -> None:
    from llm_gym.actions import get_action_format
    from llm_gym.core.tool import decode_arguments

    parsed = get_action_format(format_name).parse(text, call_id_prefix="c")
    assert not parsed.is_failure and encodes(parsed.message)
    decoded = [parsed.message["content"]]
    for call in parsed.tool_calls:  # what a tool gets once it decodes its arguments
        decoded += [call["function"]["name"], decode_arguments(call["function"]["arguments"])]
    assert encodes(decoded) and "\ufffd" in json.dumps(decoded, ensure_ascii=False)


# --- model output: deeply nested tool-call arguments ----------------------------------------------

DEEP_SURROGATE = "[" * 900 + '"\\ud800"' + "]" * 900


@pytest.mark.parametrize("format_name", ["hermes", "json"])
def test_deep_arguments_with_an_escaped_surrogate_parse(format_name: str) -> None:
    body = '{"name": "calculator", "arguments": {"expression": ' + DEEP_SURROGATE + "}}"
    text = f"<tool_call>{body}</tool_call>" if format_name == "hermes" else body
    parsed = get_action_format(format_name).parse(text)  # raised RecursionError
    assert parsed.is_tool_calls or parsed.is_failure
    json.dumps(parsed.message, ensure_ascii=False).encode("utf-8")
    answer = get_action_format("json").parse('{"answer": ' + DEEP_SURROGATE + "}")
    assert answer.is_final and "\ufffd" in answer.message["content"]


def test_clean_json_walks_any_depth_copies_shared_values_and_refuses_cycles() -> None:
    deep = json.loads(DEEP_SURROGATE)
    cleaned = clean_json(deep)
    for _ in range(900):
        cleaned = cleaned[0]
    assert cleaned == "\ufffd"
    shared = ["x\ud800"]
    assert clean_json({"a": shared, "b": (shared,)}) == {"a": ["x\ufffd"], "b": (["x\ufffd"],)}
    ok = ["fine"]
    assert clean_json([ok, ok]) == [ok, ok]  # shared and valid: an equal copy
    cycle: list[Any] = ["\ud800"]
    cycle.append(cycle)
    with pytest.raises(InvalidArgumentError, match="contains itself"):
        clean_json(cycle)
    assert freeze_message({"role": "tool", "content": "x", "deep": json.loads(DEEP_SURROGATE)})


def test_a_deep_surrogate_argument_is_an_episode_outcome() -> None:
    env = gym.make("ToolUseGame-v0")
    try:
        env.reset(seed=0)
        action = '{"name": "lookup", "arguments": {"key": ' + DEEP_SURROGATE + "}}"
        observation, reward, _, _, info = env.step(f"<tool_call>{action}</tool_call>")
        assert "tool_error" in observation or info.get("truncation_cause") == "parse_failure"
        assert math.isfinite(reward)
    finally:
        env.close()


def test_freeze_message_is_the_iterative_copy_at_any_depth() -> None:
    from llm_gym.core.types import FrozenMessage, rebuild_nested

    def build(container: Any, kids: list[Any]) -> Any:
        if isinstance(container, dict):
            return FrozenMessage(zip(kids[::2], kids[1::2], strict=True))
        return tuple(kids)

    def iterative(message: Any) -> Any:  # what freeze_message returned for every message
        return rebuild_nested(message, lambda leaf: leaf, build)

    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    shared = [1, 2]
    for message in (
        {"role": "assistant", "content": "x", "tool_calls": [call, call]},  # recursion's path
        {"role": "tool", "content": "x", "a": shared, "b": (shared, {(1, 2): None})},
        {"role": "tool", "content": "x", "deep": json.loads("[" * 500 + "]" * 500)},  # the loop's
    ):
        frozen = freeze_message(message)
        assert frozen == iterative(message) and type(frozen) is FrozenMessage
    looped: dict[str, Any] = {"role": "tool", "content": "x"}
    looped["tool_calls"] = [{"again": looped}]
    with pytest.raises(InvalidArgumentError, match="contains itself"):
        freeze_message(looped)
