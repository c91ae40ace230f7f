"""The action format a chat template teaches, and the one an episode uses.

A template that renders tools natively (:class:`~llm_gym.policies.template_tools.TemplateSupport`
``.native``) also shows the model how to call them: Qwen2.5's writes ``<tool_call>`` JSON
(``hermes``), Llama 3.1's a bare ``{"name": ..., "parameters": ...}`` reply, Mistral v0.3's
``[TOOL_CALLS] [...]``, Qwen3-Coder's ``<function=...>`` XML, gpt-oss's harmony channels. The
model was tuned to write what its template writes, so an episode parses its replies with that
format. :func:`template_format` finds it from the template itself, never from the model's name:
the probe conversation (a user turn and an assistant turn calling the probe tool with
``{"key": "probe"}``, the probe spec as ``tools``) is rendered, the assistant turn's text is
cut out of it (:func:`probe_reply`: what follows the generation prompt, end-of-turn tokens
dropped), and the format is the registered one whose ``parse`` of that text gives back exactly
the probe call, name and arguments (:func:`recognise_format`; the registry's order breaks a
tie). Probed once per template and template arguments.

:func:`episode_format` chooses an episode's format: ``"auto"`` takes the template's; a named
format (the user's, or one the environment pins) is kept, with a warning naming both when the
template teaches another (an error under ``template_tools="require"``). A template that cannot
render tools, or renders them in a convention no registered format reads, keeps the
environment's format (the text layout teaches it). Each format chosen for a template is logged
once, with why (logger ``llm_gym.policies.template_format``, level INFO).
"""

from __future__ import annotations

import json
import logging
import threading
import weakref
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

from llm_gym.actions import ACTION_FORMATS, ActionFormat, get_action_format
from llm_gym.errors import InvalidArgumentError
from llm_gym.policies.chat import control_token_strings
from llm_gym.policies.template_render import apply_template, template_errors, template_name
from llm_gym.policies.template_tools import (
    PROBE_CALL_ID,
    PROBE_SPEC,
    TemplateToolsError,
    check_template_tools,
    template_key,
    template_support,
    warn_once,
)

__all__ = [
    "AUTO",
    "PROBE_ARGUMENTS",
    "episode_format",
    "probe_reply",
    "recognise_format",
    "require_format_choice",
    "template_format",
]

AUTO = "auto"
"""The action format a policy's chat template teaches, else the environment's."""
PROBE_ARGUMENTS = {"key": "probe"}
"""The arguments of the probe call: a format that reads the template's rendering of the call
back must give exactly these."""
_PROBE_USER = "llm_gym_probe_user_5813"
_PROBE_PLAIN = "llm_gym_probe_reply_2957"
_CACHE = 32
_LOGGED_CACHE = 256

logger = logging.getLogger(__name__)

_FOUND: weakref.WeakKeyDictionary[Any, OrderedDict[str, str | None]]
_FOUND = weakref.WeakKeyDictionary()
_LOGGED: OrderedDict[str, None] = OrderedDict()
_LOCK = threading.Lock()


def require_format_choice(action_format: object) -> str | ActionFormat:
    """``action_format`` when it is ``"auto"``, a registered name or an :class:`ActionFormat`;
    else a clear error (an unknown name suggests the closest)."""
    if action_format == AUTO or isinstance(action_format, ActionFormat):
        return action_format  # type: ignore[return-value]
    if not isinstance(action_format, str):
        raise InvalidArgumentError(
            "action_format must be 'auto' (the chat template's own format) or a registered "
            f"format name ({sorted(ACTION_FORMATS)}), actual value: {action_format!r:.60}."
        )
    get_action_format(action_format)  # raises UnknownNameError with a suggestion
    return action_format


def _probe_name() -> str:
    return str(PROBE_SPEC["function"]["name"])


def _reads_probe_call(fmt: ActionFormat, text: str) -> bool:
    try:
        parsed = fmt.parse(text, call_id_prefix="probe")
    except Exception:  # a third-party format that raises reads nothing
        return False
    calls = parsed.tool_calls
    if len(calls) != 1 or calls[0]["function"]["name"] != _probe_name():
        return False
    try:
        return json.loads(calls[0]["function"]["arguments"]) == PROBE_ARGUMENTS
    except (TypeError, ValueError):
        return False


def recognise_format(
    reply: str, formats: Mapping[str, type[ActionFormat]] | None = None
) -> str | None:
    """The name of the first format of ``formats`` (default: the registry, in its order) whose
    ``parse`` of ``reply`` (a template's rendering of the probe call, :func:`probe_reply`) gives
    one call of the probe tool with :data:`PROBE_ARGUMENTS`; None when none does.

    Example:
        >>> reply = '<tool_call>\\n{"name": "llm_gym_probe_tool", "arguments": {"key": "probe"}}'
        >>> recognise_format(reply + "\\n</tool_call>")
        'hermes'
        >>> recognise_format('{"name": "llm_gym_probe_tool", "arguments": {"key": "probe"}}')
        'json'
        >>> recognise_format("I would call llm_gym_probe_tool.") is None
        True
    """
    for name, cls in (ACTION_FORMATS if formats is None else formats).items():
        try:
            fmt = cls()
        except Exception:  # a format that needs arguments is not probed
            continue
        if _reads_probe_call(fmt, reply):
            return name
    return None


def _strip_end(text: str, control: Sequence[str]) -> str:
    """``text`` without the control tokens and whitespace at its end (end-of-turn tokens)."""
    text = text.rstrip()
    changed = True
    while changed:
        changed = False
        for token in control:
            if text.endswith(token):
                text, changed = text[: -len(token)].rstrip(), True
    return text


def probe_reply(tokenizer: Any, chat_template_kwargs: dict[str, Any] | None = None) -> str | None:
    """The text the template writes for an assistant turn that calls the probe tool with
    :data:`PROBE_ARGUMENTS`: the rendering of ``[user, assistant]`` past the rendering of
    ``[user]`` with the generation prompt (past the user's text where that is no prefix of it),
    without what ends a plain assistant turn (the template's text after a reply's content:
    ``<|eot_id|>``, ``</s>``, ...) and the control tokens and whitespace at its end. None when
    the template refuses the conversation (an error of its own)."""
    kwargs = dict(chat_template_kwargs or {})
    user = {"role": "user", "content": _PROBE_USER}
    call = {
        "id": PROBE_CALL_ID,
        "type": "function",
        "function": {"name": _probe_name(), "arguments": dict(PROBE_ARGUMENTS)},
    }
    calling = {"role": "assistant", "content": "", "tool_calls": [call]}
    try:
        head = apply_template(
            tokenizer, [user], tools=[PROBE_SPEC], add_generation_prompt=True,
            template_kwargs=kwargs,
        )  # fmt: skip
        whole = apply_template(
            tokenizer, [user, calling], tools=[PROBE_SPEC], add_generation_prompt=False,
            template_kwargs=kwargs,
        )  # fmt: skip
        plain = apply_template(
            tokenizer, [user, {"role": "assistant", "content": _PROBE_PLAIN}], tools=[PROBE_SPEC],
            add_generation_prompt=False, template_kwargs=kwargs,
        )  # fmt: skip
    except template_errors():
        return None
    end = plain.rpartition(_PROBE_PLAIN)[2].strip() if _PROBE_PLAIN in plain else ""
    if whole.startswith(head):
        reply = whole[len(head) :]
    elif _PROBE_USER in whole:
        reply = whole[whole.rindex(_PROBE_USER) + len(_PROBE_USER) :]
    else:
        return None
    reply = reply.rstrip()
    if end and reply.endswith(end):  # the end of a plain assistant turn: not the model's text
        reply = reply[: -len(end)]
    return _strip_end(reply, control_token_strings(tokenizer))


def template_format(
    tokenizer: Any, chat_template_kwargs: dict[str, Any] | None = None
) -> str | None:
    """The registered action format ``tokenizer``'s chat template teaches: None when it cannot
    render tools natively, or renders a call in a convention no registered format reads back
    (see the module docstring). Probed once per template and template arguments (the 32 most
    recently used kept per tokenizer).

    Raises:
        TemplateTimeoutError: a probe ran past the render deadline.
    """
    kwargs = dict(chat_template_kwargs or {})
    key = f"{template_key(tokenizer, kwargs)}:{','.join(ACTION_FORMATS)}"
    with _LOCK:
        try:
            entries = _FOUND.get(tokenizer)
        except TypeError:  # not weak-referenceable: probed each time
            entries = None
        if entries is not None and key in entries:
            entries.move_to_end(key)
            return entries[key]
    found = None
    if template_support(tokenizer, kwargs).native:
        reply = probe_reply(tokenizer, kwargs)
        found = None if reply is None else recognise_format(reply)
    with _LOCK:
        try:
            entries = _FOUND.setdefault(tokenizer, OrderedDict())
        except TypeError:
            return found
        entries[key] = found
        while len(entries) > _CACHE:
            entries.popitem(last=False)
    return found


def _log_once(key: str, message: str) -> None:
    with _LOCK:
        first = key not in _LOGGED
        _LOGGED[key] = None
        _LOGGED.move_to_end(key)
        while len(_LOGGED) > _LOGGED_CACHE:
            _LOGGED.popitem(last=False)
    if first:
        logger.info(message)


def episode_format(
    action_format: str | ActionFormat,
    tokenizer: Any,
    *,
    env_format: str | ActionFormat = "hermes",
    template_tools: str = "fallback",
    chat_template_kwargs: dict[str, Any] | None = None,
) -> ActionFormat:
    """The action format an episode parses its replies with (and writes its tool calls in).

    Args:
        action_format: ``"auto"``: the format ``tokenizer``'s template teaches
            (:func:`template_format`), else ``env_format``. A name or an instance: that format
            (pinned), with a warning naming both when the template teaches another.
        tokenizer: The policy's tokenizer; None (a policy without one: scripted, an endpoint)
            gives ``env_format`` for ``"auto"``.
        env_format: The environment's format: what the text layout teaches a template that
            cannot render tools.
        template_tools: ``"require"`` makes a pinned format the template contradicts an error.
        chat_template_kwargs: The template arguments the episode renders with.

    Raises:
        TemplateToolsError: ``template_tools="require"`` and the pinned format is not the one
            the template teaches.
        UnknownNameError: a name that is not registered.
    """
    check_template_tools(template_tools)
    require_format_choice(action_format)
    fallback = get_action_format(env_format)
    if tokenizer is None or getattr(tokenizer, "chat_template", None) is None:
        return fallback if action_format == AUTO else get_action_format(action_format)
    taught = template_format(tokenizer, chat_template_kwargs)
    name = template_name(tokenizer)
    key = template_key(tokenizer, dict(chat_template_kwargs or {}))
    if action_format != AUTO:
        pinned = get_action_format(action_format)
        if taught is not None and taught != pinned.name:
            message = (
                f"action_format={pinned.name!r} is pinned, but the chat template of {name} "
                f"teaches the {taught!r} format: the model is told to call tools one way and "
                f"its replies are parsed another. Pass action_format='auto' (or {taught!r}) to "
                "parse what the template teaches."
            )
            if template_tools == "require":
                raise TemplateToolsError(message + " (template_tools='require' refuses it.)")
            warn_once(f"{key}:pinned:{pinned.name}:{taught}", message)
        source = "pinned, " + (
            "as its chat template teaches"
            if taught == pinned.name
            else "its chat template teaches none"
            if taught is None
            else f"over the {taught!r} its chat template teaches"
        )
        _log_once(f"{key}:{pinned.name}", f"{name}: action format {pinned.name!r} ({source})")
        return pinned
    if taught is not None:
        _log_once(
            f"{key}:{taught}",
            f"{name}: action format {taught!r}, the one its chat template teaches",
        )
        return get_action_format(taught)
    if template_support(tokenizer, chat_template_kwargs).native:
        warn_once(
            f"{key}:unread:{fallback.name}",
            f"the chat template of {name} renders tool calls in a convention no registered "
            f"action format reads back ({sorted(ACTION_FORMATS)}): episodes parse the "
            f"environment's {fallback.name!r} format. Register a format for it, or pin one "
            "with action_format=...",
        )
    _log_once(
        f"{key}:{fallback.name}",
        f"{name}: action format {fallback.name!r}, the environment's (its chat template "
        "teaches none)",
    )
    return fallback
