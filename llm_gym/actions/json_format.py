"""The plain JSON tool-call format: the whole reply is a JSON call object or a list of them.

A reply calls one tool with::

    {"name": "search", "arguments": {"query": "capital of France"}}

or several with a non-empty JSON list of such objects. Parsing rules (on top of the shared ones in
:mod:`llm_gym.actions.codec`):

* The reply is stripped; a surrounding Markdown code fence (`````` ``` `````` or
  `````` ```json ``````) is removed. If what is left starts with ``{`` or ``[`` it must be a tool
  call (or a list of them), else the reply is a final answer with content = the text unchanged.
* An object without ``"name"`` whose only key is ``"answer"`` or ``"final_answer"`` is a final
  answer with that value as content (strings as they are, other values JSON-encoded).
* Anything else starting with ``{`` or ``[`` that is not valid is a parse failure.
* Tool calls carry no text besides the JSON, so a parsed message's content is ``""`` and
  :meth:`JsonFormat.render_tool_calls` drops its ``content`` argument.
"""

from __future__ import annotations

import json
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
from llm_gym.core.text import clean_json
from llm_gym.core.types import Message, ToolCall, ToolSpec
from llm_gym.errors import InvalidArgumentError

__all__ = ["ANSWER_KEYS", "JsonFormat"]

ANSWER_KEYS = ("answer", "final_answer")
"""Keys that make a lone ``{"answer": ...}`` object a final answer instead of a tool call."""

_FENCE = "```"
_FENCE_LANGUAGES = ("", "json")

_INSTRUCTIONS_HEADER = (
    "# Tools\n\n"
    "You may call one or more functions to assist with the user query.\n\n"
    "Function signatures, one JSON object per line:\n"
)
_INSTRUCTIONS_FOOTER = (
    "\n\nTo call a function, reply with only a JSON object and no other text:\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n'
    "To call several functions at once, reply with a JSON list of such objects.\n"
    "A reply that does not start with { or [ is taken as your final answer; "
    'you may also give it as {"answer": <your answer>}.'
)


def _unfence(stripped: str) -> str:
    """The inside of a ````` ``` ````` or ````` ```json ````` fence, or ``stripped`` unchanged."""
    if not stripped.startswith(_FENCE):
        return stripped
    newline = stripped.find("\n")
    if newline == -1:
        return stripped
    if stripped[len(_FENCE) : newline].strip().lower() not in _FENCE_LANGUAGES:
        return stripped
    inner = stripped[newline + 1 :]
    if inner.rstrip().endswith(_FENCE):
        inner = inner.rstrip()[: -len(_FENCE)]
    return inner.strip()


@register_action_format
class JsonFormat(ActionFormat):
    """Tool calls as a bare JSON object ``{"name": ..., "arguments": {...}}`` or a list of them."""

    name: ClassVar[str] = "json"

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
        body = _unfence(text.strip())
        if not body.startswith(("{", "[")):
            return ParsedAction.final(text)
        try:
            value = loads_lenient(body)
        except (ValueError, RecursionError) as exc:
            return ParsedAction.failure(text, f"invalid JSON: {json_error_reason(exc)}")

        if isinstance(value, dict):
            if "name" not in value and len(value) == 1 and next(iter(value)) in ANSWER_KEYS:
                answer = clean_json(next(iter(value.values())))  # JSON may escape surrogates
                if isinstance(answer, str):
                    return ParsedAction.final(answer)
                try:
                    return ParsedAction.final(json.dumps(answer, ensure_ascii=False))
                except (ValueError, RecursionError) as exc:
                    return ParsedAction.failure(text, f"answer cannot be re-encoded: {exc}")
            items: list[Any] = [value]
        elif isinstance(value, list):
            if not value:
                return ParsedAction.failure(text, "empty list of tool calls")
            if len(value) > MAX_TOOL_CALLS:
                return ParsedAction.failure(
                    text, f"too many tool calls (more than {MAX_TOOL_CALLS})"
                )
            items = value
        else:  # pragma: no cover - a body starting with { or [ decodes to a dict or list
            return ParsedAction.failure(text, "expected a JSON object or list of tool calls")

        decoded: list[tuple[str, dict[str, Any]]] = []
        for number, item in enumerate(items, start=1):
            result = decode_tool_call(item, number)
            if isinstance(result, str):
                return ParsedAction.failure(text, result)
            decoded.append(result)
        calls = make_tool_calls(decoded, call_id_prefix)
        if isinstance(calls, str):
            return ParsedAction.failure(text, calls)
        return ParsedAction.calls(calls, "")

    def call_grammar(
        self, name: str, schema: Mapping[str, Any], rule: str, lark: Lark
    ) -> list[str]:
        """``{"name": NAME, "arguments": ARGS}``."""
        head = f'{{"name": {dumps_for_model(name)}, "arguments": '
        return lark.json_call(rule, head, schema, "}")

    def calls_grammar(self, call: str, parallel: bool, lark: Lark) -> str:
        """One call object, or (``parallel``) a JSON list of them."""
        return f'{call} | "[" {call} (", " {call})* "]"' if parallel else call

    def text_grammar(self) -> str:
        """Text that does not start with whitespace, ``{``, ``[`` nor a code fence."""
        return Lark.free_text(first=r"[^\s{\[`]")

    def render_tool_calls(self, tool_calls: Sequence[ToolCall], content: str = "") -> str:
        """One JSON object for a single call, a JSON list for several.

        Args:
            tool_calls: OpenAI-style tool calls (at least one).
            content: Ignored: this format has no place for text besides the calls.

        Returns:
            The assistant text.

        Raises:
            InvalidArgumentError: There are no tool calls, or one is malformed.
        """
        del content  # the format carries no free text next to tool calls
        objects = [tool_call_to_object(call) for call in tool_calls]
        if not objects:
            raise InvalidArgumentError("the json format needs at least one tool call to render")
        return dumps_for_model(objects[0] if len(objects) == 1 else objects)

    def render_tool_specs(self, tool_specs: Sequence[ToolSpec]) -> str:
        """Short instructions for the format plus one JSON spec per line; ``""`` without tools.

        Args:
            tool_specs: OpenAI-style tool specs.

        Returns:
            The system-prompt text.
        """
        return spec_block(tool_specs, _INSTRUCTIONS_HEADER, _INSTRUCTIONS_FOOTER)

    def render_tool_result(self, message: Message) -> str:
        """A JSON object with the message's ``tool_call_id``, ``name`` (when set) and ``content``.

        Args:
            message: A ``role="tool"`` message.

        Returns:
            The rendered result.

        Raises:
            InvalidArgumentError: The message is not a tool message.
        """
        content = super().render_tool_result(message)
        result: dict[str, Any] = {}
        for key in ("tool_call_id", "name"):
            if key in message:
                result[key] = message[key]  # type: ignore[literal-required]
        result["content"] = content
        return dumps_for_model(result)
