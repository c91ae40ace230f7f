"""``POST /v1/responses`` requests as :mod:`llm_gym.serving` reads them.

:func:`parse_responses_request` checks a decoded body and translates it into the chat
completions request of :mod:`llm_gym.serving.chat_protocol`, so a Responses request is rendered,
generated, constrained and parsed exactly as the equivalent chat request is (``tool_choice``,
``parallel_tool_calls`` and ``response_format`` mean there what the chat path makes them mean).
Every refusal is a 400 naming the Responses field (``input[3].call_id``, ``text.format``, ...).

The translation:

* ``instructions`` and ``input`` (a string, or ``message``, ``function_call`` and
  ``function_call_output`` items): the messages, read by
  :func:`~llm_gym.serving.responses_input.input_messages`.
* ``tools``: ``{"type": "function", "name", "description"?, "parameters"?, "strict"?}`` only;
  ``tool_choice`` ``"auto"``, ``"none"``, ``"required"`` or ``{"type": "function", "name"}``.
* ``text.format``: ``text``, ``json_object`` or ``json_schema`` (``name``, ``schema``,
  ``strict``, ``description``), the chat path's ``response_format``.
* ``max_output_tokens``, ``temperature``, ``top_p``, ``parallel_tool_calls``, ``seed`` and
  ``chat_template_kwargs`` (the last two this server's extensions, as on chat) pass through.
* ``include: ["message.output_text.logprobs"]`` (with ``top_logprobs``) returns the tokens'
  logprobs on the ``output_text`` part; other ``include`` values name items this server never
  produces and change nothing.

Nothing is kept between requests: ``previous_response_id``, ``conversation``, ``prompt`` and
``item_reference`` items are refused (send the whole conversation in ``input``). Fields that
would change the answer and are not implemented are refused (``reasoning`` with a value, as
OpenAI refuses it for a model that does not reason; ``truncation: "auto"``, ``background``,
``context_management``, ``moderation``, ``text.verbosity`` other than ``"medium"``); fields that
change nothing here are accepted (``store``, ``metadata``, ``user``, ``safety_identifier``,
``service_tier``, ``prompt_cache_key``, ``prompt_cache_retention``, ``prompt_cache_options``,
``max_tool_calls``, ``stream_options.include_obfuscation``). The sampling fields the chat path
refuses unless neutral (:data:`~llm_gym.serving.protocol.UNHONOURED_FIELDS`: ``logit_bias``,
the penalties, vLLM's ``top_k``, ...) are refused here alike; other unknown fields are ignored.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from llm_gym.serving.chat_protocol import (
    DEFAULT_CHAT_TEMPLATE_KWARGS,
    ChatRequest,
    parse_chat_request,
)
from llm_gym.serving.protocol import (
    UNHONOURED_FIELDS,
    APIError,
    bad_request,
    check_common,
    flag_field,
    int_field,
    number_field,
)
from llm_gym.serving.responses_input import NOT_KEPT, input_messages, required_string

__all__ = [
    "LOGPROBS_INCLUDE",
    "MAX_METADATA_KEYS",
    "ResponsesRequest",
    "parse_responses_request",
    "responses_error",
]

LOGPROBS_INCLUDE = "message.output_text.logprobs"
"""The ``include`` value that returns the output text's logprobs."""
MAX_METADATA_KEYS = 16
"""OpenAI's limits on ``metadata``: 16 pairs, keys of 64 characters, values of 512."""
_MAX_METADATA_KEY = 64
_MAX_METADATA_VALUE = 512
_SERVICE_TIERS = ("auto", "default", "flex", "scale", "priority", "fast")
_PARAM_RENAMES = (
    (re.compile(r"^messages.*"), "input"),
    (re.compile(r"^tools\[(\d+)\]\.function"), r"tools[\1]"),
    (re.compile(r"^response_format(\.json_schema)?"), "text.format"),
    (re.compile(r"^max_completion_tokens"), "max_output_tokens"),
)
_TEXT_RENAMES = (
    ("'response_format'", "'text.format'"),
    ("response_format.json_schema", "text.format"),
    ("'max_completion_tokens'", "'max_output_tokens'"),
    ("'messages'", "'input'"),
)


@dataclass(frozen=True)
class ResponsesRequest:
    """A checked ``/v1/responses`` request."""

    chat: ChatRequest
    """The same request as chat completions reads it (what is rendered and generated)."""
    settings: dict[str, Any]
    """The request's settings as the Response object repeats them (``instructions``,
    ``tools``, ``tool_choice``, ``text``, ``metadata``, ...)."""
    stream: bool
    """Answer with the Responses API's server-sent events."""


def responses_error(error: APIError) -> APIError:
    """``error`` of the chat path (or the engine) with the Responses field names: ``messages``
    is ``input``, ``response_format`` is ``text.format``, ``tools[i].function.x`` is
    ``tools[i].x``, ``max_completion_tokens`` is ``max_output_tokens``.

    Example:
        >>> responses_error(bad_request("'messages' is too long", "messages")).param
        'input'
    """
    param = error.param
    if param is not None:
        for pattern, name in _PARAM_RENAMES:
            param = pattern.sub(name, param, count=1)
    message = error.message
    for old, new in _TEXT_RENAMES:
        message = message.replace(old, new)
    return APIError(error.status, message, param, error.kind, error.code)


def _tools(value: Any) -> list[dict[str, Any]] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise bad_request(f"'tools' must be a list; got {type(value).__name__}", "tools")
    tools = []
    for i, tool in enumerate(value):
        field = f"tools[{i}]"
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind != "function":
            shown = kind if isinstance(kind, str) else type(tool).__name__
            raise bad_request(
                f"{field} must be a function tool {{'type': 'function', 'name': ..., "
                f"'parameters': ...}} (this server runs no built-in tools); got {shown[:40]!r}",
                f"{field}.type" if isinstance(tool, dict) else field,
            )
        function: dict[str, Any] = {
            "name": required_string(tool, "name", field, "the function's name")
        }
        for key, kinds in (("description", str), ("parameters", dict), ("strict", bool)):
            if tool.get(key) is not None:
                if not isinstance(tool[key], kinds):
                    raise bad_request(
                        f"{field}.{key} must be a {kinds.__name__}; got {type(tool[key]).__name__}",
                        f"{field}.{key}",
                    )
                function[key] = tool[key]
        if tool.get("defer_loading"):
            raise bad_request(
                f"{field}.defer_loading is not supported (this server has no tool search); omit it",
                f"{field}.defer_loading",
            )
        tools.append({"type": "function", "function": function})
    return tools


def _tool_choice(value: Any) -> Any:
    """The chat form of a Responses ``tool_choice``."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, dict) and value.get("type") == "function":
        if not isinstance(value.get("name"), str) or not value["name"]:
            raise bad_request("'tool_choice.name' must be the function's name", "tool_choice.name")
        return {"type": "function", "function": {"name": value["name"]}}
    shown = value.get("type") if isinstance(value, dict) else value
    raise bad_request(
        "'tool_choice' must be 'auto', 'none', 'required' or {'type': 'function', 'name': ...} "
        f"on this server; got {str(shown)[:60]!r}",
        "tool_choice",
    )


def _response_format(text: Any) -> Any:
    """The chat ``response_format`` of the Responses ``text`` field."""
    if text is None:
        return None
    if not isinstance(text, dict):
        raise bad_request(f"'text' must be an object; got {type(text).__name__}", "text")
    if text.get("verbosity") not in (None, "medium"):
        raise bad_request(
            "'text.verbosity' must be 'medium' for this model (it has no other verbosity); got "
            f"{str(text['verbosity'])[:40]!r}",
            "text.verbosity",
        )
    form = text.get("format")
    if form is None:
        return None
    kind = form.get("type") if isinstance(form, dict) else None
    if kind in ("text", "json_object"):
        return {"type": kind}
    if kind != "json_schema":
        raise bad_request(
            f"'text.format.type' must be text, json_object or json_schema; got {str(kind)[:40]!r}",
            "text.format.type",
        )
    schema = {"name": required_string(form, "name", "text.format", "the schema's name")}
    if not isinstance(form.get("schema"), dict):
        raise bad_request("'text.format.schema' must be a JSON schema object", "text.format.schema")
    for key in ("schema", "strict", "description"):
        if form.get(key) is not None:
            schema[key] = form[key]
    return {"type": "json_schema", "json_schema": schema}


def _refuse_unkept(body: dict[str, Any]) -> None:
    for key in ("previous_response_id", "conversation", "prompt"):
        if body.get(key) is not None:
            raise bad_request(f"'{key}' is not supported: {NOT_KEPT}", key)
    reasoning = body.get("reasoning")
    if reasoning is not None and not (
        isinstance(reasoning, dict) and all(v is None for v in reasoning.values())
    ):
        raise bad_request(
            "'reasoning' is not supported with this model (it is not a reasoning model); omit "
            "it or send null (a chat template's own thinking switch is 'chat_template_kwargs')",
            "reasoning",
        )
    refused = {
        "truncation": ("disabled",),
        "background": (False,),
        "context_management": (),
        "moderation": (),
    }
    for key, allowed in refused.items():
        value = body.get(key)
        if value is not None and value not in allowed:
            accepted = " or ".join(["null", *(repr(v) for v in allowed)])
            raise bad_request(
                f"'{key}' is not supported by this server (it would be ignored); omit it or send "
                f"{accepted}; got {str(value)[:60]!r}",
                key,
            )


def _checked_settings(body: dict[str, Any]) -> dict[str, Any]:
    """The fields that change nothing here, checked for their type, as the Response echoes
    them."""
    metadata = body.get("metadata") or {}
    if not isinstance(metadata, dict) or len(metadata) > MAX_METADATA_KEYS:
        raise bad_request(
            f"'metadata' must be an object of at most {MAX_METADATA_KEYS} pairs", "metadata"
        )
    for key, value in metadata.items():
        if len(key) > _MAX_METADATA_KEY or not isinstance(value, str):
            raise bad_request(
                f"'metadata' keys must be at most {_MAX_METADATA_KEY} characters and values "
                f"strings of at most {_MAX_METADATA_VALUE}; {key[:70]!r} is not",
                f"metadata.{key[:70]}",
            )
        if len(value) > _MAX_METADATA_VALUE:
            raise bad_request(
                f"metadata.{key[:70]} is longer than {_MAX_METADATA_VALUE} characters",
                f"metadata.{key[:70]}",
            )
    for key in ("user", "safety_identifier", "prompt_cache_key"):
        if body.get(key) is not None and not isinstance(body[key], str):
            raise bad_request(f"'{key}' must be a string", key)
    tier = body.get("service_tier")
    if tier is not None and tier not in _SERVICE_TIERS:
        raise bad_request(
            f"'service_tier' must be one of {', '.join(_SERVICE_TIERS)}; got {str(tier)[:40]!r}",
            "service_tier",
        )
    include = body.get("include") or []
    if not isinstance(include, list) or not all(isinstance(v, str) for v in include):
        raise bad_request("'include' must be a list of strings", "include")
    return {
        "metadata": dict(metadata),
        "user": body.get("user"),
        "safety_identifier": body.get("safety_identifier"),
        "prompt_cache_key": body.get("prompt_cache_key"),
        "store": flag_field(body, "store", True),
        "max_tool_calls": int_field(body, "max_tool_calls", 1),
        "include": include,
    }


def _stream_options(body: dict[str, Any], stream: bool) -> None:
    options = body.get("stream_options")
    if options is None:
        return
    if not stream:
        raise bad_request("'stream_options' is only allowed with stream=true", "stream_options")
    if not isinstance(options, dict) or set(options) - {"include_obfuscation"}:
        raise bad_request(
            "'stream_options' must be an object with 'include_obfuscation' (true or false)",
            "stream_options",
        )
    flag_field(options, "include_obfuscation")


def parse_responses_request(
    body: dict[str, Any],
    model_name: str,
    allowed_template_kwargs: Collection[str] = DEFAULT_CHAT_TEMPLATE_KWARGS,
) -> ResponsesRequest:
    """Check a ``/v1/responses`` body for a server that serves ``model_name`` (see the module
    docstring).

    Raises:
        APIError: 400 naming the first field at fault, or 404 for another model.
    """
    check_common({"model": body.get("model")}, model_name)  # the model first: 400 or 404
    _refuse_unkept(body)
    stream = flag_field(body, "stream")
    _stream_options(body, stream)
    settings = _checked_settings(body)
    logprobs = LOGPROBS_INCLUDE in settings.pop("include")
    max_output_tokens = int_field(body, "max_output_tokens", 1)
    temperature = number_field(body, "temperature", 1.0, 0.0, 2.0)
    top_p = number_field(body, "top_p", 1.0, 0.0, 1.0, low_open=True)
    top_logprobs = int_field(body, "top_logprobs", 0, 20)
    tools = _tools(body.get("tools"))
    chat: dict[str, Any] = {
        "model": body.get("model"),
        "messages": input_messages(body),
        "tools": tools or None,  # an empty list is no tools here (the Agents SDK sends one)
        "tool_choice": _tool_choice(body.get("tool_choice")),
        "parallel_tool_calls": body.get("parallel_tool_calls"),
        "response_format": _response_format(body.get("text")),
        "max_completion_tokens": max_output_tokens,
        "temperature": temperature,
        "top_p": top_p,
        "logprobs": logprobs,
        "top_logprobs": top_logprobs if logprobs else None,
        "stream": stream,
        "stream_options": {"include_usage": True} if stream else None,
        "seed": body.get("seed"),
        "chat_template_kwargs": body.get("chat_template_kwargs"),
    }
    for key in UNHONOURED_FIELDS:  # the chat path decides what they may be
        if key in body and key not in chat:
            chat[key] = body[key]
    try:
        parsed = parse_chat_request(chat, model_name, allowed_template_kwargs)
    except APIError as exc:
        raise responses_error(exc) from None
    text = body.get("text") if isinstance(body.get("text"), dict) else {}
    settings.update(
        instructions=body.get("instructions"),
        model=model_name,
        tools=[
            {"type": "function", "strict": None, "description": None, **t["function"]}
            for t in tools or ()
        ],
        tool_choice=body.get("tool_choice") or "auto",
        parallel_tool_calls=body.get("parallel_tool_calls") is not False,
        text={"format": text.get("format") or {"type": "text"}, "verbosity": "medium"},
        temperature=temperature,
        top_p=top_p,
        top_logprobs=top_logprobs or 0,
        max_output_tokens=max_output_tokens,
        service_tier=body.get("service_tier") or "default",
    )
    return ResponsesRequest(chat=parsed, settings=settings, stream=stream)
