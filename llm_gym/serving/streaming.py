"""``stream=true``: server-sent events for chat and completions.

:func:`chat_stream` and :func:`completion_stream` queue the generation in the engine's worker
thread and return once the prompt is rendered and checked, so a bad request is still a plain
4xx answer; then the returned iterator yields the events:

* chat: a first chunk with ``delta: {"role": "assistant", "content": ""}``, content deltas as the
  text is generated (with ``logprobs`` when asked), a last chunk with an empty delta and the
  ``finish_reason``; with ``stream_options.include_usage`` every chunk has ``"usage": null`` and
  one more chunk with no choices carries the usage. Then ``data: [DONE]``.
* With ``tools``, the text outside tool calls streams until a tool call can have started (for the
  Hermes format, up to ``<tool_call>``; other formats hold the whole reply back); the rest is
  parsed once the generation ends and sent as one ``tool_calls`` delta (each call with its
  ``index``, ``id``, ``type`` and complete ``function``) with ``finish_reason: "tool_calls"``;
  a reply that is no call, or calls a tool the request did not declare, ends as content.
  A forced reply (``tool_choice`` ``"required"`` or named) that ``max_tokens`` cuts keeps its
  whole calls: the call the budget cut is dropped (its tokens too) and ``finish_reason`` is
  ``"tool_calls"``; with no whole call it ends as content with ``"length"``.
  The streamed content may differ from a whole answer's in the whitespace around the calls.
* completions: ``text_completion`` objects with text deltas (the prompt first with ``echo``).

A failure after the first event is sent as an ``error`` event before ``[DONE]``. When the
client goes away, the generation is stopped at the next token.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable, Collection
from typing import Any

from llm_gym.actions import ActionFormat
from llm_gym.actions.hermes import TOOL_CALL_OPEN
from llm_gym.serving.chat_protocol import ChatRequest
from llm_gym.serving.completions import completion_prompt
from llm_gym.serving.engine import Engine
from llm_gym.serving.generation import Piece, Sampling, TextAssembler
from llm_gym.serving.protocol import APIError, CompletionRequest
from llm_gym.serving.responses import (
    SSE_DONE,
    assistant_message,
    chat_chunk,
    completion_chunk,
    logprobs_content,
    new_id,
    sse,
    usage,
)

__all__ = ["STREAM_MARKERS", "chat_stream", "completion_stream"]

STREAM_MARKERS = {"hermes": TOOL_CALL_OPEN}
"""Per action format, the text a tool call starts with: content streams up to it. A format
without one holds the whole reply of a request with tools until the end."""

_END = object()


class _Feed:
    """Pieces from the worker thread to the event loop; ``cancelled`` goes the other way."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self.cancelled = threading.Event()

    def put(self, item: Any) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:  # the loop is closed: nobody reads any more
            self.cancelled.set()


async def _start(
    engine: Engine,
    prepare: Callable[[], tuple[Any, list[int], Sampling]],
    assembler: TextAssembler,
    convert: Callable[[Piece], Any],
) -> tuple[Any, _Feed]:
    """Queue ``prepare`` then the generation in the worker; return ``prepare``'s first value once
    it succeeded (its :class:`APIError` is raised here). Pieces reach the feed through
    ``convert``, in the worker: the sampled tokens are decoded in the model's thread."""
    loop = asyncio.get_running_loop()
    feed = _Feed(loop)
    prepared: asyncio.Future[Any] = loop.create_future()

    def settle(value: Any, failed: bool) -> None:
        if not prepared.done():
            (prepared.set_exception if failed else prepared.set_result)(value)

    def job() -> None:
        try:
            result, prompt_ids, sampling = prepare()
        except BaseException as exc:
            loop.call_soon_threadsafe(settle, exc, True)
            return
        loop.call_soon_threadsafe(settle, result, False)
        try:
            engine.run(
                prompt_ids,
                sampling,
                assembler,
                lambda piece: feed.put(convert(piece)),
                feed.cancelled.is_set,
            )
        except BaseException as exc:
            feed.put(exc)
        else:
            feed.put(_END)

    work = engine.submit(job)
    try:
        await asyncio.wait([prepared, work], return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        feed.cancelled.set()
        raise
    if not prepared.done():  # the job never ran (the server is closing) or failed outright
        feed.cancelled.set()
        work.result()
        raise APIError(503, "the server is shutting down", kind="server_error")
    return prepared.result(), feed


def _error_event(exc: BaseException) -> bytes:
    if not isinstance(exc, APIError):
        exc = APIError(500, f"internal error: {type(exc).__name__}: {exc}", kind="server_error")
    return sse(exc.body())


class _ToolHold:
    """Streams the content before a tool call can start; holds the rest for the parser."""

    def __init__(
        self, action_format: ActionFormat, tool_names: Collection[str], parallel: bool = True
    ) -> None:
        self.format = action_format
        self.tool_names = tool_names
        self.parallel = parallel
        self.marker = STREAM_MARKERS.get(action_format.name)
        self.text = ""
        self.sent = 0
        self.holding = self.marker is None

    def push(self, text: str) -> str:
        self.text += text
        if self.holding or self.marker is None:
            return ""
        start = self.text.find(self.marker, max(0, self.sent - len(self.marker)))
        if start != -1:
            end, self.holding = start, True
        else:  # keep back an end that may begin the marker
            keep = next(
                (
                    k
                    for k in range(len(self.marker) - 1, 0, -1)
                    if self.text.endswith(self.marker[:k])
                ),
                0,
            )
            end = len(self.text) - keep
        out = self.text[self.sent : max(end, self.sent)]
        self.sent = max(end, self.sent)
        return out

    def finish(self) -> tuple[str, list[dict[str, Any]]]:
        """The content not sent yet and the parsed tool calls (none: the rest is content)."""
        message, _ = assistant_message(
            self.text, "stop", self.format, parallel=self.parallel, tool_names=self.tool_names
        )
        calls = message.get("tool_calls")
        if not calls:
            return self.text[self.sent :], []
        content = message["content"] or ""
        lead = self.text[: self.sent].lstrip()
        return (content[len(lead) :] if content.startswith(lead) else ""), calls


async def chat_stream(
    engine: Engine, request: ChatRequest, prompt_ids: list[int] | None = None
) -> AsyncIterator[bytes]:
    """The events of a streamed chat completion (see the module docstring) from its
    ``prompt_ids`` (:meth:`Engine.render`; None: rendered in the model's thread)."""
    assembler = TextAssembler(
        engine.tokenizer, engine.eos_ids, request.stops, keep_special=request.parse_tool_calls
    )

    def prepare() -> tuple[int, list[int], Sampling]:
        ids = engine.chat_prompt(request) if prompt_ids is None else prompt_ids
        return len(ids), ids, engine.chat_sampling(request, len(ids))

    def convert(piece: Piece) -> tuple[str, list[dict[str, Any]]]:
        if not request.logprobs:
            return piece.text, []
        return piece.text, logprobs_content(piece.tokens, request.top_logprobs, engine.token_text)

    prompt_tokens, feed = await _start(engine, prepare, assembler, convert)
    return _chat_events(engine, request, assembler, feed, prompt_tokens)


async def _chat_events(
    engine: Engine,
    request: ChatRequest,
    assembler: TextAssembler,
    feed: _Feed,
    prompt_tokens: int,
) -> AsyncIterator[bytes]:
    head = {"id": new_id("chatcmpl"), "created": int(time.time()), "model": engine.model_name}
    with_usage = request.include_usage
    hold = None
    if request.parse_tool_calls:
        hold = _ToolHold(engine.action_format, request.tool_names, request.parallel_tool_calls)
    lps: list[dict[str, Any]] = []
    sent = [0]  # logprob entries sent

    def content(text: str, finish: str | None = None) -> bytes:
        logprobs = None
        if request.logprobs:
            logprobs, lps[:] = list(lps), []
            sent[0] += len(logprobs)
        return sse(chat_chunk(head, {"content": text}, finish, logprobs, with_usage))

    try:
        yield sse(chat_chunk(head, {"role": "assistant", "content": ""}, None, None, with_usage))
        while (item := await feed.queue.get()) is not _END:
            if isinstance(item, BaseException):
                yield _error_event(item)
                yield SSE_DONE
                return
            text, entries = item
            lps.extend(entries)
            text = text if hold is None else hold.push(text)
            if text:
                yield content(text)
        finish = assembler.finish or "length"
        if hold is not None:
            if assembler.dropped:  # cut back to its whole calls: all of them still held
                hold.text = assembler.text
                del lps[max(0, len(assembler.ids) - sent[0]) :]
            rest, calls = hold.finish()
            if rest or (lps and not calls):
                yield content(rest)
            if calls:
                delta = {"tool_calls": [{"index": i, **call} for i, call in enumerate(calls)]}
                logprobs = list(lps) if request.logprobs else None
                yield sse(chat_chunk(head, delta, None, logprobs, with_usage))
                lps.clear()
                finish = "tool_calls"
        yield sse(chat_chunk(head, {}, finish, list(lps) if lps else None, with_usage))
        if with_usage:
            counts = usage(prompt_tokens, len(assembler.generated))
            yield sse({**head, "object": "chat.completion.chunk", "choices": [], "usage": counts})
        yield SSE_DONE
    finally:
        feed.cancelled.set()


async def completion_stream(engine: Engine, request: CompletionRequest) -> AsyncIterator[bytes]:
    """The events of a streamed ``/v1/completions`` request (see the module docstring)."""
    assembler = TextAssembler(engine.tokenizer, engine.eos_ids)

    def prepare() -> tuple[tuple[int, str], list[int], Sampling]:
        ids, budget = completion_prompt(
            request,
            model=engine.model,
            tokenizer=engine.tokenizer,
            context=engine.context,
            default_max_tokens=engine.default_max_tokens,
            max_tokens_limit=engine.max_tokens_limit,
        )
        echo = ""
        if request.echo:
            echo = (
                request.prompt
                if isinstance(request.prompt, str)
                else engine.tokenizer.decode(
                    ids, skip_special_tokens=False, clean_up_tokenization_spaces=False
                )
            )
        sampling = Sampling(budget, request.temperature, request.top_p, request.seed)
        return (len(ids), echo), ids, sampling

    (prompt_tokens, echo), feed = await _start(engine, prepare, assembler, lambda piece: piece.text)
    return _completion_events(engine, request, assembler, feed, prompt_tokens, echo)


async def _completion_events(
    engine: Engine,
    request: CompletionRequest,
    assembler: TextAssembler,
    feed: _Feed,
    prompt_tokens: int,
    echo: str,
) -> AsyncIterator[bytes]:
    head = {"id": new_id("cmpl"), "created": int(time.time()), "model": engine.model_name}
    with_usage = request.include_usage
    try:
        if echo:
            yield sse(completion_chunk(head, echo, None, with_usage))
        while (item := await feed.queue.get()) is not _END:
            if isinstance(item, BaseException):
                yield _error_event(item)
                yield SSE_DONE
                return
            if item:
                yield sse(completion_chunk(head, item, None, with_usage))
        yield sse(completion_chunk(head, "", assembler.finish or "length", with_usage))
        if with_usage:
            counts = usage(prompt_tokens, len(assembler.generated))
            yield sse({**head, "object": "text_completion", "choices": [], "usage": counts})
        yield SSE_DONE
    finally:
        feed.cancelled.set()
