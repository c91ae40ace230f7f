"""Environments whose tools come from MCP servers: :class:`MCPToolEnv` and :func:`with_mcp_tools`.

* :class:`MCPToolEnv` is a :class:`~llm_gym.core.tool_env.ToolEnv` (system prompt, final
  answer scored by :meth:`~llm_gym.core.tool_env.ToolEnv.score`) whose tools are its own plus
  those of its MCP servers.
* :func:`with_mcp_tools` adds MCP servers' tools to any environment (an id, a class, a factory
  or an instance): the episode's tool calls to MCP tools are answered by the servers, the rest
  (and every reply without tool calls) by the environment, which keeps its rules and reward.

Either way the servers are connected at reset, for that episode alone (its tools listed then;
a stdio server is a fresh process per episode, so no state leaks between episodes) and closed
with it. A server that cannot be reached fails the reset (the episode ends, cause ``ENV``);
everything a server does later is a ``tool_error`` message to the model
(:mod:`llm_gym.integrations.mcp.client` lists the cases). The final step's metrics add
``mcp_tools`` (tools served), ``mcp_tools_refused`` and, for :func:`with_mcp_tools`,
``mcp_tool_calls`` and ``mcp_tool_errors``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from llm_gym.core.env import Env, StepResult
from llm_gym.core.factories import as_env_factory
from llm_gym.core.task import Task
from llm_gym.core.tool import Tool, run_tool, tool_to_spec
from llm_gym.core.tool_env import ToolEnv, bound_tool_text, tool_error_text
from llm_gym.core.types import Message, ToolSpec
from llm_gym.errors import InvalidArgumentError
from llm_gym.integrations.mcp.client import MCPConnection, MCPTool
from llm_gym.integrations.mcp.params import MCPServerParams, as_server_list

__all__ = ["MCPToolEnv", "MCPToolsWrapper", "open_mcp_tools", "with_mcp_tools"]


async def open_mcp_tools(
    servers: Sequence[MCPServerParams], reserved: Sequence[str] = ()
) -> tuple[list[MCPConnection], list[MCPTool], list[str]]:
    """Open a connection to each server at once; returns them, the tools they serve and why
    each left-out tool is refused. A tool whose name is in ``reserved`` (the env's own) or
    came from an earlier server is left out.

    Raises:
        MCPServerError: a server could not be opened (the others are closed again).
    """
    connections = [MCPConnection(params) for params in servers]
    opened = await asyncio.gather(*(c.open() for c in connections), return_exceptions=True)
    failure = next((r for r in opened if isinstance(r, BaseException)), None)
    if failure is not None:
        await asyncio.gather(*(c.close() for c in connections))
        raise failure
    taken = set(reserved)
    tools: list[MCPTool] = []
    refused = [why for c in connections for why in c.refused]
    for connection in connections:
        for tool in connection.tools:
            if tool.name in taken:
                refused.append(f"{tool.name!r}: another tool of the episode has that name")
                continue
            taken.add(tool.name)
            tools.append(tool)
    return connections, tools, refused


class MCPToolEnv(ToolEnv):
    """A :class:`~llm_gym.core.tool_env.ToolEnv` whose tools include those of MCP servers.

    Subclass it like ``ToolEnv`` and set :attr:`mcp_servers` (or pass ``mcp_servers``)::

        class WeatherEnv(MCPToolEnv):
            system_prompt = "Use the tools, then answer with one word."
            mcp_servers = [MCPServerParams(command="python", args=("weather.py",))]

    Args:
        tools: Tools of its own (default: the class's :attr:`tools`).
        system_prompt: As for ``ToolEnv``.
        mcp_servers: :class:`~llm_gym.integrations.mcp.params.MCPServerParams`, a config entry
            (``{"command": ..., "args": [...]}`` or ``{"url": ...}``), a list of them or a
            mapping ``name -> entry`` (default: the class's :attr:`mcp_servers`).
    """

    mcp_servers: Sequence[MCPServerParams] = ()
    """The MCP servers whose tools each episode gets."""

    def __init__(
        self,
        tools: Sequence[Tool] | None = None,
        system_prompt: str | None = None,
        *,
        mcp_servers: Any = None,
        tool_latency_s: float = 0.0,
    ) -> None:
        super().__init__(tools, system_prompt, tool_latency_s=tool_latency_s)
        self.servers = as_server_list(self.mcp_servers if mcp_servers is None else mcp_servers)
        self._own_tools = dict(self._tools)
        self._connections: list[MCPConnection] = []
        self._refused: list[str] = []

    async def reset(self, task: Task) -> list[Message]:
        await self.close()
        connections, tools, self._refused = await open_mcp_tools(self.servers, self._own_tools)
        self._connections = connections
        self._tools = {**self._own_tools, **{t.name: t for t in tools}}
        self._specs = [tool_to_spec(t) for t in self._tools.values()]
        return await super().reset(task)

    def metrics(self, answer: str | None, task: Task) -> dict[str, Any]:
        """Adds ``mcp_tools`` and ``mcp_tools_refused`` (override and extend for more)."""
        served = len(self._tools) - len(self._own_tools)
        return {"mcp_tools": served, "mcp_tools_refused": len(self._refused)}

    @property
    def synchronous(self) -> bool:
        return False  # its tools are remote

    async def close(self) -> None:
        connections, self._connections = self._connections, []
        await asyncio.gather(*(c.close() for c in connections))


class MCPToolsWrapper(Env):
    """``env`` with the tools of MCP servers added (build it with :func:`with_mcp_tools`).

    A step whose tool calls all name MCP tools is answered here (the env does not see it); one
    without MCP calls goes to the env as it is; a step with both gives the env the message with
    its own calls only, and the transcript holds the whole message and every result, in call
    order. The env's ending, reward, metrics, ``max_turns`` and token budget hold.
    """

    def __init__(self, env: Env, servers: Sequence[MCPServerParams]) -> None:
        if getattr(env, "raw_text_actions", False):
            raise InvalidArgumentError(
                f"{type(env).__name__} parses the assistant's raw text itself "
                "(raw_text_actions=True), so tool calls never reach a wrapper; give the env the "
                "MCP tools itself (an MCPToolEnv, or MCPConnection in its own step)."
            )
        self.env = env
        self.servers = list(servers)
        budget = getattr(env, "max_tokens_per_turn", None)
        if budget is not None:
            self.max_tokens_per_turn = budget  # type: ignore[misc]
        self._connections: list[MCPConnection] = []
        self._tools: dict[str, MCPTool] = {}
        self._refused: list[str] = []
        self._messages: list[Message] = []
        self._seen = 0
        self._calls = self._errors = 0

    @property
    def max_turns(self) -> int | None:  # type: ignore[override]
        return getattr(self.env, "max_turns", None)

    async def reset(self, task: Task) -> list[Message]:
        await self.close()
        opening = list(await self.env.reset(task))
        own = [spec["function"]["name"] for spec in self.env.tool_specs]
        self._connections, tools, self._refused = await open_mcp_tools(self.servers, own)
        self._tools = {t.name: t for t in tools}
        self._messages, self._seen = list(opening), len(opening)
        self._calls = self._errors = 0
        return opening

    async def _call(self, call: Any) -> Message:
        function = call.get("function") or {}
        name = function.get("name", "")
        self._calls += 1
        try:
            content = (await run_tool(self._tools[name], function.get("arguments", "{}"))).content
        except Exception as exc:  # a failed call is an outcome for the model
            self._errors += 1
            content = tool_error_text(exc)
        return Message(
            role="tool",
            content=bound_tool_text(str(content)),
            tool_call_id=call.get("id", ""),
            name=name,
        )

    async def step(self, message: Message) -> StepResult:
        calls = list(message.get("tool_calls") or [])
        ours = [c for c in calls if ((c.get("function") or {}).get("name")) in self._tools]
        if not ours:
            return self._absorb(await self.env.step(message), None)
        results = {id(c): await self._call(c) for c in ours}
        if len(ours) == len(calls):
            self._messages.append(message)
            self._messages.extend(results[id(c)] for c in calls)
            return StepResult(False, False, list(self._messages))
        theirs = [c for c in calls if id(c) not in results]
        result = await self.env.step(Message(message, tool_calls=theirs))  # type: ignore[misc]
        return self._absorb(result, (message, calls, results))

    def _absorb(self, result: StepResult, mixed: Any) -> StepResult:
        """The transcript after the env's ``result`` (its new messages; for a mixed step the
        whole assistant message and the results in call order)."""
        new = list(result.messages[self._seen :])
        self._seen = len(result.messages)
        if mixed is None:
            self._messages.extend(new)
        else:
            message, calls, results = mixed
            if new and new[0].get("role") == "assistant":
                new = new[1:]  # the env's copy of the message, with its own calls only
            replies = {m.get("tool_call_id"): m for m in new if m.get("role") == "tool"}
            self._messages.append(message)
            for call in calls:
                reply = results.get(id(call)) or replies.pop(call.get("id"), None)
                if reply is not None:
                    self._messages.append(reply)
            self._messages.extend(
                m for m in new if m.get("role") != "tool" or m in replies.values()
            )
        if not (result.terminated or result.truncated):
            return StepResult(False, False, list(self._messages))
        metrics = {**dict(result.metrics), **self._metrics()}
        return StepResult(
            result.terminated, result.truncated, list(self._messages), result.reward, metrics
        )

    def _metrics(self) -> dict[str, Any]:
        return {
            "mcp_tools": len(self._tools),
            "mcp_tools_refused": len(self._refused),
            "mcp_tool_calls": self._calls,
            "mcp_tool_errors": self._errors,
        }

    async def conclude(self, cause: str) -> StepResult | None:
        """The env's ``conclude(cause)`` when it scores cut episodes (else None)."""
        conclude = getattr(self.env, "conclude", None)
        if conclude is None:
            return None
        result = await conclude(cause)
        if result is None:
            return None
        metrics = {**dict(result.metrics), **self._metrics()}
        return StepResult(
            result.terminated, result.truncated, list(self._messages), result.reward, metrics
        )

    @property
    def tool_specs(self) -> list[ToolSpec]:
        return [*self.env.tool_specs, *(tool_to_spec(t) for t in self._tools.values())]

    @property
    def messages(self) -> list[Message]:
        return list(self._messages)

    async def close(self) -> None:
        connections, self._connections = self._connections, []
        try:
            await asyncio.gather(*(c.close() for c in connections))
        finally:
            await self.env.close()


class _WithMCPTools:
    """A picklable env factory: the wrapped factory's env with the servers' tools."""

    def __init__(self, factory: Any, servers: list[MCPServerParams]) -> None:
        self.factory = factory
        self.servers = servers
        for attr in ("max_tokens_per_turn", "max_turns"):
            if hasattr(factory, attr):
                setattr(self, attr, getattr(factory, attr))

    def __call__(self, task: Task) -> MCPToolsWrapper:
        return MCPToolsWrapper(self.factory(task), self.servers)


def with_mcp_tools(env: Any, servers: Any) -> _WithMCPTools:
    """An env factory ``task -> Env``: ``env`` (a registered id, an ``Env`` class, a factory, an
    instance or ``"module:attr"``) with the tools of ``servers`` (what
    :func:`~llm_gym.integrations.mcp.params.as_server_list` accepts) added, for
    ``collect_groups``, ``run_and_report``, ``train_multi_turn`` or ``gym.make``'s ``env``.

    Example:
        >>> factory = with_mcp_tools("ToolUseGame-v0", {"url": "http://127.0.0.1:9/mcp"})
        >>> factory.servers[0].transport
        'streamable-http'
    """
    if isinstance(env, str) and ":" not in env:
        from llm_gym.core.registry import env_entry

        factory = env_entry(env).env_factory()
    else:
        factory = as_env_factory(env)
    return _WithMCPTools(factory, as_server_list(servers))
