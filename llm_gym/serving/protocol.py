"""The OpenAI protocol as :mod:`llm_gym.serving.openai_server` reads and writes it.

:func:`parse_chat_request` checks a ``/v1/chat/completions`` body and returns a
:class:`ChatRequest`, :func:`parse_completion_request` a ``/v1/completions`` body and returns a
:class:`CompletionRequest`; both raise :class:`APIError` whose message names the offending field
(the client sees it as ``{"error": {"message", "type", "param", "code"}}``). Unknown fields are
ignored; ``stream=true`` and ``n`` other than 1 are refused. Content parts must be text parts;
a tool call's string ``arguments`` are decoded to an object (chat templates ``tojson`` them),
kept as sent when they are not JSON. :func:`completion_body` writes the chat answer. What needs
the model (token ids in its vocabulary, the context length) is checked by the server.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

__all__ = [
    "MAX_LOGPROBS",
    "ROLES",
    "APIError",
    "ChatRequest",
    "CompletionRequest",
    "bad_request",
    "completion_body",
    "parse_chat_request",
    "parse_completion_request",
]

ROLES = ("system", "user", "assistant", "tool", "developer")
"""The message roles accepted (``developer`` is read as ``system``)."""
MAX_LOGPROBS = 5
"""The most alternatives ``logprobs`` / ``prompt_logprobs`` may ask for (OpenAI's limit)."""


class APIError(Exception):
    """An error answer: its HTTP status and the OpenAI-style error body.

    Args:
        status: The HTTP status.
        message: What went wrong (names the field when one is at fault).
        param: The request field at fault, if any.
        kind: The error ``type`` (``invalid_request_error``, ``server_error``, ...).
        code: A machine-readable code (``model_not_found``, ...), if any.
    """

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        kind: str = "invalid_request_error",
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.kind = kind
        self.code = code

    def body(self) -> dict[str, Any]:
        """``{"error": {"message", "type", "param", "code"}}``."""
        return {
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        }


def bad_request(message: str, param: str | None = None) -> APIError:
    """A 400 :class:`APIError` about ``param``."""
    return APIError(HTTPStatus.BAD_REQUEST, message, param)


@dataclass(frozen=True)
class ChatRequest:
    """A checked ``/v1/chat/completions`` request."""

    messages: list[dict[str, Any]]
    """The conversation, normalised for a chat template (text content, object arguments)."""
    tools: list[dict[str, Any]] | None
    """The ``tools`` field, when given."""
    temperature: float
    """Sampling temperature (0: greedy)."""
    top_p: float
    """Nucleus mass, in (0, 1]."""
    max_tokens: int | None
    """``max_completion_tokens`` or else ``max_tokens`` (None: the server's default)."""
    seed: int | None
    """Reseeds the sampler before the generation."""
    stops: list[str]
    """Stop strings (empty ones dropped)."""
    chat_template_kwargs: dict[str, Any]
    """Extra keyword arguments for the chat template."""


def _text_content(value: Any, field: str) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):  # content parts: only text parts are supported
        texts = []
        for i, part in enumerate(value):
            if not (isinstance(part, dict) and part.get("type") == "text"):
                raise bad_request(
                    f"{field}[{i}] must be a text part {{'type': 'text', ...}}", field
                )
            if not isinstance(part.get("text"), str):
                raise bad_request(f"{field}[{i}].text must be a string", f"{field}[{i}].text")
            texts.append(part["text"])
        return "".join(texts)
    raise bad_request(f"{field} must be a string, a list of text parts or null", field)


def _tool_calls(value: Any, field: str) -> list[dict[str, Any]]:
    if not isinstance(value, list):
        raise bad_request(f"{field} must be a list", field)
    calls = []
    for i, call in enumerate(value):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise bad_request(
                f"{field}[{i}] must be {{'type': 'function', 'function': {{'name': ..., "
                "'arguments': ...}}}",
                f"{field}[{i}]",
            )
        arguments = function.get("arguments", {})
        if isinstance(arguments, str):  # chat templates expect an object (they tojson it)
            # Unparseable: keep the string, the template writes what the client sent.
            with contextlib.suppress(ValueError):
                arguments = json.loads(arguments) if arguments.strip() else {}
        calls.append(
            {
                "id": call.get("id", f"call_{i}"),
                "type": "function",
                "function": {"name": function["name"], "arguments": arguments},
            }
        )
    return calls


def _messages(value: Any) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not value:
        raise bad_request("'messages' must be a non-empty list of message objects", "messages")
    out = []
    for i, message in enumerate(value):
        field = f"messages[{i}]"
        if not isinstance(message, dict):
            raise bad_request(f"{field} must be an object", field)
        role = message.get("role")
        if role not in ROLES:
            raise bad_request(
                f"{field}.role must be one of {', '.join(ROLES)}; got {role!r}", field
            )
        item: dict[str, Any] = {
            "role": "system" if role == "developer" else role,
            "content": _text_content(message.get("content"), f"{field}.content"),
        }
        if role == "assistant" and message.get("tool_calls"):
            item["tool_calls"] = _tool_calls(message["tool_calls"], f"{field}.tool_calls")
        if role == "tool":
            for key in ("tool_call_id", "name"):
                if isinstance(message.get(key), str):
                    item[key] = message[key]
        out.append(item)
    return out


def _number(body: dict[str, Any], key: str, default: float, low: float, high: float) -> float:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise bad_request(f"'{key}' must be a number in [{low:g}, {high:g}]; got {value!r}", key)
    return float(value)


def _positive_int(body: dict[str, Any], key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise bad_request(f"'{key}' must be an integer >= 1; got {value!r}", key)
    return value


def _stops(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value] if value else []
    if isinstance(value, list) and all(isinstance(s, str) for s in value):
        return [s for s in value if s]
    raise bad_request("'stop' must be a string or a list of strings", "stop")


def _check_common(body: Any, model_name: str) -> None:
    """The checks every endpoint shares: a JSON object, this server's model, no stream, n=1."""
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("'model' is required (a string)", "model")
    if model != model_name:
        raise APIError(
            HTTPStatus.NOT_FOUND,
            f"The model {model!r} does not exist; this server serves {model_name!r}.",
            "model",
            code="model_not_found",
        )
    if body.get("stream"):
        raise bad_request(
            "stream=true is not supported by this server; send stream=false", "stream"
        )
    if body.get("n") not in (None, 1):
        raise bad_request(f"'n' must be 1 on this server; got {body.get('n')!r}", "n")


def parse_chat_request(body: Any, model_name: str) -> ChatRequest:
    """Check a ``/v1/chat/completions`` body for a server that serves ``model_name``.

    Raises:
        APIError: 400 naming the first field at fault, or 404 for another model.
    """
    _check_common(body, model_name)
    messages = _messages(body.get("messages"))
    tools = body.get("tools")
    if tools is not None and not (
        isinstance(tools, list) and all(isinstance(t, dict) for t in tools)
    ):
        raise bad_request("'tools' must be a list of tool objects", "tools")
    temperature = _number(body, "temperature", 1.0, 0.0, 100.0)
    top_p = _number(body, "top_p", 1.0, 0.0, 1.0)
    if top_p == 0:
        raise bad_request("'top_p' must be > 0", "top_p")
    max_tokens = _positive_int(body, "max_completion_tokens") or _positive_int(body, "max_tokens")
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise bad_request(f"'seed' must be an integer; got {seed!r}", "seed")
    stops = _stops(body.get("stop"))
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise bad_request("'chat_template_kwargs' must be an object", "chat_template_kwargs")
    return ChatRequest(
        messages=messages,
        tools=tools,
        temperature=temperature,
        top_p=top_p,
        max_tokens=max_tokens,
        seed=seed,
        stops=stops,
        chat_template_kwargs=kwargs,
    )


@dataclass(frozen=True)
class CompletionRequest:
    """A checked ``/v1/completions`` request."""

    prompt: str | list[int]
    """The text to tokenize, or the token ids themselves."""
    max_tokens: int | None
    """Tokens to generate (0 only with ``echo``; None: the server's default)."""
    echo: bool
    """Put the prompt in front of the answer (its text, and its tokens in ``logprobs``)."""
    logprobs: int | None
    """Return the legacy ``logprobs`` object with this many alternatives per token (0..5)."""
    prompt_logprobs: int | None
    """Return vLLM's ``prompt_logprobs`` with this many alternatives per token (0..5)."""
    temperature: float
    """Sampling temperature (0: greedy)."""
    top_p: float
    """Nucleus mass, in (0, 1]."""
    seed: int | None
    """Reseeds the sampler before the generation."""
    add_special_tokens: bool
    """Tokenize a text prompt with the tokenizer's special tokens (BOS, ...); default False."""


def _optional_count(body: dict[str, Any], key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_LOGPROBS:
        raise bad_request(
            f"'{key}' must be an integer in [0, {MAX_LOGPROBS}] or null; got {value!r}", key
        )
    return value


def _flag(body: dict[str, Any], key: str, default: bool) -> bool:
    value = body.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise bad_request(f"'{key}' must be true or false; got {value!r}", key)
    return value


def parse_completion_request(body: Any, model_name: str) -> CompletionRequest:
    """Check a ``/v1/completions`` body (legacy completions, with vLLM's ``prompt_logprobs``).

    ``prompt`` is a string or a non-empty list of token ids (batches are refused); ``stop`` is
    refused (it would cut the logprobs out of line with the text).

    Raises:
        APIError: 400 naming the first field at fault, or 404 for another model.
    """
    _check_common(body, model_name)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        if any(isinstance(t, bool) or t < 0 for t in prompt):
            raise bad_request("'prompt' token ids must be integers >= 0", "prompt")
    elif not isinstance(prompt, str) or not prompt:
        raise bad_request(
            "'prompt' must be a non-empty string or a non-empty list of token ids (one prompt; "
            f"batches are not supported); got {type(prompt).__name__}",
            "prompt",
        )
    echo = _flag(body, "echo", False)
    max_tokens = body.get("max_tokens")
    if max_tokens is not None and (
        isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1 - echo
    ):
        lowest = "0 (echo is true)" if echo else "1 (0 only with echo=true)"
        raise bad_request(
            f"'max_tokens' must be an integer >= {lowest}; got {max_tokens!r}", "max_tokens"
        )
    if body.get("stop") not in (None, [], ""):
        raise bad_request("'stop' is not supported on /v1/completions by this server", "stop")
    top_p = _number(body, "top_p", 1.0, 0.0, 1.0)
    if top_p == 0:
        raise bad_request("'top_p' must be > 0", "top_p")
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise bad_request(f"'seed' must be an integer; got {seed!r}", "seed")
    return CompletionRequest(
        prompt=prompt,
        max_tokens=max_tokens,
        echo=echo,
        logprobs=_optional_count(body, "logprobs"),
        prompt_logprobs=_optional_count(body, "prompt_logprobs"),
        temperature=_number(body, "temperature", 1.0, 0.0, 100.0),
        top_p=top_p,
        seed=seed,
        add_special_tokens=_flag(body, "add_special_tokens", False),
    )


def completion_body(
    model_name: str, text: str, finish_reason: str, prompt_tokens: int, completion_tokens: int
) -> dict[str, Any]:
    """A ``chat.completion`` answer with one choice."""
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model_name,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": finish_reason,
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }
