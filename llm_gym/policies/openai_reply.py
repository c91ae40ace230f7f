"""A chat-completions answer, checked field by field before the policy reads it.

:func:`parse_chat_completion` reads ``choices[0]`` of a decoded ``/chat/completions`` body. Every
field it reads (the message's content and tool calls, ``finish_reason``, ``reasoning_content``,
``usage``, ``logprobs``) must have the shape the OpenAI API gives it; any other shape raises
:class:`~llm_gym.policies.http.MalformedResponseError` naming the field, what was expected and
what came, never a bare ``KeyError`` or ``TypeError``. Fields it does not read are ignored.

**Caps.** A reply holds at most :data:`MAX_TOOL_CALLS` tool calls and ``max_logprob_entries``
logprob entries (:func:`logprob_entries_cap`: the request's ``max_tokens``, a server sending one
entry per generated token); a reply past either is refused the same way, its size checked before
any of its entries is read. :class:`ReplyGuard` applies the same caps while the answer decodes,
so a server answering hundreds of thousands of calls is refused after the first ones past the
cap, before the rest is built.

What a tool call *says* is the model's own (arguments that are not JSON, an unknown tool): those
are left for the episode's action format to report. Only the structure around them is checked.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from llm_gym.actions.codec import json_type_name
from llm_gym.policies.http import EndpointError, MalformedResponseError

__all__ = [
    "MAX_LOGPROB_ENTRIES",
    "MAX_TOOL_CALLS",
    "MAX_TOP_LOGPROBS",
    "USAGE_FIELDS",
    "ChatReply",
    "ReplyGuard",
    "logprob_entries_cap",
    "parse_chat_completion",
]

USAGE_FIELDS = ("prompt_tokens", "completion_tokens", "total_tokens")
"""The ``usage`` counts that must be non-negative integers when present."""
MAX_TOOL_CALLS = 1024
"""Native tool calls one reply may hold; a reply with more is a :class:`MalformedResponseError`."""
MAX_LOGPROB_ENTRIES = 2**17
"""Logprob entries one reply may hold when its request sets no ``max_tokens`` (a 128k-token
generation); with ``max_tokens`` the bound is ``max_tokens`` (:func:`logprob_entries_cap`)."""
MAX_TOP_LOGPROBS = 20
"""Alternatives per logprob entry :class:`ReplyGuard` allows for (OpenAI's bound on
``top_logprobs``; vLLM's default ``max_logprobs``)."""


@dataclass(frozen=True)
class ChatReply:
    """What a policy reads from a chat completion's ``choices[0]``."""

    content: str
    """The message's text: its content parts joined, ``""`` when it had none."""
    tool_calls: list[dict[str, Any]]
    """The native tool calls, as the server sent them (checked in structure only)."""
    finish_reason: str | None
    """The server's ``finish_reason``."""
    usage: dict[str, Any] | None
    """The body's ``usage``."""
    reasoning_content: str | None
    """Reasoning text servers with a reasoning parser put beside the content."""
    logprobs: list[float] | None
    """The sampled tokens' log-probabilities, when the server sent them (``logprobs: true``)."""


_MISSING: Any = object()
"""Stands for a field the answer does not have."""


def _json_type(value: Any) -> str:
    return "missing" if value is _MISSING else json_type_name(value, article=True)


class _Checker:
    """Raises :class:`MalformedResponseError` for the answer of ``source``."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, field: str, expected: str, value: Any) -> MalformedResponseError:
        actual = _json_type(value)
        if value is not _MISSING and value is not None:
            preview = json.dumps(value, ensure_ascii=False, default=str)
            actual += f" {preview[:100]}" + ("..." if len(preview) > 100 else "")
        return MalformedResponseError(
            f"{self.source} answered a malformed chat completion: {field} must be {expected}, "
            f"actual value: {actual}.",
            status=200,
            field=field,
        )

    def object(self, value: Any, field: str, *, optional: bool = False) -> dict[str, Any]:
        if optional and value is None:
            return {}
        if not isinstance(value, dict):
            raise self.fail(field, "an object" + (" or null" if optional else ""), value)
        return value

    def array(
        self, value: Any, field: str, *, optional: bool = False, cap: int | None = None
    ) -> list[Any]:
        if optional and value is None:
            return []
        if not isinstance(value, list):
            raise self.fail(field, "an array" + (" or null" if optional else ""), value)
        if cap is not None and len(value) > cap:  # its items are not shown: there are too many
            raise MalformedResponseError(
                f"{self.source} answered a reply past its cap: {field} must hold at most {cap} "
                f"entries, actual count: {len(value)}. A server sending this many is broken or "
                "hostile; check its tool-call parser and max_tokens.",
                status=200,
                field=field,
            )
        return value

    def string(self, value: Any, field: str) -> str | None:
        """A string or null."""
        if value is not None and not isinstance(value, str):
            raise self.fail(field, "a string or null", value)
        return value

    def content(self, value: Any, field: str) -> str:
        if value is None or isinstance(value, str):
            return value or ""
        parts = []
        for i, part in enumerate(self.array(value, field)):
            part = self.object(part, f"{field}[{i}]")
            text = part.get("text")
            if text is not None and not isinstance(text, str):
                raise self.fail(f"{field}[{i}].text", "a string", text)
            parts.append(text or "")
        return "".join(parts)

    def tool_calls(self, value: Any, field: str, cap: int) -> list[dict[str, Any]]:
        calls = self.array(value, field, optional=True, cap=cap)
        for i, call in enumerate(calls):
            where = f"{field}[{i}]"
            self.string(self.object(call, where).get("id"), f"{where}.id")
            function = self.object(call.get("function", _MISSING), f"{where}.function")
            name = function.get("name", _MISSING)
            if not isinstance(name, str):
                raise self.fail(f"{where}.function.name", "a string", name)
            arguments = function.get("arguments")
            if arguments is not None and not isinstance(arguments, str | dict):
                raise self.fail(
                    f"{where}.function.arguments", "a string, an object or null", arguments
                )
        return calls

    def usage(self, value: Any) -> dict[str, Any] | None:
        if value is None:
            return None
        usage = self.object(value, "usage", optional=True)
        for key in USAGE_FIELDS:
            count = usage.get(key)
            if count is not None and (
                isinstance(count, bool) or not isinstance(count, int) or count < 0
            ):
                raise self.fail(f"usage.{key}", "a non-negative integer", count)
        return usage

    def logprobs(self, value: Any, field: str, cap: int) -> list[float] | None:
        if value is None:
            return None
        entries = self.object(value, field).get("content")
        if entries is None:
            return None
        out = []
        entries = self.array(entries, f"{field}.content", optional=True, cap=cap)
        for i, entry in enumerate(entries):
            where = f"{field}.content[{i}]"
            entry = self.object(entry, where)
            token = entry.get("token", _MISSING)
            if not isinstance(token, str):
                raise self.fail(f"{where}.token", "a string", token)
            logprob = entry.get("logprob", _MISSING)
            if isinstance(logprob, bool) or not isinstance(logprob, int | float):
                raise self.fail(f"{where}.logprob", "a number", logprob)
            if logprob != logprob or logprob > 1e-4:
                raise self.fail(f"{where}.logprob", "a number <= 0", logprob)
            self.array(entry.get("top_logprobs"), f"{where}.top_logprobs", optional=True)
            out.append(float(logprob))
        return out


class ReplyGuard:
    """``json.loads``'s ``object_hook`` for one chat-completion answer
    (:meth:`~llm_gym.policies.http.JsonClient.post`'s ``watch``): counts the decoded objects
    shaped like a tool call (a ``"function"`` key) and like a logprob entry or alternative
    (``"token"`` and ``"logprob"`` keys), and refuses the answer
    (:class:`MalformedResponseError`) once either count passes what a reply within the caps can
    hold: ``max_tool_calls`` calls; ``max_logprob_entries`` entries of
    :data:`MAX_TOP_LOGPROBS` alternatives each. The exact caps are
    :func:`parse_chat_completion`'s; this one stops the decoding early.

    Example:
        >>> import json
        >>> guard = ReplyGuard("url", max_tool_calls=1, max_logprob_entries=1)
        >>> json.loads('[{"function": {}}]', object_hook=guard)
        [{'function': {}}]
        >>> try:
        ...     json.loads('[{"function": {}}]', object_hook=guard)  # a second call
        ... except MalformedResponseError as error:
        ...     print(error.field)
        choices[0].message.tool_calls
    """

    def __init__(self, source: str, max_tool_calls: int, max_logprob_entries: int) -> None:
        self.source = source
        self.max_tool_calls = max_tool_calls
        self.max_logprob_entries = max_logprob_entries
        self.max_logprob_objects = max_logprob_entries * (1 + MAX_TOP_LOGPROBS)
        self.tool_calls = 0
        self.logprob_objects = 0

    def __call__(self, obj: dict[str, Any]) -> dict[str, Any]:
        if "function" in obj:
            self.tool_calls += 1
            if self.tool_calls > self.max_tool_calls:
                raise self._refuse(
                    "choices[0].message.tool_calls", f"{self.max_tool_calls} entries"
                )
        elif "logprob" in obj and "token" in obj:
            self.logprob_objects += 1
            if self.logprob_objects > self.max_logprob_objects:
                raise self._refuse(
                    "choices[0].logprobs.content",
                    f"{self.max_logprob_entries} entries of at most {MAX_TOP_LOGPROBS} "
                    f"alternatives each ({self.max_logprob_objects} objects)",
                )
        return obj

    def _refuse(self, field: str, cap: str) -> MalformedResponseError:
        return MalformedResponseError(
            f"{self.source} answered a reply past its cap: {field} must hold at most {cap}, "
            "actual count: more (decoding stopped at the first past the cap). A server sending "
            "this many is broken or hostile; check its tool-call parser and max_tokens.",
            status=200,
            field=field,
        )


def logprob_entries_cap(payload: dict[str, Any]) -> int:
    """The most logprob entries a reply to the request ``payload`` may hold: its
    ``max_completion_tokens`` or ``max_tokens`` (a positive integer), else
    :data:`MAX_LOGPROB_ENTRIES`; never above :data:`MAX_LOGPROB_ENTRIES`.

    Example:
        >>> logprob_entries_cap({"max_tokens": 256}), logprob_entries_cap({})
        (256, 131072)
    """
    for key in ("max_completion_tokens", "max_tokens"):
        value = payload.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
            return min(value, MAX_LOGPROB_ENTRIES)
    return MAX_LOGPROB_ENTRIES


def parse_chat_completion(
    body: Any,
    source: str,
    *,
    max_tool_calls: int = MAX_TOOL_CALLS,
    max_logprob_entries: int = MAX_LOGPROB_ENTRIES,
) -> ChatReply:
    """The :class:`ChatReply` of a decoded chat completion; ``source`` (the URL) names the
    server in errors. The reply holds at most ``max_tool_calls`` tool calls and
    ``max_logprob_entries`` logprob entries.

    Raises:
        MalformedResponseError: A field the policy reads has the wrong shape, or holds more
            entries than its cap (the error's ``field`` names it).
        EndpointError: The body is an error object instead of a completion.

    Example:
        >>> reply = parse_chat_completion(
        ...     {"choices": [{"message": {"content": "42"}, "finish_reason": "stop"}]}, "url"
        ... )
        >>> reply.content, reply.finish_reason
        ('42', 'stop')
        >>> try:
        ...     parse_chat_completion({"choices": [{"message": "42"}]}, "url")
        ... except MalformedResponseError as error:
        ...     print(error.field)
        choices[0].message
    """
    check = _Checker(source)
    body = check.object(body, "the body")
    if "choices" not in body and body.get("error"):
        error = body["error"]
        message = error.get("message") if isinstance(error, dict) else None
        message = str(message or json.dumps(error, ensure_ascii=False, default=str))[:500]
        raise EndpointError(
            f"{source} answered HTTP 200 with an error instead of a completion: {message}",
            status=200,
            server_message=message,
        )
    choices = body.get("choices", _MISSING)
    if not isinstance(choices, list) or not choices:
        raise check.fail("choices", "a non-empty array", choices)
    choice = check.object(choices[0], "choices[0]")
    message = check.object(choice.get("message", _MISSING), "choices[0].message")
    where = "choices[0].message"
    return ChatReply(
        content=check.content(message.get("content"), f"{where}.content"),
        tool_calls=check.tool_calls(
            message.get("tool_calls"), f"{where}.tool_calls", max_tool_calls
        ),
        finish_reason=check.string(choice.get("finish_reason"), "choices[0].finish_reason"),
        usage=check.usage(body.get("usage")),
        reasoning_content=check.string(
            message.get("reasoning_content"), f"{where}.reasoning_content"
        ),
        logprobs=check.logprobs(choice.get("logprobs"), "choices[0].logprobs", max_logprob_entries),
    )
