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
"""

from __future__ import annotations

import contextvars
import json
from collections.abc import Sequence
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

__all__ = ["ACTIVE_TRACE", "ToolBox", "ToolServer"]

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
