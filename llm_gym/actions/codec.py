"""The JSON codec shared by the action formats: decode, validate and encode tool calls.

Rules shared by every built-in format (see :func:`decode_tool_call`):

* A tool call is a JSON object ``{"name": <non-empty string>, "arguments": <object>}``. Names that
  are empty or whitespace-only are rejected. ``arguments`` may be missing (meaning ``{}``) or a JSON
  string that itself decodes to an object. Other keys are ignored.
* At most :data:`~llm_gym.actions.base.MAX_TOOL_CALLS` calls per message.
* Decoded names and argument values are valid text: a surrogate the JSON spelled as an escape
  becomes U+FFFD (:mod:`llm_gym.core.text`), so neither a tool nor a policy gets one.
* Every parsed call gets an id ``f"{prefix}_{i}"`` (``i`` from 0). ``prefix`` is the
  ``call_id_prefix`` argument when given (deterministic ids), else ``"call_"`` plus 12 random hex
  digits, fresh per parse (globally unique ids).

The helpers never raise on model output: a decoding problem comes back as a short error string
that the format turns into a parse failure.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from llm_gym.actions.base import MAX_TOOL_CALLS
from llm_gym.core.text import clean_json, clean_text
from llm_gym.core.types import ToolCall
from llm_gym.errors import InvalidArgumentError

__all__ = [
    "spec_block",
    "count_json_values",
    "decode_tool_calls",
    "scan_json",
    "short_call_id",
    "json_type_name",
    "decode_tool_call",
    "dumps_for_model",
    "json_error_reason",
    "loads_lenient",
    "make_tool_calls",
    "new_call_id_prefix",
    "require_text",
    "tool_call_to_object",
]

_JSON_TYPE_NAMES: dict[type, str] = {
    dict: "object",
    list: "array",
    str: "string",
    int: "number",
    float: "number",
    bool: "boolean",
    type(None): "null",
}


def json_type_name(value: Any, *, article: bool = False) -> str:
    """JSON's name for a decoded value's type, for error messages (``"an array"`` with
    ``article``); a value JSON has no name for gives its Python type's name.

    Example:
        >>> json_type_name([1]), json_type_name(True, article=True), json_type_name(None)
        ('array', 'a boolean', 'null')
    """
    name = _JSON_TYPE_NAMES.get(type(value), type(value).__name__)
    if not article or name == "null":
        return name
    return ("an " if name[0] in "aeiou" else "a ") + name


def count_json_values(text: str, limit: int) -> int:
    """An upper bound of the values in the JSON ``text`` (exact enough up to ``limit``), from its
    commas and brackets outside strings: str methods only (linear, in C), so a document can be
    refused for its count before ``json.loads`` builds millions of objects from it (an empty
    list is 2 bytes of text and 56 of memory).

    Example:
        >>> count_json_values('{"a": [1, 2], "b": "x, y"}', 100)
        7
        >>> count_json_values('{"a": "x, y, z"}', 0)
        2
    """
    rough = text.count(",") + 2 * (text.count("[") + text.count("{"))
    if rough <= limit:  # the common case: a few long strings
        return rough
    bare = text.replace("\\\\", "").replace('\\"', "")  # escapes: every '"' left delimits
    quotes = bare.count('"')
    if quotes > 2 * limit:
        return quotes // 2
    outside = "".join(bare.split('"')[0::2])
    return quotes // 2 + outside.count(",") + 2 * (outside.count("[") + outside.count("{"))


_LENIENT_DECODER = json.JSONDecoder(strict=False)


def loads_lenient(text: str) -> Any:
    """``json.loads`` that tolerates raw control characters (e.g. newlines) inside strings."""
    return _LENIENT_DECODER.decode(text)


def scan_json(text: str, pos: int) -> tuple[Any, int] | str:
    """Decode the JSON value that starts exactly at ``text[pos]`` (leniently, as
    :func:`loads_lenient`) and say where it ends; text after it is left to the caller.

    Returns:
        ``(value, end)``, or a short error string when no valid value starts there.

    Example:
        >>> scan_json('x {"a": 1}; rest', 2)
        ({'a': 1}, 10)
    """
    try:
        return _LENIENT_DECODER.raw_decode(text, pos)
    except (ValueError, RecursionError) as exc:
        if isinstance(exc, json.JSONDecodeError):  # positions from the value's first char
            return f"{exc.msg} at char {exc.pos - pos}"
        return json_error_reason(exc)


def json_error_reason(exc: BaseException) -> str:
    """A short reason for an exception raised by ``json.loads``."""
    if isinstance(exc, json.JSONDecodeError):
        return f"{exc.msg} at char {exc.pos}"
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    return str(exc)  # e.g. an integer literal with too many digits


def decode_tool_call(obj: Any, number: int) -> tuple[str, dict[str, Any]] | str:
    """Validate one decoded tool-call object.

    Args:
        obj: The value ``json.loads`` gave for the call.
        number: The call's 1-based position, used in error messages.

    Returns:
        ``(name, arguments)`` for a valid call, else a short error string.
    """
    if not isinstance(obj, dict):
        return f"tool call {number} must be a JSON object, got {json_type_name(obj)}"
    name = obj.get("name")
    if not isinstance(name, str):
        return f"tool call {number} has no string 'name'"
    if not name.strip():
        return f"'name' of tool call {number} is empty"
    arguments = obj.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = loads_lenient(arguments)
        except (ValueError, RecursionError) as exc:
            return (
                f"'arguments' of tool call {number} is a string that is not valid JSON: "
                f"{json_error_reason(exc)}"
            )
        if not isinstance(arguments, dict):
            return (
                f"'arguments' of tool call {number} must be a JSON object, "
                f"got a string holding {json_type_name(arguments)}"
            )
    elif not isinstance(arguments, dict):
        return (
            f"'arguments' of tool call {number} must be a JSON object, "
            f"got {json_type_name(arguments)}"
        )
    return clean_text(name), clean_json(arguments)


def decode_tool_calls(items: Sequence[Any], call_id_prefix: str | None) -> list[ToolCall] | str:
    """Validate decoded call objects (:func:`decode_tool_call`) and build the tool calls.

    Args:
        items: The decoded call objects, in order.
        call_id_prefix: Id prefix; ``None`` for a fresh random one.

    Returns:
        The tool calls, or the first error string (none, or more than
        :data:`~llm_gym.actions.base.MAX_TOOL_CALLS`, are errors too).
    """
    if not items:
        return "no tool call in the list"
    if len(items) > MAX_TOOL_CALLS:
        return f"too many tool calls (more than {MAX_TOOL_CALLS})"
    decoded: list[tuple[str, dict[str, Any]]] = []
    for number, item in enumerate(items, start=1):
        result = decode_tool_call(item, number)
        if isinstance(result, str):
            return result
        decoded.append(result)
    return make_tool_calls(decoded, call_id_prefix)


_SHORT_ID = re.compile(r"[A-Za-z0-9]{9}")


def short_call_id(call_id: str) -> str:
    """A tool-call id as Mistral's templates require it, 9 alphanumerics: ``call_id`` itself
    when it is one, else the first 9 hex digits of its SHA-256 (one id always maps to one short
    id, so calls and their results still pair).

    Example:
        >>> short_call_id("call_0"), short_call_id("abcDEF123")
        ('c557a85a0', 'abcDEF123')
    """
    if _SHORT_ID.fullmatch(call_id):
        return call_id
    return hashlib.sha256(call_id.encode("utf-8", "surrogatepass")).hexdigest()[:9]


def new_call_id_prefix() -> str:
    """A fresh random tool-call id prefix: ``"call_"`` plus 12 hex digits."""
    return "call_" + uuid.uuid4().hex[:12]


def make_tool_calls(
    decoded: Sequence[tuple[str, dict[str, Any]]], call_id_prefix: str | None
) -> list[ToolCall] | str:
    """Build OpenAI-style tool calls with ids from validated ``(name, arguments)`` pairs.

    Args:
        decoded: The validated calls, in order.
        call_id_prefix: Id prefix; ``None`` for a fresh random one.

    Returns:
        The tool calls, or an error string when some arguments cannot be re-encoded as JSON.
    """
    prefix = new_call_id_prefix() if call_id_prefix is None else call_id_prefix
    calls: list[ToolCall] = []
    for i, (name, arguments) in enumerate(decoded):
        try:
            encoded = json.dumps(arguments)
        except (ValueError, RecursionError) as exc:
            return f"'arguments' of tool call {i + 1} cannot be re-encoded as JSON: {exc}"
        calls.append(
            {
                "id": f"{prefix}_{i}",
                "type": "function",
                "function": {"name": name, "arguments": encoded},
            }
        )
    return calls


_SURROGATES = re.compile("[\ud800-\udfff]")
_SURROGATES_AND_MARKUP = re.compile("[<>&\ud800-\udfff]")


def _escape_char(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def dumps_for_model(value: Any, *, escape_markup: bool = False) -> str:
    """JSON-encode ``value`` as a model should see it.

    Non-ASCII text stays readable (like ``tojson`` in Hugging Face chat templates), but lone
    surrogates are written as ``\\uXXXX`` escapes so the result always encodes to UTF-8. (As in
    any JSON, a high surrogate directly followed by a low one decodes back as the single astral
    character they pair into.)

    Args:
        value: A JSON-compatible value.
        escape_markup: Also write ``<``, ``>`` and ``&`` as ``\\u003c``, ``\\u003e``, ``\\u0026``,
            so a string value can never close or open an XML-like tag around the JSON.

    Returns:
        The JSON text.
    """
    text = json.dumps(value, ensure_ascii=False)
    # Outside string literals JSON text holds only ASCII syntax, so every match is inside a string.
    pattern = _SURROGATES_AND_MARKUP if escape_markup else _SURROGATES
    return pattern.sub(_escape_char, text)


def spec_block(tool_specs: Sequence[Any], header: str, footer: str) -> str:
    """``header``, one JSON spec per line (:func:`dumps_for_model`), ``footer``; ``""`` without
    tools: the text layout's tool instructions of every format that lists its specs as JSON.

    Example:
        >>> spec_block([{"name": "f"}], "<tools>\\n", "\\n</tools>")
        '<tools>\\n{"name": "f"}\\n</tools>'
        >>> spec_block([], "<tools>", "</tools>")
        ''
    """
    if not tool_specs:
        return ""
    return header + "\n".join(dumps_for_model(spec) for spec in tool_specs) + footer


def tool_call_to_object(tool_call: ToolCall) -> dict[str, Any]:
    """``{"name": ..., "arguments": {...}}`` for an OpenAI-style tool call.

    Args:
        tool_call: A tool call whose ``function.arguments`` is a JSON-encoded object (a mapping
            or an empty string are accepted too).

    Returns:
        The call as a plain object with decoded arguments.

    Raises:
        InvalidArgumentError: The tool call is malformed.
    """
    function = tool_call.get("function") if isinstance(tool_call, Mapping) else None
    if not isinstance(function, Mapping):
        raise InvalidArgumentError(
            "a tool call must be {'type': 'function', 'function': {...}}, "
            f"got {tool_call!r:.200}"
        )
    name = function.get("name")
    if not isinstance(name, str) or not name.strip():
        raise InvalidArgumentError(f"a tool call needs a non-empty string name, got {name!r:.200}")
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        if not arguments.strip():
            arguments = {}
        else:
            try:
                arguments = loads_lenient(arguments)
            except (ValueError, RecursionError) as exc:
                raise InvalidArgumentError(
                    f"arguments of tool call {name!r} are not valid JSON: {json_error_reason(exc)}"
                ) from exc
    if not isinstance(arguments, Mapping):
        raise InvalidArgumentError(
            f"arguments of tool call {name!r} must be a JSON object, "
            f"got {json_type_name(arguments)}"
        )
    return {"name": name, "arguments": dict(arguments)}


def require_text(text: Any) -> str:
    """``text`` itself when it is a ``str``; model output to parse must be text.

    Raises:
        InvalidArgumentError: ``text`` is not a ``str``.
    """
    if not isinstance(text, str):
        raise InvalidArgumentError(f"text to parse must be a str, got {type(text).__name__}")
    return text
