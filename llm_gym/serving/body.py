"""Request bodies of :mod:`llm_gym.serving`: bytes in, one checked JSON object out.

:func:`decode_json_body` is the one door every request body comes through. It refuses, with a
400 that says what was wrong and where:

* bytes that are not UTF-8, and text that is not JSON (``NaN``, ``Infinity`` and numbers of more
  than Python's 4,300 digits included: they are not JSON numbers a client can mean);
* JSON nested deeper than :data:`MAX_JSON_DEPTH` (a chat template or a tokenizer would recurse
  into it);
* strings, keys included, that hold a lone UTF-16 surrogate (``"\\ud800"``): JSON allows the
  escape, but the text is not Unicode, and a tokenizer, a chat template or the answer's encoding
  would fail on it later. The message names the field (``messages[0].content``);
* a top-level value that is not an object.

The walk is iterative and linear in the size of the body.
"""

from __future__ import annotations

import json
import re
from typing import Any

from llm_gym.actions.codec import json_type_name
from llm_gym.serving.protocol import bad_request

__all__ = ["MAX_JSON_DEPTH", "decode_json_body", "field_path"]

MAX_JSON_DEPTH = 64
"""The deepest nesting of arrays and objects a body may have (OpenAI requests need about 10)."""

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


def _check_tree(value: Any) -> None:
    """Depth and lone surrogates, iteratively (no recursion on client data)."""
    stack: list[tuple[Any, str, int]] = [(value, "", 0)]
    while stack:
        node, where, depth = stack.pop()
        if isinstance(node, str):
            if _SURROGATE.search(node):
                raise _surrogate_error(node, where)
            continue
        if not isinstance(node, dict | list):
            continue
        if depth >= MAX_JSON_DEPTH:
            raise bad_request(
                f"the body nests arrays and objects deeper than {MAX_JSON_DEPTH} levels (at "
                f"{where or 'the top'}); OpenAI requests need about 10",
                where or None,
            )
        if isinstance(node, dict):
            for key, item in node.items():
                path = field_path(where, key)
                if _SURROGATE.search(key):
                    raise _surrogate_error(key, f"the key of {path}")
                stack.append((item, path, depth + 1))
        else:
            stack.extend((item, field_path(where, i), depth + 1) for i, item in enumerate(node))


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
    try:
        value = _DECODER.decode(text)
    except RecursionError:
        raise bad_request(
            f"the body nests arrays and objects deeper than {MAX_JSON_DEPTH} levels"
        ) from None
    except ValueError as exc:  # JSONDecodeError, NaN/Infinity, an integer of too many digits
        raise bad_request(f"the body is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise bad_request(
            f"the request body must be a JSON object, got a JSON {json_type_name(value)}"
        )
    _check_tree(value)
    return value
