"""The Qwen3-Coder tool-call format: XML-like function and parameter tags.

A reply calls tools with one or more blocks::

    Let me look that up.
    <tool_call>
    <function=search>
    <parameter=query>
    capital of France
    </parameter>
    </function>
    </tool_call>

Parsing rules (on top of the shared ones in :mod:`llm_gym.actions.codec`), as vLLM's
``qwen3_coder`` parser reads them:

* No ``<tool_call>``, ``</tool_call>`` nor ``<function=`` anywhere: a final answer, content = the
  text unchanged.
* Otherwise each call is ``<tool_call> <function=NAME> PARAMETERS </function> </tool_call>``
  (whitespace between the tags allowed) or a bare ``<function=NAME> ... </function>``. Each
  parameter is ``<parameter=KEY>VALUE</parameter>``: the value is the text up to the first
  ``</parameter>``, less one leading and one trailing newline. ``NAME`` and ``KEY`` end at the
  first ``>`` and hold no ``<`` nor newline. The message content is the text outside the calls,
  stripped; ``</tool_call>``, ``</function>``, ``<parameter=`` or ``</parameter>`` there (or an
  unclosed tag) is a parse failure.
* Values are typed by the tool's JSON schema (see :meth:`Qwen3CoderFormat.with_tool_specs`):
  ``null`` (any case) is null; a ``string`` parameter keeps the text; ``integer`` and
  ``number`` parameters get the number the text spells (a whole ``number`` becomes an integer);
  ``boolean`` ones ``true``/``false`` (any case); ``object`` and ``array`` ones the JSON the
  text holds. Text that does not fit the declared type stays a string, for the tool to reject.
  A parameter with no declared type (an unknown tool or key, or a format not bound to tools)
  gets the JSON value when the text is a JSON number, ``true``, ``false`` (any case),
  ``null``, object or array, else the text.
* Parsing is linear in the length of the text.

Rendering writes string values as they are and other values as JSON (``<``, ``>`` and ``&``
escaped inside it). A string value holding ``</parameter>``, or a name or key holding ``>``,
``<`` or a newline, cannot be written in this format: rendering raises for it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from llm_gym.actions.base import (
    MAX_TOOL_CALLS,
    ActionFormat,
    ParsedAction,
    register_action_format,
)
from llm_gym.actions.codec import (
    decode_tool_calls,
    dumps_for_model,
    loads_lenient,
    require_text,
    spec_block,
    tool_call_to_object,
)
from llm_gym.actions.grammar import Lark, tagged_parameters
from llm_gym.core.types import Message, ToolCall, ToolSpec
from llm_gym.errors import InvalidArgumentError

__all__ = ["Qwen3CoderFormat", "parameter_value"]

_CALL_OPEN, _CALL_CLOSE = "<tool_call>", "</tool_call>"
_FUNCTION_OPEN, _FUNCTION_CLOSE = "<function=", "</function>"
_PARAMETER_OPEN, _PARAMETER_CLOSE = "<parameter=", "</parameter>"
_STRAY = (_CALL_CLOSE, _FUNCTION_CLOSE, _PARAMETER_OPEN, _PARAMETER_CLOSE)
_WHITESPACE = " \t\r\n"

_STRING_TYPES = frozenset({"string", "str", "text", "varchar", "char", "enum"})
_INTEGER_PREFIXES = ("int", "uint", "long", "short", "unsigned")
_NUMBER_PREFIXES = ("num", "float")
_BOOLEAN_TYPES = frozenset({"boolean", "bool", "binary"})
_JSON_PREFIXES = ("object", "array", "arr", "dict", "list")

_TOOLS_HEADER = (
    "# Tools\n\n"
    "You have access to the following functions, one JSON signature per line:\n\n"
    "<tools>\n"
)
_TOOLS_FOOTER = (
    "\n</tools>\n\n"
    "If you choose to call a function ONLY reply in the following format with NO suffix:\n\n"
    "<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n"
    "</parameter>\n<parameter=example_parameter_2>\nThis is the value for the second parameter\n"
    "that can span\nmultiple lines\n</parameter>\n</function>\n</tool_call>\n\n"
    "Reminder:\n"
    "- Function calls MUST follow the specified format: an inner <function=...></function> "
    "block must be nested within <tool_call></tool_call> XML tags\n"
    "- Required parameters MUST be specified\n"
    "- A reply without a <tool_call> block is taken as your final answer."
)


def _declared_type(schema: Any) -> str | None:
    """The schema's ``type`` in lower case (the first non-null one of a list), or ``None``."""
    declared = schema.get("type") if isinstance(schema, Mapping) else None
    if isinstance(declared, list):
        declared = next((t for t in declared if t != "null"), None)
    return declared.strip().lower() if isinstance(declared, str) else None


def _guess(text: str) -> Any:
    """The JSON value ``text`` spells when it is not a JSON string (``True`` and ``False`` in
    any case are booleans), else ``text``."""
    stripped = text.strip()
    if not stripped or stripped[0] == '"':
        return text
    if stripped.lower() in ("true", "false"):  # Qwen3-Coder's template writes Python's True
        return stripped.lower() == "true"
    try:
        return loads_lenient(stripped)
    except (ValueError, RecursionError):
        return text


def parameter_value(text: str, schema: Any) -> Any:
    """A parameter's value from its text and its JSON schema (see the module docstring).

    Example:
        >>> [parameter_value(t, {"type": k}) for t, k in [("7", "string"), ("7", "integer")]]
        ['7', 7]
        >>> parameter_value("2.0", {"type": "number"}), parameter_value("True", {"type": "boolean"})
        (2, True)
        >>> parameter_value('[1, "a"]', None), parameter_value("x", {"type": "integer"})
        ([1, 'a'], 'x')
    """
    if text.lower() == "null":
        return None
    declared = _declared_type(schema)
    if declared is None:
        return _guess(text)
    if declared in _STRING_TYPES:
        return text
    if declared.startswith(_INTEGER_PREFIXES) or declared.startswith(_NUMBER_PREFIXES):
        try:
            return int(text)  # exact for long integers; too many digits stay text
        except ValueError:
            if declared.startswith(_INTEGER_PREFIXES):
                return text
        try:
            number = float(text)
        except ValueError:
            return text
        if not math.isfinite(number):
            return text
        return int(number) if number.is_integer() else number
    if declared in _BOOLEAN_TYPES:
        lowered = text.strip().lower()
        return lowered == "true" if lowered in ("true", "false") else text
    if declared.startswith(_JSON_PREFIXES):
        try:
            return loads_lenient(text)
        except (ValueError, RecursionError):
            return text
    return _guess(text)


def _value_text(value: Any, key: str) -> str:
    if isinstance(value, str):
        if _PARAMETER_CLOSE in value:
            raise InvalidArgumentError(
                f"the value of parameter {key!r} holds {_PARAMETER_CLOSE!r}, which the "
                "qwen3_coder format cannot write; use another action format for such values"
            )
        return value
    return dumps_for_model(value, escape_markup=True)


def _tag_name(name: str, what: str) -> str:
    if not name.strip() or any(c in name for c in "<>\n"):
        raise InvalidArgumentError(
            f"a {what} in the qwen3_coder format must be non-blank without '<', '>' or a "
            f"newline, got {name!r:.200}; use another action format for such names"
        )
    return name


@register_action_format
class Qwen3CoderFormat(ActionFormat):
    """Tool calls as ``<function=NAME>`` blocks with one ``<parameter=KEY>`` tag per argument
    inside ``<tool_call>`` tags (Qwen3-Coder).

    Args:
        tool_specs: The tools whose JSON schemas type the parameter values; ``None`` (the
            registry's instance) types none of them. :meth:`with_tool_specs` binds them.
    """

    name: ClassVar[str] = "qwen3_coder"
    MARKERS: ClassVar[tuple[str, ...]] = (_FUNCTION_OPEN,)

    def __init__(self, tool_specs: Sequence[ToolSpec] | None = None) -> None:
        self._schemas: dict[str, Mapping[str, Any]] = {}
        for spec in tool_specs or ():
            function = spec.get("function") if isinstance(spec, Mapping) else None
            if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
                continue
            parameters = function.get("parameters")
            properties = parameters.get("properties") if isinstance(parameters, Mapping) else None
            if isinstance(properties, Mapping):
                self._schemas[function["name"]] = properties

    @classmethod
    def signature(cls, rendered: str) -> bool:
        """Whether ``rendered`` holds a ``<function=NAME>`` tag followed by a ``<parameter=``
        tag or ``</function>``.

        Example:
            >>> Qwen3CoderFormat.signature("<tool_call>\\n<function=f>\\n<parameter=x>\\n1")
            True
            >>> Qwen3CoderFormat.signature('<function=f>{"x": 1}</function>')
            False
        """
        start = rendered.find(_FUNCTION_OPEN)
        while start != -1:
            end = rendered.find(">", start)
            if end == -1:
                return False
            after = rendered[end + 1 : end + 64].lstrip(_WHITESPACE)
            if after.startswith((_PARAMETER_OPEN, _FUNCTION_CLOSE)):
                return True
            start = rendered.find(_FUNCTION_OPEN, end)
        return False

    def with_tool_specs(self, tool_specs: Sequence[ToolSpec]) -> Qwen3CoderFormat:
        """This format with parameter values typed by ``tool_specs``' JSON schemas.

        Args:
            tool_specs: The episode's OpenAI-style tool specs.

        Returns:
            A new format bound to them.
        """
        return Qwen3CoderFormat(tool_specs)

    def parse(self, text: str, *, call_id_prefix: str | None = None) -> ParsedAction:
        """:meth:`ActionFormat.parse` (its contract); the rules are in the module docstring."""
        require_text(text)
        if _CALL_OPEN not in text and _CALL_CLOSE not in text and _FUNCTION_OPEN not in text:
            return ParsedAction.final(text)
        outside: list[str] = []
        items: list[dict[str, Any]] = []
        pos = 0
        while True:
            call = text.find(_CALL_OPEN, pos)
            function = text.find(_FUNCTION_OPEN, pos)
            starts = [i for i in (call, function) if i != -1]
            start = min(starts) if starts else len(text)
            gap = text[pos:start]
            for stray in _STRAY:
                if stray in gap:
                    return ParsedAction.failure(text, f"stray {stray} outside a tool call")
            outside.append(gap)
            if not starts:
                break
            number = len(items) + 1
            if number > MAX_TOOL_CALLS:
                return ParsedAction.failure(
                    text, f"too many tool calls (more than {MAX_TOOL_CALLS})"
                )
            wrapped = start == call
            pos = start + len(_CALL_OPEN) if wrapped else start
            if wrapped:
                pos = _skip_whitespace(text, pos)
                if not text.startswith(_FUNCTION_OPEN, pos):
                    return ParsedAction.failure(
                        text, f"expected <function=NAME> after <tool_call> (tool call {number})"
                    )
            result = self._function(text, pos, number)
            if isinstance(result, str):
                return ParsedAction.failure(text, result)
            item, pos = result
            items.append(item)
            if wrapped:
                pos = _skip_whitespace(text, pos)
                if not text.startswith(_CALL_CLOSE, pos):
                    return ParsedAction.failure(
                        text, f"unclosed <tool_call> tag (tool call {number})"
                    )
                pos += len(_CALL_CLOSE)

        calls = decode_tool_calls(items, call_id_prefix)
        if isinstance(calls, str):
            return ParsedAction.failure(text, calls)
        return ParsedAction.calls(calls, "".join(outside).strip())

    def _function(self, text: str, pos: int, number: int) -> tuple[dict[str, Any], int] | str:
        """The call object of the ``<function=...>`` block at ``pos`` and where it ends."""
        name_end = _tag_end(text, pos + len(_FUNCTION_OPEN))
        if name_end == -1:
            return f"unclosed <function= tag (tool call {number})"
        name = text[pos + len(_FUNCTION_OPEN) : name_end]
        schemas = self._schemas.get(name, {})
        arguments: dict[str, Any] = {}
        pos = name_end + 1
        while True:
            pos = _skip_whitespace(text, pos)
            if text.startswith(_FUNCTION_CLOSE, pos):
                return {"name": name, "arguments": arguments}, pos + len(_FUNCTION_CLOSE)
            if not text.startswith(_PARAMETER_OPEN, pos):
                return f"expected <parameter=KEY> or </function> in tool call {number}"
            key_end = _tag_end(text, pos + len(_PARAMETER_OPEN))
            if key_end == -1:
                return f"unclosed <parameter= tag in tool call {number}"
            key = text[pos + len(_PARAMETER_OPEN) : key_end]
            value_end = text.find(_PARAMETER_CLOSE, key_end + 1)
            if value_end == -1:
                return f"unclosed <parameter={key:.100}> in tool call {number}"
            value = text[key_end + 1 : value_end]
            value = value.removeprefix("\n").removesuffix("\n")
            arguments[key] = parameter_value(value, schemas.get(key))
            pos = value_end + len(_PARAMETER_CLOSE)

    GUARDS_MARKUP = True
    TEXT_BEFORE_CALLS = True

    def call_grammar(
        self, name: str, schema: Mapping[str, Any], rule: str, lark: Lark
    ) -> list[str]:
        """``<tool_call>``, ``<function=NAME>``, the parameters
        (:func:`~llm_gym.actions.grammar.tagged_parameters`), ``</function>``,
        ``</tool_call>``, a newline after each tag, as :meth:`render_tool_calls` writes them."""
        head = f"{_CALL_OPEN}\n{_FUNCTION_OPEN}{_tag_name(name, 'function name')}>\n"
        tail = lark.text(f"{_FUNCTION_CLOSE}\n{_CALL_CLOSE}")
        args = tagged_parameters(f"{rule}_args", schema, lark)
        return [*args, f"{rule}: {lark.text(head)} {rule}_args {tail}"]

    def text_grammar(self) -> str:
        """Text holding neither ``<tool_call>``, ``</tool_call>`` nor ``<function=``."""
        return Lark.free_text(_CALL_OPEN, _CALL_CLOSE, _FUNCTION_OPEN)

    def render_tool_calls(self, tool_calls: Sequence[ToolCall], content: str = "") -> str:
        """Content (if non-empty) then one ``<tool_call>`` block per call, joined by newlines.

        Args:
            tool_calls: OpenAI-style tool calls.
            content: Text written before the calls, as it is (it must hold none of this
                format's tags to parse back as the content).

        Returns:
            The assistant text.

        Raises:
            InvalidArgumentError: A tool call is malformed, or holds a name, key or string
                value this format cannot write (see the module docstring).
        """
        parts = [content] if content else []
        for call in tool_calls:
            obj = tool_call_to_object(call)
            lines = [_CALL_OPEN, f"{_FUNCTION_OPEN}{_tag_name(obj['name'], 'function name')}>"]
            for key, value in obj["arguments"].items():
                lines.append(f"{_PARAMETER_OPEN}{_tag_name(key, 'parameter name')}>")
                lines.append(_value_text(value, key))
                lines.append(_PARAMETER_CLOSE)
            lines += [_FUNCTION_CLOSE, _CALL_CLOSE]
            parts.append("\n".join(lines))
        return "\n".join(parts)

    def render_tool_specs(self, tool_specs: Sequence[ToolSpec]) -> str:
        """Qwen3-Coder's tool instructions with one JSON spec per line; ``""`` without tools.

        Args:
            tool_specs: OpenAI-style tool specs.

        Returns:
            The system-prompt text.
        """
        return spec_block(tool_specs, _TOOLS_HEADER, _TOOLS_FOOTER)

    def render_tool_result(self, message: Message) -> str:
        """``"<tool_response>\\n{content}\\n</tool_response>"``, as Qwen3-Coder's template writes.

        Args:
            message: A ``role="tool"`` message.

        Returns:
            The rendered result.

        Raises:
            InvalidArgumentError: The message is not a tool message.
        """
        content = super().render_tool_result(message)
        return f"<tool_response>\n{content}\n</tool_response>"

    def __repr__(self) -> str:
        bound = f"tools={sorted(self._schemas)!r}" if self._schemas else ""
        return f"{type(self).__name__}({bound})"


def _skip_whitespace(text: str, pos: int) -> int:
    end = len(text)
    while pos < end and text[pos] in _WHITESPACE:
        pos += 1
    return pos


def _tag_end(text: str, pos: int) -> int:
    """The index of the ``>`` closing a name that starts at ``pos``; -1 when the name is not
    closed before a ``<`` or a newline (or is blank)."""
    end = text.find(">", pos)
    if end == -1:
        return -1
    name = text[pos:end]
    if not name.strip() or "<" in name or "\n" in name:
        return -1
    return end
