"""The Mistral tool-call format: a JSON list of calls after the ``[TOOL_CALLS]`` token.

A reply calls tools with::

    Let me look that up.[TOOL_CALLS] [{"name": "search", "arguments": {"query": "Paris"}}]

Parsing rules (on top of the shared ones in :mod:`llm_gym.actions.codec`), as vLLM's
``mistral`` parser reads Mistral's models (v0.3 and the later ``[TOOL_CALLS]name{...}`` shape):

* No ``[TOOL_CALLS]`` anywhere: a final answer, content = the text unchanged.
* Otherwise the text before the first ``[TOOL_CALLS]`` is the message content (stripped), and
  everything after it must be tool calls, each segment one of: a non-empty JSON list of call
  objects ``{"name": ..., "arguments": {...}}`` (Mistral 7B v0.3; other keys such as ``"id"`` are
  ignored), one call object, or ``NAME{...}`` / ``NAME[ARGS]{...}`` /
  ``NAME[CALL_ID]ID[ARGS]{...}`` (the v11+ tokenizers' shape, the object being the arguments).
  Segments are separated by whitespace or further ``[TOOL_CALLS]`` tokens; any other text after
  the calls is a parse failure.
* Parsing is linear in the length of the text.

Mistral's templates require tool-call ids of 9 alphanumerics. Parsed calls keep the shared ids
(``f"{prefix}_{i}"``); rendering writes each id as :func:`~llm_gym.actions.codec.short_call_id`
maps it, in calls (``"id"``) and in tool results (``"call_id"``), so they pair as in Mistral's
own history.
"""

from __future__ import annotations

import re
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
    require_text,
    scan_json,
    short_call_id,
    tool_call_to_object,
)
from llm_gym.actions.grammar import Lark
from llm_gym.core.types import Message, ToolCall, ToolSpec

__all__ = ["TOOL_CALLS", "MistralFormat"]

TOOL_CALLS = "[TOOL_CALLS]"
"""The token that opens a Mistral model's tool calls."""

# NAME, then an optional [CALL_ID]ID, then an optional [ARGS], then the arguments object.
_NAMED_CALL = re.compile(r"([^\s\[\]{}]+)(?:\[CALL_ID\][A-Za-z0-9]*)?(?:\[ARGS\])?(?=\{)")
_WHITESPACE = " \t\r\n"

_INSTRUCTIONS_FOOTER = (
    "\n\nTo call functions, reply with [TOOL_CALLS] followed by a JSON list of calls:\n"
    '[TOOL_CALLS] [{"name": <function-name>, "arguments": <args-json-object>}]\n'
    "A reply without [TOOL_CALLS] is taken as your final answer."
)


@register_action_format
class MistralFormat(ActionFormat):
    """Tool calls as a JSON list after ``[TOOL_CALLS]`` (Mistral, Mixtral, Ministral)."""

    name: ClassVar[str] = "mistral"
    MARKERS: ClassVar[tuple[str, ...]] = (TOOL_CALLS, "[AVAILABLE_TOOLS]")

    def parse(self, text: str, *, call_id_prefix: str | None = None) -> ParsedAction:
        """:meth:`ActionFormat.parse` (its contract); the rules are in the module docstring."""
        require_text(text)
        start = text.find(TOOL_CALLS)
        if start == -1:
            return ParsedAction.final(text)
        items: list[Any] = []
        pos, end = start + len(TOOL_CALLS), len(text)
        while True:
            while pos < end and text[pos] in _WHITESPACE:
                pos += 1
            if pos == end:
                break
            if text.startswith(TOOL_CALLS, pos):
                pos += len(TOOL_CALLS)
                continue
            if len(items) >= MAX_TOOL_CALLS:
                return ParsedAction.failure(
                    text, f"too many tool calls (more than {MAX_TOOL_CALLS})"
                )
            number = len(items) + 1
            named = None if text[pos] in "[{" else _NAMED_CALL.match(text, pos)
            if named is not None:
                pos = named.end()
            elif text[pos] not in "[{":
                reason = "expected a JSON list of tool calls after [TOOL_CALLS]"
                if items:
                    reason = f"unexpected text after tool call {number - 1}"
                return ParsedAction.failure(text, reason)
            scanned = scan_json(text, pos)
            if isinstance(scanned, str):
                return ParsedAction.failure(text, f"invalid JSON in tool call {number}: {scanned}")
            value, pos = scanned
            if named is not None:
                items.append({"name": named.group(1), "arguments": value})
            elif isinstance(value, list):
                if not value:
                    return ParsedAction.failure(text, "empty list of tool calls")
                items.extend(value)
            else:
                items.append(value)
        if not items:
            return ParsedAction.failure(text, "no tool call after [TOOL_CALLS]")
        calls = decode_tool_calls(items, call_id_prefix)
        if isinstance(calls, str):
            return ParsedAction.failure(text, calls)
        return ParsedAction.calls(calls, text[:start].strip())

    TEXT_BEFORE_CALLS = True

    def call_grammar(
        self, name: str, schema: Mapping[str, Any], rule: str, lark: Lark
    ) -> list[str]:
        """``{"name": NAME, "arguments": ARGS}`` (one item of the list of calls)."""
        head = f'{{"name": {dumps_for_model(name, escape_markup=True)}, "arguments": '
        return lark.json_call(rule, head, schema, "}")

    def calls_grammar(self, call: str, parallel: bool, lark: Lark) -> str:
        """``[TOOL_CALLS]``, a space and a JSON list of the calls."""
        more = f' (", " {call})*' if parallel else ""
        return f'{lark.text(TOOL_CALLS + " [")} {call}{more} "]"'

    def text_grammar(self) -> str:
        """Text without ``[TOOL_CALLS]``."""
        return Lark.free_text(TOOL_CALLS)

    def render_tool_calls(self, tool_calls: Sequence[ToolCall], content: str = "") -> str:
        """Content (as it is) then ``[TOOL_CALLS]`` and one JSON list of the calls, each with
        its id as Mistral's templates write it when the call has one.

        Args:
            tool_calls: OpenAI-style tool calls.
            content: Text written before the calls, as it is (it must not itself hold
                ``[TOOL_CALLS]`` to parse back as the content).

        Returns:
            The assistant text.

        Raises:
            InvalidArgumentError: A tool call is malformed.
        """
        objects = []
        for call in tool_calls:
            obj: dict[str, Any] = tool_call_to_object(call)
            call_id = call.get("id")
            if isinstance(call_id, str):
                obj["id"] = short_call_id(call_id)
            objects.append(obj)
        return f"{content}{TOOL_CALLS} {dumps_for_model(objects, escape_markup=True)}"

    def render_tool_specs(self, tool_specs: Sequence[ToolSpec]) -> str:
        """The specs in an ``[AVAILABLE_TOOLS]`` block, as Mistral's templates write them, plus
        the calling convention; ``""`` without tools.

        Args:
            tool_specs: OpenAI-style tool specs.

        Returns:
            The system-prompt text.
        """
        if not tool_specs:
            return ""
        specs = dumps_for_model(list(tool_specs))
        return f"[AVAILABLE_TOOLS] {specs}[/AVAILABLE_TOOLS]{_INSTRUCTIONS_FOOTER}"

    def render_tool_result(self, message: Message) -> str:
        """``[TOOL_RESULTS] {"content": ..., "call_id": ...}[/TOOL_RESULTS]`` (the call id as
        the calls are rendered; left out when the message has none).

        Args:
            message: A ``role="tool"`` message.

        Returns:
            The rendered result.

        Raises:
            InvalidArgumentError: The message is not a tool message.
        """
        content = super().render_tool_result(message)
        result: dict[str, Any] = {"content": content}
        call_id = message.get("tool_call_id")
        if isinstance(call_id, str):
            result["call_id"] = short_call_id(call_id)
        return f"[TOOL_RESULTS] {dumps_for_model(result)}[/TOOL_RESULTS]"
