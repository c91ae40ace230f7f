"""Request bodies of :mod:`llm_gym.serving`: bytes in, one checked JSON object out.

:func:`decode_json_body` is the one door every request body comes through. It refuses, with a
400 that says what was wrong and where:

* bytes that are not UTF-8, and text that is not JSON (``NaN``, ``Infinity`` and numbers of more
  than Python's 4,300 digits included: they are not JSON numbers a client can mean);
* JSON of more than about :data:`MAX_JSON_VALUES` values, counted in the text before it is
  decoded (``[],`` is 3 bytes of text and 56 of memory, so memory and decoding time follow the
  count of values, not the body's bytes);
* JSON nested deeper than :data:`MAX_JSON_DEPTH` (a chat template or a tokenizer would recurse
  into it);
* strings, keys included, that hold a lone UTF-16 surrogate (``"\\ud800"``): JSON allows the
  escape, but the text is not Unicode, and a tokenizer, a chat template or the answer's encoding
  would fail on it later. The message names the field (``messages[0].content``);
* a top-level value that is not an object.

The walk is iterative and linear in the size of the body. :func:`decode_json_text` applies the
same rules to JSON text found inside a body (a tool call's ``arguments`` string).
"""

from __future__ import annotations

import json
import re
from typing import Any

from llm_gym.actions.codec import count_json_values, json_type_name
from llm_gym.serving.protocol import bad_request

__all__ = [
    "MAX_JSON_DEPTH",
    "MAX_JSON_VALUES",
    "decode_json_body",
    "decode_json_text",
    "field_path",
]

MAX_JSON_DEPTH = 64
"""The deepest nesting of arrays and objects a body may have (OpenAI requests need about 10)."""
MAX_JSON_VALUES = 1_000_000
"""The most JSON values a body may hold (a prompt of token ids is one value per token)."""

_SURROGATE = re.compile("[\ud800-\udfff]")
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


_DECODER = json.JSONDecoder(parse_constant=_refuse_constant)
"""One decoder for every body (``json.loads`` with options builds a new one per call)."""


def field_path(parent: str, key: str | int) -> str:
    """``messages[0].content``-style paths, as error messages and ``param`` name fields.

    Example:
        >>> field_path(field_path(field_path("", "messages"), 0), "content")
        'messages[0].content'
        >>> field_path("tools", "odd key")
        "tools['odd key']"
    """
    if isinstance(key, int):
        return f"{parent}[{key}]"
    if not _KEY.match(key):
        return f"{parent}[{key!r}]"
    return f"{parent}.{key}" if parent else key


def _surrogate_error(text: str, where: str) -> Exception:
    match = _SURROGATE.search(text)
    assert match is not None
    return bad_request(
        f"{where or 'the body'} holds a lone UTF-16 surrogate (U+{ord(match.group()):04X} at "
        f"character {match.start()}); text must be valid Unicode: send the character itself or "
        "a surrogate pair",
        where or None,
    )


def _path(where: tuple[Any, ...] | None, prefix: str) -> str:
    """The field path of a ``(parent, key)`` chain under ``prefix`` (built only for an error)."""
    keys: list[str | int] = []
    while where is not None:
        where, key = where
        keys.append(key)
    path = prefix
    for key in reversed(keys):
        path = field_path(path, key)
    return path


def _check_tree(value: Any, what: str = "") -> None:
    """Depth and lone surrogates, iteratively (no recursion on client data). ``what`` is the
    field path of ``value`` (``messages[0].tool_calls[0].function.arguments``; ``""``: the body)."""
    # Each entry: a value, where it is as a (parent, key) chain, its depth.
    stack: list[tuple[Any, tuple[Any, ...] | None, int]] = [(value, None, 0)]
    while stack:
        node, where, depth = stack.pop()
        if isinstance(node, str):
            if _SURROGATE.search(node):
                raise _surrogate_error(node, _path(where, what))
            continue
        if not isinstance(node, dict | list):
            continue
        if depth >= MAX_JSON_DEPTH:
            at = _path(where, what)
            raise bad_request(
                f"{what or 'the body'} nests arrays and objects deeper than {MAX_JSON_DEPTH} "
                f"levels (at {at or 'the top'}); OpenAI requests need about 10",
                at or None,
            )
        if isinstance(node, dict):
            for key, item in node.items():
                if _SURROGATE.search(key):
                    raise _surrogate_error(key, f"the key of {_path((where, key), what)}")
                stack.append((item, (where, key), depth + 1))
        else:
            stack.extend((item, (where, i), depth + 1) for i, item in enumerate(node))


def _decode(text: str, what: str) -> Any:
    where = what or "the body"
    if (count := count_json_values(text, MAX_JSON_VALUES)) > MAX_JSON_VALUES:
        raise bad_request(
            f"{where} holds too many JSON values (about {count:,}; at most {MAX_JSON_VALUES:,})",
            what or None,
        )
    try:
        return _DECODER.decode(text)
    except RecursionError:
        raise bad_request(
            f"{where} nests arrays and objects deeper than {MAX_JSON_DEPTH} levels", what or None
        ) from None
    except ValueError as exc:  # JSONDecodeError, NaN/Infinity, an integer of too many digits
        raise bad_request(f"{where} is not valid JSON: {exc}", what or None) from None


def decode_json_text(text: str, what: str) -> Any:
    """The JSON value of ``text`` (any value, not only an object), checked as the module
    docstring says; ``what`` is the field that holds the text, for error messages.

    Raises:
        APIError: 400 naming what is wrong and the field.

    Example:
        >>> decode_json_text('{"x": [1]}', "arguments")
        {'x': [1]}
    """
    value = _decode(text, what)
    _check_tree(value, what)
    return value


def decode_json_body(raw: bytes) -> dict[str, Any]:
    """The request's JSON object, checked as the module docstring says.

    Raises:
        APIError: 400 naming what is wrong (and the field, when one is at fault).

    Example:
        >>> decode_json_body(b'{"model": "m", "n": 1}')
        {'model': 'm', 'n': 1}
        >>> decode_json_body(b'{"n": NaN}')
        Traceback (most recent call last):
        ...
        llm_gym.serving.protocol.APIError: the body is not valid JSON: NaN is not a JSON number
    """
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise bad_request(
            f"the body is not valid UTF-8 (byte {exc.start}: {raw[exc.start : exc.start + 1]!r})"
        ) from None
    value = _decode(text, "")
    if not isinstance(value, dict):
        raise bad_request(
            f"the request body must be a JSON object, got a JSON {json_type_name(value)}"
        )
    _check_tree(value)
    return value
