"""``POST /v1/chat/completions`` requests as :mod:`llm_gym.serving` reads them.

:func:`parse_chat_request` checks a decoded body (:mod:`llm_gym.serving.body`) and returns a
:class:`ChatRequest`; every refusal is a 400 naming the field. What reaches the chat template is
bounded here:

* **Messages** are rebuilt from what is checked: a role of :data:`ROLES`, text content (a string,
  text parts or null), an assistant's ``tool_calls`` (``function.name`` a string; string
  ``arguments`` are decoded to an object, as chat templates ``tojson`` them, under the body's
  rules of :mod:`llm_gym.serving.body`, and kept as sent when they are not JSON or break a
  rule) and a tool message's ``tool_call_id`` / ``name``. Nothing else a client sends reaches
  the template.
* **Tools** must be ``{"type": "function", "function": {"name", "description"?, "parameters"?}}``;
  an empty list is refused as OpenAI refuses it (400, ``empty_array``; no tools: omit or null).
* **The template is the model's own.** A client's ``chat_template`` is refused: a template is a
  program the server would run (an unbounded loop is one line), and no flag turns this on.
  ``chat_template_kwargs`` may only set the names in the server's allow-list
  (:data:`DEFAULT_CHAT_TEMPLATE_KWARGS` unless the server was given another), each to a boolean, a
  number or a string of at most :data:`MAX_TEMPLATE_STRING` characters. No allow-list may name a
  key that carries a template or steers the rendering (:func:`reserved_template_kwarg`: any name
  holding ``template``, ``chat_template`` first; :data:`RENDERING_KWARGS`): such a list is
  refused when the server starts (:func:`check_template_kwargs_allowlist`), and such a key in a
  request is refused whatever the list.
* ``tool_choice`` (``"auto"``, ``"none"``, ``"required"`` or a named function),
  ``parallel_tool_calls`` and ``response_format`` (``text``, ``json_object``, ``json_schema``)
  are checked here (:mod:`llm_gym.actions.grammar`) and enforced by the engine's constrained
  decoding (:mod:`llm_gym.policies.constraint`).
* Unknown fields are ignored. Known fields this server cannot honour are refused rather than
  silently dropped: ``n`` other than 1, and any value but a neutral one of the sampling fields
  of :data:`~llm_gym.serving.protocol.UNHONOURED_FIELDS` (``logit_bias``, the penalties,
  vLLM's ``top_k``, ``min_p``, ...) or of :data:`~llm_gym.serving.protocol.CHAT_UNHONOURED_FIELDS`
  (audio, web search, ``reasoning_effort``, ...); ``docs/guides/serving.md`` has every field.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from llm_gym.actions.grammar import ToolChoice, check_schema, parse_tool_choice
from llm_gym.errors import InvalidArgumentError
from llm_gym.serving.body import decode_json_text
from llm_gym.serving.protocol import (
    CHAT_UNHONOURED_FIELDS,
    APIError,
    bad_request,
    check_common,
    flag_field,
    int_field,
    number_field,
    refuse_unhonoured,
)

__all__ = [
    "DEFAULT_CHAT_TEMPLATE_KWARGS",
    "MAX_STOPS",
    "MAX_STOP_CHARS",
    "MAX_TEMPLATE_STRING",
    "MAX_TOP_LOGPROBS",
    "ROLES",
    "RENDERING_KWARGS",
    "ChatRequest",
    "check_template_kwargs_allowlist",
    "parse_chat_request",
    "reserved_template_kwarg",
]

ROLES = ("system", "user", "assistant", "tool", "developer")
"""The message roles accepted (``developer`` is read as ``system``)."""
DEFAULT_CHAT_TEMPLATE_KWARGS = frozenset({"enable_thinking", "thinking", "reasoning_effort"})
"""The ``chat_template_kwargs`` a client may set by default (Qwen3's, DeepSeek's, gpt-oss's)."""
RENDERING_KWARGS = frozenset(
    {
        "conversation",
        "messages",
        "tools",
        "documents",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
        "sanitize_control_tokens",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
        "raise_exception",
        "strftime_now",
    }
)
"""``apply_chat_template``'s own parameters and the names the template binds itself: the server
sets them, never a client (nor any name holding ``template``: :func:`reserved_template_kwarg`)."""
MAX_TEMPLATE_STRING = 1024
"""The longest string value of a ``chat_template_kwargs`` entry."""
MAX_TOP_LOGPROBS = 20
"""The most alternatives ``top_logprobs`` may ask for (OpenAI's limit)."""
MAX_STOPS = 16
"""The most ``stop`` strings a request may have."""
MAX_STOP_CHARS = 1024
"""The longest ``stop`` string."""


@dataclass(frozen=True)
class ChatRequest:
    """A checked ``/v1/chat/completions`` request."""

    messages: list[dict[str, Any]]
    """The conversation, normalised for a chat template (text content, object arguments)."""
    tools: list[dict[str, Any]] | None
    """The ``tools`` field, when given (checked tool specs)."""
    parse_tool_calls: bool
    """Whether tool calls are parsed out of the reply (tools given, ``tool_choice`` not none)."""
    temperature: float
    """Sampling temperature (0: greedy)."""
    top_p: float
    """Nucleus mass, in (0, 1]."""
    max_tokens: int | None
    """``max_completion_tokens`` or else ``max_tokens`` (None: the server's default)."""
    seed: int | None
    """Seeds this generation's own sampler (other requests' sampling is untouched)."""
    stops: list[str]
    """Stop strings (empty ones dropped)."""
    chat_template_kwargs: dict[str, Any]
    """Extra keyword arguments for the chat template (allow-listed names, scalar values)."""
    logprobs: bool = False
    """Return ``choices[0].logprobs.content``."""
    top_logprobs: int = 0
    """Alternatives per token in ``logprobs`` (0..20)."""
    stream: bool = False
    """Answer with server-sent events."""
    include_usage: bool = False
    """``stream_options.include_usage``."""
    return_token_ids: bool = False
    """Add ``prompt_token_ids`` and ``token_ids`` to the answer."""
    tool_choice: ToolChoice = field(default_factory=ToolChoice)
    """The checked ``tool_choice`` (``"required"`` or a named tool: the reply is forced)."""
    parallel_tool_calls: bool = True
    """False: one call at most (the grammar allows one; a free reply keeps its first)."""
    answer_schema: dict[str, Any] | None = None
    """The JSON schema the reply's answer follows (``response_format`` ``json_object``:
    any object; ``json_schema``: its ``schema``); None: text."""

    @property
    def tool_names(self) -> frozenset[str]:  # a reply that calls any other tool stays text
        return frozenset(tool["function"]["name"] for tool in self.tools or ())


def _text_content(value: Any, field: str) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):  # content parts: only text parts are supported
        texts = []
        for i, part in enumerate(value):
            if not (isinstance(part, dict) and part.get("type") == "text"):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise bad_request(
                    f"{field}[{i}] must be a text part {{'type': 'text', 'text': ...}}; got "
                    f"{str(kind)[:40]!r} (this server reads text only)",
                    f"{field}[{i}]",
                )
            if not isinstance(part.get("text"), str):
                raise bad_request(f"{field}[{i}].text must be a string", f"{field}[{i}].text")
            texts.append(part["text"])
        return "".join(texts)
    raise bad_request(
        f"{field} must be a string, a list of text parts or null; got {type(value).__name__}",
        field,
    )


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
            # Read under the body's own rules (a NaN, a lone surrogate, too deep a nest or too
            # many values are refused); refused or unparseable, the string stays as it was sent
            # and the template writes it as it is.
            with contextlib.suppress(APIError):
                where = f"{field}[{i}].function.arguments"
                arguments = decode_json_text(arguments, where) if arguments.strip() else {}
        call_id = call.get("id")
        calls.append(
            {
                "id": call_id if isinstance(call_id, str) else f"call_{i}",
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
                f"{field}.role must be one of {', '.join(ROLES)}; got {str(role)[:40]!r}",
                f"{field}.role",
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


def _tools(value: Any) -> list[dict[str, Any]] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise bad_request(
            f"'tools' must be a list of tool objects; got {type(value).__name__}", "tools"
        )
    if not value:  # OpenAI's answer (and vLLM's): an empty list is not "no tools"
        empty = "Invalid 'tools': empty array. Expected an array with minimum length 1, but got "
        why = "an empty array instead. Omit 'tools' (or send null) for a request without tools."
        raise APIError(400, empty + why, "tools", code="empty_array")
    tools = []
    for i, tool in enumerate(value):
        field = f"tools[{i}]"
        function = tool.get("function") if isinstance(tool, dict) else None
        if (
            not isinstance(tool, dict)
            or tool.get("type", "function") != "function"
            or not isinstance(function, dict)
            or not isinstance(function.get("name"), str)
            or not function["name"]
        ):
            raise bad_request(
                f"{field} must be {{'type': 'function', 'function': {{'name': str, "
                "'description'?: str, 'parameters'?: object}}}",
                field,
            )
        spec: dict[str, Any] = {"name": function["name"]}
        for key, kind in (("description", str), ("parameters", dict), ("strict", bool)):
            if function.get(key) is not None:
                if not isinstance(function[key], kind):
                    raise bad_request(
                        f"{field}.function.{key} must be a {kind.__name__}",
                        f"{field}.function.{key}",
                    )
                spec[key] = function[key]
        tools.append({"type": "function", "function": spec})
    return tools


def _tool_choice(value: Any, tools: list[dict[str, Any]] | None) -> ToolChoice:
    try:
        return parse_tool_choice(value, [t["function"]["name"] for t in tools or ()])
    except InvalidArgumentError as exc:
        raise bad_request(str(exc), "tool_choice") from None


def _response_format(value: Any) -> dict[str, Any] | None:
    """The answer's JSON schema (None: text)."""
    kind = value.get("type") if isinstance(value, dict) else None
    if value is None or kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    spec = value.get("json_schema") if kind == "json_schema" else None
    if not isinstance(spec, dict):
        raise bad_request(
            "'response_format' must be {'type': 'text'}, {'type': 'json_object'} or {'type': "
            "'json_schema', 'json_schema': {'name': ..., 'schema': {...}, 'strict'?: bool}}; got "
            f"{str(value)[:80]!r}",
            "response_format",
        )
    if not isinstance(spec.get("strict", False), bool | None):
        where = "response_format.json_schema.strict"
        raise bad_request(f"{where} must be a boolean", where)
    try:
        return check_schema(spec.get("schema", {}), "response_format.json_schema.schema")
    except InvalidArgumentError as exc:
        raise bad_request(str(exc), "response_format.json_schema.schema") from None


def reserved_template_kwarg(name: str) -> str | None:
    """Why ``name`` can never be a client's ``chat_template_kwargs`` entry, or ``None`` when an
    allow-list may hold it.

    Example:
        >>> reserved_template_kwarg("enable_thinking") is None
        True
        >>> print(reserved_template_kwarg("chat_template"))
        it carries a template (code the server would run; client templates are always refused)
    """
    if "template" in name.lower():
        return (
            "it carries a template (code the server would run; client templates are always refused)"
        )
    if name in RENDERING_KWARGS:
        return "the server sets it when it renders a request (apply_chat_template's own argument)"
    return None


def check_template_kwargs_allowlist(names: Collection[str]) -> frozenset[str]:
    """``names`` as the server's ``chat_template_kwargs`` allow-list.

    Raises:
        InvalidArgumentError: A name that is not a non-empty string, or one
            :func:`reserved_template_kwarg` reserves (``chat_template`` and any other name
            holding ``template``, :data:`RENDERING_KWARGS`).
    """
    if isinstance(names, str):
        raise InvalidArgumentError(
            f"The chat_template_kwargs allow-list must be a collection of names, actual value: "
            f"the string {names!r}. Pass a list, e.g. ['enable_thinking']."
        )
    for name in names:
        if not isinstance(name, str) or not name:
            raise InvalidArgumentError(
                f"Expected chat_template_kwargs names as non-empty strings, actual value: {name!r}."
            )
        why = reserved_template_kwarg(name)
        if why is not None:
            raise InvalidArgumentError(
                f"chat_template_kwargs may not allow clients to set {name!r}: {why}. Remove it "
                "from the allow-list (llm-gym serve --template-kwargs)."
            )
    return frozenset(names)


def _template_kwargs(value: Any, allowed: Collection[str]) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise bad_request("'chat_template_kwargs' must be an object", "chat_template_kwargs")
    names = ", ".join(sorted(allowed)) or "none"
    for key, item in value.items():
        field = f"chat_template_kwargs.{key}"
        why = reserved_template_kwarg(key) if isinstance(key, str) else None
        if why is not None:
            raise bad_request(f"'chat_template_kwargs' may not set {key[:60]!r}: {why}", field)
        if key not in allowed:
            raise bad_request(
                f"'chat_template_kwargs' may only set {names}; got {key[:60]!r}", field
            )
        scalar = isinstance(item, bool | int | str) or (
            isinstance(item, float) and math.isfinite(item)
        )
        if not scalar or (isinstance(item, str) and len(item) > MAX_TEMPLATE_STRING):
            raise bad_request(
                f"{field} must be a boolean, a number or a string of at most "
                f"{MAX_TEMPLATE_STRING} characters; got {type(item).__name__}",
                field,
            )
    return dict(value)


def _stops(value: Any) -> list[str]:
    if value is None:
        return []
    stops = [value] if isinstance(value, str) else value
    if (
        not isinstance(stops, list)
        or not all(isinstance(s, str) for s in stops)
        or len(stops) > MAX_STOPS
        or any(len(s) > MAX_STOP_CHARS for s in stops)
    ):
        raise bad_request(
            f"'stop' must be a string or a list of at most {MAX_STOPS} strings of at most "
            f"{MAX_STOP_CHARS} characters each",
            "stop",
        )
    return [s for s in stops if s]


def _refuse_unsupported(body: dict[str, Any]) -> None:
    if "chat_template" in body:
        raise bad_request(
            "'chat_template' is not accepted: this server renders every request with the "
            "model's own template (a template is code; clients may not send one). Use "
            "'chat_template_kwargs' for the template's options.",
            "chat_template",
        )
    refuse_unhonoured(body, CHAT_UNHONOURED_FIELDS)


def parse_chat_request(
    body: dict[str, Any],
    model_name: str,
    allowed_template_kwargs: Collection[str] = DEFAULT_CHAT_TEMPLATE_KWARGS,
) -> ChatRequest:
    """Check a ``/v1/chat/completions`` body for a server that serves ``model_name``.

    Raises:
        APIError: 400 naming the first field at fault, or 404 for another model.
    """
    common = check_common(body, model_name)
    _refuse_unsupported(body)
    messages = _messages(body.get("messages"))
    tools = _tools(body.get("tools"))
    logprobs = flag_field(body, "logprobs")
    top_logprobs = int_field(body, "top_logprobs", 0, MAX_TOP_LOGPROBS)
    if top_logprobs is not None and not logprobs:
        raise bad_request("'top_logprobs' needs logprobs=true", "top_logprobs")
    max_tokens = int_field(body, "max_completion_tokens", 1) or int_field(body, "max_tokens", 1)
    choice = _tool_choice(body.get("tool_choice"), tools)
    return ChatRequest(
        messages=messages,
        tools=tools,
        parse_tool_calls=bool(tools) and choice.mode != "none",
        temperature=number_field(body, "temperature", 1.0, 0.0, 100.0),
        top_p=number_field(body, "top_p", 1.0, 0.0, 1.0, low_open=True),
        max_tokens=max_tokens,
        seed=common.seed,
        stops=_stops(body.get("stop")),
        chat_template_kwargs=_template_kwargs(
            body.get("chat_template_kwargs"), allowed_template_kwargs
        ),
        logprobs=logprobs,
        top_logprobs=top_logprobs or 0,
        stream=common.stream,
        include_usage=common.include_usage,
        return_token_ids=common.return_token_ids,
        tool_choice=choice,
        parallel_tool_calls=flag_field(body, "parallel_tool_calls", True),
        answer_schema=_response_format(body.get("response_format")),
    )
