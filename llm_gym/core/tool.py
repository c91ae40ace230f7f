"""Tools: the ``Tool`` protocol, ``ToolResult``, ``tool_to_spec`` and the ``@tool`` decorator.

A tool is anything with ``name``, ``description``, ``parameters_schema`` and an async
``execute(arguments: str) -> ToolResult``. ``@tool`` builds one from a typed Python function:

    >>> @tool
    ... def add(a: int, b: int) -> int:
    ...     '''Add two integers.
    ...
    ...     Args:
    ...         a: The first addend.
    ...         b: The second addend.
    ...     '''
    ...     return a + b
    >>> tool_to_spec(add)["function"]["parameters"]["required"]
    ['a', 'b']
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import re
import types
import typing
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from llm_gym.core.types import JsonSchema, ToolSpec
from llm_gym.errors import InvalidArgumentError, ToolArgumentError

__all__ = ["FunctionTool", "Tool", "ToolResult", "decode_arguments", "tool", "tool_to_spec"]


@dataclass(frozen=True)
class ToolResult:
    """What ``Tool.execute`` returns."""

    content: str
    """The text the model sees as the tool message."""
    should_stop: bool = False
    """Ask the environment to end the episode; its ``step`` decides how to honour it."""


@runtime_checkable
class Tool(Protocol):
    """Anything the model can call."""

    name: str
    description: str
    parameters_schema: JsonSchema

    async def execute(self, arguments: str) -> ToolResult:
        """Run the tool on JSON-encoded ``arguments``; raise to report a tool error."""
        ...


def tool_to_spec(tool: Tool) -> ToolSpec:
    """The OpenAI-style function spec of ``tool``, as chat templates render it."""
    for attr in ("name", "description", "parameters_schema"):
        if not hasattr(tool, attr):
            raise InvalidArgumentError(
                f"Expected a Tool with name, description and parameters_schema; "
                f"{type(tool).__name__} has no {attr!r}."
            )
    return {
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.parameters_schema,
        },
    }


def decode_arguments(arguments: str | Mapping[str, Any]) -> dict[str, Any]:
    """Decode a tool call's JSON arguments into a dict, or raise ``ToolArgumentError``."""
    if isinstance(arguments, Mapping):
        return dict(arguments)
    if not isinstance(arguments, str):
        raise ToolArgumentError(
            f"Expected tool arguments as a JSON object string, actual type: "
            f"{type(arguments).__name__}."
        )
    if not arguments.strip():
        return {}
    try:
        decoded = json.loads(arguments)
    except (ValueError, RecursionError) as exc:
        raise ToolArgumentError(f"arguments are not valid JSON: {exc}") from None
    if not isinstance(decoded, dict):
        raise ToolArgumentError(
            f"arguments must be a JSON object, actual value: {type(decoded).__name__}."
        )
    return decoded


# --- @tool: a Tool from a typed, docstring'd function ------------------------------------------

_JSON_TYPES: dict[type, str] = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    dict: "object",
    list: "array",
}


def _schema_for(annotation: Any) -> JsonSchema:
    """JSON schema of a Python type annotation (str, int, float, bool, list[X], dict, Literal)."""
    origin = typing.get_origin(annotation)
    if annotation is inspect.Parameter.empty or annotation is Any:
        return {}
    if origin is Literal:
        values = list(typing.get_args(annotation))
        schema: JsonSchema = {"enum": values}
        kinds = {_JSON_TYPES.get(type(v)) for v in values}
        if len(kinds) == 1 and None not in kinds:
            schema["type"] = kinds.pop()
        return schema
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(options) == 1:
            return _schema_for(options[0])
        return {"anyOf": [_schema_for(a) for a in options]}
    if origin in (list, tuple, set, frozenset) or annotation in (list, tuple):
        args = typing.get_args(annotation)
        schema = {"type": "array"}
        if args and args[0] is not Ellipsis:
            schema["items"] = _schema_for(args[0])
        return schema
    if origin is dict or annotation is dict:
        return {"type": "object"}
    if annotation in _JSON_TYPES:
        return {"type": _JSON_TYPES[annotation]}
    raise InvalidArgumentError(
        f"@tool cannot express the type {annotation!r} in JSON schema; use str, int, float, "
        "bool, list[...], dict or Literal[...]."
    )


_ARGS_HEADER = re.compile(r"^\s*(Args|Arguments|Parameters):\s*$")
_SECTION_HEADER = re.compile(r"^\s*[A-Z][A-Za-z ]*:\s*$")
_ARG_LINE = re.compile(r"^\s*(\*{0,2}\w+)\s*(\([^)]*\))?\s*:\s*(.*)$")


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """Split a Google-style docstring into (description, {arg: description})."""
    lines = inspect.cleandoc(doc).splitlines() if doc else []
    description: list[str] = []
    params: dict[str, str] = {}
    current: str | None = None
    in_args = False
    for line in lines:
        if _ARGS_HEADER.match(line):
            in_args, current = True, None
            continue
        if in_args and _SECTION_HEADER.match(line):
            in_args, current = False, None
            continue
        if in_args:
            match = _ARG_LINE.match(line)
            indent = len(line) - len(line.lstrip())
            if match and indent <= 4:
                current = match.group(1).lstrip("*")
                params[current] = match.group(3).strip()
            elif current and line.strip():
                params[current] = f"{params[current]} {line.strip()}".strip()
            continue
        if current is None and not params:
            description.append(line)
    text = "\n".join(description).strip()
    return text.split("\n\n")[0].replace("\n", " ").strip(), params


def _check_type(name: str, value: Any, schema: JsonSchema) -> Any:
    """Validate (and lightly coerce) one argument against its schema."""
    kind = schema.get("type")
    if "enum" in schema and value not in schema["enum"]:
        raise ToolArgumentError(f"{name!r} must be one of {schema['enum']}, got {value!r}.")
    if kind is None:
        ok = True
    elif kind == "string":
        ok = isinstance(value, str)
    elif kind == "integer":
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif kind == "number":
        ok = isinstance(value, int | float) and not isinstance(value, bool)
    elif kind == "boolean":
        ok = isinstance(value, bool)
    elif kind == "array":
        ok = isinstance(value, list)
    elif kind == "object":
        ok = isinstance(value, dict)
    else:
        ok = True
    if kind == "integer" and isinstance(value, float) and value.is_integer():
        return int(value)
    if not ok:
        raise ToolArgumentError(
            f"{name!r} must be of type {kind}, got {type(value).__name__} {value!r:.80}."
        )
    return value


class FunctionTool:
    """A :class:`Tool` made from a Python function by :func:`tool`."""

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
    ) -> None:
        self.fn = fn
        self.name = name or fn.__name__
        doc_description, doc_params = _parse_docstring(inspect.getdoc(fn) or "")
        self.description = description if description is not None else doc_description
        try:
            hints = typing.get_type_hints(fn)
        except Exception:  # unresolvable forward references: fall back to raw annotations
            hints = {}
        properties: dict[str, JsonSchema] = {}
        required: list[str] = []
        self._signature = inspect.signature(fn)
        for param in self._signature.parameters.values():
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                raise InvalidArgumentError(
                    f"@tool function {self.name!r} takes *{param.name}; a tool needs named "
                    "parameters so that its JSON schema can list them."
                )
            schema = dict(_schema_for(hints.get(param.name, param.annotation)))
            if param.name in doc_params:
                schema["description"] = doc_params[param.name]
            if param.default is param.empty:
                required.append(param.name)
            properties[param.name] = schema
        self.parameters_schema: JsonSchema = {
            "type": "object",
            "properties": properties,
            "required": required,
        }
        self._is_async = inspect.iscoroutinefunction(fn)
        self.synchronous = not self._is_async
        """A plain function never awaits: callers may run ``execute`` without an event loop."""

    def bind_arguments(self, arguments: str | Mapping[str, Any]) -> dict[str, Any]:
        """The validated keyword arguments of a call: ``arguments`` (JSON text or a mapping)
        checked against the schema; a bad call raises :class:`ToolArgumentError`."""
        values = decode_arguments(arguments)
        properties = self.parameters_schema["properties"]
        unknown = sorted(set(values) - set(properties))
        if unknown:
            raise ToolArgumentError(
                f"unknown argument(s) {unknown} for tool {self.name!r}; "
                f"allowed: {sorted(properties)}."
            )
        missing = [n for n in self.parameters_schema["required"] if n not in values]
        if missing:
            raise ToolArgumentError(f"missing required argument(s) {missing} for {self.name!r}.")
        return {k: _check_type(k, v, properties[k]) for k, v in values.items()}

    async def execute(self, arguments: str) -> ToolResult:
        """Validate ``arguments`` against the schema, call the function, wrap its result."""
        kwargs = self.bind_arguments(arguments)
        if self._is_async:
            result = await self.fn(**kwargs)
        else:
            result = self.fn(**kwargs)
            if isinstance(result, Awaitable):
                self.synchronous = False  # it returned an awaitable after all
                result = await result
        if isinstance(result, ToolResult):
            return result
        if isinstance(result, str):
            return ToolResult(content=result)
        return ToolResult(content=json.dumps(result, ensure_ascii=False, default=str))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the wrapped function directly (handy in tests)."""
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"FunctionTool(name={self.name!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        # ``@tool`` replaces the module attribute with this object, so pickle by reference.
        return (
            _load_function_tool,
            (self.fn.__module__, self.fn.__qualname__, self.name, self.description),
        )


def _load_function_tool(module: str, qualname: str, name: str, description: str) -> FunctionTool:
    value: Any = importlib.import_module(module)
    for part in qualname.split("."):
        value = getattr(value, part)
    if isinstance(value, FunctionTool):
        return value
    return FunctionTool(value, name=name, description=description)


def tool(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
) -> Any:
    """Turn a typed, docstring'd function (sync or async) into a :class:`Tool`.

    The JSON schema comes from the signature (``str``, ``int``, ``float``, ``bool``,
    ``list[...]``, ``dict``, ``Literal[...]``, ``X | None``), the description from the
    docstring's first paragraph and each parameter's description from its ``Args:`` section.
    Usable bare (``@tool``) or with overrides (``@tool(name="lookup")``).
    """

    def wrap(f: Callable[..., Any]) -> FunctionTool:
        return FunctionTool(f, name=name, description=description)

    return wrap(fn) if fn is not None else wrap


async def run_tool(tool: Tool, arguments: str) -> ToolResult:
    """Await ``tool.execute``; a plain function returning a ToolResult is accepted too."""
    result = tool.execute(arguments)
    if asyncio.iscoroutine(result) or isinstance(result, Awaitable):
        result = await result
    return result
