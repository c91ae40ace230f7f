"""The stdio transport to an MCP server, with a bound on what the server may send.

The MCP SDK's own ``stdio_client`` holds a line of any length (and re-splits the growing buffer
at every chunk, quadratic in the line's length), so a hostile server could stall the run or fill
its memory with one reply. :func:`bounded_stdio` keeps what
``stdio_client`` keeps (newline-delimited JSON-RPC over the process's stdin and stdout; on
exit stdin is closed, the server given :data:`EXIT_GRACE_S` to leave, then its process group is
terminated and killed) and adds the bound:

* a message (one line) over ``max_message_bytes`` is never held: its bytes are dropped as they
  arrive, and when its head names the request it answers (``{"jsonrpc": "2.0", "id": 7, ...``,
  how JSON-RPC peers write a response) that request gets a JSON-RPC error saying so, so the
  call fails at once instead of waiting out its timeout;
* lines are split in linear time (a scan never revisits bytes it has seen);
* a line that is not JSON-RPC is handed to the session as an error value, as the SDK does.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import anyio
import anyio.abc

from llm_gym.integrations.mcp.params import DEFAULT_MAX_MESSAGE_BYTES

try:
    import mcp_types
    from mcp.client.stdio import get_default_environment
    from mcp.shared.message import SessionMessage
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("llm_gym's MCP integration needs mcp: pip install -e '.[interop]'") from exc

__all__ = ["EXIT_GRACE_S", "bounded_stdio", "oversized_reply"]

EXIT_GRACE_S = 2.0
"""Seconds a server has to leave after its stdin closes (then SIGTERM, and as long again before
SIGKILL, to its whole process group)."""
OVERSIZED = -32001
"""The JSON-RPC error code of a reply dropped for its size (the server-error range)."""

_READ_CHUNK = 64 * 1024
_HEAD_BYTES = 256
_RESPONSE_ID = re.compile(
    rb'^\s*\{\s*"jsonrpc"\s*:\s*"2\.0"\s*,\s*"id"\s*:\s*(-?\d{1,18}|"[^"\\]{0,64}")'
)


def oversized_reply(head: bytes, limit: int) -> SessionMessage | None:
    """The JSON-RPC error answering the request a dropped message of ``head`` (its first bytes)
    responds to, or None when the head names none.

    Example:
        >>> oversized_reply(b'{"jsonrpc":"2.0","id":7,"result":{"content":', 10).message.id
        7
        >>> oversized_reply(b'{"jsonrpc":"2.0","method":"x"', 10) is None
        True
    """
    match = _RESPONSE_ID.match(head)
    if match is None:
        return None
    raw = match.group(1)
    request_id: int | str = int(raw) if raw[:1] != b'"' else raw[1:-1].decode("utf-8", "replace")
    error = mcp_types.ErrorData(
        code=OVERSIZED,
        message=f"the server's reply is over {limit} bytes (the client's bound) and is dropped",
    )
    return SessionMessage(mcp_types.JSONRPCError(jsonrpc="2.0", id=request_id, error=error))


def _parse(line: bytes) -> SessionMessage | Exception:
    try:
        message = mcp_types.jsonrpc_message_adapter.validate_json(line, by_name=False)
    except ValueError as exc:  # a line that is not JSON-RPC: the session reports it
        return exc
    return SessionMessage(message)


class _LineReader:
    """Splits a byte stream into lines of at most ``limit`` bytes, in linear time; a longer line
    is dropped as it arrives (its first :data:`_HEAD_BYTES` kept to answer its request)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.buffer = bytearray()
        self.scanned = 0
        self.dropping: bytes | None = None
        """The head of the line being dropped, while one is."""

    def feed(self, chunk: bytes) -> list[SessionMessage | Exception]:
        out: list[SessionMessage | Exception] = []
        if self.dropping is not None:
            end = chunk.find(b"\n")
            if end == -1:
                return out
            reply = oversized_reply(self.dropping, self.limit)
            if reply is not None:
                out.append(reply)
            self.dropping = None
            chunk = chunk[end + 1 :]
        self.buffer += chunk
        start = 0
        while (end := self.buffer.find(b"\n", self.scanned)) != -1:
            if end - start > self.limit:
                reply = oversized_reply(bytes(self.buffer[start : start + _HEAD_BYTES]), self.limit)
                out.extend([reply] if reply is not None else [])
            elif line := bytes(self.buffer[start:end]).strip():
                out.append(_parse(line))
            start = self.scanned = end + 1
        del self.buffer[:start]
        self.scanned = len(self.buffer)
        if len(self.buffer) > self.limit:  # no newline within the bound: drop the rest of it
            self.dropping = bytes(self.buffer[:_HEAD_BYTES])
            self.buffer.clear()
            self.scanned = 0
        return out


async def _stop(process: anyio.abc.Process) -> None:
    """Close stdin, give the server :data:`EXIT_GRACE_S`, then terminate and kill its group."""
    with contextlib.suppress(Exception):
        await process.stdin.aclose()  # type: ignore[union-attr]
    for sig in (None, signal.SIGTERM, signal.SIGKILL):
        if sig is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, sig)
        with anyio.move_on_after(EXIT_GRACE_S):
            while process.returncode is None:
                await anyio.sleep(0.01)
        if process.returncode is not None:
            break
    with contextlib.suppress(Exception):
        await process.aclose()


@contextlib.asynccontextmanager
async def bounded_stdio(
    command: str,
    args: Sequence[str] = (),
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    stderr: Any = None,
) -> AsyncIterator[tuple[Any, Any]]:
    """Run ``command args`` as an MCP server and yield the (read, write) streams of an MCP
    ``Client`` transport; on exit the server is stopped (:func:`_stop`), also when cancelled.

    ``env`` is merged over the SDK's safe default environment (``PATH``, ``HOME``, ...);
    ``stderr`` is where the server's stderr goes (None: this process's stderr).

    Raises:
        OSError: the command could not be started.
    """
    process = await anyio.open_process(
        [command, *args],
        env=get_default_environment() | dict(env or {}),
        cwd=cwd,
        stderr=stderr,
        start_new_session=True,  # its own process group: the stop reaches its children
    )
    read_in, read_out = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_in, write_out = anyio.create_memory_object_stream[SessionMessage](0)

    async def pump_stdout() -> None:
        reader = _LineReader(max_message_bytes)
        assert process.stdout is not None
        async with read_in:
            with contextlib.suppress(anyio.EndOfStream, anyio.ClosedResourceError, OSError):
                while True:
                    for message in reader.feed(await process.stdout.receive(_READ_CHUNK)):
                        await read_in.send(message)

    async def pump_stdin() -> None:
        assert process.stdin is not None
        try:
            async with write_out:
                async for message in write_out:
                    text = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    await process.stdin.send(text.encode() + b"\n")
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            await read_in.aclose()  # the server stopped reading: the session sees it closed

    try:
        async with anyio.create_task_group() as group:
            group.start_soon(pump_stdout)
            group.start_soon(pump_stdin)
            try:
                yield read_out, write_in
            finally:
                with anyio.CancelScope(shield=True):
                    await write_in.aclose()
                    await read_out.aclose()
                    await _stop(process)
                group.cancel_scope.cancel()
    finally:
        if process.returncode is None:  # pragma: no cover - the stop above always runs
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
