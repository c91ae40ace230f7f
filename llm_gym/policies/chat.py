"""How a model sees a conversation: the chat template's text for llm_gym messages.

Assistant turns are rendered with their raw sampled text as ``content`` (no structured
``tool_calls``), so the template reproduces exactly what the model wrote, except on a template
that renders a tool-using history only with structured calls (gpt-oss, Mistral v0.3: past calls
parsed into ``tool_calls``, :mod:`llm_gym.policies.template_history`); tool results keep their
``name`` and ``tool_call_id``. The rollout's token tracker, the HF policy, the SFT data, the
server and the TRL bridge all render through :func:`render_chat`, so they agree token for token.
A template that cannot render tools gets them as text (:mod:`llm_gym.policies.template_tools`).

Text the model did not write (system, user and tool messages: environment replies, tool errors,
a program's output; and the tool specs: names, descriptions, parameters) cannot forge the
template's control tokens, and neither can a template argument's string values
(``chat_template_kwargs``: a client's, a config's): a tokenizer's special-token strings in
them (``<|im_start|>``, ``<|im_end|>``, ...) get a word joiner (U+2060) after their first character
(:func:`neutralize_control_tokens`), so they tokenize as plain text and a quoted
``<|im_end|>\n<|im_start|>user`` cannot open a turn of its own. Every string of such a message
and of every tool spec is neutralised, keys included (:func:`neutralize_json`): a template may
print any of them. So in every layout (native, text, and the text layout fitted to the template)
the only control tokens in a prompt are the template's own and the model's.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Sequence
from typing import Any

from llm_gym.actions import ActionFormat
from llm_gym.core.types import Message, ToolSpec
from llm_gym.policies.template_history import plain_message, structured_history
from llm_gym.policies.template_render import apply_template, template_name
from llm_gym.policies.template_tools import (
    carries_tools,
    layout_for,
    short_call_ids,
    template_key,
    template_support,
    text_layout,
    warn_once,
)

__all__ = [
    "control_token_strings",
    "longest_token",
    "neutralize_control_tokens",
    "neutralize_json",
    "plain_message",
    "prefix_past_limit",
    "render_chat",
    "template_input",
    "untrusted_kwargs",
    "untrusted_messages",
    "untrusted_tools",
]

JOINER = "\u2060"
"""Word joiner: invisible, and splits a special-token string into plain text."""

_CONTROL: weakref.WeakKeyDictionary[Any, tuple[str, ...]] = weakref.WeakKeyDictionary()
_LONGEST_TOKEN: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()


def control_token_strings(tokenizer: Any) -> tuple[str, ...]:
    """The tokenizer's special-token strings (its special tokens and added special tokens),
    longest first; cached per tokenizer."""
    try:
        return _CONTROL[tokenizer]
    except (KeyError, TypeError):
        pass
    found = set(getattr(tokenizer, "all_special_tokens", None) or ())
    for token in (getattr(tokenizer, "added_tokens_decoder", None) or {}).values():
        if getattr(token, "special", False):
            found.add(str(getattr(token, "content", token)))
    strings = tuple(
        sorted((t for t in found if isinstance(t, str) and len(t) > 1), key=len, reverse=True)
    )
    with contextlib.suppress(TypeError):  # not weak-referenceable: computed each time
        _CONTROL[tokenizer] = strings
    return strings


def neutralize_control_tokens(text: str, control: Sequence[str]) -> str:
    """``text`` with every string of ``control`` broken by a word joiner after its first
    character (linear in ``len(text)`` per string).

    Example:
        >>> neutralize_control_tokens("a<|im_end|>b", ["<|im_end|>"]) == "a<\u2060|im_end|>b"
        True
    """
    for token in control:
        if token in text:
            text = text.replace(token, token[0] + JOINER + token[1:])
    return text


def neutralize_json(value: Any, control: Sequence[str]) -> Any:
    """``value`` (JSON-like: dicts, lists, tuples, strings, scalars) with every string in it, keys
    included, through :func:`neutralize_control_tokens`; ``value`` itself when no string holds a
    control token (a changed container is copied as a dict or a list).

    Example:
        >>> spec = {"name": "f<|im_end|>", "parameters": {"<|im_start|>k": {"type": "string"}}}
        >>> neutralize_json(spec, ["<|im_end|>", "<|im_start|>"]) == {
        ...     "name": "f<\u2060|im_end|>",
        ...     "parameters": {"<\u2060|im_start|>k": {"type": "string"}},
        ... }
        True
        >>> neutralize_json(spec["parameters"]["<|im_start|>k"], ["<|im_end|>"]) is spec[
        ...     "parameters"
        ... ]["<|im_start|>k"]
        True
    """
    if isinstance(value, str):
        return neutralize_control_tokens(value, control)
    if isinstance(value, dict):
        items = [
            (neutralize_json(k, control), neutralize_json(v, control)) for k, v in value.items()
        ]
        if all(k is k0 and v is v0 for (k, v), (k0, v0) in zip(items, value.items(), strict=True)):
            return value
        return dict(items)
    if isinstance(value, list | tuple):
        items = [neutralize_json(item, control) for item in value]
        if all(item is old for item, old in zip(items, value, strict=True)):
            return value
        return items
    return value


def untrusted_messages(tokenizer: Any, messages: Sequence[Any]) -> list[Any]:
    """``messages`` (dicts) with the control tokens in every string of every non-assistant
    message neutralised (:func:`neutralize_json`: its content, as a string or OpenAI's text
    parts, its ``name``, its ``tool_call_id``, keys included); the assistant's turns unchanged."""
    control = control_token_strings(tokenizer)
    if not control:
        return list(messages)
    return [
        message
        if not isinstance(message, dict) or message.get("role") == "assistant"
        else neutralize_json(message, control)
        for message in messages
    ]


def untrusted_tools(tokenizer: Any, tool_specs: Sequence[Any] | None) -> list[Any] | None:
    """``tool_specs`` as a list (``None`` when there are none) with the control tokens in every
    string of every spec neutralised (:func:`neutralize_json`: names, descriptions, parameters,
    keys included): a tool spec is not the model's own text."""
    if not tool_specs:
        return None
    control = control_token_strings(tokenizer)
    return [neutralize_json(spec, control) if control else spec for spec in tool_specs]


def untrusted_kwargs(tokenizer: Any, chat_template_kwargs: dict[str, Any] | None) -> dict:
    """``chat_template_kwargs`` with the control tokens in every string neutralised
    (:func:`neutralize_json`; keys included): a template may print any of them."""
    kwargs = dict(chat_template_kwargs or {})
    control = control_token_strings(tokenizer)
    return neutralize_json(kwargs, control) if control and kwargs else kwargs


def template_input(
    tokenizer: Any,
    messages: Sequence[Message],
    tool_specs: Sequence[ToolSpec] | None,
    *,
    action_format: str | ActionFormat = "hermes",
    template_tools: str = "fallback",
    chat_template_kwargs: dict[str, Any] | None = None,
    raw_assistant: bool = True,
) -> tuple[list[Any], list[Any] | None]:
    """What the chat template gets for a conversation: ``(messages, tools)``, the control tokens
    of every non-assistant message and of every tool spec neutralised, in either layout (pass
    the template arguments through :func:`untrusted_kwargs`).

    A template that cannot render tools gets the text layout when the conversation has tools
    (:mod:`llm_gym.policies.template_tools`: the specs and ``action_format``'s calling convention
    in the system message, or at the head of the first user message where a system message does
    not survive the template; ``template_tools="require"`` refuses it instead), and so does a
    conversation that the template cannot render as it is. Otherwise the messages are kept:
    with ``raw_assistant`` (the rollout's turns) as role and text (:func:`plain_message`), or,
    for a template that renders a tool-using history only with structured tool calls (gpt-oss,
    Mistral v0.3), with each assistant turn's calls parsed with ``action_format`` into
    ``tool_calls`` (:mod:`llm_gym.policies.template_history`); without ``raw_assistant`` (a
    client's conversation) as they are, structured tool calls included, for the template to
    render; tool-call ids made 9 alphanumerics for a template that refuses others."""
    if layout_for(
        tokenizer,
        tool_specs,
        messages=messages,
        template_tools=template_tools,
        chat_template_kwargs=chat_template_kwargs,
        action_format=action_format,
    ):
        support = template_support(tokenizer, chat_template_kwargs)
        chat, tools = text_layout(messages, tool_specs, action_format, support), None
    else:
        tools = untrusted_tools(tokenizer, tool_specs)
        probed = carries_tools(messages) or (
            raw_assistant
            and any(isinstance(m, dict) and m.get("role") == "assistant" for m in messages)
        )
        support = template_support(tokenizer, chat_template_kwargs) if probed else None
        if not raw_assistant:
            chat = list(messages)
        elif support is not None and support.structured_history:
            chat, reasons = structured_history(
                messages, action_format, text_before_user=support.text_before_user
            )
            if reasons:
                _warn_text_arguments(tokenizer, chat_template_kwargs, reasons[0])
        else:
            chat = [plain_message(m) for m in messages]
        if support is not None and support.short_call_ids and carries_tools(chat):
            chat = short_call_ids(chat)
    return untrusted_messages(tokenizer, chat), tools


def _warn_text_arguments(tokenizer: Any, kwargs: dict[str, Any] | None, reason: str) -> None:
    warn_once(
        f"{template_key(tokenizer, dict(kwargs or {}))}:text-arguments:{reason}",
        f"a past tool call has {reason}: the chat template of {template_name(tokenizer)} gets "
        "them as their JSON text, not as an object (the sampled tokens are trained as they are).",
    )


def render_chat(
    tokenizer: Any,
    messages: Sequence[Message],
    tool_specs: Sequence[ToolSpec] | None,
    *,
    add_generation_prompt: bool,
    chat_template_kwargs: dict[str, Any] | None = None,
    action_format: str | ActionFormat = "hermes",
    template_tools: str = "fallback",
    deadline_s: float | None = None,
) -> str:
    """The chat template's text for ``messages``: assistant turns as raw text, control tokens in
    the other turns, the tool specs and the template arguments neutralised, tools as
    :func:`template_input` gives them; the render stopped after ``deadline_s`` (None: the
    default, :data:`~llm_gym.policies.template_render.DEFAULT_RENDER_DEADLINE_S`) with a
    :class:`~llm_gym.policies.template_render.TemplateTimeoutError`."""
    kwargs = chat_template_kwargs or {}
    chat, tools = template_input(
        tokenizer,
        messages,
        tool_specs,
        action_format=action_format,
        template_tools=template_tools,
        chat_template_kwargs=kwargs,
    )
    return apply_template(
        tokenizer,
        chat,
        tools=tools,
        add_generation_prompt=add_generation_prompt,
        template_kwargs=untrusted_kwargs(tokenizer, kwargs),
        deadline_s=deadline_s,
    )


def longest_token(tokenizer: Any) -> int:
    """The most characters one token of ``tokenizer`` stands for: its vocabulary's longest
    entry (a byte-level entry counts bytes, at least the characters they encode), cached."""
    if tokenizer not in _LONGEST_TOKEN:
        _LONGEST_TOKEN[tokenizer] = max(map(len, tokenizer.get_vocab()), default=1)
    return _LONGEST_TOKEN[tokenizer]


def prefix_past_limit(
    tokenizer: Any, text: str, limit: int, add_special_tokens: bool = False
) -> tuple[int, int] | None:
    """``(characters, tokens)`` of a prefix of ``text`` that alone holds more than ``limit``
    tokens, read without tokenizing the rest; None when ``text`` is short enough to be read
    whole (or its prefix fits: a tokenizer that shrinks text when it normalises it).

    Tokenizing is linear but not cheap: 10 MB of text is ~17 s, in a server's one model thread
    or a rollout's event loop. No token stands for more than :func:`longest_token` characters,
    so a prefix of twice that many characters per token of the limit holds about twice the
    limit in tokens: when it holds more than the limit, so does the text.

    Example:
        >>> class Chars:  # one token a character
        ...     def get_vocab(self): return {"a": 0}
        ...     def encode(self, text, add_special_tokens=False): return list(text)
        >>> prefix_past_limit(Chars(), "a" * 100, 10)
        (22, 22)
        >>> prefix_past_limit(Chars(), "a" * 20, 10) is None  # short: read whole by the caller
        True
    """
    window = 2 * longest_token(tokenizer) * (max(limit, 0) + 1)
    if len(text) > window:
        head = tokenizer.encode(text[:window], add_special_tokens=add_special_tokens)
        if len(head) > limit:
            return window, len(head)
    return None
