"""An environment's tools served over MCP (llm_gym.integrations.mcp.server, ``llm-gym
serve-mcp``), checked with the ``mcp`` SDK's own client: in process, over stdio (the CLI as a
subprocess) and over streamable HTTP on loopback. Hostile clients and failing envs get an
``isError`` result; the server goes on."""

from __future__ import annotations

import asyncio
import json
import sys

import pytest

pytest.importorskip("mcp")

from mcp import Client, StdioServerParameters, stdio_client

from llm_gym.core.env import Env, StepResult
from llm_gym.core.registry import env_entry
from llm_gym.errors import InvalidArgumentError
from llm_gym.integrations.mcp.server import (
    MAX_ARGUMENT_BYTES,
    ServedTools,
    build_mcp_server,
    choose_task,
    serve_mcp_http,
)

from .conftest import ROOT, subprocess_env

ENV_ID = "ToolUseGame-v0"


def text(result) -> str:
    return "\n".join(block.text for block in result.content)


def expected_lookup(key: str) -> str:
    """What ToolUseGame's own ``lookup`` answers for ``key`` in task 0 of the train split."""

    async def run() -> str:
        task = env_entry(ENV_ID).tasks("train")[0]
        env = env_entry(ENV_ID).env_factory()(task)
        await env.reset(task)
        call = {"id": "x", "type": "function", "function": {"name": "lookup", "arguments": ""}}
        call["function"]["arguments"] = json.dumps({"key": key})
        result = await env.step({"role": "assistant", "content": "", "tool_calls": [call]})
        return result.messages[-1]["content"]

    return asyncio.run(run())


def test_the_sdk_client_lists_and_calls_an_envs_tools_in_process() -> None:
    served = ServedTools(ENV_ID, choose_task(ENV_ID))
    key = served.task.metadata["keys"][0]

    async def session():
        async with Client(build_mcp_server(served)) as client:
            listed = (await client.list_tools()).tools
            found = await client.call_tool("lookup", {"key": key})
            unknown = await client.call_tool("teleport", {})
            oversized = await client.call_tool("lookup", {"key": "k" * MAX_ARGUMENT_BYTES})
            bad_key = await client.call_tool("lookup", {"key": "Nowhere.nothing"})
            return listed, found, unknown, oversized, bad_key

    listed, found, unknown, oversized, bad_key = asyncio.run(session())
    task = served.task
    env = env_entry(ENV_ID).env_factory()(task)
    asyncio.run(env.reset(task))
    assert [(t.name, t.input_schema) for t in listed] == [
        (s["function"]["name"], s["function"]["parameters"]) for s in env.tool_specs
    ]
    assert not found.is_error and text(found) == expected_lookup(key)
    assert unknown.is_error and "unknown tool 'teleport'" in text(unknown)
    assert oversized.is_error and f"over {MAX_ARGUMENT_BYTES} bytes" in text(oversized)
    assert bad_key.is_error and text(bad_key).startswith("tool_error")


class Fragile(Env):
    """One tool, ``act``: ``{"how": "ok" | "raise" | "hang" | "end"}``."""

    def __init__(self, task=None) -> None:
        self._messages: list = []

    async def reset(self, task):
        self._messages = [{"role": "user", "content": task.prompt}]
        return list(self._messages)

    async def step(self, message):
        self._messages.append(message)
        how = json.loads(message["tool_calls"][0]["function"]["arguments"])["how"]
        if how == "raise":
            raise RuntimeError("the env broke")
        if how == "hang":
            await asyncio.sleep(60)
        reply = {"role": "tool", "content": f"did {how}", "tool_call_id": "x"}
        self._messages.append(reply)
        ended = how == "end"
        return StepResult(ended, False, list(self._messages), reward=1.0 if ended else 0.0)

    @property
    def tool_specs(self):
        schema = {"type": "object", "properties": {"how": {"type": "string"}}}
        function = {"name": "act", "description": "", "parameters": schema}
        return [{"type": "function", "function": function}]

    @property
    def messages(self):
        return list(self._messages)


def test_a_failing_env_is_an_error_result_and_the_server_goes_on() -> None:
    from llm_gym.core.task import Task

    served = ServedTools(Fragile, Task("play"), step_timeout_s=0.3)

    async def session() -> list[tuple[bool, str]]:
        async with Client(build_mcp_server(served)) as client:
            out = []
            for how in ("ok", "raise", "ok", "hang", "ok", "end", "ok"):
                result = await client.call_tool("act", {"how": how})
                out.append((bool(result.is_error), text(result)))
            return out

    out = asyncio.run(session())
    assert out[0] == (False, "did ok")
    assert out[1][0] and "RuntimeError: the env broke" in out[1][1]
    assert out[2] == (False, "did ok")  # a new episode after the failure
    assert out[3][0] and "took over 0.3 s" in out[3][1]
    assert out[5] == (False, "did end\n[episode over: reward 1; the next call starts a new one]")
    assert out[6] == (False, "did ok")


def test_choose_task_refuses_what_is_not_there() -> None:
    with pytest.raises(InvalidArgumentError, match="index must be an int in"):
        choose_task(ENV_ID, index=10**6)
    with pytest.raises(InvalidArgumentError, match="No task 'nope'"):
        choose_task(ENV_ID, task_id="nope")
    first = env_entry(ENV_ID).tasks("val")[0]
    assert choose_task(ENV_ID, split="val", task_id=first.id) == first


def test_the_cli_serves_over_stdio(tmp_path) -> None:
    command = [sys.executable, "-m", "llm_gym.cli", "serve-mcp", ENV_ID, "--split", "val"]
    params = StdioServerParameters(
        command=command[0], args=command[1:], env=subprocess_env(tmp_path), cwd=str(ROOT)
    )
    task = env_entry(ENV_ID).tasks("val")[0]

    async def session():
        async with Client(stdio_client(params)) as client:
            names = [t.name for t in (await client.list_tools()).tools]
            keys = await client.call_tool("list_fact_keys", {"prefix": task.metadata["keys"][0]})
            return names, keys

    names, keys = asyncio.run(asyncio.wait_for(session(), 60))
    assert names == ["list_fact_keys", "lookup", "calculator"]
    assert not keys.is_error and task.metadata["keys"][0] in text(keys)


def test_streamable_http_on_loopback() -> None:
    with serve_mcp_http(ENV_ID, port=0) as server:
        assert server.url.startswith("http://127.0.0.1:") and server.url.endswith("/mcp")

        async def session():
            async with Client(server.url) as client:
                names = [t.name for t in (await client.list_tools()).tools]
                result = await client.call_tool("calculator", {"expression": "6*7"})
                return names, result

        names, result = asyncio.run(asyncio.wait_for(session(), 30))
    assert names == ["list_fact_keys", "lookup", "calculator"]
    assert not result.is_error and text(result) == "42"
