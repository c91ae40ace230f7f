"""The messages of llm_gym's OpenEnv face: the action (the assistant's message, validated with
limits) and the observation (the conversation's new messages, tool specs, reward, truncation).

:mod:`llm_gym.integrations.openenv_server` serves them; any OpenEnv client reads them (the
action and observation JSON schemas are at the server's ``/schema``).

Both sides treat the other as hostile, with the same rules: every WebSocket frame is read by
:func:`read_frame` (a JSON object of bounded size, count of values and depth, finite numbers,
lone surrogates replaced) before anything else looks at it; :class:`~llm_gym.integrations.
openenv_client.RemoteEnv` then checks an llm_gym server's observation with
:func:`~llm_gym.integrations.openenv_checks.check_observation` and its task listing with
:func:`~llm_gym.integrations.openenv_checks.check_listing`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import re
from collections.abc import Mapping
from typing import Any, Literal

from llm_gym.actions.codec import count_json_values
from llm_gym.core.text import clean_json
from llm_gym.errors import InvalidArgumentError

try:
    from openenv.core.env_server.types import Action, Observation
    from pydantic import (
        BaseModel,
        ConfigDict,
        Field,
        field_validator,
        model_validator,
    )
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "llm_gym's OpenEnv integration needs openenv-core: pip install -e '.[interop]'"
    ) from exc

__all__ = [
    "MAX_CONTENT_CHARS",
    "MAX_DEPTH",
    "MAX_FRAME_BYTES",
    "MAX_FRAME_VALUES",
    "MAX_MESSAGES",
    "MAX_TOOL_CALLS",
    "AssistantMessage",
    "EnvAction",
    "EnvObservation",
    "FrameGuard",
    "check_reset_seed",
    "clip_validation_errors",
    "json_safe",
    "read_frame",
]

MAX_CONTENT_CHARS = 1_000_000
"""The longest assistant ``content`` (or tool-call ``arguments``) a client may send."""
MAX_TOOL_CALLS = 64
"""The most tool calls in one assistant message."""
MAX_FRAME_BYTES = 16 * 1024 * 1024
"""The largest WebSocket frame either side reads (a bigger one closes the connection, 1009)."""
MAX_FRAME_VALUES = 100_000
"""The most JSON values in one frame: 16 MB of ``[],`` would be 5 million lists (2 s and 400 MB
to parse); counted in the text before it is parsed."""
MAX_DEPTH = 64
"""The deepest nesting of a frame's JSON (llm_gym's own frames nest about 8 deep)."""
MAX_MESSAGES = 4096
"""The most messages in one observation."""


class FunctionCallModel(BaseModel):
    """A tool call's function: its name and its arguments (a JSON string, or an object that is
    serialised to one)."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=256)
    arguments: str = Field(default="{}", max_length=MAX_CONTENT_CHARS)

    @field_validator("arguments", mode="before")
    @classmethod
    def _as_json_text(cls, value: Any) -> Any:
        return json.dumps(value) if isinstance(value, dict) else value


class ToolCallModel(BaseModel):
    """One tool call of an assistant message (OpenAI's format)."""

    model_config = ConfigDict(extra="forbid")
    id: str = Field(default="call_0", max_length=256)
    type: Literal["function"] = "function"
    function: FunctionCallModel


class AssistantMessage(BaseModel):
    """The assistant's message a client sends as its action."""

    model_config = ConfigDict(extra="forbid")
    role: Literal["assistant"] = "assistant"
    content: str = Field(default="", max_length=MAX_CONTENT_CHARS)
    tool_calls: list[ToolCallModel] = Field(default_factory=list, max_length=MAX_TOOL_CALLS)

    @field_validator("content", mode="before")
    @classmethod
    def _none_is_empty(cls, value: Any) -> Any:
        return "" if value is None else value

    def to_message(self) -> dict[str, Any]:
        """Our :class:`~llm_gym.core.types.Message` (``tool_calls`` only when there are some)."""
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = [call.model_dump() for call in self.tool_calls]
        return message


class EnvAction(Action):
    """An llm_gym step: the assistant's message, or (``conclude``) the end of an episode the
    client's loop cut short, which the env may score as it stands (``Env.conclude``)."""

    message: AssistantMessage | None = Field(
        default=None,
        description="The assistant's message (OpenAI format), or its text as a string; text "
        "without tool_calls is parsed with the env's action format.",
    )
    conclude: str | None = Field(
        default=None,
        max_length=64,
        description="Instead of a message: why the client's loop ended the episode (its "
        "truncation cause, e.g. 'max_turns'); the env scores what it has, if it can.",
    )

    @field_validator("message", mode="before")
    @classmethod
    def _text_is_content(cls, value: Any) -> Any:
        """A plain string (``{"message": "..."}``, as OpenEnv's text envs take) is the
        assistant's text: the server parses it with the env's action format."""
        return {"content": value} if isinstance(value, str) else value

    @model_validator(mode="after")
    def _one_of(self) -> EnvAction:
        if (self.message is None) == (self.conclude is None):
            raise ValueError("an action is a 'message' or a 'conclude', exactly one of them")
        return self


class EnvObservation(Observation):
    """What the environment said: the conversation's tail from ``start`` (after a step, the
    assistant's message as the env recorded it, then the env's replies)."""

    messages: list[dict[str, Any]] = Field(default_factory=list)
    start: int = Field(default=0, ge=0, description="The index of messages[0] in the episode.")
    tool_specs: list[dict[str, Any]] = Field(default_factory=list)
    truncated: bool = Field(default=False, description="Cut short by the env (not task logic).")
    task_id: str | None = None
    metrics: dict[str, Any] = Field(default_factory=dict)
    raw_text_actions: bool = Field(
        default=False, description="At reset: the env reads the assistant's raw text itself."
    )
    max_turns: int | None = Field(default=None, description="At reset: the env's own turn cap.")
    concludes: bool = Field(
        default=False, description="At reset: the env scores an episode cut short (conclude)."
    )


def json_safe(value: Any) -> Any:
    """``value`` with anything JSON cannot hold (numpy scalars, sets, objects) as text."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else str(value)
    try:
        return json_safe(value.item())  # numpy / torch scalars
    except Exception:
        return str(value)[:1000]


# --- frames, read the same way by the server and by RemoteEnv ------------------------------------

_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _path(value: Any, target: Any, where: str = "") -> str | None:
    """Where ``target`` (that very object) sits in ``value``: ``data.message.content``."""
    if value is target:
        return where or "the frame"
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(
        value, list) else ()  # fmt: skip
    for key, item in items:
        found = _path(item, target, f"{where}[{key}]" if isinstance(key, int) else
                      f"{where}.{key}".lstrip("."))  # fmt: skip
        if found is not None:
            return found
    return None


def _check_tree(value: Any, what: str) -> None:
    """No nesting deeper than :data:`MAX_DEPTH`, no NaN or infinity (walked without recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if type(item) is float and not math.isfinite(item):
            raise InvalidArgumentError(
                f"{_path(value, item)} is not a finite number ({item}); JSON numbers are finite."
            )
        children = item.values() if type(item) is dict else item if type(item) is list else ()
        if children and depth >= MAX_DEPTH:
            raise InvalidArgumentError(f"The {what} is nested deeper than {MAX_DEPTH} levels.")
        stack.extend((child, depth + 1) for child in children)


def read_frame(
    data: str | bytes, what: str = "frame", max_values: int = MAX_FRAME_VALUES
) -> tuple[dict[str, Any], str]:
    """A WebSocket frame (or another JSON document: ``what``) read as a JSON object, checked
    before anything else parses it; returns the object and the text to hand on (the same
    text, unless lone surrogates were replaced).

    Raises:
        InvalidArgumentError: naming what is wrong (not UTF-8, not JSON, not an object, more
            than ``max_values`` values, deeper than :data:`MAX_DEPTH`, a number that is not
            finite).
    """
    if isinstance(data, bytes | bytearray):
        try:
            data = bytes(data).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidArgumentError(f"A binary {what} must be UTF-8 JSON text: {exc}.") from None
    if (count := count_json_values(data, max_values)) > max_values:
        raise InvalidArgumentError(
            f"The {what} holds too many values (about {count:,}; at most {max_values:,})."
        )
    try:
        message = json.loads(data)
    except RecursionError:
        raise InvalidArgumentError("Invalid JSON: nested too deep to read.") from None
    except ValueError as exc:  # JSONDecodeError, and ints of more than 4,300 digits
        raise InvalidArgumentError(f"Invalid JSON: {str(exc)[:200]}") from None
    if not isinstance(message, dict):
        shape = ' {"type": ..., "data": {...}}' if what == "frame" else ""
        raise InvalidArgumentError(
            f"The {what} must be a JSON object{shape}, actual: a JSON {type(message).__name__}."
        )
    _check_tree(message, what)
    if _SURROGATE_ESCAPE.search(data) is not None:  # a lone surrogate cannot leave as UTF-8
        message = clean_json(message)
        data = json.dumps(message)
    return message, data


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


# --- what RemoteEnv accepts from an llm_gym server ------------------------------------------------
