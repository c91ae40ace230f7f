"""The Hermes / Qwen2.5 / Qwen3 tool-call format: JSON inside ``<tool_call>`` tags.

A reply calls tools with one or more blocks::

    Let me look that up.
    <tool_call>
    {"name": "search", "arguments": {"query": "capital of France"}}
    </tool_call>

Parsing rules (on top of the shared ones in :mod:`llm_gym.actions.codec`):

* No ``<tool_call>`` and no ``</tool_call>`` anywhere: a final answer, content = the text unchanged.
* Otherwise every ``<tool_call>`` must be closed by ``</tool_call>`` before the next
  ``<tool_call>``, with no stray ``</tool_call>``, and each block must hold one JSON object
  (whitespace around it allowed; raw control characters such as newlines inside JSON strings are
  tolerated). The message content is then the text outside the blocks, stripped.
* Parsing is linear in the length of the text (``str.find`` scans, no regular expressions).

Rendering escapes ``<``, ``>`` and ``&`` inside the JSON (as ``\\u003c`` and so on), so no name or
argument value can break out of its block. The ``content`` passed to :meth:`render_tool_calls` is
written as it is: if it contains ``<tool_call>`` or ``</tool_call>`` itself, the rendered text will
not parse back to the same calls, and that is the caller's responsibility.
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
    decode_tool_call,
    dumps_for_model,
    json_error_reason,
    loads_lenient,
    make_tool_calls,
    require_text,
    spec_block,
    tool_call_to_object,
)
from llm_gym.actions.grammar import Lark
from llm_gym.core.types import Message, ToolCall, ToolSpec

__all__ = ["TOOL_CALL_CLOSE", "TOOL_CALL_OPEN", "HermesFormat"]

TOOL_CALL_OPEN = "<tool_call>"
"""The tag that opens a tool-call block."""
TOOL_CALL_CLOSE = "</tool_call>"
"""The tag that closes a tool-call block."""

# A JSON object after the tag: what Qwen2.5 and Hermes templates teach (Qwen3-Coder's templates
# also write <tool_call>, around XML).
_JSON_BLOCK = re.compile(r"<tool_call>\s*\{")

_TOOLS_HEADER = (
    "# Tools\n\n"
    "You may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n"
    "<tools>\n"
)
_TOOLS_FOOTER = (
    "\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n"
    "<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n'
    "</tool_call>\n\n"
    "A reply without a <tool_call> block is taken as your final answer."
)


@register_action_format
class HermesFormat(ActionFormat):
    """Tool calls as JSON objects inside ``<tool_call></tool_call>`` tags (Hermes, Qwen2.5/3)."""

    name: ClassVar[str] = "hermes"
    MARKERS: ClassVar[tuple[str, ...]] = (TOOL_CALL_OPEN,)

    @classmethod
    def signature(cls, rendered: str) -> bool:
        """Whether ``rendered`` holds a ``<tool_call>`` tag followed by a JSON object.

        Example:
            >>> HermesFormat.signature('<tool_call>\\n{"name": "f", "arguments": {}}')
            True
            >>> HermesFormat.signature("<tool_call>\\n<function=f>")
            False
        """
        return _JSON_BLOCK.search(rendered) is not None

    def parse(self, text: str, *, call_id_prefix: str | None = None) -> ParsedAction:
        """Parse the model's raw assistant text; see the module docstring for the rules.

        Args:
            text: The raw assistant text.
            call_id_prefix: Tool-call ids become ``f"{call_id_prefix}_{i}"``; ``None`` draws a
                fresh random prefix.

        Returns:
            The parsed action; never raises for a ``str``.

        Raises:
            InvalidArgumentError: ``text`` is not a ``str``.
        """
        require_text(text)
        if TOOL_CALL_OPEN not in text and TOOL_CALL_CLOSE not in text:
            return ParsedAction.final(text)

        outside: list[str] = []
        blocks: list[str] = []
        pos = 0
        while True:
            start = text.find(TOOL_CALL_OPEN, pos)
            end = text.find(TOOL_CALL_CLOSE, pos)
            if start == -1:
                if end != -1:
                    return ParsedAction.failure(text, "stray </tool_call> without <tool_call>")
                outside.append(text[pos:])
                break
            number = len(blocks) + 1
            if end == -1:
                return ParsedAction.failure(text, f"unclosed <tool_call> tag (tool call {number})")
            if end < start:
                return ParsedAction.failure(text, "stray </tool_call> without <tool_call>")
            if number > MAX_TOOL_CALLS:
                return ParsedAction.failure(
                    text, f"too many tool calls (more than {MAX_TOOL_CALLS})"
                )
            body_start = start + len(TOOL_CALL_OPEN)
            if text.find(TOOL_CALL_OPEN, body_start, end) != -1:
                return ParsedAction.failure(text, f"nested <tool_call> inside tool call {number}")
            outside.append(text[pos:start])
            blocks.append(text[body_start:end])
            pos = end + len(TOOL_CALL_CLOSE)

        decoded: list[tuple[str, dict[str, Any]]] = []
        for number, block in enumerate(blocks, start=1):
            body = block.strip()
            if not body:
                return ParsedAction.failure(text, f"tool call {number} is empty")
            try:
                obj = loads_lenient(body)  # error positions count from the JSON's first char
            except (ValueError, RecursionError) as exc:
                return ParsedAction.failure(
                    text, f"invalid JSON in tool call {number}: {json_error_reason(exc)}"
                )
            result = decode_tool_call(obj, number)
            if isinstance(result, str):
                return ParsedAction.failure(text, result)
            decoded.append(result)

        calls = make_tool_calls(decoded, call_id_prefix)
        if isinstance(calls, str):
            return ParsedAction.failure(text, calls)
        return ParsedAction.calls(calls, "".join(outside).strip())

    GUARDS_MARKUP = True
    TEXT_BEFORE_CALLS = True

    def call_grammar(
        self, name: str, schema: Mapping[str, Any], rule: str, lark: Lark
    ) -> list[str]:
        """``<tool_call>``, a newline, ``{"name": NAME, "arguments": ARGS}``, a newline,
        ``</tool_call>``: what :meth:`render_tool_calls` writes."""
        head = f'{TOOL_CALL_OPEN}\n{{"name": {dumps_for_model(name, escape_markup=True)}, '
        return lark.json_call(rule, head + '"arguments": ', schema, f"}}\n{TOOL_CALL_CLOSE}")

    def text_grammar(self) -> str:
        """Text holding neither tag."""
        return Lark.free_text(TOOL_CALL_OPEN, TOOL_CALL_CLOSE)

    def render_tool_calls(self, tool_calls: Sequence[ToolCall], content: str = "") -> str:
        """Content (if non-empty) then one ``<tool_call>`` block per call, joined by newlines.

        Args:
            tool_calls: OpenAI-style tool calls.
            content: Text written before the calls, as it is (see the module docstring).

        Returns:
            The assistant text.

        Raises:
            InvalidArgumentError: A tool call is malformed.
        """
        parts = [content] if content else []
        for call in tool_calls:
            body = dumps_for_model(tool_call_to_object(call), escape_markup=True)
            parts.append(f"{TOOL_CALL_OPEN}\n{body}\n{TOOL_CALL_CLOSE}")
        return "\n".join(parts)

    def render_tool_specs(self, tool_specs: Sequence[ToolSpec]) -> str:
        """Qwen2.5's tool instructions with one JSON spec per line; ``""`` without tools.

        Args:
            tool_specs: OpenAI-style tool specs.

        Returns:
            The system-prompt text.
        """
        return spec_block(tool_specs, _TOOLS_HEADER, _TOOLS_FOOTER)

    def render_tool_result(self, message: Message) -> str:
        """``"<tool_response>\\n{content}\\n</tool_response>"``.

        Args:
            message: A ``role="tool"`` message.

        Returns:
            The rendered result.

        Raises:
            InvalidArgumentError: The message is not a tool message.
        """
        content = super().render_tool_result(message)
        return f"<tool_response>\n{content}\n</tool_response>"
