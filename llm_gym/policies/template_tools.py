"""Tools shown to every model: a chat template that cannot render them gets them as text.

Many chat templates have no tools block (SmolLM2, Llama 2, Mistral v0.1, Phi-3, Gemma 2, most
base models): ``apply_chat_template(messages, tools=specs)`` renders exactly what it renders
without them, and the model is never told that tools exist. Some also refuse or drop what the
text layout writes: Gemma 2 raises on a ``system`` message, some Phi-3 templates drop it
silently, Llama 2, Mistral v0.1 and Gemma raise unless user and assistant turns alternate.
:func:`template_support` finds out once per template, by rendering probe conversations
(:class:`TemplateSupport`, one field a probe). A probe fails only on the template's own errors
(:func:`~llm_gym.policies.template_render.template_errors`: Jinja's ``TemplateError``, which
``raise_exception`` raises); any other error, a template that runs past its deadline
included, is raised. Probe tool calls have ids of 9 alphanumerics (Mistral v0.3's rule).

A template that renders the specs and ``role="tool"`` messages gets a tool-using conversation
as it is (the *native* layout), tool-call ids made 9 alphanumerics where it refuses others
(:func:`short_call_ids`), past calls structured where it renders a tool-using history only so
(``structured_history``, :mod:`llm_gym.policies.template_history`). Any other gets the *text*
layout (:func:`text_layout`) whenever the conversation has tools (specs, or tool calls and
results in its history): the episode's action format writes the tool specs and its calling
convention into the system message
(``render_tool_specs``: for hermes the ``<tools>...</tools>`` block with its instructions; a
system message holding only it is inserted when the conversation has none), earlier assistant
turns as the text the model wrote (``render_message``: content plus rendered tool calls) and
tool results as ``user`` messages (``render_tool_result``, consecutive results merged into one).
That is the layout :class:`~llm_gym.policies.OpenAIPolicy` sends a plain chat model, so a local
model and the same model behind an endpoint see the same text. The text layout then fits the
template (:func:`fit_template`): where a system message does not survive (raises or is
dropped), the system text, tool block included, goes at the head of the first user message;
where the template demands alternation, consecutive messages of one role are merged (an
environment reply of ``[tool, user]`` is one user turn). A conversation without tools gets the
text layout too when the template cannot render it as it is (a system message it refuses or
drops, consecutive turns of one role it refuses).

The first time a template gets the text layout a warning says so; ``template_tools="require"``
refuses a template that cannot render tools instead (:class:`TemplateToolsError`).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import threading
import warnings
import weakref
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from llm_gym.actions import ActionFormat, get_action_format
from llm_gym.actions.codec import short_call_id
from llm_gym.core.types import Message, ToolSpec
from llm_gym.errors import InvalidArgumentError, LlmGymError
from llm_gym.policies.openai_messages import build_messages
from llm_gym.policies.template_render import apply_template, template_errors, template_name

__all__ = [
    "PROBE_CALL_ID",
    "PROBE_SPEC",
    "TEMPLATE_TOOLS_MODES",
    "TemplateSupport",
    "TemplateToolsError",
    "carries_tools",
    "check_template_tools",
    "fit_template",
    "layout_for",
    "short_call_ids",
    "template_key",
    "template_support",
    "text_layout",
    "warn_once",
]

TEMPLATE_TOOLS_MODES = ("fallback", "require")
"""``fallback``: a template without tools gets the text layout (warned once); ``require``:
such a template is refused."""

_PROBE_NAME = "llm_gym_probe_tool"
_PROBE_RESULT = "llm_gym_probe_result_7351"
_PROBE_SYSTEM = "llm_gym_probe_system_4219"
_PROBE_TEXT = "llm_gym_probe_text_8063"
PROBE_CALL_ID = "a1B2c3D4e"
"""The probes' tool-call id: 9 alphanumerics, which every template accepts (Mistral v0.3's
refuse any other)."""
_TWO_IDS = (PROBE_CALL_ID, "f5G6h7J8k")
PROBE_SPEC: dict[str, Any] = {  # a tool spec of no consequence: what probes render
    "type": "function",
    "function": {
        "name": _PROBE_NAME,
        "description": "Probe.",
        "parameters": {"type": "object", "properties": {"key": {"type": "string"}}},
    },
}
_SUPPORT_CACHE = 32
"""Probe results kept per tokenizer (one per template and template arguments; least recently
used dropped): a server's clients choose the arguments."""
_WARNED_CACHE = 256


class TemplateToolsError(LlmGymError, ValueError):
    """A chat template that cannot render tools, under ``template_tools="require"``."""


@dataclass(frozen=True)
class TemplateSupport:
    """What a chat template renders of a conversation, one field a probe."""

    tools: bool
    """The ``tools`` argument (the specs) reaches the rendering."""
    tool_role: bool
    """A ``role="tool"`` message's content reaches the rendering."""
    system: bool = True
    """A ``system`` message's text reaches the rendering (False: refused or dropped)."""
    alternates: bool = False
    """Two consecutive ``user`` messages are refused: turns must alternate."""
    short_call_ids: bool = False
    """Tool-call ids other than 9 alphanumerics are refused (Mistral v0.3)."""
    structured_history: bool = False
    """Two tool-calling assistant turns, each followed by its result, render with structured
    ``tool_calls`` but not as text (refused, or a result or the text missing): gpt-oss's
    template, Mistral v0.3's (:mod:`llm_gym.policies.template_history`)."""
    text_before_user: bool = False
    """With ``structured_history``: a user message right after a structured call's result is
    refused, and after the call as text it is not (Mistral v0.3 counts text turns only in its
    alternation): a calling turn that a user message follows stays text."""

    @property
    def native(self) -> bool:
        """Tools and tool results: a tool-using conversation is rendered as it is."""
        return self.tools and self.tool_role


_SUPPORT: weakref.WeakKeyDictionary[Any, OrderedDict[str, TemplateSupport]]
_SUPPORT = weakref.WeakKeyDictionary()
_WARNED: OrderedDict[str, None] = OrderedDict()
_LOCK = threading.Lock()


def _renders(tokenizer: Any, messages: list[dict], tools: Any, kwargs: dict) -> str | None:
    """The rendering, or None when the template refuses it with an error of its own."""
    try:
        return apply_template(
            tokenizer, messages, tools=tools, add_generation_prompt=True, template_kwargs=kwargs
        )
    except template_errors():
        return None


def _shows(tokenizer: Any, marker: str, cases: list[tuple[list, Any]], kwargs: dict) -> int:
    """The index of the first case whose rendering shows ``marker``, or -1."""
    for index, (messages, tools) in enumerate(cases):
        text = _renders(tokenizer, messages, tools, kwargs)
        if text is not None and marker in text:
            return index
    return -1


def template_key(tokenizer: Any, kwargs: dict[str, Any]) -> str:
    """A digest of ``tokenizer``'s chat template and the template arguments ``kwargs``: what
    a probe's result is kept under."""
    template = getattr(tokenizer, "chat_template", None)
    try:
        text = json.dumps([template, kwargs], sort_keys=True, default=repr)
    except (TypeError, ValueError):
        text = repr((template, sorted(kwargs)))
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _cached(tokenizer: Any, key: str) -> TemplateSupport | None:
    with _LOCK:
        try:
            entries = _SUPPORT.get(tokenizer)
        except TypeError:  # not weak-referenceable
            return None
        if entries is None or key not in entries:
            return None
        entries.move_to_end(key)
        return entries[key]


def _remember(tokenizer: Any, key: str, support: TemplateSupport) -> None:
    with _LOCK:
        try:
            entries = _SUPPORT.setdefault(tokenizer, OrderedDict())
        except TypeError:  # not weak-referenceable: probed each time
            return
        entries[key] = support
        while len(entries) > _SUPPORT_CACHE:
            entries.popitem(last=False)


def _probe(tokenizer: Any, kwargs: dict[str, Any]) -> TemplateSupport:
    user = {"role": "user", "content": "Hi."}
    tools = _shows(tokenizer, _PROBE_NAME, [([user], [PROBE_SPEC])], kwargs) == 0

    def tool_cases(*ids: str, then: tuple = ()) -> list[tuple[list, Any]]:
        """``[user, (call, result) per id, *then]``: the calls structured, then as text."""
        cases = []
        result = {"role": "tool", "content": _PROBE_RESULT, "name": _PROBE_NAME}
        for turn in ({"content": "", "tool_calls": []}, {"content": _PROBE_TEXT}):
            chat = [user]
            for call_id in ids:
                function = {"name": _PROBE_NAME, "arguments": {"key": "a"}}
                call = {"id": call_id, "type": "function", "function": function}
                calls = {"tool_calls": [call]} if "tool_calls" in turn else {}
                chat += [
                    {"role": "assistant", **turn, **calls},
                    {**result, "tool_call_id": call_id},
                ]
            cases.append(([*chat, *then], [PROBE_SPEC] if tools else None))
        return cases

    case = _shows(tokenizer, _PROBE_RESULT, tool_cases(PROBE_CALL_ID), kwargs)
    short_ids = structured = text_before_user = False
    if case >= 0:
        short_ids = _renders(tokenizer, *tool_cases("call_0")[case], kwargs) is None
        calls, text = (_renders(tokenizer, *c, kwargs) or "" for c in tool_cases(*_TWO_IDS))
        structured = calls.count(_PROBE_RESULT) == 2 and (
            text.count(_PROBE_RESULT) < 2 or text.count(_PROBE_TEXT) < 2
        )
        if structured:
            go = tool_cases(PROBE_CALL_ID, then=({"role": "user", "content": "Go."},))
            text_before_user = [_renders(tokenizer, *c, kwargs) is None for c in go] == [
                True,
                False,
            ]
    system = {"role": "system", "content": _PROBE_SYSTEM}
    return TemplateSupport(
        tools=tools,
        tool_role=case >= 0,
        system=_shows(tokenizer, _PROBE_SYSTEM, [([system, user], None)], kwargs) == 0,
        alternates=_renders(tokenizer, [user, {"role": "user", "content": "Go."}], None, kwargs)
        is None,
        short_call_ids=short_ids,
        structured_history=structured,
        text_before_user=text_before_user,
    )


def template_support(
    tokenizer: Any, chat_template_kwargs: dict[str, Any] | None = None
) -> TemplateSupport:
    """What ``tokenizer``'s chat template renders of tools, tool results, system messages and
    turns of one role in a row (probed once per template and template arguments; the 32 most
    recently used kept per tokenizer, so clients' arguments cannot grow it).

    Raises:
        TemplateTimeoutError: a probe ran past the render deadline (a template that loops).
        Exception: any error of a probe that is not the template's own.
    """
    kwargs = dict(chat_template_kwargs or {})
    key = template_key(tokenizer, kwargs)
    found = _cached(tokenizer, key)
    if found is None:
        found = _probe(tokenizer, kwargs)
        _remember(tokenizer, key, found)
    return found


def check_template_tools(mode: object) -> str:
    """``mode`` when it is one of :data:`TEMPLATE_TOOLS_MODES`, else a clear error."""
    if not isinstance(mode, str) or mode not in TEMPLATE_TOOLS_MODES:
        raise InvalidArgumentError(
            f"template_tools must be one of {list(TEMPLATE_TOOLS_MODES)}, actual value: "
            f"{mode!r:.60}."
        )
    return mode


def carries_tools(messages: Sequence[Any]) -> bool:
    """Whether a conversation holds tool calls or tool results (which a template without a
    tool role would drop even when the request lists no tools)."""
    return any(
        isinstance(m, Mapping) and (m.get("role") == "tool" or m.get("tool_calls"))
        for m in messages
    )


def _roles(messages: Sequence[Any]) -> list[Any]:
    return [m.get("role") if isinstance(m, Mapping) else None for m in messages]


def _unfit(messages: Sequence[Any], support: TemplateSupport) -> str | None:
    """What ``support``'s template cannot render of a conversation without tools, or None."""
    roles = _roles(messages)
    if "system" in roles and not support.system:
        return "a system message"
    if support.alternates and any(a == b for a, b in itertools.pairwise(roles)):
        return "two messages of one role in a row"
    return None


def warn_once(key: str, message: str) -> None:
    """``warnings.warn(message)`` the first time ``key`` comes (the 256 most recent kept)."""
    with _LOCK:
        first = key not in _WARNED
        _WARNED[key] = None
        _WARNED.move_to_end(key)
        while len(_WARNED) > _WARNED_CACHE:
            _WARNED.popitem(last=False)
    if first:
        warnings.warn(message, stacklevel=3)


def layout_for(
    tokenizer: Any,
    tool_specs: Sequence[ToolSpec] | None,
    *,
    messages: Sequence[Any] = (),
    template_tools: str = "fallback",
    chat_template_kwargs: dict[str, Any] | None = None,
    action_format: str | ActionFormat = "hermes",
) -> bool:
    """Whether a conversation is rendered in the text layout (True) or as it is (False): in the
    text layout when the template cannot render tools and the conversation has some (tool specs,
    or tool calls and results in ``messages``), or when it has none and the template cannot
    render it as it is (a system message it refuses or drops, turns of one role in a row it
    refuses).

    Raises:
        TemplateToolsError: ``template_tools="require"`` and the template cannot render tools.
    """
    check_template_tools(template_tools)
    has_tools = bool(tool_specs) or carries_tools(messages)
    roles = _roles(messages)
    if not has_tools and "system" not in roles and len(set(roles)) == len(roles):
        return False  # nothing a probe could change: no probe
    kwargs = dict(chat_template_kwargs or {})
    support = template_support(tokenizer, kwargs)
    fmt = get_action_format(action_format).name
    key = f"{template_key(tokenizer, kwargs)}:{fmt}"
    if not has_tools:
        unfit = _unfit(messages, support)
        if unfit is not None:
            warn_once(
                f"{key}:unfit",
                f"the chat template of {template_name(tokenizer)} cannot render {unfit}: the "
                "conversation is fitted to it (system text at the head of the first user "
                "message, turns of one role merged).",
            )
        return unfit is not None
    if support.native:
        return False
    missing = "the tools argument" if not support.tools else "role='tool' messages"
    if template_tools == "require":
        raise TemplateToolsError(
            f"the chat template of {template_name(tokenizer)} does not render {missing}; with "
            "template_tools='fallback' the tool specs and the calling convention of the "
            f"{fmt!r} action format go into the system message instead."
        )
    where = "system message" if support.system else "first user message"
    warn_once(
        key,
        f"the chat template of {template_name(tokenizer)} does not render {missing}: the tool "
        f"specs and the {fmt!r} action format's calling convention go into the {where}, tool "
        "results into user messages (template_tools='require' refuses such a template "
        "instead).",
    )
    return True


def fit_template(chat: Sequence[dict[str, Any]], support: TemplateSupport) -> list[dict[str, Any]]:
    """``chat`` (role and text messages) fitted to a template: where a system message does not
    survive it, the system text goes at the head of the first user message (a user message of
    its own when there is none); where it demands alternation, consecutive messages of one role
    are merged, their texts joined by a blank line.

    Example:
        >>> chat = [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"},
        ...         {"role": "assistant", "content": "A"}, {"role": "user", "content": "R"},
        ...         {"role": "user", "content": "U"}]
        >>> fit_template(chat, TemplateSupport(False, False, system=False, alternates=True))[::2]
        [{'role': 'user', 'content': 'S\n\nQ'}, {'role': 'user', 'content': 'R\n\nU'}]
    """
    out = [dict(m) for m in chat]
    if not support.system:
        head = "\n\n".join(str(m.get("content") or "") for m in out if m.get("role") == "system")
        out = [m for m in out if m.get("role") != "system"]
        if head:
            first = next((i for i, m in enumerate(out) if m.get("role") == "user"), None)
            if first is None:
                out.insert(0, {"role": "user", "content": head})
            else:
                text = str(out[first].get("content") or "")
                out[first] = {**out[first], "content": f"{head}\n\n{text}" if text else head}
    if support.alternates:
        merged: list[dict[str, Any]] = []
        for message in out:
            if merged and merged[-1].get("role") == message.get("role"):
                texts = [str(merged[-1].get("content") or ""), str(message.get("content") or "")]
                merged[-1] = {**merged[-1], "content": "\n\n".join(t for t in texts if t)}
            else:
                merged.append(message)
        out = merged
    return out


def text_layout(
    messages: Sequence[Message],
    tool_specs: Sequence[ToolSpec] | None,
    action_format: str | ActionFormat = "hermes",
    support: TemplateSupport | None = None,
) -> list[dict[str, Any]]:
    """The conversation in the text layout (see the module docstring), fitted to ``support``'s
    template when given (:func:`fit_template`); pass no ``tools`` to the template with it."""
    chat = build_messages(messages, tool_specs or [], get_action_format(action_format))
    return chat if support is None else fit_template(chat, support)


def _short_id(call_id: Any) -> Any:
    return short_call_id(call_id) if isinstance(call_id, str) else call_id


def short_call_ids(messages: Sequence[Any]) -> list[Any]:
    """``messages`` with every tool-call id (a tool result's ``tool_call_id``, an assistant's
    ``tool_calls[].id``) made 9 alphanumerics: kept when it is, else the first 9 hex digits of
    its SHA-256 (one id always maps to one short id, so calls and results still pair).

    Example:
        >>> short_call_ids([{"role": "tool", "tool_call_id": "call_0", "content": "7"}])
        [{'role': 'tool', 'tool_call_id': 'c557a85a0', 'content': '7'}]
    """
    out: list[Any] = []
    for message in messages:
        if isinstance(message, Mapping) and "tool_call_id" in message:
            message = {**message, "tool_call_id": _short_id(message["tool_call_id"])}
        calls = message.get("tool_calls") if isinstance(message, Mapping) else None
        if isinstance(calls, list):
            message = {
                **message,
                "tool_calls": [
                    {**c, "id": _short_id(c["id"])} if isinstance(c, Mapping) and "id" in c else c
                    for c in calls
                ],
            }
        out.append(message)
    return out
