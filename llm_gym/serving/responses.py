"""What :mod:`llm_gym.serving` answers: chat bodies, stream chunks, logprobs, tool calls, SSE.

* :func:`assistant_message` parses the reply with the server's action format when the request
  carried ``tools``: well-formed calls go to ``message.tool_calls`` (``arguments`` a JSON string,
  as OpenAI sends them), ``content`` is the text outside the calls (``null`` when there is none)
  and ``finish_reason`` becomes ``"tool_calls"``. A reply that is not a well-formed call stays
  text in ``content``, and so does a reply that calls a tool the request did not declare (the
  whole reply, its calls of declared tools too): a structured call is always one the client
  can run, and the model's text is kept for the client to read.
* :func:`logprobs_content` writes OpenAI's ``logprobs.content`` list (``token``, ``logprob``,
  ``bytes`` (the UTF-8 of the token's text), ``top_logprobs``).
* :func:`chat_chunk` / :func:`completion_chunk` are the stream's ``data:`` objects and
  :func:`sse` writes one event; a stream ends with :data:`SSE_DONE`.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Collection, Sequence
from typing import Any

from llm_gym.actions import ActionFormat
from llm_gym.serving.generation import TokenOut, TokenText

__all__ = [
    "MIN_LOGPROB",
    "SSE_DONE",
    "assistant_message",
    "chat_body",
    "chat_chunk",
    "completion_chunk",
    "dumps",
    "logprobs_content",
    "new_id",
    "sse",
    "usage",
]

SSE_DONE = b"data: [DONE]\n\n"
"""The last event of every stream."""


def new_id(prefix: str) -> str:
    """``chatcmpl-<hex>`` / ``cmpl-<hex>``."""
    return f"{prefix}-{uuid.uuid4().hex}"


def dumps(payload: Any) -> bytes:
    """Compact UTF-8 JSON (a lone surrogate, never expected, becomes ``?`` rather than a 500)."""
    text = json.dumps(payload, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return text.encode("utf-8", "replace")


def sse(payload: Any) -> bytes:
    """One server-sent event carrying ``payload`` as JSON."""
    return b"data: " + dumps(payload) + b"\n\n"


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


MIN_LOGPROB = -9999.0
"""What a logprob of minus infinity (a token a logits processor masked) is written as (vLLM's)."""


def _token_entry(token_id: int, logprob: float, text: TokenText) -> dict[str, Any]:
    token = text(token_id)
    logprob = logprob if math.isfinite(logprob) else MIN_LOGPROB
    return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8", "replace"))}


def logprobs_content(
    tokens: Sequence[TokenOut], top_logprobs: int, text: TokenText
) -> list[dict[str, Any]]:
    """OpenAI's ``choices[0].logprobs.content`` for ``tokens``."""
    out = []
    for token in tokens:
        entry = _token_entry(token.token_id, token.logprob or 0.0, text)
        entry["top_logprobs"] = [_token_entry(i, v, text) for i, v in token.top[:top_logprobs]]
        out.append(entry)
    return out


def assistant_message(
    text: str,
    finish_reason: str,
    action_format: ActionFormat | None,
    *,
    parallel: bool = True,
    tool_names: Collection[str] | None = None,
) -> tuple[dict[str, Any], str]:
    """The answer's ``message`` and ``finish_reason`` (``action_format`` None: no tool parsing;
    ``parallel`` False: the first call alone, the rest of the reply dropped, as vLLM does;
    ``tool_names``: the request's declared tools, a reply that calls any other stays text;
    None: any name is a call).

    Example:
        >>> from llm_gym.actions import get_action_format
        >>> hermes = get_action_format("hermes")
        >>> reply = 'On it.\\n<tool_call>\\n{"name": "add", "arguments": {"a": 1}}\\n</tool_call>'
        >>> message, finish = assistant_message(reply, "stop", hermes, tool_names={"add"})
        >>> message["content"], message["tool_calls"][0]["function"], finish
        ('On it.', {'name': 'add', 'arguments': '{"a": 1}'}, 'tool_calls')
        >>> message, finish = assistant_message(reply, "stop", hermes, tool_names={"search"})
        >>> message["content"] == reply, "tool_calls" in message, finish
        (True, False, 'stop')
    """
    if action_format is not None:
        parsed = action_format.parse(text)
        calls = parsed.tool_calls if parallel else parsed.tool_calls[:1]
        declared = tool_names is None or all(c["function"]["name"] in tool_names for c in calls)
        if parsed.is_tool_calls and declared:
            content = parsed.message.get("content") or None
            message = {"role": "assistant", "content": content, "tool_calls": calls}
            return message, "tool_calls"
    return {"role": "assistant", "content": text}, finish_reason


def chat_body(
    model_name: str,
    message: dict[str, Any],
    finish_reason: str,
    prompt_tokens: int,
    completion_tokens: int,
    *,
    logprobs: list[dict[str, Any]] | None = None,
    token_ids: tuple[list[int], list[int]] | None = None,
) -> dict[str, Any]:
    """A ``chat.completion`` answer with one choice (``token_ids``: prompt and completion ids,
    vLLM's ``return_token_ids``)."""
    choice: dict[str, Any] = {
        "index": 0,
        "message": message,
        "logprobs": None if logprobs is None else {"content": logprobs, "refusal": None},
        "finish_reason": finish_reason,
    }
    body: dict[str, Any] = {
        "id": new_id("chatcmpl"),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model_name,
        "choices": [choice],
        "usage": usage(prompt_tokens, completion_tokens),
    }
    if token_ids is not None:
        body["prompt_token_ids"], choice["token_ids"] = token_ids
    return body


def chat_chunk(
    head: dict[str, Any],
    delta: dict[str, Any],
    finish_reason: str | None = None,
    logprobs: list[dict[str, Any]] | None = None,
    include_usage: bool = False,
) -> dict[str, Any]:
    """One ``chat.completion.chunk`` (``head``: ``id``, ``created``, ``model``)."""
    chunk: dict[str, Any] = {
        **head,
        "object": "chat.completion.chunk",
        "choices": [
            {
                "index": 0,
                "delta": delta,
                "logprobs": None if logprobs is None else {"content": logprobs, "refusal": None},
                "finish_reason": finish_reason,
            }
        ],
    }
    if include_usage:
        chunk["usage"] = None
    return chunk


def completion_chunk(
    head: dict[str, Any], text: str, finish_reason: str | None = None, include_usage: bool = False
) -> dict[str, Any]:
    """One streamed ``text_completion`` object."""
    chunk: dict[str, Any] = {
        **head,
        "object": "text_completion",
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}],
    }
    if include_usage:
        chunk["usage"] = None
    return chunk
