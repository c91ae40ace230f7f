"""Tools shown to every model: a chat template that ignores ``tools`` gets them as text.

Many chat templates have no tools block (SmolLM2, Llama 2, Mistral v0.1, Phi-3, most base
models): ``apply_chat_template(messages, tools=specs)`` renders exactly what it renders
without them, and the model is never told that tools exist. :func:`template_support` finds out
once per template, by rendering probe conversations:

* ``tools``: a probe tool's name appears in the rendering with ``tools``;
* ``tool_role``: a ``role="tool"`` message's content appears in the rendering.

A template that does both gets the conversation as it is (the *native* layout). Any other gets
the *text* layout (:func:`text_layout`) whenever the conversation has tools (specs, or tool calls
and results in its history): the episode's action format writes the tool specs and
its calling convention into the system message (``render_tool_specs``: for hermes the
``<tools>...</tools>`` block with its instructions; a system message holding only it is inserted
when the conversation has none), earlier assistant turns as the text the model wrote
(``render_message``: content plus rendered tool calls) and tool results as ``user`` messages
(``render_tool_result``, consecutive results merged into one). That is the layout
:class:`~llm_gym.policies.OpenAIPolicy` sends a plain chat model, so a local model and the same
model behind an endpoint see the same text.

The first time a template gets the text layout a warning says so; ``template_tools="require"``
refuses such a template instead (:class:`TemplateToolsError`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
import warnings
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from llm_gym.actions import ActionFormat, get_action_format
from llm_gym.core.types import Message, ToolSpec
from llm_gym.errors import InvalidArgumentError, LlmGymError
from llm_gym.policies.openai_messages import build_messages

__all__ = [
    "PROBE_SPEC",
    "TEMPLATE_TOOLS_MODES",
    "TemplateSupport",
    "TemplateToolsError",
    "carries_tools",
    "check_template_tools",
    "layout_for",
    "template_support",
    "text_layout",
]

TEMPLATE_TOOLS_MODES = ("fallback", "require")
"""``fallback``: a template without tools gets the text layout (warned once); ``require``:
such a template is refused."""

_PROBE_NAME = "llm_gym_probe_tool"
_PROBE_RESULT = "llm_gym_probe_result_7351"
PROBE_SPEC: dict[str, Any] = {  # a tool spec of no consequence: what probes render
    "type": "function",
    "function": {
        "name": _PROBE_NAME,
        "description": "Probe.",
        "parameters": {"type": "object", "properties": {"key": {"type": "string"}}},
    },
}
_PROBE_CALL = {
    "id": "call_0",
    "type": "function",
    "function": {"name": _PROBE_NAME, "arguments": {"key": "a"}},
}


class TemplateToolsError(LlmGymError, ValueError):
    """A chat template that cannot render tools, under ``template_tools="require"``."""


@dataclass(frozen=True)
class TemplateSupport:
    """What a chat template renders of a tool-using conversation."""

    tools: bool
    """The ``tools`` argument (the specs) reaches the rendering."""
    tool_role: bool
    """A ``role="tool"`` message's content reaches the rendering."""

    @property
    def native(self) -> bool:
        """Both: the conversation is rendered as it is."""
        return self.tools and self.tool_role


_SUPPORT: weakref.WeakKeyDictionary[Any, dict[str, TemplateSupport]]
_SUPPORT = weakref.WeakKeyDictionary()
_WARNED: set[str] = set()
_LOCK = threading.Lock()


def _render(tokenizer: Any, messages: list[dict[str, Any]], tools: Any, kwargs: dict) -> str:
    return tokenizer.apply_chat_template(
        messages, tools=tools, tokenize=False, add_generation_prompt=True, **kwargs
    )


def _shows(tokenizer: Any, marker: str, cases: list[tuple[list, Any]], kwargs: dict) -> bool:
    for messages, tools in cases:
        try:
            if marker in _render(tokenizer, messages, tools, kwargs):
                return True
        except Exception:  # a template that rejects the probe shows nothing of it
            continue
    return False


def _template_key(tokenizer: Any, kwargs: dict[str, Any]) -> str:
    template = getattr(tokenizer, "chat_template", None)
    try:
        text = json.dumps([template, kwargs], sort_keys=True, default=repr)
    except (TypeError, ValueError):
        text = repr((template, sorted(kwargs)))
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def template_support(
    tokenizer: Any, chat_template_kwargs: dict[str, Any] | None = None
) -> TemplateSupport:
    """What ``tokenizer``'s chat template renders of tools and tool results (probed once per
    template and template arguments, cached per tokenizer)."""
    kwargs = dict(chat_template_kwargs or {})
    key = _template_key(tokenizer, kwargs)
    with contextlib.suppress(TypeError):
        found = _SUPPORT.get(tokenizer, {}).get(key)
        if found is not None:
            return found
    user = {"role": "user", "content": "Hi."}
    tools = _shows(tokenizer, _PROBE_NAME, [([user], [PROBE_SPEC])], kwargs)
    result = {
        "role": "tool",
        "content": _PROBE_RESULT,
        "name": _PROBE_NAME,
        "tool_call_id": "call_0",
    }
    calling = {"role": "assistant", "content": "", "tool_calls": [_PROBE_CALL]}
    plain = {"role": "assistant", "content": "Let me look."}
    specs = [PROBE_SPEC] if tools else None
    tool_role = _shows(
        tokenizer,
        _PROBE_RESULT,
        [([user, calling, result], specs), ([user, plain, result], specs)],
        kwargs,
    )
    support = TemplateSupport(tools=tools, tool_role=tool_role)
    with contextlib.suppress(TypeError):  # not weak-referenceable: probed each time
        _SUPPORT.setdefault(tokenizer, {})[key] = support
    return support


def check_template_tools(mode: object) -> str:
    """``mode`` when it is one of :data:`TEMPLATE_TOOLS_MODES`, else a clear error."""
    if not isinstance(mode, str) or mode not in TEMPLATE_TOOLS_MODES:
        raise InvalidArgumentError(
            f"template_tools must be one of {list(TEMPLATE_TOOLS_MODES)}, actual value: "
            f"{mode!r:.60}."
        )
    return mode


def _name(tokenizer: Any) -> str:
    return str(getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__)


def carries_tools(messages: Sequence[Any]) -> bool:
    """Whether a conversation holds tool calls or tool results (which a template without a
    tool role would drop even when the request lists no tools)."""
    return any(
        isinstance(m, Mapping) and (m.get("role") == "tool" or m.get("tool_calls"))
        for m in messages
    )


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
    or tool calls and results in ``messages``).

    Raises:
        TemplateToolsError: ``template_tools="require"`` and the template cannot render tools.
    """
    check_template_tools(template_tools)
    if not tool_specs and not carries_tools(messages):
        return False
    kwargs = dict(chat_template_kwargs or {})
    support = template_support(tokenizer, kwargs)
    if support.native:
        return False
    missing = "the tools argument" if not support.tools else "role='tool' messages"
    fmt = get_action_format(action_format).name
    if template_tools == "require":
        raise TemplateToolsError(
            f"the chat template of {_name(tokenizer)} does not render {missing}; with "
            "template_tools='fallback' the tool specs and the calling convention of the "
            f"{fmt!r} action format go into the system message instead."
        )
    key = f"{_template_key(tokenizer, kwargs)}:{fmt}"
    with _LOCK:
        first = key not in _WARNED
        _WARNED.add(key)
    if first:
        warnings.warn(
            f"the chat template of {_name(tokenizer)} does not render {missing}: the tool specs "
            f"and the {fmt!r} action format's calling convention go into the system message, "
            "tool results into user messages (template_tools='require' refuses such a "
            "template instead).",
            stacklevel=2,
        )
    return True


def text_layout(
    messages: Sequence[Message],
    tool_specs: Sequence[ToolSpec] | None,
    action_format: str | ActionFormat = "hermes",
) -> list[dict[str, Any]]:
    """The conversation in the text layout (see the module docstring); pass no ``tools`` to the
    template with it."""
    return build_messages(messages, tool_specs or [], get_action_format(action_format))
