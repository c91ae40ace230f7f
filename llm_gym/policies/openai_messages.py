"""An episode's conversation as the ``messages`` of a chat-completions request, and back.

**Tools.** With ``send_tools=False`` (the default) the model sees the tools as text, the way the
episode's action format writes them: ``action_format.render_tool_specs(tool_specs)`` is appended
to the first system message (a system message holding only it is inserted when the conversation
has none), earlier assistant turns are sent as the text the model wrote
(``action_format.render_message``: content plus rendered tool calls), and tool results as
``user`` messages rendered with ``action_format.render_tool_result`` (consecutive results merged
into one message, as the Qwen/Hermes chat layout does). This works with any plain chat model and
keeps the prompt identical to what a local ``HFPolicy`` renders for Hermes-style models.
With ``send_tools=True`` the tool specs go in the request's native ``tools`` field, assistant turns
carry native ``tool_calls`` and tool results are ``role="tool"`` messages with their
``tool_call_id``; the server's chat template then renders them. Either way, when a response holds
native ``tool_calls`` (servers that parse tool calls out of the text do this even without
``tools``) they are rendered back into text with ``action_format.render_tool_calls``
(:func:`reply_text`), so the episode loop parses them like any other reply.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from llm_gym.actions import ActionFormat
from llm_gym.core.types import Message, ToolCall

__all__ = ["DEFAULT_SEND_TOOLS", "build_messages", "reply_text"]

DEFAULT_SEND_TOOLS = False
"""Tools as text in the system prompt (False) or in the native ``tools`` field (True)."""


def _tool_results_text(messages: Sequence[Message], action_format: ActionFormat) -> str:
    return "\n".join(action_format.render_tool_result(m) for m in messages)


def build_messages(
    messages: Sequence[Message],
    tool_specs: Sequence[Any],
    action_format: ActionFormat,
    *,
    send_tools: bool = DEFAULT_SEND_TOOLS,
) -> list[dict[str, Any]]:
    """The ``messages`` of a chat-completions request for an episode's conversation.

    See the module docstring (**Tools**) for how tools, assistant turns and tool results are
    written with and without ``send_tools``.
    """
    out: list[dict[str, Any]] = []
    pending_results: list[Message] = []

    def flush_results() -> None:
        if pending_results:
            out.append(
                {"role": "user", "content": _tool_results_text(pending_results, action_format)}
            )
            pending_results.clear()

    for message in messages:
        role = message.get("role", "user")
        content = message.get("content") or ""
        if role == "tool":
            if send_tools:
                item: dict[str, Any] = {"role": "tool", "content": content}
                if message.get("tool_call_id"):
                    item["tool_call_id"] = message["tool_call_id"]
                out.append(item)
            else:
                pending_results.append(message)
            continue
        flush_results()
        if role == "assistant":
            if send_tools:
                item = {"role": "assistant", "content": content}
                if message.get("tool_calls"):
                    item["tool_calls"] = [dict(call) for call in message["tool_calls"]]
                out.append(item)
            else:
                out.append({"role": "assistant", "content": action_format.render_message(message)})
            continue
        out.append({"role": role, "content": content})
    flush_results()
    if not send_tools and tool_specs:
        tools_text = action_format.render_tool_specs(tool_specs)
        if tools_text:
            if out and out[0]["role"] == "system":
                system = out[0]["content"]
                out[0] = {
                    "role": "system",
                    "content": f"{system}\n\n{tools_text}" if system else tools_text,
                }
            else:
                out.insert(0, {"role": "system", "content": tools_text})
    return out


def reply_text(message: Mapping[str, Any], action_format: ActionFormat) -> tuple[str, str | None]:
    """The text an episode sees for a response's ``message``, and why its tool calls could not be
    rendered (``None`` when they could or there were none).

    Content parts are joined; native ``tool_calls`` are rendered after the content with
    ``action_format.render_tool_calls``. A malformed call (arguments that are not a JSON object,
    say) is the model's own: the episode then sees the raw calls as JSON text.
    """
    content = message.get("content") or ""
    if isinstance(content, list):  # content parts
        content = "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    tool_calls: list[ToolCall] = message.get("tool_calls") or []
    text = str(content)
    if not tool_calls:
        return text, None
    try:
        return action_format.render_tool_calls(tool_calls, text), None
    except (ValueError, TypeError, AttributeError, RecursionError) as exc:  # InvalidArgumentError
        try:
            raw = json.dumps(tool_calls, ensure_ascii=False, default=str)
        except (ValueError, RecursionError):
            raw = "[tool calls nested too deeply to show]"
        return (f"{text}\n{raw}" if text else raw), str(exc)
