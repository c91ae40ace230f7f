"""The server's front door: :class:`FrameGuard`, ASGI middleware in front of OpenEnv's app that
reads every client frame and HTTP body with
:func:`~llm_gym.integrations.openenv.protocol.read_frame` before OpenEnv's handlers see it, and
sends validation errors back without the refused input (:func:`clip_validation_errors`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Mapping
from typing import Any

from llm_gym.errors import InvalidArgumentError
from llm_gym.integrations.openenv.protocol import MAX_FRAME_BYTES, read_frame

__all__ = ["MESSAGE_TYPES", "FrameGuard", "check_reset_seed", "clip_validation_errors"]

MESSAGE_TYPES = ("reset", "step", "state", "close")
"""The frames a client may send on ``/ws`` (OpenEnv's ``mcp`` is not served)."""


def clip_validation_errors(errors: Any) -> list[dict[str, Any]]:
    """Pydantic's ``errors()`` as a client may get them back: ``type``, ``loc`` (each key cut to
    100 characters) and ``msg`` of the first 20, without the ``input`` pydantic adds (the value
    refused, echoed whole: a 2 MB ``content`` came back as a 2 MB error).

    Example:
        >>> clip_validation_errors([{"type": "t", "loc": ["a", 0], "msg": "m", "input": "x" * 9}])
        [{'type': 't', 'loc': ['a', 0], 'msg': 'm'}]
    """
    clipped = []
    for error in list(errors)[:20] if isinstance(errors, list | tuple) else []:
        if isinstance(error, Mapping):
            loc = error.get("loc") or ()
            clipped.append({
                "type": str(error.get("type", ""))[:100],
                "loc": [part if type(part) is int else str(part)[:100] for part in loc][:20],
                "msg": str(error.get("msg", ""))[:300],
            })  # fmt: skip
    return clipped


def _clip_error_frame(event: Any) -> Any:
    """An outgoing WebSocket event, with the validation errors of an error frame clipped."""
    text = event.get("text") if event.get("type") == "websocket.send" else None
    if not text or not text.startswith('{"type":"error"') or '"errors"' not in text:
        return event
    try:
        frame = json.loads(text)
        frame["data"]["errors"] = clip_validation_errors(frame["data"]["errors"])
    except (ValueError, TypeError, KeyError):
        return event
    return {**event, "text": json.dumps(frame)}


def _error_frame(message: str, code: str) -> dict[str, Any]:
    text = json.dumps({"type": "error", "data": {"message": message, "code": code}})
    return {"type": "websocket.send", "text": text}


async def _http_answer(send: Any, status: int, detail: str, close: bool = False) -> None:
    """A JSON ``{"detail": ...}`` answer (``close``: and the connection closed after it)."""
    headers = [(b"content-type", b"application/json")]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": json.dumps({"detail": detail}).encode()})


def check_reset_seed(data: Any) -> None:
    """A reset's ``seed`` is a JSON integer or null, as OpenEnv's schema says: OpenEnv's
    ``ResetRequest`` reads it in pydantic's lax mode, where ``true`` becomes task 1 and
    ``"12"`` task 12 (a client that sends them has a bug the server should name).

    Raises:
        InvalidArgumentError: naming the value's JSON type.
    """
    seed = data.get("seed") if isinstance(data, Mapping) else None
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        kind = {bool: "boolean", str: "string", float: "number"}.get(type(seed), "value")
        raise InvalidArgumentError(
            f"reset takes an integer seed (a JSON integer) or none, actual: a JSON {kind} "
            f"({json.dumps(seed)[:40]})."
        )


async def _read_body(
    receive: Any, send: Any, reset: bool = False, timeout_s: float | None = None
) -> bytes | None:
    """An HTTP request's JSON body, read (at most :data:`MAX_FRAME_BYTES`, all of it within
    ``timeout_s``) and checked like a frame (a ``reset``'s seed by :func:`check_reset_seed`);
    None when it was refused (the answer is sent: 413, 408, 422) or the client left."""
    body, more = bytearray(), True
    try:
        async with asyncio.timeout(timeout_s):
            while more:
                event = await receive()
                if event["type"] != "http.request":
                    return None
                body += event.get("body", b"")
                more = event.get("more_body", False)
                if len(body) > MAX_FRAME_BYTES:
                    detail = f"The request body is over {MAX_FRAME_BYTES:,} bytes."
                    await _http_answer(send, 413, detail)
                    return None
    except TimeoutError:
        detail = (
            f"The request body did not arrive within {timeout_s} s ({len(body):,} bytes came; "
            "send a body as long as its Content-Length)."
        )
        await _http_answer(send, 408, detail, close=True)
        return None
    try:
        if not body:
            return b""
        message, text = read_frame(bytes(body), "request body")
        if reset:
            check_reset_seed(message)
        return text.encode()
    except InvalidArgumentError as exc:
        await _http_answer(send, 422, str(exc))
        return None


async def _next(replayed: list[Any], receive: Any) -> Any:
    return replayed.pop() if replayed else await receive()


class FrameGuard:
    """ASGI middleware in front of OpenEnv's ``/ws``: every client frame is read by
    :func:`read_frame` and its ``type`` checked before OpenEnv's handler sees it; a bad one is
    answered with an error and the session goes on (OpenEnv's handler would end the session on
    a list, a binary frame or JSON nested 50,000 deep). The validation errors of OpenEnv's
    error frames go out without the refused input (:func:`clip_validation_errors`). A
    connection silent for ``idle_timeout_s`` is told so and closed, which ends its session.
    A client that leaves without a close handshake is normal: OpenEnv's handler then raises
    ``WebSocketDisconnect`` while closing (it expects ``RuntimeError``), and the error is
    dropped here. The body of an
    HTTP ``/reset`` or ``/step`` is read the same way (9 MB of ``[],`` held the loop for 13 s, a
    NaN made a 500), all of it within ``body_timeout_s`` (else a 408 and the connection closed:
    a body shorter than its ``Content-Length`` would hold its connection for good). OpenEnv's
    ``/mcp`` routes are refused (404, or a WebSocket closed with 1008): MCP sessions opened over
    HTTP are never closed."""

    def __init__(
        self, app: Any, idle_timeout_s: float | None = None, body_timeout_s: float | None = None
    ) -> None:
        self.app = app
        self.idle_timeout_s = idle_timeout_s
        self.body_timeout_s = body_timeout_s

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "websocket" and scope.get("path") == "/mcp":
            await receive()  # the connect
            await send({"type": "websocket.close", "code": 1008, "reason": "no MCP here"})
            return
        if scope["type"] == "http" and scope.get("path") == "/mcp":
            await _http_answer(send, 404, "llm_gym envs serve no MCP: play through /ws.")
            return
        if scope["type"] == "http" and scope.get("path") in ("/reset", "/step"):
            reset = scope["path"] == "/reset"
            body = await _read_body(receive, send, reset, self.body_timeout_s)
            if body is not None:
                replayed = [{"type": "http.request", "body": body, "more_body": False}]
                await self.app(scope, lambda: _next(replayed, receive), send)
            return
        if scope["type"] != "websocket" or scope.get("path") != "/ws":
            await self.app(scope, receive, send)
            return
        from starlette.websockets import WebSocketDisconnect

        async def guarded_receive() -> Any:
            while True:
                try:
                    event = await asyncio.wait_for(receive(), self.idle_timeout_s)
                except TimeoutError:
                    idle = f"The session was idle for {self.idle_timeout_s} s and is closed."
                    with contextlib.suppress(Exception):
                        await send(_error_frame(idle, "SESSION_ERROR"))
                    return {"type": "websocket.disconnect", "code": 1000}
                if event["type"] != "websocket.receive":
                    return event
                text = event.get("text")
                try:
                    message, text = read_frame(event.get("bytes") or b"" if text is None else text)
                    if (kind := message.get("type")) not in MESSAGE_TYPES:
                        raise InvalidArgumentError(
                            f"Unknown message type {kind!r:.40}; allowed: {MESSAGE_TYPES}."
                        )
                    if kind == "reset":
                        check_reset_seed(message.get("data"))
                except InvalidArgumentError as exc:
                    code = "INVALID_JSON" if "JSON" in str(exc) else "VALIDATION_ERROR"
                    await send(_error_frame(str(exc), code))
                    continue
                return {"type": "websocket.receive", "text": text}

        async def guarded_send(event: Any) -> None:
            await send(_clip_error_frame(event))

        with contextlib.suppress(WebSocketDisconnect):
            await self.app(scope, guarded_receive, guarded_send)
