"""How a model sees a conversation: the chat template's text for llm_gym messages.

Assistant turns are rendered with their raw sampled text as ``content`` (no structured
``tool_calls``), so the template reproduces exactly what the model wrote; tool results keep their
``name`` and ``tool_call_id``. The rollout's token tracker, the HF policy and the SFT data all
render through :func:`render_chat`, so they agree token for token.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llm_gym.core.types import Message, ToolSpec

__all__ = ["plain_message", "render_chat"]


def render_chat(
    tokenizer: Any,
    messages: Sequence[Message],
    tool_specs: Sequence[ToolSpec] | None,
    *,
    add_generation_prompt: bool,
    chat_template_kwargs: dict[str, Any] | None = None,
) -> str:
    """The chat template's text for ``messages`` (assistant turns as raw text)."""
    plain = [plain_message(m) for m in messages]
    return tokenizer.apply_chat_template(
        plain,
        tools=list(tool_specs) if tool_specs else None,
        tokenize=False,
        add_generation_prompt=add_generation_prompt,
        **(chat_template_kwargs or {}),
    )


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
