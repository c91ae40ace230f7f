"""Tools from MCP servers: :class:`MCPServerParams`, :class:`MCPConnection`, :class:`MCPTool`.

An MCP server (stdio: a command run as a subprocess; streamable HTTP: a URL) is reached
through the ``mcp`` SDK's ``Client``. One :class:`MCPConnection` is one episode's session with
one server: opened at reset (tools listed then), closed with the episode. Its tools are
:class:`~llm_gym.core.tool.Tool` objects, so any tool-using env calls them like its own.

The server is hostile. What it may do and what comes of it:

=================================  ==============================================================
the server                         outcome
=================================  ==============================================================
cannot start, or does not answer   reset raises :class:`~llm_gym.errors.MCPServerError` within
 the handshake / listing in time   ``connect_timeout_s``: the episode ends (cause ``ENV``)
sends a listing the MCP schema     reset raises ``MCPServerError`` (the SDK checks the whole
 refuses (an input schema whose    listing): the episode ends (cause ``ENV``)
 type is not ``object``, ...)
lists a tool with a bad name, a    that tool is left out (:attr:`MCPConnection.refused`, a
 taken name or a schema of over    ``RuntimeWarning``); the others are served
 ``MAX_SCHEMA_CHARS``
lists too many tools               the first :data:`MAX_TOOLS` are served
sends a long description           cut at :data:`MAX_DESCRIPTION_CHARS`
answers a call slowly              ``tool_error: ... timed out`` after ``call_timeout_s``
answers with ``isError``           ``tool_error: <its text>``
sends a huge result                stdio: dropped past ``max_message_bytes`` (a ``tool_error``);
                                   the text is cut at ``MAX_TOOL_RESULT_CHARS`` either way
sends images, audio, resources     a one-line placeholder each (the model reads text)
crashes mid-episode                ``tool_error: ... connection closed``, on this and every
                                   later call of the episode; the episode goes on
=================================  ==============================================================

The SDK's contexts (anyio task groups) must be entered and left by one task, and the episode
driver runs ``reset`` and ``close`` as tasks of their own, so each connection is held open by
an owner task of its own; calls reach its client from any task of the same event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import warnings
from collections.abc import Sequence
from typing import Any

from llm_gym.aio import within
from llm_gym.core.tool import ToolResult, decode_arguments
from llm_gym.core.tool_env import MAX_TOOL_RESULT_CHARS
from llm_gym.core.types import JsonSchema
from llm_gym.errors import InvalidArgumentError, MCPServerError, ToolCallError
from llm_gym.integrations.mcp.params import MCPServerParams
from llm_gym.integrations.mcp.stdio import bounded_stdio

try:
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("llm_gym's MCP integration needs mcp: pip install -e '.[interop]'") from exc

__all__ = [
    "MAX_DESCRIPTION_CHARS",
    "MAX_TOOLS",
    "MCPConnection",
    "MCPTool",
    "result_text",
]

MAX_TOOLS = 64
"""Tools served from one MCP server (a listing past it is cut, with a warning)."""
MAX_DESCRIPTION_CHARS = 2_000
"""A tool description longer than this is cut: it goes into every prompt."""
MAX_SCHEMA_CHARS = 16_000
"""A tool whose parameter schema encodes to more JSON than this is left out."""
_MAX_PAGES = 8
_TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_CLOSE_S = 10.0
"""Seconds :meth:`MCPConnection.close` waits for the owner task before cancelling it."""


def _placeholder(block: Any) -> str:
    kind = getattr(block, "type", "unknown")
    mime = getattr(block, "mime_type", None) or ""
    if kind == "resource":
        inner = getattr(block, "resource", None)
        text = getattr(inner, "text", None)
        if isinstance(text, str):
            return text
        return f"[resource {getattr(inner, 'uri', '')} omitted]"
    if kind == "resource_link":
        return f"[resource link: {getattr(block, 'uri', '')}]"
    return f"[{kind} content{' ' + mime if mime else ''} omitted]"


def result_text(result: Any, limit: int = MAX_TOOL_RESULT_CHARS) -> str:
    """The text of an MCP ``CallToolResult`` for the model: its text blocks joined by newlines
    (other blocks as one-line placeholders), else its structured content as JSON; read only up
    to ``limit`` characters and a note past them. Raises :class:`ToolCallError` with that text
    when the result is marked ``isError``."""
    parts: list[str] = []
    size = 0
    for block in getattr(result, "content", None) or ():
        text = block.text if getattr(block, "type", None) == "text" else _placeholder(block)
        parts.append(text[: limit - size + 1])
        size += len(parts[-1]) + 1
        if size > limit:
            parts.append(f"[cut at {limit} chars]")
            break
    text = "\n".join(parts)
    structured = getattr(result, "structured_content", None)
    if not parts and structured is not None:
        text = json.dumps(structured, ensure_ascii=False, default=str)[: limit + 1]
    if getattr(result, "is_error", False):
        raise ToolCallError(text or "the tool reported an error and sent no text")
    return text


def _checked_schema(schema: Any) -> JsonSchema | None:
    """``schema`` when it is a JSON object schema this client serves (type ``object``,
    ``properties`` a mapping, ``required`` a list of names, at most :data:`MAX_SCHEMA_CHARS`
    of JSON); None otherwise."""
    if not isinstance(schema, dict) or schema.get("type", "object") != "object":
        return None
    if not isinstance(schema.get("properties", {}), dict):
        return None
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        return None
    try:
        if len(json.dumps(schema)) > MAX_SCHEMA_CHARS:
            return None
    except (TypeError, ValueError, RecursionError):
        return None
    return {"type": "object", **schema}


class MCPTool:
    """One tool of an MCP server, as a :class:`~llm_gym.core.tool.Tool`."""

    def __init__(
        self,
        connection: MCPConnection,
        remote_name: str,
        name: str,
        description: str,
        parameters_schema: JsonSchema,
    ) -> None:
        self.connection = connection
        self.remote_name = remote_name
        """The name the server knows the tool by (:attr:`name` carries the prefix)."""
        self.name = name
        self.description = description
        self.parameters_schema = parameters_schema

    async def execute(self, arguments: str) -> ToolResult:
        """Call the tool with ``arguments`` (a JSON object); raises on a failed call (the env
        turns it into a ``tool_error`` message)."""
        return ToolResult(await self.connection.call(self.remote_name, decode_arguments(arguments)))

    def __repr__(self) -> str:
        return f"MCPTool(name={self.name!r}, server={self.connection.params.label!r})"


class MCPConnection:
    """One session with one MCP server: :meth:`open` (start, handshake, list the tools),
    :meth:`call`, :meth:`close`. Use it on one event loop."""

    def __init__(self, params: MCPServerParams) -> None:
        self.params = params
        self.tools: list[MCPTool] = []
        """The tools served (after :meth:`open`)."""
        self.refused: list[str] = []
        """Why the client leaves out each tool of the listing it does not serve."""
        self._client: Any = None
        self._owner: asyncio.Task[None] | None = None
        self._stop: asyncio.Event | None = None
        self._failure: BaseException | None = None

    def _transport(self, stack: contextlib.AsyncExitStack) -> Any:
        params = self.params
        if params.command is not None:
            return bounded_stdio(
                params.command,
                params.args,
                env=params.env,
                cwd=params.cwd,
                max_message_bytes=params.max_message_bytes,
            )
        timeout = httpx2.Timeout(params.call_timeout_s, connect=params.connect_timeout_s)
        http = create_mcp_http_client(headers=dict(params.headers or {}), timeout=timeout)
        stack.push_async_callback(http.aclose)
        assert params.url is not None
        return streamable_http_client(params.url, http_client=http)

    async def _own(self, ready: asyncio.Future[None], stop: asyncio.Event) -> None:
        """Hold the client open until :meth:`close` (run as its own task)."""
        try:
            async with contextlib.AsyncExitStack() as stack:
                client = Client(self._transport(stack), cache=None)
                self._client = await stack.enter_async_context(client)
                ready.set_result(None)
                await stop.wait()
        except BaseException as exc:  # reported to the caller that waits on ``ready``
            self._failure = exc
            if not ready.done():
                ready.set_exception(exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
        finally:
            self._client = None

    async def open(self) -> list[MCPTool]:
        """Start the server (or connect), hand-shake and list its tools, within
        ``connect_timeout_s``; returns :attr:`tools`.

        Raises:
            MCPServerError: naming the server and what failed.
        """
        if self._owner is not None:
            raise InvalidArgumentError("This MCP connection is open already; make a new one.")
        label = self.params.label
        timeout = self.params.connect_timeout_s
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[None] = loop.create_future()
        self._stop = asyncio.Event()
        self._owner = loop.create_task(self._own(ready, self._stop), name=f"mcp:{label}")
        try:
            await within(
                self._start(ready),
                timeout,
                lambda: MCPServerError(
                    f"The MCP server {label!r} did not start, hand-shake and list its tools "
                    f"within connect_timeout_s={timeout:g} s."
                ),
            )
        except MCPServerError:
            await self.close()
            raise
        except BaseException as exc:
            await self.close()
            if isinstance(exc, asyncio.CancelledError | KeyboardInterrupt):
                raise
            raise MCPServerError(
                f"The MCP server {label!r} could not be started, reached or listed: "
                f"{type(exc).__name__}: {exc!s:.500}"
            ) from exc
        return self.tools

    async def _start(self, ready: asyncio.Future[None]) -> None:
        await asyncio.shield(ready)
        listed: list[Any] = []
        cursor = None
        for _ in range(_MAX_PAGES):
            page = await self._client.list_tools(cursor=cursor)
            listed.extend(page.tools)
            cursor = page.next_cursor
            if not cursor or len(listed) > MAX_TOOLS:
                break
        self.tools = self._serve(listed)

    def _serve(self, listed: Sequence[Any]) -> list[MCPTool]:
        tools: dict[str, MCPTool] = {}
        prefix = f"{self.params.name}_" if self.params.name else ""
        for tool in listed:
            remote = getattr(tool, "name", None)
            name = f"{prefix}{remote}"
            schema = _checked_schema(getattr(tool, "input_schema", None))
            why = None
            if not isinstance(remote, str) or not _TOOL_NAME.fullmatch(name):
                why = "its name is not 1-64 letters, digits, '_' or '-'"
            elif name in tools:
                why = "a tool of that name came first"
            elif schema is None:
                why = f"its input schema is not a JSON object schema of <= {MAX_SCHEMA_CHARS} chars"
            elif len(tools) == MAX_TOOLS:
                why = f"the server lists more than MAX_TOOLS={MAX_TOOLS} tools"
            if why is not None:
                self.refused.append(f"{str(remote)[:80]!r}: {why}")
                continue
            description = getattr(tool, "description", None) or ""
            tools[name] = MCPTool(self, remote, name, description[:MAX_DESCRIPTION_CHARS], schema)
        if self.refused:
            warnings.warn(
                f"MCP server {self.params.label!r}: {len(self.refused)} tool(s) left out: "
                + "; ".join(self.refused[:5]),
                RuntimeWarning,
                stacklevel=3,
            )
        return list(tools.values())

    async def call(self, name: str, arguments: dict[str, Any]) -> str:
        """The text of tool ``name``'s result for ``arguments``.

        Raises:
            ToolCallError: the tool answered with an error (its text).
            MCPServerError: the server is gone, failed the request or outlasted
                ``call_timeout_s``.
        """
        label, timeout = self.params.label, self.params.call_timeout_s
        client = self._client
        if client is None:
            why = f": {self._failure!s:.300}" if self._failure else ""
            raise MCPServerError(f"the MCP server {label!r} is not connected (it stopped){why}")
        try:
            result = await within(
                client.call_tool(name, arguments, read_timeout_seconds=timeout),
                timeout,
                lambda: MCPServerError(
                    f"the MCP server {label!r} did not answer {name!r} within {timeout:g} s"
                ),
            )
        except (MCPServerError, asyncio.CancelledError):
            raise
        except Exception as exc:  # the SDK's MCPError, a transport or validation error
            raise MCPServerError(f"the MCP server {label!r} failed the call: {exc!s:.500}") from exc
        return result_text(result)

    async def close(self) -> None:
        """Stop the server (stdio) or end the session (HTTP); safe to call more than once."""
        owner, self._owner = self._owner, None
        if owner is None or self._stop is None:
            return
        if owner.get_loop() is not asyncio.get_running_loop():
            # Opened on another event loop: when that loop ended (``asyncio.run`` returned) it
            # cancelled the owner, which stopped the server; there is nothing left to wait on.
            if not owner.get_loop().is_closed():
                owner.get_loop().call_soon_threadsafe(self._stop.set)
            return
        self._stop.set()
        if self._client is None:  # still starting (or gone): nothing to end politely
            owner.cancel()
        done, _ = await asyncio.wait((owner,), timeout=_CLOSE_S)
        if not done:
            owner.cancel()
            await asyncio.wait((owner,), timeout=_CLOSE_S)
        if owner.done() and not owner.cancelled():
            owner.exception()  # retrieved: its failure reached whoever waited on ``ready``
