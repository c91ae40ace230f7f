"""One OpenEnv session seen from the client: openenv-core's ``GenericEnvClient`` with every
frame read by :func:`~llm_gym.integrations.openenv_protocol.read_frame`, a close bounded in
time, and a connection that is cheap to open (one per episode; see
:meth:`SessionClient.connect`). :class:`~llm_gym.integrations.openenv_client.RemoteEnv`
plays its episodes through it."""

from __future__ import annotations

import asyncio
import json
from typing import Any
from urllib.parse import urlsplit

from llm_gym.errors import InvalidArgumentError
from llm_gym.integrations.openenv_protocol import MAX_FRAME_BYTES, read_frame

try:
    from openenv.core.generic_client import GenericEnvClient
    from websockets.asyncio.client import connect as ws_connect
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "llm_gym's OpenEnv integration needs openenv-core: pip install -e '.[interop]'"
    ) from exc

__all__ = ["LOOPBACK_HOSTS", "SessionClient", "is_loopback"]

LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
"""Hosts that are this machine (never reached through a proxy)."""


def is_loopback(url: str) -> bool:
    """Whether ``url``'s host is this machine (never reached through a proxy)."""
    return (urlsplit(url).hostname or "").lower() in LOOPBACK_HOSTS


def _json_type(value: Any) -> str:
    """``value``'s JSON type in words (``a JSON list``; ``nothing`` for a missing value)."""
    if value is None:
        return "nothing (null or missing)"
    names = {dict: "object", list: "list", str: "string", bool: "boolean"}
    return f"a JSON {names.get(type(value), 'number')}"


class SessionClient(GenericEnvClient):
    """openenv's dict client: every frame read by ``read_frame``, its ``type`` the one its
    request calls for (``observation``, or ``error``) and its ``data`` an object (with an
    ``observation`` object), a close bounded in time."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options, max_message_size_mb=MAX_FRAME_BYTES / 2**20)
        self._asked = "reset"
        """The type of the last message sent (its answer's type follows from it)."""

    async def _send(self, message: dict[str, Any]) -> None:
        self._asked = str(message.get("type"))
        await super()._send(message)

    async def connect(self) -> SessionClient:
        """Open the WebSocket as openenv's ``connect`` does, but cheaper per session (one per
        episode): openenv sets and restores ``NO_PROXY`` around every loopback connection (a
        process-wide change that overlapping connections leave behind), where this tells the
        connection itself: no proxy and no keepalive pings on loopback (other hosts keep
        websockets' proxy lookup and pings; every call has its deadline anyway); and frames
        are not compressed (permessage-deflate cost the client about a tenth of its CPU per
        call, for frames of a few KB)."""
        if self._ws is not None:
            return self
        local = is_loopback(self._ws_url)
        try:
            self._ws = await ws_connect(
                self._ws_url,
                open_timeout=self._connect_timeout,
                max_size=self._max_message_size,
                compression=None,
                proxy=None if local else True,
                ping_interval=None if local else 20.0,
            )
        except Exception as exc:
            raise ConnectionError(f"Failed to connect to {self._ws_url}: {exc}") from exc
        return self

    async def _receive(self) -> dict[str, Any]:
        assert self._ws is not None
        async with asyncio.timeout(self._message_timeout):  # no task per call, as wait_for has
            raw = await self._ws.recv()
        frame = read_frame(raw)[0]
        kind, data = frame.get("type"), frame.get("data")
        expected = "state" if self._asked == "state" else "observation"
        if kind not in (expected, "error"):
            raise InvalidArgumentError(
                f"The answer to {self._asked!r:.20} must be a frame of type {expected!r} (or "
                f"'error'), actual: type {kind!r:.40}."
            )
        if not isinstance(data, dict):
            raise InvalidArgumentError(
                f"The frame's data must be a JSON object, actual: {_json_type(data)}."
            )
        if kind == "observation" and not isinstance(data.get("observation"), dict):
            raise InvalidArgumentError(
                "The frame's data.observation must be a JSON object, actual: "
                f"{_json_type(data.get('observation'))}."
            )
        return frame

    async def close_session(self, timeout_s: float) -> None:
        """Send ``close`` and wait up to ``timeout_s`` for the server to close the socket (it
        ends the session then), so neither side closes into the other (a server-side error in
        the log); then, or at once when ``timeout_s`` is 0, the connection is cut."""
        ws, self._ws = self._ws, None
        if ws is None:
            return
        try:
            if timeout_s > 0:
                async with asyncio.timeout(timeout_s):
                    await ws.send(json.dumps({"type": "close"}))
                    await ws.wait_closed()
        except Exception:  # a server that does not close in time is cut off below
            pass
        finally:
            ws.transport.abort()
