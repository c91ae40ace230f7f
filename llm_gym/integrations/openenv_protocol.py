"""The messages of llm_gym's OpenEnv face: the action (the assistant's message, validated with
limits) and the observation (the conversation's new messages, tool specs, reward, truncation).

:mod:`llm_gym.integrations.openenv_server` serves them; any OpenEnv client reads them (the
action and observation JSON schemas are at the server's ``/schema``).
"""

from __future__ import annotations

import json
from typing import Any, Literal

try:
    from openenv.core.env_server.types import Action, Observation
    from pydantic import BaseModel, ConfigDict, Field, field_validator
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "llm_gym's OpenEnv integration needs openenv-core: pip install -e '.[interop]'"
    ) from exc

__all__ = [
    "MAX_CONTENT_CHARS",
    "MAX_TOOL_CALLS",
    "AssistantMessage",
    "EnvAction",
    "EnvObservation",
    "json_safe",
]

MAX_CONTENT_CHARS = 1_000_000
"""The longest assistant ``content`` (or tool-call ``arguments``) a client may send."""
MAX_TOOL_CALLS = 64
"""The most tool calls in one assistant message."""


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
    """An llm_gym step: the assistant's message."""

    message: AssistantMessage = Field(description="The assistant's message (OpenAI format).")


class EnvObservation(Observation):
    """What the environment said: the conversation's tail from ``start`` (after a step, the
    assistant's message as the env recorded it, then the env's replies)."""

    messages: list[dict[str, Any]] = Field(default_factory=list)
    start: int = Field(default=0, ge=0, description="The index of messages[0] in the episode.")
    tool_specs: list[dict[str, Any]] = Field(default_factory=list)
    truncated: bool = Field(default=False, description="Cut short by the env (not task logic).")
    task_id: str | None = None
    metrics: dict[str, Any] = Field(default_factory=dict)


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
