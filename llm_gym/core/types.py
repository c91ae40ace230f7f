"""Chat message and tool spec shapes: the OpenAI chat-completions dicts.

``Message`` and ``ToolSpec`` are ``TypedDict`` s, so ``Message(role="user", content="hi")`` builds a
plain ``dict`` that any chat template, HTTP client or JSON encoder accepts as it is.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, Literal, Required, TypeAlias, TypedDict

__all__ = [
    "FrozenMessage",
    "FunctionCall",
    "FunctionSpec",
    "JsonSchema",
    "Message",
    "Role",
    "ToolCall",
    "ToolSpec",
    "freeze_message",
]

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


class FrozenMessage(dict):
    """A read-only chat message: a ``dict`` (JSON, chat templates and ``isinstance`` work) that
    refuses changes. ``TextEnv``'s ``info["messages"]`` holds these, so the entries can be shared
    between the infos of one episode at no risk; ``dict(message)`` (or ``copy.copy``) gives an
    editable copy. Pickles, and deep-copies, as a plain ``dict``.

    An environment may build its own messages as ``FrozenMessage`` s when it never edits them:
    ``TextEnv`` then shares them as they are instead of copying each one.
    """

    __slots__ = ()

    def _read_only(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(
            "info['messages'] entries are read-only (FrozenMessage); copy one with "
            "dict(message) to edit it."
        )

    __setitem__ = __delitem__ = __ior__ = _read_only  # type: ignore[assignment]
    clear = pop = popitem = setdefault = update = _read_only  # type: ignore[assignment]

    def __copy__(self) -> dict[str, Any]:
        return dict(self)

    def __deepcopy__(self, memo: dict[int, Any]) -> dict[str, Any]:
        return {key: copy.deepcopy(value, memo) for key, value in self.items()}

    def __reduce__(self) -> tuple[Any, ...]:
        return (dict, (copy.deepcopy(self),))


def _freeze(value: Any) -> Any:
    kind = type(value)
    if kind is str or value is None or kind is int or kind is float or kind is bool:
        return value
    if isinstance(value, Mapping):
        return FrozenMessage({key: _freeze(item) for key, item in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(item) for item in value)
    return copy.deepcopy(value)


def freeze_message(message: Message) -> Message:
    """A read-only deep copy of ``message`` (nested dicts frozen too, lists become tuples)."""
    for value in message.values():
        if type(value) is not str:
            break
    else:  # the common case: every value is a string
        return FrozenMessage(message)  # type: ignore[return-value]
    return _freeze(message)  # type: ignore[no-any-return]
