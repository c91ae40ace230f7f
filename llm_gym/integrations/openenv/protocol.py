"""The messages of llm_gym's OpenEnv face, and how each side reads the other's.

* The action (:class:`EnvAction`: the assistant's message, validated with limits) and the
  observation (:class:`EnvObservation`: the conversation's new messages, tool specs, reward,
  truncation); :mod:`llm_gym.integrations.openenv.server` serves them, and any OpenEnv client
  reads them (the JSON schemas are at the server's ``/schema``).
* Every WebSocket frame either side reads goes through :func:`read_frame` (a JSON object of
  bounded size, count of values and depth, finite numbers, lone surrogates replaced) before
  anything else looks at it; the server's front door is
  :class:`~llm_gym.integrations.openenv.guard.FrameGuard`.
* What :class:`~llm_gym.integrations.openenv.client.RemoteEnv` accepts from an llm_gym server:
  strict models of an observation (:func:`check_observation`) and of the task listing
  (:func:`check_listing`); a hostile server's answer becomes an
  :class:`~llm_gym.errors.InvalidArgumentError` naming the field.
"""

from __future__ import annotations

import json
import math
import re
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
        ValidationError,
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
    "ServedObservation",
    "TaskListing",
    "check_listing",
    "check_observation",
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


# --- what RemoteEnv accepts from an llm_gym server ------------------------------------------------


class ServedMessage(BaseModel):
    """A message of an llm_gym server's observation (OpenAI's format, nothing else)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    role: Literal["system", "user", "assistant", "tool"]
    content: str
    tool_calls: list[ToolCallModel] = Field(default_factory=list, max_length=MAX_TOOL_CALLS)
    tool_call_id: str = Field(default="", max_length=256)
    name: str = Field(default="", max_length=256)


class FunctionSpecModel(BaseModel):
    """The function half of a served tool spec (other keys are kept as they came)."""

    model_config = ConfigDict(extra="allow", strict=True)
    name: str = Field(min_length=1, max_length=256)
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=dict)


class ToolSpecModel(BaseModel):
    """A served tool spec: ``{"type": "function", "function": {...}}``."""

    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["function"]
    function: FunctionSpecModel


class ServedObservation(BaseModel):
    """An llm_gym server's observation, as :class:`EnvObservation` sends it."""

    model_config = ConfigDict(extra="ignore", strict=True)
    messages: list[ServedMessage] = Field(max_length=MAX_MESSAGES)
    start: int = Field(ge=0)
    tool_specs: list[ToolSpecModel] = Field(default_factory=list, max_length=256)
    truncated: bool = False
    task_id: str | None = None
    metrics: dict[str, Any] = Field(default_factory=dict)
    raw_text_actions: bool = False
    max_turns: int | None = Field(default=None, ge=1)
    concludes: bool = False


class ListedTask(BaseModel):
    """One task of ``GET /llm_gym/tasks``."""

    model_config = ConfigDict(extra="ignore", strict=True)
    id: str = Field(min_length=1, max_length=1024)
    prompt: str


class TaskListing(BaseModel):
    """``GET /llm_gym/tasks``: the split's tasks and the env's settings."""

    model_config = ConfigDict(extra="ignore", strict=True)
    tasks: list[ListedTask]
    max_turns: int | None = Field(default=None, ge=1)
    action_format: str | None = Field(default=None, min_length=1, max_length=64)


def _problems(exc: ValidationError) -> str:
    """``messages[0].role='root': Input should be ...`` for the first three errors."""
    found = []
    for error in exc.errors()[:3]:
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error["loc"])
        where = where.lstrip(".") or "the value"
        if error["type"] != "missing":
            where = f"{where}={error['input']!r:.40}"
        found.append(f"{where}: {error['msg']}"[:300])
    return "; ".join(found)


def check_observation(observation: Any) -> dict[str, Any]:
    """An llm_gym server's observation as plain dicts (messages with only the keys they came
    with), checked: messages in OpenAI's format, ``start`` an int >= 0, tool specs, a bool
    ``truncated`` and a dict of ``metrics``.

    Raises:
        InvalidArgumentError: naming the field (``messages[2].content: ...``).
    """
    try:
        checked = ServedObservation.model_validate(observation)
    except ValidationError as exc:
        raise InvalidArgumentError(_problems(exc)) from None
    result = checked.model_dump(exclude_unset=True)
    result["messages"] = [m.model_dump(exclude_unset=True) for m in checked.messages]
    result["tool_specs"] = [s.model_dump(exclude_unset=True) for s in checked.tool_specs]
    return result


def check_listing(listing: Any) -> dict[str, Any]:
    """``GET /llm_gym/tasks``'s answer, checked (task ids unique); raises InvalidArgumentError."""
    if not isinstance(listing, dict) or not isinstance(listing.get("tasks"), list):
        raise InvalidArgumentError("the task listing is not llm_gym's (no list of tasks).")
    try:
        checked = TaskListing.model_validate(listing).model_dump()
    except ValidationError as exc:
        raise InvalidArgumentError(f"the task listing is malformed: {_problems(exc)}") from None
    seen: set[str] = set()
    for task in checked["tasks"]:
        if task["id"] in seen:
            raise InvalidArgumentError(f"the task listing has a duplicate task id {task['id']!r}")
        seen.add(task["id"])
    return checked
