"""The harmony format of OpenAI's gpt-oss models: channels, and calls addressed to functions.

A reply is a sequence of messages. The chat template's generation prompt ends with
``<|start|>assistant``, so the first message starts at its header's ``<|channel|>``; the
policy's text stops before the stop token (``<|call|>`` or ``<|return|>``)::

    <|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary
    to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}

(one line in the reply). Parsing rules (on top of the shared ones in
:mod:`llm_gym.actions.codec`), as openai-harmony's parser and vLLM's ``openai`` tool parser
read gpt-oss replies:

* No ``<|start|>``, ``<|channel|>``, ``<|message|>``, ``<|constrain|>`` nor ``<|call|>``
  anywhere: a final answer, content = the text unchanged.
* Otherwise the text must be messages ``[<|start|>assistant] HEADER <|message|> CONTENT``, each
  ended by ``<|end|>``, ``<|call|>``, ``<|return|>``, the next ``<|start|>`` or the end of the
  text, with only whitespace between a message's end and the next ``<|start|>``. The header
  holds ``<|channel|>CHANNEL``, optionally ``to=RECIPIENT`` (before or after the channel),
  ``<|constrain|>TYPE`` or a bare content type after the channel (``json``). A message from
  another role, an unknown channel, a special token inside a content, or text after the last
  message is a parse failure.
* A message with a recipient is a tool call: the name is the recipient less its ``functions.``
  namespace, the content must be a JSON object (the arguments).
* ``final`` messages are the answer; ``commentary`` messages without a recipient are preambles
  shown to the user; ``analysis`` messages are reasoning, never an answer. With tool calls, the
  message content is the preambles and finals joined by newlines, stripped; without, it is the
  final message's content (finals joined by newlines). Neither a call nor a final message (an
  analysis alone) is a parse failure.
* Parsing is linear in the length of the text (one regular-expression scan for the tokens).

Rendering writes each call on the commentary channel to ``functions.NAME`` with
``<|constrain|>json``, later messages after ``<|start|>assistant``, each but the last ended by its
stop token; ``<``, ``>`` and ``&`` are escaped inside the JSON. A final answer renders as a
``final`` message. A name that is blank or holds whitespace or ``<|`` cannot be a recipient:
rendering raises for it.
"""

from __future__ import annotations

import json
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
    json_error_reason,
    loads_lenient,
    require_text,
    tool_call_to_object,
)
from llm_gym.actions.grammar import GrammarUnsupportedError, Lark
from llm_gym.core.types import Message, ToolCall, ToolSpec
from llm_gym.errors import InvalidArgumentError

__all__ = ["HarmonyFormat"]

_START, _END, _MESSAGE = "<|start|>", "<|end|>", "<|message|>"
_CHANNEL, _CONSTRAIN, _CALL = "<|channel|>", "<|constrain|>", "<|call|>"
_TRIGGERS = (_START, _CHANNEL, _MESSAGE, _CONSTRAIN, _CALL)
_TOKEN = re.compile(r"<\|(start|end|message|channel|constrain|return|call)\|>")
_ENDINGS = frozenset({"end", "call", "return"})
_NAMESPACE = "functions."
_CHANNELS = frozenset({"analysis", "commentary", "final"})

_TOOLS_FOOTER = (
    "\n\n} // namespace functions\n\n"
    "Calls to these tools must go to the commentary channel: 'functions'. To call one, write:\n"
    "<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{JSON arguments}<|call|>\n"
    "Write your final answer as:\n"
    "<|channel|>final<|message|>your answer"
)


def _header(header: str) -> tuple[str | None, str | None] | str:
    """``(recipient, channel)`` of a message header (its tokens included), or an error."""
    text = header.strip()
    words = text.replace(_CHANNEL, f" {_CHANNEL} ").replace(_CONSTRAIN, f" {_CONSTRAIN} ").split()
    if words and words[0].startswith(_START):
        role = words.pop(0)[len(_START) :] or (words.pop(0) if words else "")
        if role != "assistant":
            return f"a message from {role!r:.60} inside the assistant's reply"
    elif words and words[0] == "assistant":
        words.pop(0)
    recipient = channel = None
    typed = False  # a content type: <|constrain|>TYPE, or a bare word once a channel is given
    while words:
        word = words.pop(0)
        if word in (_CHANNEL, _CONSTRAIN):
            if not words or words[0].startswith("<|"):
                return f"{word} without a name after it"
            if word == _CHANNEL:
                if channel is not None:
                    return "a message header with two channels"
                channel = words.pop(0)
            else:
                words.pop(0)
                typed = True
        elif word.startswith("to="):
            if recipient is not None or len(word) == 3:
                return "a message header with an empty or second recipient"
            recipient = word[3:]
        elif channel is not None and not typed:  # "commentary json"
            typed = True
        else:
            return f"unexpected {word!r:.60} in a message header"
    return recipient, channel


@register_action_format
class HarmonyFormat(ActionFormat):
    """Tool calls as harmony messages to ``functions.NAME`` (OpenAI gpt-oss)."""

    name: ClassVar[str] = "harmony"
    MARKERS: ClassVar[tuple[str, ...]] = ("to=functions.", "namespace functions {")

    @classmethod
    def signature(cls, rendered: str) -> bool:
        """Whether ``rendered`` holds harmony's ``<|message|>`` token and a recipient in the
        ``functions`` namespace or the ``namespace functions {`` tool block.

        Example:
            >>> HarmonyFormat.signature("<|start|>assistant to=functions.f<|channel|>"
            ...                         "commentary json<|message|>{}<|call|>")
            True
            >>> HarmonyFormat.signature("<|im_start|>assistant to=functions.f\\n{}")
            False
        """
        return _MESSAGE in rendered and super().signature(rendered)

    def parse(self, text: str, *, call_id_prefix: str | None = None) -> ParsedAction:
        """:meth:`ActionFormat.parse` (its contract); the rules are in the module docstring."""
        require_text(text)
        if not any(token in text for token in _TRIGGERS):
            return ParsedAction.final(text)
        messages = _messages(text)
        if isinstance(messages, str):
            return ParsedAction.failure(text, messages)

        items: list[dict[str, Any]] = []
        shown: list[str] = []
        finals: list[str] = []
        for header, content in messages:
            parsed_header = _header(header)
            if isinstance(parsed_header, str):
                return ParsedAction.failure(text, parsed_header)
            recipient, channel = parsed_header
            if recipient is not None:
                number = len(items) + 1
                if number > MAX_TOOL_CALLS:
                    return ParsedAction.failure(
                        text, f"too many tool calls (more than {MAX_TOOL_CALLS})"
                    )
                try:
                    arguments = loads_lenient(content.strip())
                except (ValueError, RecursionError) as exc:
                    reason = f"invalid JSON in tool call {number}: {json_error_reason(exc)}"
                    return ParsedAction.failure(text, reason)
                items.append({"name": recipient.removeprefix(_NAMESPACE), "arguments": arguments})
            elif channel is None:
                return ParsedAction.failure(text, "a message without a channel")
            elif channel not in _CHANNELS:
                return ParsedAction.failure(text, f"unknown channel {channel!r:.60}")
            elif channel == "final":
                finals.append(content)
                shown.append(content)
            elif channel == "commentary":
                shown.append(content)
        if items:
            calls = decode_tool_calls(items, call_id_prefix)
            if isinstance(calls, str):
                return ParsedAction.failure(text, calls)
            return ParsedAction.calls(calls, "\n".join(shown).strip())
        if finals:
            return ParsedAction.final("\n".join(finals))
        return ParsedAction.failure(
            text, "no final answer: the reply has no final-channel message and no tool call"
        )

    def render_tool_calls(self, tool_calls: Sequence[ToolCall], content: str = "") -> str:
        """A commentary preamble with ``content`` (if non-empty), then one message per call.

        Args:
            tool_calls: OpenAI-style tool calls.
            content: The preamble, as it is (it must hold no harmony token to parse back as the
                content).

        Returns:
            The assistant text.

        Raises:
            InvalidArgumentError: A tool call is malformed or its name cannot be a recipient.
        """
        messages = [f"{_CHANNEL}commentary{_MESSAGE}{content}{_END}"] if content else []
        for call in tool_calls:
            obj = tool_call_to_object(call)
            name = obj["name"]
            if not name.strip() or "<|" in name or any(c.isspace() for c in name):
                raise InvalidArgumentError(
                    "a tool name in the harmony format must be non-blank without whitespace or "
                    f"'<|', got {name!r:.200}; use another action format for such names"
                )
            body = dumps_for_model(obj["arguments"], escape_markup=True)
            recipient = f"to={_NAMESPACE}{name} {_CONSTRAIN}json"
            messages.append(f"{_CHANNEL}commentary {recipient}{_MESSAGE}{body}{_CALL}")
        text = f"{_START}assistant".join(messages)
        return text.removesuffix(_CALL)  # the policy's text stops before the stop token

    GUARDS_MARKUP = True

    def call_grammar(
        self, name: str, schema: Mapping[str, Any], rule: str, lark: Lark
    ) -> list[str]:
        """A commentary message to ``functions.NAME`` with ``<|constrain|>json``, its content
        the arguments (the stop token ``<|call|>`` ends the reply).

        Raises:
            GrammarUnsupportedError: ``name`` cannot be a recipient.
        """
        if not name.strip() or "<|" in name or any(c.isspace() for c in name):
            raise GrammarUnsupportedError(
                "a tool name in the harmony format must be non-blank without whitespace or "
                f"'<|', got {name!r:.200}"
            )
        head = f"{_CHANNEL}commentary to={_NAMESPACE}{name} {_CONSTRAIN}json{_MESSAGE}"
        return lark.json_call(rule, head, schema, "")

    def calls_grammar(self, call: str, parallel: bool, lark: Lark) -> str:
        """One call: the stop token after it ends the reply."""
        return call

    def render_message(self, message: Message) -> str:
        """A final answer as a ``final`` message; tool calls as :meth:`render_tool_calls`.

        Args:
            message: An assistant message.

        Returns:
            The assistant text.

        Raises:
            InvalidArgumentError: The message is not an assistant message.
        """
        rendered = super().render_message(message)
        if message.get("tool_calls"):
            return rendered
        return f"{_CHANNEL}final{_MESSAGE}{rendered}"

    def render_tool_specs(self, tool_specs: Sequence[ToolSpec]) -> str:
        """The tools as harmony's TypeScript-like ``namespace functions`` block, plus the
        calling convention; ``""`` without tools.

        Args:
            tool_specs: OpenAI-style tool specs.

        Returns:
            The system-prompt text.
        """
        if not tool_specs:
            return ""
        lines = ["# Tools", "", "## functions", "", "namespace functions {"]
        for spec in tool_specs:
            function = spec.get("function") if isinstance(spec, Mapping) else None
            if not isinstance(function, Mapping):
                continue
            lines.append("")
            description = function.get("description")
            if isinstance(description, str) and description:
                lines += [f"// {line}" for line in description.splitlines()]
            parameters = function.get("parameters")
            name = function.get("name")
            if isinstance(parameters, Mapping) and parameters.get("properties"):
                lines.append(f"type {name} = (_: {_typescript(parameters)}) => any;")
            else:
                lines.append(f"type {name} = () => any;")
        return "\n".join(lines) + _TOOLS_FOOTER

    def render_tool_result(self, message: Message) -> str:
        """``<|start|>functions.NAME to=assistant<|channel|>commentary<|message|>{content}<|end|>``
        (``NAME`` from the message's ``name``; ``tool`` without one).

        Args:
            message: A ``role="tool"`` message.

        Returns:
            The rendered result.

        Raises:
            InvalidArgumentError: The message is not a tool message.
        """
        content = super().render_tool_result(message)
        name = message.get("name") or "tool"
        header = f"{_START}{_NAMESPACE}{name} to=assistant{_CHANNEL}commentary"
        return f"{header}{_MESSAGE}{content}{_END}"


def _messages(text: str) -> list[tuple[str, str]] | str:
    """The ``(header, content)`` of each message in ``text``, or an error string."""
    messages: list[tuple[str, str]] = []
    state, mark, last, header = "header", 0, "", ""
    for match in _TOKEN.finditer(text):
        token, at = match.group(1), match.start()
        if state == "header":
            if token == "message":
                header, state, mark = text[mark:at], "content", match.end()
            elif token == "start" and text[mark:at].strip():
                return "<|start|> inside a message header"
            elif token in _ENDINGS:
                return f"a message header ended by <|{token}|> before <|message|>"
        elif state == "content":
            if token not in _ENDINGS and token != "start":
                return f"unexpected <|{token}|> inside a message's content"
            messages.append((header, text[mark:at]))
            if token == "start":  # a message may end where the next one starts
                state, mark = "header", at
            else:
                state, mark, last = "between", match.end(), token
        else:  # between messages
            if text[mark:at].strip():
                return f"unexpected text after <|{last}|>"
            if token != "start":
                return f"expected <|start|> after <|{last}|>, got <|{token}|>"
            state, mark = "header", at
    if state == "header":
        return "a message header without <|message|>"
    if state == "content":
        messages.append((header, text[mark:]))
    elif text[mark:].strip():
        return f"unexpected text after <|{last}|>"
    return messages


def _typescript(schema: Any) -> str:
    """A JSON schema as harmony's TypeScript-like type (``any`` for what it cannot say)."""
    if not isinstance(schema, Mapping):
        return "any"
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return " | ".join(json.dumps(v, ensure_ascii=False) for v in enum)
    declared = schema.get("type")
    if isinstance(declared, list):
        return " | ".join(_typescript({**schema, "type": t}) for t in declared) or "any"
    if declared == "array":
        item = _typescript(schema.get("items"))
        return f"({item})[]" if " | " in item else f"{item}[]"
    if declared == "object":
        properties = schema.get("properties")
        if not isinstance(properties, Mapping) or not properties:
            return "object"
        required = schema.get("required") or ()
        lines = ["{"]
        for key, sub in properties.items():
            if isinstance(sub, Mapping) and isinstance(sub.get("description"), str):
                lines += [f"// {line}" for line in sub["description"].splitlines()]
            mark = "" if key in required else "?"
            line = f"{key}{mark}: {_typescript(sub)},"
            if isinstance(sub, Mapping) and "default" in sub:
                line += f" // default: {json.dumps(sub['default'], ensure_ascii=False)}"
            lines.append(line)
        return "\n".join(lines) + "\n}"
    simple = {"string": "string", "integer": "number", "number": "number", "boolean": "boolean"}
    return simple.get(declared, "null" if declared == "null" else "any")
