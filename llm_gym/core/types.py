"""Chat message and tool spec shapes: the OpenAI chat-completions dicts.

``Message`` and ``ToolSpec`` are ``TypedDict`` s, so ``Message(role="user", content="hi")`` builds a
plain ``dict`` that any chat template, HTTP client or JSON encoder accepts as it is.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Literal, Required, TypeAlias, TypedDict

from llm_gym.errors import InvalidArgumentError

__all__ = [
    "FrozenList",
    "FrozenMessage",
    "FunctionCall",
    "FunctionSpec",
    "JsonSchema",
    "Message",
    "Role",
    "ToolCall",
    "ToolSpec",
    "freeze_message",
    "freeze_spec",
    "rebuild_nested",
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
            "info['messages'] and info['tool_specs'] entries are read-only (FrozenMessage); "
            "copy one with dict(message) to edit it."
        )

    __setitem__ = __delitem__ = __ior__ = _read_only  # type: ignore[assignment]
    clear = pop = popitem = setdefault = update = _read_only  # type: ignore[assignment]

    def __copy__(self) -> dict[str, Any]:
        return dict(self)

    def __deepcopy__(self, memo: dict[int, Any]) -> dict[str, Any]:
        return {key: copy.deepcopy(value, memo) for key, value in self.items()}

    def __reduce__(self) -> tuple[Any, ...]:
        return (dict, (copy.deepcopy(self),))


class FrozenList(list):
    """A read-only ``list`` (it equals the list it was made from, and JSON, templates and
    ``isinstance`` see a list): the lists inside :func:`freeze_spec`'s tool specs, which
    ``TextEnv`` shares between the infos of an episode. Pickles, and deep-copies, as a plain
    ``list``."""

    __slots__ = ()

    def _read_only(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(
            "info['tool_specs'] entries are read-only (FrozenList); copy one with list(value) "
            "to edit it."
        )

    __setitem__ = __delitem__ = __iadd__ = __imul__ = _read_only  # type: ignore[assignment]
    append = extend = insert = pop = remove = clear = sort = reverse = _read_only  # type: ignore[assignment]

    def __copy__(self) -> list[Any]:
        return list(self)

    def __deepcopy__(self, memo: dict[int, Any]) -> list[Any]:
        return [copy.deepcopy(value, memo) for value in self]

    def __reduce__(self) -> tuple[Any, ...]:
        return (list, (copy.deepcopy(self),))


def _is_container(value: Any) -> bool:
    return not isinstance(value, str) and isinstance(value, Mapping | list | tuple)


def _children(container: Any) -> Iterator[Any]:
    if isinstance(container, Mapping):
        return itertools.chain.from_iterable(container.items())  # key, item, key, item, ...
    return iter(container)


def rebuild_nested(
    value: Any, leaf: Callable[[Any], Any], build: Callable[[Any, list[Any]], Any]
) -> Any:
    """A copy of ``value``, a structure of mappings, lists and tuples: each other value goes
    through ``leaf``, and each container is rebuilt by ``build(container, children)`` from its
    rebuilt children (a mapping's as ``[key, item, key, item, ...]``), innermost first.

    A loop over an explicit stack, not recursion: a structure nested as deeply as ``json.loads``
    allows (close to the recursion limit) is copied from any call depth.

    Example:
        >>> rebuild_nested({"a": [1, (2,)]}, str, lambda c, kids: kids)
        ['a', ['1', ['2']]]

    Raises:
        InvalidArgumentError: ``value`` contains itself (it could never be sent as JSON).
    """
    if not _is_container(value):
        return leaf(value)
    # Each frame: a container, an iterator over its children, the children rebuilt so far.
    stack: list[tuple[Any, Iterator[Any], list[Any]]] = [(value, _children(value), [])]
    on_path = {id(value)}
    while True:
        container, children, done = stack[-1]
        for child in children:
            if _is_container(child):
                if id(child) in on_path:
                    raise InvalidArgumentError(
                        f"a {type(container).__name__} contains itself; a message or a JSON "
                        "value must be a tree of dicts, lists and scalars."
                    )
                on_path.add(id(child))
                stack.append((child, _children(child), []))
                break
            done.append(leaf(child))
        else:
            stack.pop()
            on_path.discard(id(container))
            rebuilt = build(container, done)
            if not stack:
                return rebuilt
            stack[-1][2].append(rebuilt)


def _freeze_leaf(value: Any) -> Any:
    kind = type(value)
    if kind is str or value is None or kind is int or kind is float or kind is bool:
        return value
    return copy.deepcopy(value)


def _freeze_build(container: Any, children: list[Any]) -> Any:
    if isinstance(container, Mapping):
        return FrozenMessage(zip(children[::2], children[1::2], strict=True))
    return tuple(children)


class _TooDeep(Exception):
    """Raised by :func:`_freeze_within` past its depth: the caller takes the iterative path."""


def _freeze_within(value: Any, depth: int) -> Any:
    """:func:`rebuild_nested` with the freezing leaf and build, by recursion ``depth`` deep at
    most (else :class:`_TooDeep`): a tool-call message, three levels deep, is frozen on every
    step of a tool-using episode, and recursion does it in half the time."""
    kind = type(value)
    if kind is str or value is None or kind is int or kind is float or kind is bool:
        return value
    if not depth:
        raise _TooDeep
    depth -= 1
    if kind is dict or isinstance(value, Mapping):  # (a str returned above)
        return FrozenMessage({  # strings (most keys and values) without a call
            key if type(key) is str else _freeze_within(key, depth): item
            if type(item) is str
            else _freeze_within(item, depth)
            for key, item in value.items()
        })  # fmt: skip
    if kind is list or kind is tuple or _is_container(value):
        return tuple([_freeze_within(item, depth) for item in value])
    return copy.deepcopy(value)


def freeze_message(message: Message) -> Message:
    """A read-only deep copy of ``message`` (nested dicts frozen too, lists become tuples).

    Raises:
        InvalidArgumentError: ``message`` contains itself.
    """
    for value in message.values():
        if type(value) is not str:
            break
    else:  # the common case: every value is a string
        return FrozenMessage(message)  # type: ignore[return-value]
    try:  # a cycle, or a message nested past 32 levels, goes the iterative way
        return _freeze_within(message, 32)  # type: ignore[no-any-return]
    except _TooDeep:
        return rebuild_nested(message, _freeze_leaf, _freeze_build)  # type: ignore[no-any-return]


def _freeze_spec_build(container: Any, children: list[Any]) -> Any:
    if isinstance(container, Mapping):
        return FrozenMessage(zip(children[::2], children[1::2], strict=True))
    return FrozenList(children) if isinstance(container, list) else tuple(children)


def freeze_spec(spec: Any) -> Any:
    """A read-only deep copy of a tool spec (or any JSON-like value): dicts become
    :class:`FrozenMessage`, lists :class:`FrozenList`, so the copy still equals ``spec``.

    Example:
        >>> spec = {"function": {"name": "f", "parameters": {"required": ["a"]}}}
        >>> frozen = freeze_spec(spec)
        >>> frozen == spec, type(frozen["function"]["parameters"]["required"]).__name__
        (True, 'FrozenList')

    Raises:
        InvalidArgumentError: ``spec`` contains itself.
    """
    return rebuild_nested(spec, _freeze_leaf, _freeze_spec_build)
