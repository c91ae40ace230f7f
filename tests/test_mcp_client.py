"""MCP servers' tools in our environments (llm_gym.integrations.mcp: client, env, stdio):
against servers written with the ``mcp`` SDK here (stdio: a script run as a subprocess;
streamable HTTP: loopback), friendly and hostile. Every hostile reply is a ``tool_error`` or an
episode outcome, never a crash of the run."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import textwrap
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

pytest.importorskip("mcp")

from llm_gym.core.task import Task
from llm_gym.core.tool_env import MAX_TOOL_RESULT_CHARS
from llm_gym.errors import InvalidArgumentError, MCPServerError
from llm_gym.integrations.mcp.client import MCPConnection, result_text
from llm_gym.integrations.mcp.env import MCPToolEnv, with_mcp_tools
from llm_gym.integrations.mcp.params import MCPServerParams, as_server_list
from llm_gym.integrations.mcp.stdio import _LineReader
from llm_gym.policies.base import Generation, Policy, PolicyRequest
from llm_gym.rollout import collect_groups

SERVER = textwrap.dedent(
    '''
    import asyncio, base64, os, sys
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.utilities.types import Image

    server = MCPServer("calc")

    @server.tool()
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @server.tool()
    def fail() -> str:
        """Always fails."""
        raise ValueError("the abacus is broken")

    @server.tool()
    async def slow(seconds: float) -> str:
        """Answers after a while."""
        await asyncio.sleep(seconds)
        return "late"

    @server.tool()
    def huge(n: int) -> str:
        """n characters."""
        return "x" * n

    @server.tool()
    def picture() -> Image:
        """An image."""
        return Image(data=b"\\x89PNG....", format="png")

    @server.tool()
    def pid() -> int:
        """The server's process id."""
        return os.getpid()

    @server.tool()
    def crash() -> str:
        """Kills the server."""
        os._exit(3)

    server.run()
    '''
)


RAW_SERVER = textwrap.dedent(
    """
    import json, sys
    tools = [{"name": "good", "inputSchema": {"type": "object"}},
             {"name": "stringly", "inputSchema": {"type": "string"}}]
    for line in sys.stdin:
        message = json.loads(line)
        if "id" not in message:
            continue
        reply = {"jsonrpc": "2.0", "id": message["id"]}
        if message["method"] == "initialize":
            reply["result"] = {"protocolVersion": "2025-06-18", "capabilities": {"tools": {}},
                               "serverInfo": {"name": "raw", "version": "0"}}
        elif message["method"] == "tools/list":
            reply["result"] = {"tools": tools}
        else:
            reply["error"] = {"code": -32601, "message": "method not found"}
        print(json.dumps(reply), flush=True)
    """
)
"""A server written by hand: what it lists no SDK server would send."""


@pytest.fixture(scope="module")
def calc(tmp_path_factory: pytest.TempPathFactory) -> MCPServerParams:
    script = tmp_path_factory.mktemp("mcp") / "calc_server.py"
    script.write_text(SERVER)
    return MCPServerParams(
        command=sys.executable,
        args=(str(script),),
        name="calc",
        call_timeout_s=0.5,
        max_message_bytes=1024 * 1024,
    )


def call(name: str, arguments: dict, call_id: str = "c1") -> dict:
    function = {"name": name, "arguments": json.dumps(arguments)}
    return {"id": call_id, "type": "function", "function": function}


def assistant(*calls: dict, content: str = "") -> dict:
    return {"role": "assistant", "content": content, "tool_calls": list(calls)}


class Texts(Policy):
    """Answers turn t of every episode with texts[t]."""

    def __init__(self, texts: Sequence[str]) -> None:
        self.texts = list(texts)

    async def act(self, requests: Sequence[PolicyRequest]) -> list[Generation]:
        turns = [sum(m["role"] == "assistant" for m in r.messages) for r in requests]
        return [Generation(text=self.texts[t]) for t in turns]


def tool_call_text(name: str, arguments: dict) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


# --- the friendly path -----------------------------------------------------------------------


class AdderEnv(MCPToolEnv):
    system_prompt = "Use calc_add, then answer with the number."


def test_an_mcp_tool_env_plays_an_episode_over_stdio(calc: MCPServerParams) -> None:
    async def episode() -> tuple[list[str], list[dict], object]:
        env = AdderEnv(mcp_servers=[calc])
        await env.reset(Task("2 + 3?", target=5))
        names = [s["function"]["name"] for s in env.tool_specs]
        middle = await env.step(assistant(call("calc_add", {"a": 2, "b": 3})))
        end = await env.step({"role": "assistant", "content": "5"})
        await env.close()
        return names, middle.messages, end

    names, messages, end = asyncio.run(episode())
    remote = ["add", "fail", "slow", "huge", "picture", "pid", "crash"]
    assert names == [f"calc_{name}" for name in remote]
    reply = {"role": "tool", "content": "5", "tool_call_id": "c1", "name": "calc_add"}
    assert messages[-1] == reply
    assert end.terminated and end.reward == 1.0
    assert end.metrics["mcp_tools"] == 7 and end.metrics["tool_calls"] == 1


def test_each_episode_gets_a_fresh_stdio_server(calc: MCPServerParams) -> None:
    async def pid_and_alive() -> tuple[int, bool]:
        env = MCPToolEnv(mcp_servers=calc)
        await env.reset(Task("pid?"))
        result = await env.step(assistant(call("calc_pid", {})))
        pid = int(result.messages[-1]["content"])
        await env.close()
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid, False
        return pid, True

    first, alive = asyncio.run(pid_and_alive())
    second, _ = asyncio.run(pid_and_alive())
    assert first != second and not alive  # closed with its episode, not left running


def test_with_mcp_tools_adds_servers_tools_to_a_registered_env(calc: MCPServerParams) -> None:
    """ToolUseGame keeps its tools, rules and reward; calc's calls are answered by the server,
    and a step with both kinds keeps the call order in the transcript."""
    factory = with_mcp_tools("ToolUseGame-v0", calc)
    task = Task("What is 2 + 3?", target=5)

    async def episode():
        env = factory(task)
        await env.reset(task)
        names = [s["function"]["name"] for s in env.tool_specs]
        mixed = assistant(
            call("calculator", {"expression": "1+1"}, "a"), call("calc_add", {"a": 2, "b": 3}, "b")
        )
        middle = await env.step(mixed)
        end = await env.step({"role": "assistant", "content": "5"})
        await env.close()
        return names, middle, end

    names, middle, end = asyncio.run(episode())
    assert names[:3] == ["list_fact_keys", "lookup", "calculator"] and "calc_add" in names
    tail = middle.messages[-3:]
    assert tail[0]["tool_calls"][1]["function"]["name"] == "calc_add"
    assert [(m["tool_call_id"], m["content"]) for m in tail[1:]] == [("a", "2"), ("b", "5")]
    assert end.terminated and end.reward == 1.0
    assert end.metrics["mcp_tool_calls"] == 1 and end.metrics["mcp_tool_errors"] == 0


def test_the_rollout_loop_plays_mcp_tools(calc: MCPServerParams) -> None:
    texts = [tool_call_text("calc_add", {"a": 2, "b": 3}), "5"]
    [[episode]] = collect_groups(
        lambda task: AdderEnv(mcp_servers=[calc]),
        [Task("2 + 3?", target=5)],
        Texts(texts),
        max_turns=4,
    )
    assert episode.reward == 1.0 and episode.terminated
    assert episode.messages[-2]["content"] == "5"


# --- the hostile server ----------------------------------------------------------------------


def test_hostile_replies_become_tool_errors_and_the_episode_goes_on(calc: MCPServerParams) -> None:
    async def episode() -> dict[str, tuple[str, float]]:
        env = MCPToolEnv(mcp_servers=[calc])
        await env.reset(Task("anything"))
        seen = {}
        for label, name, arguments in [
            ("slow", "calc_slow", {"seconds": 30}),
            ("after_slow", "calc_add", {"a": 1, "b": 1}),
            ("error", "calc_fail", {}),
            ("bad_arguments", "calc_add", {"a": "one"}),
            ("oversized", "calc_huge", {"n": 5_000_000}),
            ("long", "calc_huge", {"n": 100_000}),
            ("image", "calc_picture", {}),
            ("crash", "calc_crash", {}),
            ("after_crash", "calc_add", {"a": 1, "b": 1}),
        ]:
            started = time.perf_counter()
            result = await env.step(assistant(call(name, arguments)))
            seen[label] = (result.messages[-1]["content"], time.perf_counter() - started)
            assert not (result.terminated or result.truncated)
        started = time.perf_counter()
        await env.close()
        seen["close"] = ("", time.perf_counter() - started)
        return seen

    seen = asyncio.run(episode())
    text = {k: v[0] for k, v in seen.items()}
    assert text["slow"].startswith("tool_error:") and "within 0.5 s" in text["slow"]
    assert seen["slow"][1] < 3
    assert text["after_slow"] == "2"
    assert text["error"].startswith("tool_error:") and "the abacus is broken" in text["error"]
    assert text["bad_arguments"].startswith("tool_error:")
    assert text["oversized"].startswith("tool_error:")
    assert "is over 1048576 bytes" in text["oversized"]
    assert seen["oversized"][1] < 3  # dropped as it streams, not parsed
    assert text["long"].endswith(f"[cut at {MAX_TOOL_RESULT_CHARS} chars]")
    assert len(text["long"]) < MAX_TOOL_RESULT_CHARS + 100
    assert text["image"] == "[image content image/png omitted]"
    assert text["crash"].startswith("tool_error:") and text["after_crash"].startswith("tool_error:")
    assert seen["close"][1] < 5


@pytest.mark.parametrize(
    "params",
    [
        MCPServerParams(command="/nonexistent/mcp-server"),
        MCPServerParams(
            command=sys.executable, args=("-c", "import time; time.sleep(60)"), connect_timeout_s=1
        ),
        MCPServerParams(command=sys.executable, args=("-c", "print('not json-rpc')")),
        MCPServerParams(command=sys.executable, args=("-c", RAW_SERVER)),
    ],
    ids=["missing", "silent", "garbage", "invalid_listing"],
)
def test_a_server_that_cannot_serve_ends_the_episode_not_the_run(params: MCPServerParams) -> None:
    started = time.perf_counter()
    [[episode]] = collect_groups(
        lambda task: MCPToolEnv(mcp_servers=params),
        [Task("x")],
        Texts(["never asked"]),
        max_turns=2,
    )
    assert episode.truncation_cause == "env" and episode.reward == 0.0
    assert "MCPServerError" in (episode.error or "")
    assert time.perf_counter() - started < 10


# --- streamable HTTP, and schemas a client must not trust ------------------------------------


@pytest.fixture(scope="module")
def http_server() -> object:
    """A low-level SDK server on loopback listing good and bad tools."""
    import mcp_types
    from mcp.server.lowlevel import Server

    from llm_gym.serving.threaded import ThreadedServer

    def tool(name: str, schema: object, description: str = "d") -> mcp_types.Tool:
        return mcp_types.Tool(name=name, description=description, input_schema=schema)

    listed = [
        tool("echo", {"type": "object", "properties": {"text": {"type": "string"}}}),
        tool("echo", {"type": "object"}),  # a duplicate
        tool("bad name!", {"type": "object"}),
        tool("wordy", {"type": "object"}, "w" * 50_000),
        tool("vast", {"type": "object", "properties": {f"p{i}": {} for i in range(5000)}}),
    ]

    async def list_tools(ctx, params):
        return mcp_types.ListToolsResult(tools=listed)

    async def call_tool(ctx, params):
        text = json.dumps(params.arguments)
        return mcp_types.CallToolResult(content=[mcp_types.TextContent(type="text", text=text)])

    import uvicorn

    app = Server("hostile", on_list_tools=list_tools, on_call_tool=call_tool).streamable_http_app()
    config = uvicorn.Config(app, host="127.0.0.1", port=0, lifespan="on", log_config=None)
    running = ThreadedServer(config, "mcp-test")
    port = running.server.servers[0].sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}/mcp"
    running.stop()


def test_streamable_http_tools_with_bad_schemas_left_out(http_server: str) -> None:
    async def listing() -> tuple[list[str], list[str], str, str]:
        connection = MCPConnection(MCPServerParams(url=http_server))
        with pytest.warns(RuntimeWarning, match="tool\\(s\\) left out"):
            tools = await connection.open()
        text = (await tools[0].execute('{"text": "hi"}')).content
        wordy = next(t.description for t in tools if t.name == "wordy")
        await connection.close()
        return [t.name for t in tools], connection.refused, text, wordy

    names, refused, text, wordy = asyncio.run(listing())
    assert names == ["echo", "wordy"]
    assert [why.split(":")[0] for why in refused] == ["'echo'", "'bad name!'", "'vast'"]
    assert text == '{"text": "hi"}'
    assert len(wordy) == 2_000


# --- pure parts ------------------------------------------------------------------------------


def test_the_line_reader_drops_an_oversized_line_and_answers_its_request() -> None:
    reader = _LineReader(limit=2048)
    ok = b'{"jsonrpc":"2.0","id":1,"result":{}}\n'
    out = reader.feed(ok[:10]) + reader.feed(ok[10:])
    assert [m.message.id for m in out] == [1]
    big = b'{"jsonrpc":"2.0","id":"r-2","result":{"content":"' + b"x" * 10_000
    out = [m for chunk in (big[:3000], big[3000:], b'"}}\n' + ok) for m in reader.feed(chunk)]
    assert [m.message.id for m in out] == ["r-2", 1]
    assert "over 2048 bytes" in out[0].message.error.message
    assert len(reader.buffer) <= 2048


def test_the_line_reader_splits_in_linear_time() -> None:
    reader = _LineReader(limit=64 * 1024 * 1024)
    line = b'{"jsonrpc":"2.0","id":1,"result":{"t":"' + b"y" * 20_000_000 + b'"}}\n'
    started = time.perf_counter()
    out = [m for i in range(0, len(line), 65536) for m in reader.feed(line[i : i + 65536])]
    assert len(out) == 1 and time.perf_counter() - started < 3


def test_result_text_reads_only_what_the_model_may_see() -> None:
    import mcp_types

    blocks = [mcp_types.TextContent(type="text", text="a" * 6000) for _ in range(1000)]
    text = result_text(mcp_types.CallToolResult(content=blocks), limit=8000)
    assert len(text) < 8100 and text.endswith("[cut at 8000 chars]")
    structured = mcp_types.CallToolResult(content=[], structured_content={"n": 1})
    assert result_text(structured) == '{"n": 1}'


def test_server_params_refuse_what_cannot_be_served() -> None:
    with pytest.raises(InvalidArgumentError, match="exactly one of command"):
        MCPServerParams()
    with pytest.raises(InvalidArgumentError, match="exactly one of command"):
        MCPServerParams(command="x", url="http://h/mcp")
    with pytest.raises(InvalidArgumentError, match="Did you mean 'args'"):
        as_server_list({"calc": {"command": "python", "argz": ["x"]}})
    with pytest.raises(InvalidArgumentError, match="call_timeout_s"):
        MCPServerParams(command="x", call_timeout_s=float("nan"))
    with pytest.raises(InvalidArgumentError, match="url must start"):
        MCPServerParams(url="file:///etc/passwd")
    [params] = as_server_list({"calc": {"command": "python", "args": ["s.py"]}})
    assert (params.name, params.args) == ("calc", ("s.py",))


def test_a_raw_text_env_is_refused_with_the_remedy() -> None:
    from llm_gym.integrations.mcp.env import MCPToolsWrapper

    class RawEnv(MCPToolEnv):
        raw_text_actions = True

    with pytest.raises(InvalidArgumentError, match="raw_text_actions"):
        MCPToolsWrapper(RawEnv(), [MCPServerParams(url="http://127.0.0.1:9/mcp")])


def test_mcp_server_errors_name_the_server() -> None:
    async def opened() -> None:
        await MCPConnection(MCPServerParams(command="/nonexistent/x", name="ghost")).open()

    with pytest.raises(MCPServerError, match="'ghost' could not be started"):
        asyncio.run(opened())


def test_params_survive_a_pickle_round_trip(calc: MCPServerParams) -> None:
    import pickle

    factory = with_mcp_tools("ToolUseGame-v0", calc)
    assert pickle.loads(pickle.dumps(factory)).servers == [calc]
    assert Path(calc.args[0]).exists()
