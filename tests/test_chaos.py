"""Chaos test of collection (issue 15): environments that raise, hang past ``env_timeout_s`` or
write invalid text in some of their steps, and a policy endpoint that drops connections.

The policy is the real ``OpenAIPolicy`` against a small local HTTP server that answers like a
model (a tool call, then the answer) but resets connections: once for a third of the requests
(the client's retry gets through) and always for the episodes marked ``[policy_down]``. Every
episode that no fault touched must complete; every faulted one must end with its own cause; the
collection must return within a bound; the counts are printed and checked.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import json
import socket
import struct
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from llm_gym import Task, ToolEnv, TruncationCause, tool
from llm_gym.policies import OpenAIPolicy
from llm_gym.rollout import collect_groups_async

ANSWER = "42"
EPISODES_PER_TASK = 2
TASKS_PER_MODE = 3
ENV_TIMEOUT_S = 1.0
WALL_BOUND_S = 30.0
HUGE_CHARS = 2_000_000


# --- the environment -------------------------------------------------------------------------


def mode_of(text: str) -> str:
    return text.split("]", 1)[0].lstrip("[")


@tool
def probe(note: str = "") -> str:
    """Look around.

    Args:
        note: Anything.
    """
    return "fine"


@tool
def explode(note: str = "") -> str:
    """Fail the way a tool that quotes undecodable bytes fails.

    Args:
        note: Anything.
    """
    raise ValueError("cannot read b'\\xff' as text: \udcff")


class Chaotic(ToolEnv):
    """One tool, ``probe``; a reply without a tool call is the answer (target ``42``). What goes
    wrong depends on the mode in the task's prompt, ``[mode] ...``:

    * ``ok``, ``flaky_policy``, ``policy_down``: nothing (the policy side is the fault);
    * ``reset_raises``: ``reset`` raises;
    * ``step_raises``: the second step raises (the first went well);
    * ``step_hangs``: the first step never returns;
    * ``tool_raises``: the tool raises an error whose message holds surrogates;
    * ``surrogates``: the tool's result holds surrogates and a NUL;
    * ``huge``: the first step adds a 2 MB message with surrogates in it.
    """

    tools = (probe, explode)

    async def reset(self, task: Task):
        self.mode = mode_of(task.prompt)
        if self.mode == "reset_raises":
            raise RuntimeError("the database is gone \udcff")
        return await super().reset(task)

    async def call_tool(self, name: str, arguments: str) -> tuple[str, bool]:
        if self.mode == "tool_raises":
            return await super().call_tool("explode", arguments)
        if self.mode == "surrogates":
            return "result \ud800 with a NUL \x00 inside", False
        return await super().call_tool(name, arguments)

    async def step(self, message):
        turn = sum(1 for m in self._messages if m.get("role") == "assistant") + 1
        if self.mode == "step_hangs":
            await asyncio.sleep(3600)
        if self.mode == "step_raises" and turn == 2:
            raise OSError("disk full \udcfe")
        result = await super().step(message)
        if self.mode == "huge" and turn == 1:
            self._messages.append({"role": "user", "content": "\ud800" + "x" * HUGE_CHARS})
            result.messages = list(self._messages)
        return result


TOOLS_SPEC_CALL = '<tool_call>{"name": "probe", "arguments": {"note": "look"}}</tool_call>'
MODES = {
    # mode: the expected outcome (None: completes with reward 1)
    "ok": None,
    "flaky_policy": None,
    "tool_raises": None,
    "surrogates": None,
    "huge": None,
    "reset_raises": TruncationCause.ENV,
    "step_raises": TruncationCause.ENV,
    "step_hangs": TruncationCause.ENV,
    "policy_down": TruncationCause.POLICY_ERROR,
}


# --- the endpoint ----------------------------------------------------------------------------


class DroppingEndpoint:
    """An OpenAI-compatible ``/chat/completions`` that answers like a model (a tool call, then
    ``42``) and resets connections: always for ``[policy_down]`` episodes; the first attempt of
    every third distinct request otherwise."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: set[str] = set()
        self.counts: collections.Counter[str] = collections.Counter()
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers["Content-Length"]))
                body = json.loads(raw)  # our client always sends valid UTF-8 JSON
                digest = hashlib.sha256(raw).hexdigest()
                messages = body["messages"]
                prompt = next(m["content"] for m in messages if m["role"] == "user")
                with endpoint.lock:
                    first_attempt = digest not in endpoint.seen
                    endpoint.seen.add(digest)
                    drop = mode_of(prompt) == "policy_down" or (
                        first_attempt and int(digest, 16) % 3 == 0
                    )
                    endpoint.counts["reset" if drop else "answered"] += 1
                if drop:
                    self.reset()
                    return
                answered = any(m["role"] == "assistant" for m in messages)
                content = ANSWER if answered else TOOLS_SPEC_CALL
                data = json.dumps(
                    {
                        "choices": [
                            {
                                "index": 0,
                                "message": {"role": "assistant", "content": content},
                                "finish_reason": "stop",
                            }
                        ],
                        "usage": {"prompt_tokens": 1, "completion_tokens": 1},
                    }
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def reset(self) -> None:
                """Drop the connection with a TCP reset, no answer."""
                self.close_connection = True
                self.connection.setsockopt(
                    socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                )
                self.connection.close()

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            request_queue_size = 128

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # a reset connection is the point, not an error

        self.server = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


@pytest.fixture
def endpoint() -> Iterator[DroppingEndpoint]:
    served = DroppingEndpoint()
    try:
        yield served
    finally:
        served.close()


# --- the test --------------------------------------------------------------------------------


def chaos_tasks() -> list[Task]:
    return [
        Task(f"[{mode}] task {i}: what is the answer?", target=ANSWER, id=f"{mode}-{i}")
        for mode in MODES
        for i in range(TASKS_PER_MODE)
    ]


def test_chaos_every_unaffected_episode_completes(endpoint: DroppingEndpoint) -> None:
    policy = OpenAIPolicy(
        "chaos",
        endpoint.url,
        max_retries=2,
        backoff_base_s=0.01,
        backoff_max_s=0.05,
        request_timeout_s=10.0,
        max_concurrency=16,
    )
    tasks = chaos_tasks()

    async def collect() -> list[list[Any]]:
        return await asyncio.wait_for(
            collect_groups_async(
                Chaotic,
                tasks,
                policy,
                episodes_per_task=EPISODES_PER_TASK,
                max_turns=3,
                env_timeout_s=ENV_TIMEOUT_S,
            ),
            WALL_BOUND_S,  # nothing hangs
        )

    started = time.perf_counter()
    try:
        groups = asyncio.run(collect())
    finally:
        policy.close()
    took = time.perf_counter() - started

    table: dict[str, collections.Counter[str]] = {mode: collections.Counter() for mode in MODES}
    for group in groups:
        for episode in group:
            mode = mode_of(episode.task.prompt)
            if episode.terminated and episode.reward == 1.0:
                table[mode]["completed"] += 1
            else:
                table[mode][str(episode.truncation_cause or "wrong answer")] += 1
            # Whatever happened, the record is valid text (it went out as JSON, too).
            json.dumps([episode.messages, episode.error], ensure_ascii=False).encode("utf-8")
    total = len(tasks) * EPISODES_PER_TASK
    print(f"\nchaos: {total} episodes in {took:.1f} s; endpoint {dict(endpoint.counts)}")
    for mode, counts in table.items():
        print(f"  {mode:<13} {dict(counts)}")

    per_mode = TASKS_PER_MODE * EPISODES_PER_TASK
    for mode, cause in MODES.items():
        expected = {"completed": per_mode} if cause is None else {str(cause): per_mode}
        assert dict(table[mode]) == expected, mode
    assert endpoint.counts["reset"] > per_mode  # flaky drops happened beyond the down episodes
    assert took < WALL_BOUND_S

    episodes = {e.task.id: e for group in groups for e in group}
    assert "tool_error: cannot read b'\\xff' as text: \ufffd" in _tool_text(
        episodes["tool_raises-0"]
    )
    assert "result \ufffd with a NUL \x00 inside" in _tool_text(episodes["surrogates-0"])
    assert "did not return within env_timeout_s" in episodes["step_hangs-0"].error
    assert "disk full \ufffd" in episodes["step_raises-0"].error
    assert episodes["step_raises-0"].num_turns == 2
    assert "the database is gone \ufffd" in episodes["reset_raises-0"].error
    assert "failed after 3 attempts" in episodes["policy_down-0"].error


def _tool_text(episode: Any) -> str:
    return "\n".join(m["content"] for m in episode.messages if m["role"] == "tool")
