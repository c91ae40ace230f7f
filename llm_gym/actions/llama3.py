"""The Llama 3.1 / 3.2 JSON tool-call format: the whole reply is the call.

A reply calls one tool with::

    {"name": "search", "parameters": {"query": "capital of France"}}

optionally preceded by the ``<|python_tag|>`` token, and several with several such objects
separated by ``;`` or whitespace (newlines), as vLLM's ``llama3_json`` parser reads them.
Parsing rules (on top of the shared ones in :mod:`llm_gym.actions.codec`):

* The reply, stripped, starts with ``{``: it must be one or more call objects and nothing else.
* Otherwise, when it holds ``<|python_tag|>``: the text before the first one is the message
  content (stripped) and the text after it must be the call objects.
* Otherwise the reply is a final answer, content = the text unchanged.
* A call object is ``{"name": ..., "parameters": {...}}``; ``"arguments"`` is read too (the key
  Llama models sometimes write, and the one taken when both are present). Other keys are
  ignored. Two objects may be separated by ``;`` and whitespace; anything else after an object
  (an unclosed object, prose, a second ``<|python_tag|>``) is a parse failure.
* Parsing is linear in the length of the text.

Rendering writes the objects with ``"parameters"``, joined by ``"; "``, with ``<``, ``>`` and
``&`` escaped inside the JSON; a non-empty ``content`` goes before a ``<|python_tag|>``, so it
parses back as the content.
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
    spec_block,
    tool_call_to_object,
)
from llm_gym.actions.grammar import Lark
from llm_gym.core.types import Message, ToolCall, ToolSpec

__all__ = ["PYTHON_TAG", "Llama3JsonFormat"]

PYTHON_TAG = "<|python_tag|>"
"""The token that may open a Llama 3 tool call."""

_SEPARATOR_CHARS = " \t\r\n;"
# An assistant call as Llama 3 templates render it, or their instruction '{"name": function
# name, "parameters": dictionary ...}'; a tool spec has "description" between the two keys.
_CALL_SHAPE = re.compile(r'\{"name": [^,{}]{1,200}, "parameters": ')

_INSTRUCTIONS_HEADER = (
    "# Tools\n\n"
    "Given the following functions, please respond with a JSON for a function call with its "
    "proper arguments that best answers the given prompt.\n\n"
    "Function signatures, one JSON object per line:\n"
)
_INSTRUCTIONS_FOOTER = (
    "\n\nTo call a function, reply with only a JSON object and no other text:\n"
    '{"name": <function-name>, "parameters": <args-json-object>}\n'
    'To call several functions at once, separate the objects with "; ".\n'
    "A reply that does not start with { is taken as your final answer."
)


def _call_object(item: Any) -> Any:
    """The object :func:`decode_tool_calls` reads: Llama's ``parameters`` as ``arguments``."""
    if isinstance(item, dict) and "arguments" not in item and "parameters" in item:
        return {"name": item.get("name"), "arguments": item["parameters"]}
    return item


@register_action_format
class Llama3JsonFormat(ActionFormat):
    """Tool calls as the whole reply: ``{"name": ..., "parameters": {...}}`` (Llama 3.1/3.2)."""

    name: ClassVar[str] = "llama3_json"
    MARKERS: ClassVar[tuple[str, ...]] = (PYTHON_TAG, "ipython<|end_header_id|>")

    @classmethod
    def signature(cls, rendered: str) -> bool:
        """Whether ``rendered`` holds ``<|python_tag|>``, an ``ipython`` turn header, or a call
        shaped ``{"name": ..., "parameters": ...}`` (a rendered call or the instruction that
        describes one).

        Example:
            >>> Llama3JsonFormat.signature('{"name": "f", "parameters": {"x": 1}}')
            True
            >>> Llama3JsonFormat.signature('{"name": "f", "description": "d", "parameters": {}}')
            False
        """
        return super().signature(rendered) or _CALL_SHAPE.search(rendered) is not None

    def parse(self, text: str, *, call_id_prefix: str | None = None) -> ParsedAction:
        """:meth:`ActionFormat.parse` (its contract); the rules are in the module docstring."""
        require_text(text)
        stripped = text.lstrip()
        content = ""
        if stripped.startswith("{"):
            pos = len(text) - len(stripped)
        else:
            tag = text.find(PYTHON_TAG)
            if tag == -1:
                return ParsedAction.final(text)
            content = text[:tag].strip()
            pos = tag + len(PYTHON_TAG)

        items: list[Any] = []
        end = len(text)
        while True:
            while pos < end and text[pos] in _SEPARATOR_CHARS:
                pos += 1
            if pos == end:
                break
            number = len(items) + 1
            if text[pos] != "{":
                if not items:
                    return ParsedAction.failure(
                        text, "expected a JSON tool call after <|python_tag|>"
                    )
                return ParsedAction.failure(text, f"unexpected text after tool call {number - 1}")
            if number > MAX_TOOL_CALLS:
                return ParsedAction.failure(
                    text, f"too many tool calls (more than {MAX_TOOL_CALLS})"
                )
            scanned = scan_json(text, pos)
            if isinstance(scanned, str):
                return ParsedAction.failure(text, f"invalid JSON in tool call {number}: {scanned}")
            value, pos = scanned
            items.append(_call_object(value))

        if not items:
            return ParsedAction.failure(text, "no tool call after <|python_tag|>")
        calls = decode_tool_calls(items, call_id_prefix)
        if isinstance(calls, str):
            return ParsedAction.failure(text, calls)
        return ParsedAction.calls(calls, content)

    def call_grammar(
        self, name: str, schema: Mapping[str, Any], rule: str, lark: Lark
    ) -> list[str]:
        """``{"name": NAME, "parameters": ARGS}``."""
        head = f'{{"name": {dumps_for_model(name, escape_markup=True)}, "parameters": '
        return lark.json_call(rule, head, schema, "}")

    def calls_grammar(self, call: str, parallel: bool, lark: Lark) -> str:
        """Call objects joined by ``"; "``."""
        return f'{call} ("; " {call})*' if parallel else call

    def text_grammar(self) -> str:
        """Text that does not start with whitespace nor ``{``, without ``<|python_tag|>``."""
        return Lark.free_text(PYTHON_TAG, first=r"[^\s{]")

    def render_tool_calls(self, tool_calls: Sequence[ToolCall], content: str = "") -> str:
        """The call objects joined by ``"; "``, after ``content`` and ``<|python_tag|>`` when
        ``content`` is non-empty.

        Args:
            tool_calls: OpenAI-style tool calls.
            content: Text written before the calls, as it is (it must not itself hold
                ``<|python_tag|>`` nor start with ``{`` to parse back as the content).

        Returns:
            The assistant text.

        Raises:
            InvalidArgumentError: A tool call is malformed.
        """
        objects = []
        for call in tool_calls:
            obj = tool_call_to_object(call)
            objects.append({"name": obj["name"], "parameters": obj["arguments"]})
        body = "; ".join(dumps_for_model(obj, escape_markup=True) for obj in objects)
        return f"{content}{PYTHON_TAG}{body}" if content else body

    def render_tool_specs(self, tool_specs: Sequence[ToolSpec]) -> str:
        """Llama 3's custom-tool instructions with one JSON spec per line; ``""`` without tools.

        Args:
            tool_specs: OpenAI-style tool specs.

        Returns:
            The system-prompt text.
        """
        return spec_block(tool_specs, _INSTRUCTIONS_HEADER, _INSTRUCTIONS_FOOTER)

    def render_tool_result(self, message: Message) -> str:
        """``{"output": content}`` as JSON, with the message's ``name`` first when set (Llama 3
        templates pass tool results in an ``ipython`` turn).

        Args:
            message: A ``role="tool"`` message.

        Returns:
            The rendered result.

        Raises:
            InvalidArgumentError: The message is not a tool message.
        """
        content = super().render_tool_result(message)
        result: dict[str, Any] = {}
        if "name" in message:
            result["name"] = message["name"]
        result["output"] = content
        return dumps_for_model(result)
