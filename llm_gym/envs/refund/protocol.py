"""The text protocol of Refund-v0 (document 002's): tool calls in, tool results out.

The model acts in plain text: one or more
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks run tools; a message without a
block is the final reply to the customer. The environment answers a tool turn with one
``<tool_result>[...]</tool_result>`` message. Parsing never raises
on model output: an unreadable block comes back as a :class:`ParsedCall` with an ``error``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from llm_gym.actions.codec import dumps_for_model

__all__ = [
    "MAX_ACTION_CHARS",
    "MAX_BLOCK_CHARS",
    "MAX_CALLS_PER_ACTION",
    "MAX_TEXT_ARGUMENT_CHARS",
    "ParsedCall",
    "parse_action",
    "read_tool_results",
    "render_tool_call",
    "render_tool_results",
]

# --- constants ---------------------------------------------------------------------------------

TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
RESULT_OPEN, RESULT_CLOSE = "<tool_result>", "</tool_result>"
MAX_CALLS_PER_ACTION = 5
"""Tool calls run per assistant message; further blocks are answered with an error."""
MAX_BLOCK_CHARS = 4_000
"""The longest ``<tool_call>`` block parsed."""
MAX_ACTION_CHARS = 20_000
"""A tool-calling message longer than this runs no call."""
MAX_TEXT_ARGUMENT_CHARS = 300
"""The longest string argument (an ID, a reason)."""
PRIVILEGED_TOOLS = frozenset({"list_orders", "get_order", "refund_order"})
"""Tools that need an authenticated customer."""

_RESULTS = re.compile(re.escape(RESULT_OPEN) + r"(.*)" + re.escape(RESULT_CLOSE), re.DOTALL)


@dataclass(frozen=True)
class ParsedCall:
    """One ``<tool_call>`` block: a name and arguments, or why it could not be read."""

    name: str
    """The tool name (``""`` when unreadable)."""
    arguments: Mapping[str, Any]
    """The decoded arguments."""
    error: str | None = None
    """Why the block is not a usable call (``None``: it is)."""


# --- parsing and rendering ---------------------------------------------------------------------


def render_tool_call(name: str, arguments: Mapping[str, Any] | None = None) -> str:
    """One call in the action protocol.

    Example:
        >>> render_tool_call("get_order", {"order_id": "W123456"})
        '<tool_call>{"name": "get_order", "arguments": {"order_id": "W123456"}}</tool_call>'
    """
    body = dumps_for_model({"name": name, "arguments": dict(arguments or {})}, escape_markup=True)
    return f"{TOOL_CALL_OPEN}{body}{TOOL_CALL_CLOSE}"


def _parse_block(block: str) -> ParsedCall:
    block = block.strip()
    if len(block) > MAX_BLOCK_CHARS:
        return ParsedCall(
            "", {}, f"tool call too long ({len(block)} chars; at most {MAX_BLOCK_CHARS})"
        )
    try:
        obj = json.loads(block)
    except (ValueError, RecursionError) as exc:
        return ParsedCall(
            "",
            {},
            f"the tool call is not valid JSON ({str(exc)[:80]}); expected "
            '{"name": ..., "arguments": {...}}',
        )
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return ParsedCall("", {}, 'expected a JSON object {"name": ..., "arguments": {...}}')
    name = obj["name"].strip()[:MAX_TEXT_ARGUMENT_CHARS]
    arguments = obj.get("arguments", obj.get("args", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except (ValueError, RecursionError):
            arguments = None
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return ParsedCall(name, {}, f"the arguments of {name!r} must be a JSON object")
    return ParsedCall(name, arguments)


def _spans(text: str, open_tag: str, close_tag: str) -> tuple[list[tuple[int, int]], bool]:
    """The ``(start, end)`` of each ``open_tag ... close_tag`` span (the first close after each
    open), and whether an open tag is left unclosed. Linear time, whatever the text (a regex
    with ``.*?`` rescans the rest of the text from every unclosed tag)."""
    spans: list[tuple[int, int]] = []
    pos = 0
    while (start := text.find(open_tag, pos)) >= 0:
        end = text.find(close_tag, start + len(open_tag))
        if end < 0:
            return spans, True
        pos = end + len(close_tag)
        spans.append((start, pos))
    return spans, False


def _strip_think(text: str) -> str:
    spans, _ = _spans(text, "<think>", "</think>")
    if not spans:
        return text
    kept, pos = [], 0
    for start, end in spans:
        kept.append(text[pos:start])
        pos = end
    kept.append(text[pos:])
    return "".join(kept)


def parse_action(text: str) -> list[ParsedCall] | None:
    """The tool calls of an assistant message, or ``None`` when it is a plain reply.

    ``<think>...</think>`` blocks are ignored. A message with a ``<tool_call>`` tag is a tool
    turn even when no block can be read: each unreadable block, an unclosed block, blocks
    beyond :data:`MAX_CALLS_PER_ACTION` and a message over :data:`MAX_ACTION_CHARS` come back
    as :class:`ParsedCall` s with an ``error``.

    Example:
        >>> parse_action("Your refund is on its way.") is None
        True
        >>> parse_action('<tool_call>{"name": "list_orders"}</tool_call>')[0].name
        'list_orders'
    """
    visible = _strip_think(text)
    if TOOL_CALL_OPEN not in visible:
        return None
    if len(visible) > MAX_ACTION_CHARS:
        return [
            ParsedCall(
                "",
                {},
                f"message too long ({len(visible)} chars; at most "
                f"{MAX_ACTION_CHARS}); no tool call was run",
            )
        ]
    spans, unclosed = _spans(visible, TOOL_CALL_OPEN, TOOL_CALL_CLOSE)
    blocks = [
        visible[start + len(TOOL_CALL_OPEN) : end - len(TOOL_CALL_CLOSE)] for start, end in spans
    ]
    calls = [_parse_block(b) for b in blocks[:MAX_CALLS_PER_ACTION]]
    if len(blocks) > MAX_CALLS_PER_ACTION:
        extra = len(blocks) - MAX_CALLS_PER_ACTION
        calls.append(
            ParsedCall(
                "",
                {},
                f"at most {MAX_CALLS_PER_ACTION} tool calls per message; {extra} more were not run",
            )
        )
    if unclosed:
        calls.append(
            ParsedCall(
                "", {}, f"an unclosed {TOOL_CALL_OPEN} block: end each call with {TOOL_CALL_CLOSE}"
            )
        )
    return calls


def render_tool_results(results: Iterable[Mapping[str, Any]]) -> str:
    """The environment's reply to a tool turn: ``<tool_result>[...]</tool_result>``, one entry
    per call (``{"name", "result"}`` or ``{"name", "error"}``)."""
    body = dumps_for_model(list(results), escape_markup=True)
    return f"{RESULT_OPEN}{body}{RESULT_CLOSE}"


def read_tool_results(content: str) -> list[dict[str, Any]] | None:
    """The entries of a ``<tool_result>`` message (``None`` for any other text)."""
    match = _RESULTS.fullmatch(content.strip()) if isinstance(content, str) else None
    if match is None:
        return None
    try:
        entries = json.loads(match.group(1))
    except (ValueError, RecursionError):
        return None
    return [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else None
