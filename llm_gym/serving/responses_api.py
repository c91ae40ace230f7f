"""What ``POST /v1/responses`` answers: Response objects and their stream of events.

The request is generated as a chat completion (:mod:`llm_gym.serving.responses_protocol`
translates it); the chat answer becomes the Response:

* :func:`response_from_chat`: the ``output`` holds a ``message`` item (one ``output_text`` part:
  the reply's text, with ``logprobs`` when ``include`` asked for them) when the reply has text or
  no tool call, then one ``function_call`` item (``call_id``, ``name``, ``arguments`` as a JSON
  string) per parsed tool call. ``status`` is ``"completed"``, or ``"incomplete"`` with
  ``incomplete_details.reason: "max_output_tokens"`` when the reply reached its token budget.
  ``usage`` counts ``input_tokens``, ``output_tokens`` and ``total_tokens`` (no cached or
  reasoning tokens). The request's settings are repeated as OpenAI repeats them.
* :func:`response_events`: the chat stream's chunks become the documented event sequence, each
  event with its ``sequence_number``: ``response.created``, ``response.in_progress``; for text
  ``response.output_item.added`` (the message), ``response.content_part.added``,
  ``response.output_text.delta`` per piece, ``response.output_text.done``,
  ``response.content_part.done``, ``response.output_item.done``; for each call
  ``response.output_item.added`` (the ``function_call``),
  ``response.function_call_arguments.delta``, ``response.function_call_arguments.done``,
  ``response.output_item.done``; last ``response.completed`` (``response.incomplete`` when the
  budget ran out) with the whole Response. A failure after the first event is an ``error`` event
  then ``response.failed``.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from llm_gym.serving.responses import SSE_DONE, dumps
from llm_gym.serving.responses_protocol import ResponsesRequest

__all__ = ["ResponseHead", "response_events", "response_from_chat"]


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class ResponseHead:
    """One response's id, times and settings: writes its Response objects."""

    def __init__(self, request: ResponsesRequest) -> None:
        self.request = request
        self.id = _id("resp")
        self.created_at = int(time.time())

    def body(
        self,
        status: str,
        output: list[dict[str, Any]],
        counts: tuple[int, int] | None = None,
        error: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The Response object (``counts``: input and output tokens, once known)."""
        usage = None
        if counts is not None:
            usage = {
                "input_tokens": counts[0],
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": counts[1],
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": counts[0] + counts[1],
            }
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        done = status in ("completed", "incomplete", "failed")
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "completed_at": int(time.time()) if status == "completed" else None,
            "status": status,
            "background": False,
            "error": error,
            "incomplete_details": incomplete,
            "output": output,
            "usage": usage if done else None,
            "previous_response_id": None,
            "reasoning": {"effort": None, "summary": None},
            "truncation": "disabled",
            **self.request.settings,
        }


def _message_item(item_id: str, text: str, logprobs: list[Any], status: str) -> dict[str, Any]:
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs}
    return {
        "id": item_id,
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": [] if status == "in_progress" else [part],
    }


def _call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> Any:
    return {
        "id": item_id,
        "type": "function_call",
        "status": status,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
    }


def response_from_chat(request: ResponsesRequest, chat: dict[str, Any]) -> dict[str, Any]:
    """The Response object of the chat answer ``chat`` (a ``chat.completion`` body)."""
    choice = chat["choices"][0]
    message = choice["message"]
    calls = message.get("tool_calls") or []
    status = "incomplete" if choice["finish_reason"] == "length" else "completed"
    output = []
    if message.get("content") or not calls:
        logprobs = (choice.get("logprobs") or {}).get("content") or []
        output.append(_message_item(_id("msg"), message.get("content") or "", logprobs, status))
    for call in calls:
        function = call["function"]
        output.append(
            _call_item(_id("fc"), call["id"], function["name"], function["arguments"], "completed")
        )
    counts = (chat["usage"]["prompt_tokens"], chat["usage"]["completion_tokens"])
    return ResponseHead(request).body(status, output, counts)


class _Events:
    """The event stream's state: open items, the output so far, sequence numbers."""

    def __init__(self, head: ResponseHead) -> None:
        self.head = head
        self.sequence = 0
        self.output: list[dict[str, Any]] = []
        self.text: dict[str, Any] | None = None  # the open message: id, text, logprobs
        self.calls: dict[int, dict[str, Any]] = {}  # chat tool-call index: the open call item

    def event(self, kind: str, **fields: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return b"event: " + kind.encode() + b"\ndata: " + dumps(payload) + b"\n\n"

    def text_delta(self, delta: str, logprobs: list[Any]) -> list[bytes]:
        events = self.close_calls()
        if self.text is None:
            self.text = {"id": _id("msg"), "index": len(self.output), "text": "", "logprobs": []}
            self.output.append({})
            item = _message_item(self.text["id"], "", [], "in_progress")
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            where = {"item_id": self.text["id"], "output_index": self.text["index"]}
            events.append(
                self.event(
                    "response.output_item.added", output_index=where["output_index"], item=item
                )
            )
            events.append(
                self.event("response.content_part.added", **where, content_index=0, part=part)
            )
        if not (delta or logprobs):
            return events
        self.text["text"] += delta
        self.text["logprobs"].extend(logprobs)
        where = {"item_id": self.text["id"], "output_index": self.text["index"]}
        events.append(
            self.event(
                "response.output_text.delta",
                **where,
                content_index=0,
                delta=delta,
                logprobs=logprobs,
            )
        )
        return events

    def close_text(self, status: str = "completed") -> list[bytes]:
        """Close the open message (``status``: ``"incomplete"`` when the budget cut it)."""
        if self.text is None:
            return []
        text, self.text = self.text, None
        where = {"item_id": text["id"], "output_index": text["index"]}
        item = _message_item(text["id"], text["text"], text["logprobs"], status)
        self.output[text["index"]] = item
        return [
            self.event(
                "response.output_text.done",
                **where,
                content_index=0,
                text=text["text"],
                logprobs=text["logprobs"],
            ),
            self.event(
                "response.content_part.done", **where, content_index=0, part=item["content"][0]
            ),
            self.event("response.output_item.done", output_index=text["index"], item=item),
        ]

    def call_delta(self, delta: dict[str, Any]) -> list[bytes]:
        """One entry of a chat chunk's ``tool_calls`` (a whole call, or OpenAI-style pieces: the
        first with ``id`` and ``name``, then ``arguments`` fragments)."""
        events = self.close_text()
        index = delta.get("index", len(self.calls))
        function = delta.get("function") or {}
        call = self.calls.get(index)
        if call is None:
            events += self.close_calls()
            call = {
                "id": _id("fc"),
                "index": len(self.output),
                "call_id": delta.get("id") or _id("call"),
                "name": function.get("name") or "",
                "arguments": "",
            }
            self.calls[index] = call
            self.output.append({})
            item = _call_item(call["id"], call["call_id"], call["name"], "", "in_progress")
            events.append(
                self.event("response.output_item.added", output_index=call["index"], item=item)
            )
        if function.get("arguments"):
            call["arguments"] += function["arguments"]
            events.append(
                self.event(
                    "response.function_call_arguments.delta",
                    item_id=call["id"],
                    output_index=call["index"],
                    delta=function["arguments"],
                )
            )
        return events

    def close_calls(self) -> list[bytes]:
        events = []
        for call in self.calls.values():
            item = _call_item(
                call["id"], call["call_id"], call["name"], call["arguments"], "completed"
            )
            self.output[call["index"]] = item
            where = {"item_id": call["id"], "output_index": call["index"]}
            events.append(
                self.event(
                    "response.function_call_arguments.done",
                    **where,
                    name=call["name"],
                    arguments=call["arguments"],
                )
            )
            events.append(
                self.event("response.output_item.done", output_index=call["index"], item=item)
            )
        self.calls.clear()
        return events


def _chat_chunks(raw: bytes) -> Any:
    """The JSON object of one chat-stream event, or None for ``[DONE]``."""
    if raw == SSE_DONE:
        return None
    return json.loads(raw.removeprefix(b"data: "))


async def response_events(
    request: ResponsesRequest, chat_events: AsyncIterator[bytes]
) -> AsyncIterator[bytes]:
    """The Responses API's events (see the module docstring) of a streamed chat answer
    (:func:`~llm_gym.serving.streaming.chat_stream`'s events, with usage)."""
    head = ResponseHead(request)
    state = _Events(head)
    finish = "stop"
    counts: tuple[int, int] | None = None
    try:
        yield state.event("response.created", response=head.body("in_progress", []))
        yield state.event("response.in_progress", response=head.body("in_progress", []))
        async for raw in chat_events:
            chunk = _chat_chunks(raw)
            if chunk is None:
                break
            if "error" in chunk:
                error = chunk["error"]
                yield state.event(
                    "error", code=error.get("code"), message=error["message"], param=error["param"]
                )
                failure = {"code": "server_error", "message": error["message"]}
                failed = head.body("failed", state.output, error=failure)
                yield state.event("response.failed", response=failed)
                return
            if chunk.get("usage"):
                counts = (chunk["usage"]["prompt_tokens"], chunk["usage"]["completion_tokens"])
            for choice in chunk.get("choices", ()):
                delta = choice.get("delta") or {}
                logprobs = (choice.get("logprobs") or {}).get("content") or []
                if delta.get("content") or logprobs:
                    for event in state.text_delta(delta.get("content") or "", logprobs):
                        yield event
                for call in delta.get("tool_calls") or ():
                    for event in state.call_delta(call):
                        yield event
                if choice.get("finish_reason") is not None:
                    finish = choice["finish_reason"]
        if not state.output:  # an empty reply is still a message, as OpenAI writes it
            for event in state.text_delta("", []):
                yield event
        status = "incomplete" if finish == "length" else "completed"
        for event in state.close_text(status) + state.close_calls():
            yield event
        yield state.event(f"response.{status}", response=head.body(status, state.output, counts))
    finally:
        close = getattr(chat_events, "aclose", None)
        if close is not None:
            await close()
