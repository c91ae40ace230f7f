"""Hostile replies to OpenAIPolicy (``llm_gym.policies.openai_reply``, ``llm_gym.policies.http``):
a reply of hundreds of thousands of tool calls or logprob entries is refused by its caps and
decoded off the event loop, so it ends its own episode and stalls no other coroutine."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from llm_gym import TruncationCause
from llm_gym.envs.tool_use_game import ToolUseGameEnv
from llm_gym.policies import PolicyBatchError
from llm_gym.policies.http import OFF_LOOP_BYTES, JsonClient, MalformedResponseError
from llm_gym.policies.openai_reply import (
    MAX_LOGPROB_ENTRIES,
    MAX_TOOL_CALLS,
    logprob_entries_cap,
    parse_chat_completion,
)
from llm_gym.rollout import collect_groups_async
from tests.test_http_client import TASKS, Answer, Stub, completion, json_answer, policy_for, request

HOSTILE_CALLS = 300_000
"""Tool calls in the hostile reply (about 8 MB of JSON: under the 16 MiB body cap)."""
MAX_TICK_GAP_S = 0.2
"""The longest pause a heartbeat coroutine on the same event loop may see."""


@pytest.fixture
def stub() -> Iterator[Stub]:
    server = Stub()
    yield server
    server.close()


def with_tool_calls(count: int) -> dict[str, Any]:
    calls = [{"function": {"name": "lookup"}}] * count
    return {"choices": [{"message": {"content": "", "tool_calls": calls}}]}


def with_logprobs(count: int) -> dict[str, Any]:
    entries = [{"token": "a", "logprob": -0.5}] * count
    return {"choices": [{"message": {"content": "a" * count}, "logprobs": {"content": entries}}]}


def test_300000_tool_calls_end_their_episode_and_stall_no_other_coroutine(stub: Stub) -> None:
    hostile = json.dumps(with_tool_calls(HOSTILE_CALLS)).encode()
    assert OFF_LOOP_BYTES < len(hostile) < 16 * 2**20

    def respond(body: Any) -> Answer:
        if TASKS[0].prompt in json.dumps(body):
            return 200, {"Content-Type": "application/json"}, hostile
        return json_answer(completion("12"))

    stub.respond = respond
    policy = policy_for(stub)

    async def main() -> tuple[list[Any], float]:
        done = asyncio.Event()
        gaps = [0.0]

        async def heartbeat() -> None:
            last = time.perf_counter()
            while not done.is_set():
                await asyncio.sleep(0.005)
                now = time.perf_counter()
                gaps.append(now - last)
                last = now

        await collect_groups_async(ToolUseGameEnv, TASKS[1:2], policy, max_turns=2)  # warm
        beat = asyncio.create_task(heartbeat())
        try:
            groups = await collect_groups_async(ToolUseGameEnv, TASKS[:2], policy, max_turns=2)
        finally:
            done.set()
            await beat
        return groups, max(gaps)

    groups, max_gap = asyncio.run(main())
    hostile_episode, fine_episode = groups[0][0], groups[1][0]
    assert hostile_episode.truncation_cause is TruncationCause.POLICY_ERROR
    assert f"tool_calls must hold at most {MAX_TOOL_CALLS} entries" in (hostile_episode.error or "")
    assert fine_episode.error is None and fine_episode.terminated
    assert max_gap < MAX_TICK_GAP_S, f"the event loop stalled for {max_gap:.3f} s"


def test_a_large_answer_is_decoded_and_parsed_off_the_loop(stub: Stub) -> None:
    small = completion("ok")
    large = completion("x" * (OFF_LOOP_BYTES + 1))
    stub.respond = lambda body: json_answer(large if body["large"] else small)
    client = JsonClient(stub.url + "/chat/completions")
    where: dict[bool, threading.Thread] = {}

    async def main() -> None:
        for large_answer in (False, True):

            def parse(body: Any, large_answer: bool = large_answer) -> Any:
                where[large_answer] = threading.current_thread()
                return body

            reply = await client.post({"large": large_answer}, parse=parse)
            assert reply.body == (large if large_answer else small)
        await client.aclose()

    asyncio.run(main())
    assert where[False] is threading.current_thread()
    assert where[True] is not threading.current_thread()


def test_tool_calls_past_the_cap_are_refused_before_any_is_read() -> None:
    assert len(parse_chat_completion(with_tool_calls(MAX_TOOL_CALLS), "url").tool_calls) == 1024
    with pytest.raises(MalformedResponseError) as info:
        parse_chat_completion(with_tool_calls(MAX_TOOL_CALLS + 1), "url")
    assert info.value.field == "choices[0].message.tool_calls"
    assert f"at most {MAX_TOOL_CALLS} entries, actual count: {MAX_TOOL_CALLS + 1}" in str(
        info.value
    )
    bad = with_tool_calls(MAX_TOOL_CALLS + 1)
    bad["choices"][0]["message"]["tool_calls"][-1] = "not a call"
    with pytest.raises(MalformedResponseError, match="at most"):  # the count, not the item
        parse_chat_completion(bad, "url")


def test_logprob_entries_are_capped_by_max_tokens(stub: Stub) -> None:
    assert logprob_entries_cap({"max_tokens": 8}) == 8
    assert logprob_entries_cap({"max_completion_tokens": 4, "max_tokens": 8}) == 4
    for odd in ({}, {"max_tokens": 0}, {"max_tokens": True}, {"max_tokens": "8"}):
        assert logprob_entries_cap(odd) == MAX_LOGPROB_ENTRIES
    assert logprob_entries_cap({"max_tokens": 10**9}) == MAX_LOGPROB_ENTRIES
    stub.respond = lambda body: json_answer(with_logprobs(8))
    [generation] = asyncio.run(policy_for(stub, max_new_tokens=8).act([request()]))
    assert generation.metadata["logprobs"] == [-0.5] * 8
    with pytest.raises(PolicyBatchError) as info:
        asyncio.run(policy_for(stub, max_new_tokens=7).act([request()]))
    error = info.value.outcomes[0]
    assert isinstance(error, MalformedResponseError)
    assert error.field == "choices[0].logprobs.content"
    assert "at most 7 entries, actual count: 8" in str(error)
    stub.respond = lambda body: json_answer(with_logprobs(10_000))
    with pytest.raises(PolicyBatchError) as info:
        asyncio.run(policy_for(stub, max_new_tokens=7).act([request()]))
    assert "at most 7 entries of at most 20 alternatives each" in str(info.value.outcomes[0])
    assert "decoding stopped" in str(info.value.outcomes[0])
    with pytest.raises(MalformedResponseError, match="actual count: 131073"):
        parse_chat_completion(with_logprobs(MAX_LOGPROB_ENTRIES + 1), "url")
