"""A verifiers task's tool servers, served in-process (no MCP transport, no subprocess).

verifiers 0.4 gives a task its tools as :class:`verifiers.v1.Toolset` s (MCP servers whose
``@vf.tool`` methods the model calls). A real rollout launches each toolset as a server process
and the harness calls it over HTTP; here each toolset registers its tools on an in-process
``MCPServer`` (the same ``register`` call the real server makes), so the tool names, JSON
schemas, argument validation and error texts are verifiers' own:

* A tool is advertised as ``<server>_<tool>`` (``server`` is the toolset's ``server_name``:
  its ``TOOL_PREFIX``, else the snake-cased class name; none when ``TOOL_PREFIX = None``), as
  verifiers' chat harness names MCP tools.
* A call runs as the chat harness runs it: arguments that are not a JSON object, an unknown
  tool and a tool that raises all become a text result for the model, never an exception.
* The rollout's shared state (``trace.state``, what a ``Toolset[Config, MyState]`` reads and
  writes through ``self.state``) is the live trace's state object, for the call's duration: the
  state channel a real server pulls and pushes over HTTP.
* What verifiers holds for a whole eval (``Env.serving()``: the taskset's shared tool servers,
  then ``Env.start()``; ``Env.stop()``, then the servers, on the way out) is held per event loop
  here (:class:`SharedResources`): started by the first episode on a loop, stopped when that loop
  shuts down.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import warnings
from collections.abc import AsyncGenerator, Sequence
from typing import Any

from llm_gym.core.types import ToolSpec
from llm_gym.errors import InvalidArgumentError

try:
    import verifiers.v1 as vf
    from mcp.server.mcpserver import MCPServer
    from mcp.shared.exceptions import MCPError
    from verifiers.v1.harnesses.utils.compaction import bound_tool_message
    from verifiers.v1.harnesses.utils.mcp import mcp_content_to_chat_content
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "llm_gym's verifiers integration needs verifiers>=0.4: pip install -e '.[interop]'"
    ) from exc

__all__ = ["ACTIVE_TRACE", "SharedResources", "ToolBox", "ToolServer"]

ACTIVE_TRACE: contextvars.ContextVar[Any] = contextvars.ContextVar(
    "llm_gym_verifiers_trace", default=None
)
"""The trace whose rollout is calling a tool (its ``state`` is the tools' ``self.state``)."""


class ToolServer:
    """One :class:`~verifiers.v1.Toolset`, started in-process.

    Args:
        toolset: The toolset (a task's ``toolsets(config)`` entry, or a taskset's shared one).
    """

    def __init__(self, toolset: Any) -> None:
        if not isinstance(toolset, vf.Toolset):
            raise InvalidArgumentError(
                f"Expected a verifiers Toolset, actual value: {toolset!r:.200}."
            )
        self.toolset = toolset
        self.server: Any = None
        self.tools: list[Any] = []
        """The MCP tool records (``name``, ``description``, ``input_schema``)."""
        self._bridge_state()

    def _bridge_state(self) -> None:
        """Point the toolset's state channel at the calling rollout's ``trace.state``."""
        toolset = self.toolset
        adapter = getattr(toolset, "_state_adapter", None)  # its State codec (verifiers 0.4)
        if adapter is None:  # another verifiers release: the toolset keeps its own channel
            return

        async def pull() -> Any:
            trace = ACTIVE_TRACE.get()
            if trace is None:
                return adapter.validate_python({})
            if isinstance(trace.state, toolset._state_cls):
                return trace.state  # the same object: the tool's writes land on the trace
            return adapter.validate_json(trace.state.model_dump_json())

        async def push(before: bytes) -> None:
            trace = ACTIVE_TRACE.get()
            state = toolset.state
            if trace is not None and state is not trace.state:
                trace.state = type(trace.state).model_validate_json(adapter.dump_json(state))

        # The server's private state channel (an HTTP pull and push in a real rollout).
        toolset._pull_state = pull
        toolset._push_state = push

    async def start(self, task: Any = None) -> None:
        """``setup()``, then ``setup_task(task)`` (a task-scoped server), then ``register``:
        the order a real server follows."""
        await self.toolset.setup()
        if task is not None:
            await self.toolset.setup_task(task)
        name = self.toolset.server_name or type(self.toolset).__name__
        self.server = MCPServer(name)
        self.toolset.register(self.server)
        self.tools = list(await self.server.list_tools())

    async def stop(self) -> None:
        """Release what the toolset's ``setup`` entered (its exit stack)."""
        stack = getattr(self.toolset, "_exit_stack", None)
        if stack is not None:
            await stack.aclose()

    async def call(self, name: str, arguments: dict[str, Any]) -> Any:
        """Call tool ``name``; its content (text, or content parts), or the error text the MCP
        server would send."""
        try:
            result = await self.server.call_tool(name, arguments)
        except MCPError as exc:
            return f"error: {exc}"
        except Exception as exc:  # a raising tool is an outcome for the model
            return str(exc)
        content = getattr(result, "content", None)
        if content is None:  # an input-required result: nothing the chat loop can answer
            return f"error: tool {name!r} asked for input the rollout cannot give"
        return mcp_content_to_chat_content(content)


class ToolBox:
    """Every tool of one rollout, by the name the model calls it.

    Args:
        owned: Started :class:`ToolServer` s of this rollout (the task's toolsets), stopped by
            :meth:`stop`.
        shared: Started servers shared by the rollouts (the taskset's toolsets), left running.
    """

    def __init__(self, owned: Sequence[ToolServer], shared: Sequence[ToolServer] = ()) -> None:
        self.owned = list(owned)
        self.servers = [*self.owned, *shared]
        self.dispatch: dict[str, tuple[ToolServer, str]] = {}
        self.specs: list[ToolSpec] = []
        """The tools as OpenAI function specs (what the model is shown)."""
        self.tools: list[Any] = []
        """The same tools as verifiers ``Tool`` records (what the trace records)."""
        for server in self.servers:
            prefix = server.toolset.server_name
            for tool in server.tools:
                full = f"{prefix}_{tool.name}" if prefix else tool.name
                if full in self.dispatch:
                    raise InvalidArgumentError(
                        f"Two toolsets offer a tool named {full!r}; verifiers keeps MCP tool "
                        "names qualified (give the toolsets distinct TOOL_PREFIX values)."
                    )
                self.dispatch[full] = (server, tool.name)
                description = tool.description or ""
                parameters = dict(tool.input_schema or {"type": "object", "properties": {}})
                self.specs.append(
                    {
                        "type": "function",
                        "function": {
                            "name": full,
                            "description": description,
                            "parameters": parameters,
                        },
                    }
                )
                self.tools.append(
                    vf.Tool(name=full, description=description, parameters=parameters)
                )

    async def run(self, call: Any, trace: Any) -> dict[str, Any]:
        """The tool message for ``call`` (a verifiers ``ToolCall``), as the chat harness makes
        it: bad arguments and unknown tools become an ``error: ...`` text; the result is bounded
        in size like every tool result verifiers records."""
        name = call.name
        try:
            arguments = json.loads(call.arguments or "{}")
        except json.JSONDecodeError as exc:
            content: Any = (
                f"error: invalid JSON in tool arguments ({exc}); resend the call with valid JSON"
            )
        else:
            if not isinstance(arguments, dict):
                content = (
                    f"error: tool arguments must be a JSON object, got "
                    f"{type(arguments).__name__}; resend as an object"
                )
            elif name in self.dispatch:
                server, raw = self.dispatch[name]
                token = ACTIVE_TRACE.set(trace)
                try:
                    content = await server.call(raw, arguments)
                finally:
                    ACTIVE_TRACE.reset(token)
            else:
                content = f"error: unknown tool {name!r}"
        message = {"role": "tool", "tool_call_id": call.id, "content": content, "name": name}
        return bound_tool_message(message)

    async def stop(self) -> None:
        """Stop this rollout's own servers (safe to call twice)."""
        owned, self.owned = self.owned, []
        for server in owned:
            await server.stop()


class _Held:
    """What :class:`SharedResources` started for one event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.ready: asyncio.Future[list[ToolServer]] | None = None
        """The start, shared by the loop's episodes (its result: the started servers)."""
        self.keeper: AsyncGenerator[None, None] | None = None
        """An async generator the loop knows: its shutdown closes it, which stops the rest."""
        self.servers: list[ToolServer] = []
        self.env_started = False


class SharedResources:
    """A verifiers environment's shared resources, held per event loop.

    verifiers starts the taskset's shared tool servers and then ``Env.start()`` once for an
    eval, and runs ``Env.stop()`` and then the servers' teardown at its end (``Env.serving()``).
    llm_gym's loop runs each ``collect_groups`` call on an event loop of its own (and resources
    such as an HTTP client belong to the loop that made them), so the same pair is held per
    loop: the first episode on a loop starts it, and it is stopped

    * when the loop shuts down its async generators (``asyncio.run`` does, so every
      ``collect_groups``, ``run_and_report`` and trainer step releases its own);
    * else, for a loop closed without that (a bare ``loop.close()``), by the first start on
      another loop, there;
    * or by :meth:`aclose`.

    At most one set is alive per event loop still open. A failure while stopping is a
    ``RuntimeWarning`` (nothing is left to fail by then).

    Args:
        environment: The ``vf.Env`` whose ``start``/``stop`` run, or None (a bare taskset).
        taskset: The taskset whose ``toolsets(config)`` are the shared servers (fresh instances
            for each loop).
    """

    def __init__(self, environment: Any, taskset: Any) -> None:
        self.environment = environment
        self.taskset = taskset
        self._held: dict[asyncio.AbstractEventLoop, _Held] = {}

    @property
    def live(self) -> int:
        """How many event loops hold started resources."""
        return len(self._held)

    async def prepare(self) -> list[ToolServer]:
        """The running loop's shared servers, started (with ``Env.start()``) on first use."""
        loop = asyncio.get_running_loop()
        held = self._held.get(loop)
        if held is None:
            held = self._held[loop] = _Held(loop)
            held.ready = asyncio.ensure_future(self._start(held))
        assert held.ready is not None
        return await asyncio.shield(held.ready)

    async def aclose(self) -> None:
        """Stop what the running loop holds and what closed loops left behind (a loop still
        running elsewhere keeps its own until it shuts down). Call it once the loop's episodes
        are over; a later :meth:`prepare` starts afresh."""
        held = self._held.get(asyncio.get_running_loop())
        if held is not None:
            assert held.ready is not None
            await asyncio.gather(held.ready, return_exceptions=True)
            if held.keeper is not None:
                await held.keeper.aclose()
        await self._release_closed()

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_held": {}}  # started resources stay with their process

    async def _start(self, held: _Held) -> list[ToolServer]:
        keeper = held.keeper = self._keep(held)
        await keeper.__anext__()  # from here the loop's shutdown closes it
        await self._release_closed()
        try:
            for toolset in type(self.taskset).toolsets(self.taskset.config):
                server = ToolServer(toolset)
                held.servers.append(server)
                await server.start()
            if self.environment is not None:
                held.env_started = True  # verifiers stops an env whose start() failed, too
                await self.environment.start()
        except BaseException:
            await keeper.aclose()  # a failed start is retried by the next episode
            raise
        return list(held.servers)

    async def _keep(self, held: _Held) -> AsyncGenerator[None, None]:
        try:
            yield
        finally:
            await self._stop(held)

    async def _stop(self, held: _Held) -> None:
        """``Env.stop()``, then the servers' teardown (verifiers' order)."""
        if self._held.get(held.loop) is held:
            self._held.pop(held.loop, None)
        failures = []
        if held.env_started:
            held.env_started = False
            try:
                await self.environment.stop()
            except Exception as exc:
                failures.append(f"{type(self.environment).__name__}.stop(): {exc!r}")
        servers, held.servers = held.servers, []
        for server in reversed(servers):
            try:
                await server.stop()
            except Exception as exc:
                failures.append(f"{type(server.toolset).__name__} teardown: {exc!r}")
        if failures:
            warnings.warn(
                "Stopping a verifiers environment's shared resources failed: "
                + "; ".join(failures),
                RuntimeWarning,
                stacklevel=2,
            )

    async def _release_closed(self) -> None:
        """Stop, on this loop, what loops closed without shutting down their generators left."""
        for loop in [loop for loop in self._held if loop.is_closed()]:
            held = self._held.pop(loop, None)
            if held is None or held.keeper is None:
                continue
            try:
                await held.keeper.aclose()
            except RuntimeError as exc:  # it was mid-stop when its loop closed
                warnings.warn(
                    f"A verifiers environment's shared resources could not be stopped: {exc}",
                    RuntimeWarning,
                    stacklevel=2,
                )
