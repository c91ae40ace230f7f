"""Past assistant turns as the chat template gets them: text, or structured tool calls.

The rollout keeps an assistant turn as the text the model sampled, and a template gets it as
role and text (:func:`plain_message`): the template reproduces what the model wrote. Some
templates cannot render a tool-using history of text turns: gpt-oss's refuses a tool result
unless the assistant turn before it has structured ``tool_calls``; Mistral v0.3's counts a text
turn after a tool result as a second assistant turn in a row and raises.
:func:`~llm_gym.policies.template_tools.template_support` finds such a template once per
template (``structured_history``), and its conversations get every assistant turn as
:func:`structured_history` writes it:

* A turn that already has structured ``tool_calls`` keeps them, ids included.
* Otherwise its text is parsed with the episode's action format. Tool calls become
  ``tool_calls`` (the arguments as an object, which templates print with ``tojson``; the text
  outside the calls as ``content``), each call's id the ``tool_call_id`` of the tool result
  that answers it (the i-th tool result after the turn), so calls and results pair (a template
  that refuses ids other than 9 alphanumerics gets both through the same
  :func:`~llm_gym.actions.codec.short_call_id`). A final answer becomes its parsed content
  (harmony: the final channel's text, which the template wraps in its own header). A reply that
  does not parse keeps its text.
* Where the template refuses a user message right after a structured call's results but not
  after the call as text (``text_before_user``: Mistral v0.3 counts text turns only when it
  checks that user and assistant alternate), a turn whose results a user message follows stays
  text.
* Arguments nested deeper than :data:`MAX_ARGUMENT_DEPTH` go to the template as their JSON
  text, with a warning once: a template's ``tojson`` recurses, and ~900 levels (which a reply
  may hold and still parse) exhaust Python's stack inside a render.

The trained tokens stay the sampled ones: the rollout's token tracker appends a turn's sampled
ids as they are (:mod:`llm_gym.rollout.tokens`), and the template's rendering of the structured
turn is only context for the turns after it. Where the template writes a call otherwise than
the model sampled it (it does for both families), the rendering is no extension of the ids held,
and the tracker starts a new sample there, as for any template that rewrites history.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from llm_gym.actions import ActionFormat, ParseKind, get_action_format
from llm_gym.core.types import Message

__all__ = ["MAX_ARGUMENT_DEPTH", "nesting_over", "plain_message", "structured_history"]

MAX_ARGUMENT_DEPTH = 64
"""The deepest nesting of a past call's arguments that a template gets as an object."""


def plain_message(message: Message) -> dict[str, Any]:
    """``message`` as the chat template gets it: role and text content (tool results keep their
    ``name`` and ``tool_call_id``)."""
    role = message.get("role", "user")
    out: dict[str, Any] = {"role": role, "content": message.get("content") or ""}
    if role == "tool":
        for key in ("name", "tool_call_id"):
            if key in message:
                out[key] = message[key]
    return out


def nesting_over(value: Any, limit: int) -> bool:
    """Whether ``value`` (JSON-like) nests lists and dicts more than ``limit`` deep; iterative,
    and it stops at the first path past ``limit``.

    Example:
        >>> nesting_over({"a": [1, {"b": 2}]}, 3), nesting_over({"a": [1, {"b": 2}]}, 2)
        (False, True)
    """
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, Mapping | list | tuple):
            if depth >= limit:
                return True
            children = item.values() if isinstance(item, Mapping) else item
            stack.extend((child, depth + 1) for child in children)
    return False


def _arguments(arguments: Any) -> tuple[Any, str | None]:
    """A call's arguments as the template gets them, and why they stay text (or None)."""
    value = arguments
    if isinstance(arguments, str):
        try:
            value = json.loads(arguments)
        except (ValueError, RecursionError):
            return arguments, "arguments that are not valid JSON"
        if not isinstance(value, dict):
            return arguments, "arguments that are not a JSON object"
    if nesting_over(value, MAX_ARGUMENT_DEPTH):
        text = arguments if isinstance(arguments, str) else None
        if text is None:
            try:
                text = json.dumps(value, ensure_ascii=False)
            except (TypeError, ValueError, RecursionError):
                text = ""
        return text, f"arguments nested more than {MAX_ARGUMENT_DEPTH} levels deep"
    return value, None


def _calls(calls: Sequence[Any], result_ids: Sequence[Any]) -> tuple[list[Any], list[str]]:
    """``calls`` with object arguments (and ``result_ids`` as their ids, by position), and why
    any stayed text."""
    out, reasons = [], []
    for index, call in enumerate(calls):
        if not isinstance(call, Mapping) or not isinstance(call.get("function"), Mapping):
            out.append(call)
            continue
        function = dict(call["function"])
        function["arguments"], reason = _arguments(function.get("arguments", {}))
        if reason is not None:
            reasons.append(reason)
        call_id = call.get("id")
        if index < len(result_ids) and isinstance(result_ids[index], str) and result_ids[index]:
            call_id = result_ids[index]
        out.append({**call, "id": call_id, "function": function})
    return out, reasons


def _reply(messages: Sequence[Any], start: int) -> tuple[list[Any], Any]:
    """The ``tool_call_id`` of each tool result after ``messages[start]`` up to the next
    non-tool message, and that message's role (None at the end)."""
    ids = []
    for message in messages[start + 1 :]:
        role = message.get("role") if isinstance(message, Mapping) else None
        if role != "tool":
            return ids, role
        ids.append(message.get("tool_call_id"))
    return ids, None


def structured_history(
    messages: Sequence[Message],
    action_format: str | ActionFormat,
    *,
    text_before_user: bool = False,
) -> tuple[list[dict[str, Any]], list[str]]:
    """``messages`` as a template that needs structured history gets them (see the module
    docstring): every assistant turn with its tool calls structured, every other message as
    :func:`plain_message`; and the reasons (one per call) why a call's arguments stay text.
    With ``text_before_user`` (a template that refuses a user message right after a structured
    call's results), a turn whose results a user message follows stays text.

    Example:
        >>> chat, reasons = structured_history([
        ...     {"role": "assistant", "content": '[TOOL_CALLS] [{"name": "f", "arguments": {}}]'},
        ...     {"role": "tool", "tool_call_id": "a1B2c3D4e", "content": "7"},
        ... ], "mistral")
        >>> chat[0]["tool_calls"][0]["id"], chat[0]["tool_calls"][0]["function"], reasons
        ('a1B2c3D4e', {'name': 'f', 'arguments': {}}, [])
    """
    fmt = get_action_format(action_format)
    out: list[dict[str, Any]] = []
    reasons: list[str] = []
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping) or message.get("role") != "assistant":
            out.append(plain_message(message))
            continue
        result_ids, after = _reply(messages, index)
        if text_before_user and after == "user":
            out.append(plain_message(message))
            continue
        content = message.get("content") or ""
        calls = message.get("tool_calls")
        paired: Sequence[Any] = ()  # structured calls keep their ids
        if not (isinstance(calls, list) and calls) and isinstance(content, str):
            parsed = fmt.parse(content, call_id_prefix=f"call_h{index}")
            if parsed.kind is ParseKind.PARSE_FAILURE:
                out.append(plain_message(message))
                continue
            content, calls = parsed.message["content"], parsed.message.get("tool_calls")
            paired = result_ids
        turn: dict[str, Any] = {"role": "assistant", "content": content}
        if isinstance(calls, list) and calls:
            turn["tool_calls"], why = _calls(calls, paired)
            reasons.extend(why)
        out.append(turn)
    return out, reasons
