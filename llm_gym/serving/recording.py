"""The training endpoint: what the served model was given and sampled, recorded per episode.

A :class:`Recorder` in front of an :class:`~llm_gym.serving.engine.Engine`
(``ChatCompletionServer(..., recorder=...)``) keys every ``/v1/chat/completions`` and
``/v1/responses`` request to an episode, read in this order:

* the ``X-Episode-Id`` header (:data:`EPISODE_HEADER`);
* the body's ``episode_id`` field (the ``openai`` client's ``extra_body={"episode_id": ...}``);
* the base URL ``http://HOST:PORT/episodes/{id}/v1`` (what the trainer hands each agent);
* the API key, when it starts with ``episode:`` (``api_key="episode:abc"``);
* else the conversation: a request whose messages extend an open conversation's, its last
  reply included, continues it; any other request opens a new one (``conversation-N``).

An id is 1 to :data:`MAX_EPISODE_ID` characters of ``A-Z a-z 0-9 . _ : -``; anything else is a
400 naming where it came from. With ``open_only`` (the trainer) only the ids :meth:`open` opened
are served: a call for an episode that ended or never began is a 400 and records nothing.

Each request of an episode is a call. The episode holds its token stream in a
:class:`~llm_gym.rollout.tokens.TokenTracker`: the model continues from the ids held (earlier
prompts and the ids it sampled, as sampled) plus the chat template's delta for the new messages,
so a continuation never re-tokenises what came before. The agent's copies of earlier replies are
matched back to the text the model wrote (content and tool calls compared, ids ignored). Where
the agent rewrote history (dropped or edited a message, changed its tools or template options)
or the template rewrites it, a new sample starts from the full rendering, as the rollout's
tracker does. Every call records its prompt ids, its sampled ids (the end-of-sequence one
included), their logprobs (the model's distribution at temperature 1, as the server reports
them) and, when the served weights are versioned (async training's replicas), the version
that sampled each.

Rules of the episode (the rollout loop's, on the endpoint): ``max_calls`` calls at most (the
next is refused and the episode ends as ``MAX_TURNS``); a prompt past ``max_model_length``, or a
reply cut by it, ends the episode as ``CONTEXT_OVERFLOW``; an ended episode refuses further
calls. Streaming is refused here (``stream=false``): a call is recorded whole.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from llm_gym.core.env import TruncationCause
from llm_gym.core.types import Message
from llm_gym.errors import ChatTemplateError, LlmGymError, TokenizerError
from llm_gym.rollout.tokens import TokenTracker
from llm_gym.serving.chat_protocol import ChatRequest
from llm_gym.serving.engine import Engine
from llm_gym.serving.generation import TokenOut
from llm_gym.serving.protocol import bad_request
from llm_gym.serving.recording_records import (
    API_KEY_PREFIX,
    EPISODE_FIELD,
    EPISODE_HEADER,
    MAX_EPISODE_ID,
    MAX_OPEN_EPISODES,
    RecordedCall,
    RecordedEpisode,
    check_episode_id,
    message_shape,
)

__all__ = [
    "API_KEY_PREFIX",
    "EPISODE_FIELD",
    "EPISODE_HEADER",
    "MAX_EPISODE_ID",
    "MAX_OPEN_EPISODES",
    "RecordedCall",
    "RecordedEpisode",
    "Recorder",
    "check_episode_id",
]


class _Episode:
    def __init__(self, episode_id: str) -> None:
        self.record = RecordedEpisode(episode_id)
        self.lock = asyncio.Lock()
        self.tracker: TokenTracker | None = None
        self.options = ""
        self.history: list[str] = []  # the conversation's shapes, its last reply included
        self.replies: list[tuple[str, str]] = []  # (shape of a reply, the text sampled)
        self.ended = False
        self.closed = False  # taken by close(): a call still running records nothing


class Recorder:
    """Records the calls of each episode served by ``engine`` (see the module docstring).

    Args:
        engine: The engine that serves the calls.
        open_only: Serve only the episodes :meth:`open` opened (the trainer's mode).
        max_calls: Calls per episode (None: any).
        max_model_length: Context of an episode in tokens (None: the model's).
        max_tokens: The most tokens one reply may have (None: the request's or the server's).
        temperature: Sample every call at this temperature, whatever the request says (None:
            the request's); ``top_p`` alike.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        open_only: bool = False,
        max_calls: int | None = None,
        max_model_length: int | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
    ) -> None:
        self.engine = engine
        self.open_only = open_only
        self.max_calls = max_calls
        context = engine.context
        if max_model_length is not None:
            context = max_model_length if context is None else min(context, max_model_length)
        self.context = context
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.top_p = top_p
        self.generating_seconds = 0.0
        """Seconds the engine spent on the recorded calls (so far)."""
        self._episodes: OrderedDict[str, _Episode] = OrderedDict()
        self._numbers = itertools.count(1)
        self._lock = threading.Lock()  # the server's loop, its threads and the trainer's

    # --- the episodes -------------------------------------------------------------------------

    def open(self, episode_id: str) -> None:
        """Start recording ``episode_id`` (call it from the server's event loop or before)."""
        check_episode_id(episode_id, "episode_id")
        with self._lock:
            if episode_id in self._episodes:
                raise bad_request(f"episode {episode_id!r} is already open", "episode_id")
            if len(self._episodes) >= MAX_OPEN_EPISODES:
                raise bad_request(f"{MAX_OPEN_EPISODES} episodes are open already", "episode_id")
            self._episodes[episode_id] = _Episode(episode_id)

    def close(self, episode_id: str) -> RecordedEpisode:
        """Stop recording ``episode_id`` and return what it recorded (an episode never opened
        or already closed: an empty record); later calls for it are refused."""
        with self._lock:
            episode = self._episodes.pop(episode_id, None)
            if episode is None:
                return RecordedEpisode(episode_id)
            episode.ended = episode.closed = True
            if episode.tracker is not None:
                episode.record.samples.extend(episode.tracker.finish())
                episode.tracker = None
            return episode.record

    def episode_key(
        self, headers: Mapping[str, str], body: Mapping[str, Any], path_id: str | None
    ) -> str | None:
        """The episode a request names (header, body, path, API key), or None."""
        header = headers.get(EPISODE_HEADER)
        if header is not None:
            return check_episode_id(header, "X-Episode-Id")
        if EPISODE_FIELD in body:
            return check_episode_id(body[EPISODE_FIELD], EPISODE_FIELD)
        if path_id is not None:
            return check_episode_id(path_id, "the base URL's /episodes/{id}")
        scheme, _, key = headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and key.startswith(API_KEY_PREFIX):
            return check_episode_id(key[len(API_KEY_PREFIX) :], "the API key's episode id")
        return None

    def _find(self, key: str | None, request: ChatRequest) -> _Episode:
        with self._lock:
            return self._find_locked(key, request)

    def _find_locked(self, key: str | None, request: ChatRequest) -> _Episode:
        if key is not None:
            found = self._episodes.get(key)
            if found is None and self.open_only:
                raise bad_request(
                    f"no open episode {key!r}: it ended (its time or turn limit) or never "
                    "began; use the base URL the trainer gave this episode",
                    "episode_id",
                )
            if found is None:
                found = self._episodes[key] = _Episode(key)
                self._evict()
            self._episodes.move_to_end(key)
            return found
        if self.open_only:
            raise bad_request(
                "this training endpoint needs an episode id: use the base URL the trainer "
                "gave the agent (…/episodes/{id}/v1), the X-Episode-Id header or "
                "extra_body={'episode_id': ...}",
                "episode_id",
            )
        shapes = [message_shape(m) for m in request.messages]
        best = None
        for episode in self._episodes.values():  # the longest open conversation it extends
            n = len(episode.history)
            if (
                episode.replies
                and not episode.lock.locked()
                and not episode.ended
                and n < len(shapes)
                and shapes[:n] == episode.history
                and (best is None or n > len(best.history))
            ):
                best = episode
        if best is None:
            name = f"conversation-{next(self._numbers)}"
            best = self._episodes[name] = _Episode(name)
            self._evict()
        self._episodes.move_to_end(best.record.episode_id)
        return best

    def _evict(self) -> None:
        while len(self._episodes) > MAX_OPEN_EPISODES:
            self._episodes.popitem(last=False)

    # --- one call -------------------------------------------------------------------------------

    async def serve(
        self,
        key: str | None,
        request: ChatRequest,
        answer: Callable[[Callable[[Callable[[], bool]], dict[str, Any]]], Any],
    ) -> Any:
        """Serve ``request`` in its episode: its prompt is built here (in the engine's render
        pool), then ``answer(work)`` runs ``work(cancelled)`` in the engine's thread (the
        app's cancellable call) and returns what ``answer`` returns. One call of an episode
        at a time."""
        if request.stream:
            raise bad_request(
                "the training endpoint records whole answers: send stream=false", "stream"
            )
        episode = self._find(key, request)
        async with episode.lock:
            self._admit(episode)
            prompt_ids = await self.engine.in_render_pool(self._prompt, episode, request)
            forced = self._sampling(request, len(prompt_ids))
            await self.engine.in_render_pool(self.engine.chat_grammar, forced)

            def work(cancelled: Callable[[], bool]) -> dict[str, Any]:
                return self._complete(episode, request, forced, prompt_ids, cancelled)

            return await answer(work)

    def _admit(self, episode: _Episode) -> None:
        record = episode.record
        if episode.ended:
            record.refused += 1
            cause = record.truncation.value if record.truncation else "closed"
            raise bad_request(
                f"episode {record.episode_id!r} has ended ({cause}); start a new episode",
                "episode_id",
            )
        if self.max_calls is not None and len(record.calls) >= self.max_calls:
            self._end(episode, TruncationCause.MAX_TURNS)
            raise bad_request(
                f"episode {record.episode_id!r} has made its {self.max_calls} calls (the turn "
                "limit); it has ended",
                "messages",
            )

    def _end(self, episode: _Episode, cause: TruncationCause, refused: bool = True) -> None:
        episode.ended = True
        episode.record.refused += int(refused)
        episode.record.truncation = cause

    def _template_messages(self, episode: _Episode, messages: list[Message]) -> list[Message]:
        """The conversation as the tracker renders it: the model's own replies as the text it
        sampled, another assistant message's tool calls written in the action format."""
        sampled = dict(episode.replies)
        out: list[Message] = []
        for message in messages:
            text = (
                sampled.get(message_shape(message)) if message.get("role") == "assistant" else None
            )
            if text is not None:
                out.append({"role": "assistant", "content": text})
            elif message.get("role") == "assistant" and message.get("tool_calls"):
                calls = [
                    {**c, "function": {**c["function"], "arguments": _json(c["function"])}}
                    for c in message["tool_calls"]
                ]
                text = self.engine.action_format.render_message({**message, "tool_calls": calls})
                out.append({"role": "assistant", "content": text})
            else:
                out.append(message)
        return out

    def _prompt(self, episode: _Episode, request: ChatRequest) -> list[int]:
        """The ids the model continues from (in the render pool; see the module docstring)."""
        with self._lock:
            if episode.closed:
                raise bad_request(f"episode {episode.record.episode_id!r} has ended", "episode_id")
            return self._prompt_locked(episode, request)

    def _prompt_locked(self, episode: _Episode, request: ChatRequest) -> list[int]:
        shapes = [message_shape(m) for m in request.messages]
        options = json.dumps([request.tools, request.chat_template_kwargs], sort_keys=True)
        n = len(episode.history)
        tracker = episode.tracker
        limit = None if self.context is None else self.context - 1
        try:
            if (
                tracker is not None
                and options == episode.options
                and n < len(shapes)
                and shapes[:n] == episode.history
            ):
                new = self._template_messages(episode, request.messages[n:])
                tracker.add_environment(new, limit)
            else:
                if tracker is not None:
                    episode.record.samples.extend(tracker.finish())
                tracker = episode.tracker = TokenTracker(
                    self.engine.tokenizer,
                    request.tools or [],
                    request.chat_template_kwargs,
                    action_format=self.engine.action_format,
                )
                episode.options = options
                tracker.start(self._template_messages(episode, request.messages))
        except (ChatTemplateError, TokenizerError, LlmGymError, ValueError, TypeError) as exc:
            message = f"the conversation could not be rendered: {exc}"[:2000]
            raise bad_request(message, "messages") from None
        episode.history = shapes
        length = tracker.overflow_tokens or tracker.context_length
        if limit is not None and (tracker.overflow_tokens is not None or length > limit):
            self._end(episode, TruncationCause.CONTEXT_OVERFLOW)
            episode.record.overflow_tokens = length
            raise bad_request(
                f"the conversation is {length} tokens; the episode's context is {self.context} "
                "tokens (one must be left to generate): the episode has ended",
                "messages",
            )
        return tracker.context_ids

    def _sampling(self, request: ChatRequest, prompt_tokens: int) -> ChatRequest:
        """The request as the model runs it: logprobs and ids always, the trainer's sampling,
        the reply within the episode's context."""
        cap = self.max_tokens or request.max_tokens or self.engine.default_max_tokens
        cap = min(cap, request.max_tokens or cap)
        if self.context is not None:
            cap = min(cap, self.context - prompt_tokens)
        return dataclasses.replace(
            request,
            logprobs=True,
            return_token_ids=True,
            max_tokens=cap,
            temperature=request.temperature if self.temperature is None else self.temperature,
            top_p=request.top_p if self.top_p is None else self.top_p,
        )

    def _complete(
        self,
        episode: _Episode,
        request: ChatRequest,
        forced: ChatRequest,
        prompt_ids: list[int],
        cancelled: Callable[[], bool],
    ) -> dict[str, Any]:
        """Generate (in the engine's thread), record the call, answer as the client asked."""
        seen: list[TokenOut] = []
        start = time.perf_counter()
        try:
            body = self.engine.chat_completion(forced, cancelled, prompt_ids, seen=seen)
        finally:
            self.generating_seconds += time.perf_counter() - start
        choice = body["choices"][0]
        ids = list(choice["token_ids"])
        logprobs = [float(t.logprob or 0.0) for t in seen[: len(ids)]]
        logprobs += [0.0] * (len(ids) - len(logprobs))
        versions = None  # the served weights' versions, when they are versioned
        if self.engine.weights is not None:
            versions = [t.version for t in seen[: len(ids)]]
            versions += [versions[-1] if versions else -1] * (len(ids) - len(versions))
        kept = ids[:-1] if ids and ids[-1] in self.engine.eos_ids else ids
        text = self.engine.tokenizer.decode(
            kept, skip_special_tokens=False, clean_up_tokenization_spaces=False
        )
        with self._lock:
            if not episode.closed and episode.tracker is not None:
                call = RecordedCall(
                    list(prompt_ids), ids, logprobs, text, choice["message"],
                    choice["finish_reason"], list(request.messages), versions,
                )  # fmt: skip
                self._record(episode, request, forced, call)
        if not request.logprobs:
            choice["logprobs"] = None
        if not request.return_token_ids:
            body.pop("prompt_token_ids", None)
            choice.pop("token_ids", None)
        return body

    def _record(
        self, episode: _Episode, request: ChatRequest, forced: ChatRequest, call: RecordedCall
    ) -> None:
        record = episode.record
        assert episode.tracker is not None
        ids, text = call.completion_ids, call.text
        episode.tracker.add_generation(
            ids, call.logprobs, text, len(record.calls), call.policy_versions
        )
        episode.history.append(message_shape(call.message))
        episode.replies.append((message_shape(call.message), text))
        record.tool_specs = list(request.tools or [])
        record.calls.append(call)
        if call.finish_reason == "length" and forced.max_tokens != (
            self.max_tokens or request.max_tokens or self.engine.default_max_tokens
        ):  # the context, not the reply's budget, cut it
            self._end(episode, TruncationCause.CONTEXT_OVERFLOW, refused=False)
            record.overflow_tokens = len(call.prompt_ids) + len(ids)


def _json(function: Mapping[str, Any]) -> str:
    arguments = function.get("arguments", {})
    return arguments if isinstance(arguments, str) else json.dumps(arguments)
