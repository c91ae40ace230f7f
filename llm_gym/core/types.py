"""Chat message and tool spec shapes: the OpenAI chat-completions dicts.

``Message`` and ``ToolSpec`` are ``TypedDict`` s, so ``Message(role="user", content="hi")`` builds a
plain ``dict`` that any chat template, HTTP client or JSON encoder accepts as it is.
"""

from __future__ import annotations

from typing import Any, Literal, Required, TypeAlias, TypedDict

__all__ = ["FunctionCall", "FunctionSpec", "JsonSchema", "Message", "Role", "ToolCall", "ToolSpec"]

Role: TypeAlias = Literal["system", "user", "assistant", "tool"]
JsonSchema: TypeAlias = dict[str, Any]


class FunctionCall(TypedDict):
    """The function half of a tool call."""

    name: str
    arguments: str
    """The arguments as a JSON-encoded object, exactly as OpenAI's API carries them."""


class ToolCall(TypedDict):
    """One tool call of an assistant message."""

    id: str
    type: Literal["function"]
    function: FunctionCall


class Message(TypedDict, total=False):
    """One chat message. Only ``role`` is required."""

    role: Required[str]
    content: str
    tool_calls: list[ToolCall]
    tool_call_id: str
    name: str


class FunctionSpec(TypedDict, total=False):
    """The function half of a tool spec."""

    name: Required[str]
    description: str
    parameters: JsonSchema


class ToolSpec(TypedDict):
    """An OpenAI-style tool spec: ``{"type": "function", "function": {...}}``."""

    type: Literal["function"]
    function: FunctionSpec
