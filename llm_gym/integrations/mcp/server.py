"""An environment's tools served as an MCP server: ``llm-gym serve-mcp``.

Any MCP client (an agent framework, an IDE, the ``mcp`` SDK's ``Client``) lists and calls the
tools of one episode of a registered environment:

* the episode is of one task, chosen when the server starts (``split`` and ``index``, or
  ``task_id``), reset when the first client lists or calls the tools;
* ``tools/list`` answers the env's tool specs (name, description, JSON schema);
* ``tools/call`` is one assistant message with that single tool call, stepped through the env
  (within ``step_timeout_s``); the result is the text of the tool messages it adds, marked
  ``isError`` when the env answered ``tool_error: ...``. A call that ends the episode says so
  (``[episode over: reward R]``), and the next call starts a new episode of the same task;
* an unknown tool, arguments over :data:`MAX_ARGUMENT_BYTES`, an env that raises or outlasts
  its deadline: an ``isError`` result, never a server crash (the episode starts over after an
  env failure).

Served over stdio (the default: an MCP client runs ``llm-gym serve-mcp ENV_ID`` as its
subprocess, one episode per process) or streamable HTTP (``--http``: one episode for the
server, shared by its clients; the SDK's DNS-rebinding guard serves this machine's hosts and
origins). Calls run one at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import Mapping
from typing import Any

from llm_gym.aio import within
from llm_gym.core.env import Env, check_step, finite_reward
from llm_gym.core.registry import as_env_entry
from llm_gym.core.task import Task, task_key
from llm_gym.core.tool_env import bound_tool_text
from llm_gym.core.types import Message
from llm_gym.errors import InvalidArgumentError
from llm_gym.serving.threaded import ThreadedServer, http_url

try:
    import mcp_types
    from mcp.server.lowlevel import Server
    from mcp.server.stdio import stdio_server
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("llm_gym's MCP integration needs mcp: pip install -e '.[interop]'") from exc

__all__ = [
    "MAX_ARGUMENT_BYTES",
    "MCPHttpServer",
    "ServedTools",
    "build_mcp_server",
    "serve_mcp_http",
    "serve_mcp_stdio",
]

MAX_ARGUMENT_BYTES = 64 * 1024
"""The largest JSON encoding of one call's arguments the server accepts."""
DEFAULT_STEP_TIMEOUT_S = 60.0


def choose_task(
    env: Any,
    *,
    split: str = "train",
    index: int = 0,
    task_id: str | None = None,
    task_options: Mapping[str, Any] | None = None,
) -> Task:
    """The task a served episode plays: ``task_id`` (``"tool_use_game/val/0"``, as ``llm-gym
    serve-env`` names tasks) when given, else task ``index`` of ``split``."""
    entry = as_env_entry(env)
    tasks = list(entry.tasks(split, **dict(task_options or {})))
    if task_id is not None:
        for i, task in enumerate(tasks):
            if task_key(task, i) == task_id:
                return task
        raise InvalidArgumentError(
            f"No task {task_id!r} in the {split!r} split of {entry.id} (pass --split with it); "
            f"its first ids: {[task_key(t, i) for i, t in enumerate(tasks[:5])]}."
        )
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(tasks):
        raise InvalidArgumentError(
            f"index must be an int in [0, {len(tasks)}) for the {split!r} split of {entry.id}, "
            f"actual: {index!r}."
        )
    return tasks[index]


class ServedTools:
    """One episode's tools behind the MCP handlers: reset on first use, stepped one call at a
    time, started over after it ends or its env fails."""

    def __init__(self, env: Any, task: Task, step_timeout_s: float = DEFAULT_STEP_TIMEOUT_S):
        if not (isinstance(step_timeout_s, int | float) and step_timeout_s > 0):
            raise InvalidArgumentError(f"step_timeout_s must be > 0, actual: {step_timeout_s!r}.")
        self.entry = as_env_entry(env)
        self.task = task
        self.step_timeout_s = float(step_timeout_s)
        self.env: Env | None = None
        self.calls = 0
        self._lock = asyncio.Lock()

    def _deadline(self, what: str) -> TimeoutError:
        return TimeoutError(f"the environment's {what} took over {self.step_timeout_s:g} s")

    async def _episode(self) -> Env:
        if self.env is None:
            env = self.entry.env_factory()(self.task)
            try:
                await within(
                    env.reset(self.task), self.step_timeout_s, lambda: self._deadline("reset")
                )
            except BaseException:
                await self._end(env)
                raise
            self.env = env
        return self.env

    async def _end(self, env: Env | None = None) -> None:
        env, self.env = env or self.env, None
        if env is not None:
            # an env that fails to close: the episode is dropped all the same
            with contextlib.suppress(Exception):
                await within(env.close(), self.step_timeout_s, lambda: self._deadline("close"))

    async def tools(self) -> list[mcp_types.Tool]:
        """The episode's tools as MCP tool records."""
        async with self._lock:
            env = await self._episode()
            listed = []
            for spec in env.tool_specs:
                function = spec.get("function") or {}
                schema = function.get("parameters") or {"type": "object", "properties": {}}
                listed.append(
                    mcp_types.Tool(
                        name=str(function.get("name", "")),
                        description=str(function.get("description") or ""),
                        input_schema=dict(schema),
                    )
                )
            return listed

    async def call(self, name: str, arguments: Mapping[str, Any] | None) -> tuple[str, bool]:
        """Step the episode with one call of tool ``name``; returns (text, is_error)."""
        try:
            encoded = json.dumps(dict(arguments or {}), ensure_ascii=False)
        except (TypeError, ValueError) as exc:
            return f"tool_error: arguments are not JSON: {exc}", True
        if len(encoded.encode()) > MAX_ARGUMENT_BYTES:
            return f"tool_error: arguments over {MAX_ARGUMENT_BYTES} bytes of JSON", True
        async with self._lock:
            try:
                env = await self._episode()
                known = [s["function"]["name"] for s in env.tool_specs]
                if name not in known:
                    return f"tool_error: unknown tool {name[:80]!r}; available: {known}", True
                self.calls += 1
                call_id = f"call_{self.calls}"
                action = Message(
                    role="assistant",
                    content="",
                    tool_calls=[
                        {
                            "id": call_id,
                            "type": "function",
                            "function": {"name": name, "arguments": encoded},
                        }
                    ],
                )
                start = len(env.messages)
                result = await within(
                    env.step(action), self.step_timeout_s, lambda: self._deadline("step")
                )
                messages = check_step(result, f"{type(env).__name__}.step", start)
            except Exception as exc:
                await self._end()
                return (
                    f"tool_error: the environment failed ({type(exc).__name__}: {exc!s:.500})",
                    True,
                )
            replies = [m for m in messages[start:] if m.get("role") not in ("assistant", None)]
            text = "\n".join(str(m.get("content") or "") for m in replies)
            if result.terminated or result.truncated:
                reward = finite_reward(getattr(result, "reward", 0.0))
                text += f"\n[episode over: reward {reward:g}; the next call starts a new one]"
                await self._end()
            return bound_tool_text(text), text.startswith("tool_error")

    async def aclose(self) -> None:
        """Close the running episode's env."""
        async with self._lock:
            await self._end()


def build_mcp_server(served: ServedTools) -> Server:
    """The low-level MCP server answering ``tools/list`` and ``tools/call`` from ``served``."""

    async def list_tools(ctx: Any, params: Any) -> mcp_types.ListToolsResult:
        return mcp_types.ListToolsResult(tools=await served.tools())

    async def call_tool(
        ctx: Any, params: mcp_types.CallToolRequestParams
    ) -> mcp_types.CallToolResult:
        text, is_error = await served.call(params.name, params.arguments)
        content = [mcp_types.TextContent(type="text", text=text)]
        return mcp_types.CallToolResult(content=content, is_error=is_error)

    return Server(
        f"llm_gym-{served.entry.id}",
        version=str(served.entry.version or "0"),
        instructions=f"The tools of one {served.entry.id} episode (llm_gym).",
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


async def serve_mcp_stdio(served: ServedTools) -> None:
    """Serve ``served`` over this process's stdin and stdout until the client closes them."""
    server = build_mcp_server(served)
    try:
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())
    finally:
        await served.aclose()


class MCPHttpServer:
    """A running streamable-HTTP MCP server (uvicorn in a thread); :func:`serve_mcp_http`."""

    def __init__(self, served: ServedTools, host: str, port: int, log: bool = False) -> None:
        import uvicorn

        app = build_mcp_server(served).streamable_http_app(host=host)
        config = uvicorn.Config(
            app, host=host, port=port, loop="asyncio", lifespan="on", access_log=log,
            log_level="info" if log else "warning", timeout_graceful_shutdown=5,
            **({} if log else {"log_config": None}),
        )  # fmt: skip
        self.served = served
        self._running = ThreadedServer(config, "llm_gym-mcp")
        self._closed = False

    @property
    def url(self) -> str:
        """The MCP endpoint (``http://HOST:PORT/mcp``)."""
        config = self._running.server.config
        port = config.port
        for server in getattr(self._running.server, "servers", None) or []:
            for sock in server.sockets:
                port = int(sock.getsockname()[1])
        return http_url(config.host, port, "/mcp")

    def wait(self) -> None:
        """Block until :meth:`close` (from another thread) or Ctrl-C."""
        self._running.wait()

    def close(self) -> None:
        """Stop serving (idempotent)."""
        if not self._closed:
            self._closed = True
            self._running.stop()

    def __enter__(self) -> MCPHttpServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def serve_mcp_http(
    env: Any,
    host: str = "127.0.0.1",
    port: int = 8002,
    *,
    log: bool = False,
    step_timeout_s: float = DEFAULT_STEP_TIMEOUT_S,
    **task: Any,
) -> MCPHttpServer:
    """Serve the tools of an episode of ``env`` over streamable HTTP at ``http://HOST:PORT/mcp``
    in a background thread (port 0: any free port; ``server.url``). ``task`` goes to
    :func:`choose_task` (``split``, ``index``, ``task_id``, ``task_options``)."""
    served = ServedTools(env, choose_task(env, **task), step_timeout_s)
    return MCPHttpServer(served, host, port, log)


def main_stdio(env: Any, *, step_timeout_s: float = DEFAULT_STEP_TIMEOUT_S, **task: Any) -> int:
    """``llm-gym serve-mcp ENV_ID`` over stdio: serve until the client leaves."""
    served = ServedTools(env, choose_task(env, **task), step_timeout_s)
    print(f"serving the tools of {served.entry.id} over MCP (stdio)", file=sys.stderr, flush=True)
    asyncio.run(serve_mcp_stdio(served))
    return 0
