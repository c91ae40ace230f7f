"""``OpenAIPolicy``: any OpenAI-compatible chat-completions endpoint behind the policy interface.

Works with vLLM, SGLang, ``transformers serve``, ``llm-gym serve`` (:mod:`llm_gym.serving`),
OpenAI itself and the like. Requests go out through :class:`~llm_gym.policies.http.JsonClient`
(httpx: pooled keep-alive connections, one client per event loop), at most ``max_concurrency``
at a time per event loop.

**Endpoint.** ``base_url`` is everything before ``/chat/completions``, so for most servers it
ends in ``/v1`` (``http://127.0.0.1:8000/v1``); nothing is appended to it. The API key is read,
at every request, from the environment variable named by ``api_key_env`` (default
``OPENAI_API_KEY``) and sent as ``Authorization: Bearer ...``; without that variable no
``Authorization`` header is sent (local servers need none). The key is never stored or
described. Proxy environment variables are not used. :meth:`OpenAIPolicy.close` closes the
connections (a loop run by ``asyncio.run`` closes its own when it ends).

**Tools.** By default the model sees the tools as text in the system prompt, the way the
episode's action format writes them; with ``send_tools=True`` they go in the request's native
``tools`` field. Native ``tool_calls`` in a response are rendered back into text either way, so
the episode loop parses them like any other reply. :mod:`llm_gym.policies.openai_messages` has
the rules.

**Answers.** An answer is read up to ``max_response_bytes``, must be JSON, and must have the
shape of a chat completion where the policy reads it (:mod:`llm_gym.policies.openai_reply`),
with at most :data:`~llm_gym.policies.openai_reply.MAX_TOOL_CALLS` tool calls and no more logprob
entries than the request's ``max_tokens``; otherwise the request fails with a
:class:`MalformedResponseError` naming the field (its episode ends with ``POLICY_ERROR``). An
answer over :data:`~llm_gym.policies.http.OFF_LOOP_BYTES` is decoded, checked and rendered on a
worker thread, so it never stalls the other episodes of the event loop.

**Failures.** Connection errors, HTTP 429 and 5xx are retried up to ``max_retries`` times with
exponential backoff and jitter (a ``Retry-After`` header is honoured up to the backoff cap).
Other 4xx answers raise :class:`EndpointError` at once, naming the status and the server's own
message. ``request_timeout_s`` is a deadline per request: a request that has not answered by
then is aborted (its connection closed, its output, if any ever comes, discarded: timed-out output
is never sent to the environment) and sent again exactly once; a second timeout raises
:class:`EndpointTimeoutError`. Each request of an ``act`` call succeeds or fails on its own:
when some fail, ``act`` raises a :class:`~llm_gym.policies.PolicyBatchError` holding every
request's outcome (its generation, or its error), so the episode loop ends only the failed
requests' episodes (``POLICY_ERROR``) and sends nothing twice. The batch error is ``fatal`` when
a request met HTTP 401, 403 or 404 (bad credentials, an unknown model, a wrong URL: no request
can succeed), and the collection then stops at once. Cancelling ``act`` cancels its requests and
closes their connections.

**Seeds.** ``seed`` seeds the backoff jitter. When it is not ``None``, every request also carries
``seed = seed + n`` (``n`` counts the requests this policy has built, in order), so a server that
honours seeds samples reproducibly while the episodes of a group still differ; a retried request
keeps its seed.
"""

from __future__ import annotations

import asyncio
import functools
import os
import threading
import urllib.parse
from collections.abc import Sequence
from typing import Any

from llm_gym.errors import InvalidArgumentError
from llm_gym.policies.base import Generation, Policy, PolicyBatchError, PolicyRequest
from llm_gym.policies.http import (
    DEFAULT_BACKOFF_BASE_S,
    DEFAULT_BACKOFF_MAX_S,
    DEFAULT_MAX_CONCURRENCY,
    DEFAULT_MAX_RESPONSE_BYTES,
    DEFAULT_MAX_RETRIES,
    DEFAULT_REQUEST_TIMEOUT_S,
    TIMEOUT_RETRIES,
    EndpointError,
    EndpointTimeoutError,
    JsonClient,
    MalformedResponseError,
)
from llm_gym.policies.openai_messages import DEFAULT_SEND_TOOLS, build_messages, reply_text
from llm_gym.policies.openai_reply import (
    MAX_TOOL_CALLS,
    ChatReply,
    ReplyGuard,
    logprob_entries_cap,
    parse_chat_completion,
)

__all__ = [
    "DEFAULT_API_KEY_ENV",
    "DEFAULT_BACKOFF_BASE_S",
    "DEFAULT_BACKOFF_MAX_S",
    "DEFAULT_MAX_CONCURRENCY",
    "DEFAULT_MAX_NEW_TOKENS",
    "DEFAULT_MAX_RESPONSE_BYTES",
    "DEFAULT_MAX_RETRIES",
    "DEFAULT_REQUEST_TIMEOUT_S",
    "DEFAULT_SEND_TOOLS",
    "DEFAULT_TEMPERATURE",
    "DEFAULT_TOP_P",
    "TIMEOUT_RETRIES",
    "EndpointError",
    "EndpointTimeoutError",
    "MalformedResponseError",
    "OpenAIPolicy",
    "build_messages",
]

DEFAULT_API_KEY_ENV = "OPENAI_API_KEY"
"""The environment variable the API key is read from."""
DEFAULT_TEMPERATURE = 1.0
"""Sampling temperature (0: greedy, where the server supports it)."""
DEFAULT_TOP_P = 1.0
"""Nucleus sampling mass."""
DEFAULT_MAX_NEW_TOKENS: int | None = None
"""Tokens per turn when the request sets none (``None``: no ``max_tokens``, the server decides)."""

_USER_AGENT = "llm-gym-openai-policy"


class OpenAIPolicy(Policy):
    """Generations from an OpenAI-compatible ``/chat/completions`` endpoint (non-streaming).

    Args:
        model: The ``model`` field of every request.
        base_url: Everything before ``/chat/completions``, e.g. ``http://127.0.0.1:8000/v1``
            (``http`` or ``https``; a trailing ``/`` is dropped, nothing is appended).
        api_key_env: Environment variable holding the API key (``None``: never send one).
        temperature: Sampling temperature.
        top_p: Nucleus sampling mass.
        max_new_tokens: ``max_tokens`` when the request sets no ``max_new_tokens`` (``None``: the
            server's default).
        max_concurrency: Requests in flight at once.
        max_retries: Retries after connection errors, HTTP 429 and 5xx.
        request_timeout_s: Deadline of one request; a timed-out request is retried once.
        seed: Seeds the backoff jitter; also sent as ``seed + n`` with request ``n`` (see the
            module docstring), unless ``None``.
        extra_body: Extra request fields (``top_k``, ``chat_template_kwargs``, ...), merged last.
        send_tools: Send tools natively (``tools`` / ``tool_calls`` / ``role="tool"``) instead
            of as text in the system prompt.
        backoff_base_s: First retry delay (doubles per retry, with jitter).
        backoff_max_s: Longest retry delay.
        max_response_bytes: Largest answer read (a larger one fails its request).
    """

    name = "openai"

    def __init__(
        self,
        model: str,
        base_url: str,
        *,
        api_key_env: str | None = DEFAULT_API_KEY_ENV,
        temperature: float = DEFAULT_TEMPERATURE,
        top_p: float = DEFAULT_TOP_P,
        max_new_tokens: int | None = DEFAULT_MAX_NEW_TOKENS,
        max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
        max_retries: int = DEFAULT_MAX_RETRIES,
        request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
        seed: int | None = None,
        extra_body: dict[str, Any] | None = None,
        send_tools: bool = DEFAULT_SEND_TOOLS,
        backoff_base_s: float = DEFAULT_BACKOFF_BASE_S,
        backoff_max_s: float = DEFAULT_BACKOFF_MAX_S,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
    ) -> None:
        if not isinstance(model, str) or not model:
            raise InvalidArgumentError(
                f"model must be a non-empty string, actual value: {model!r}."
            )
        parts = urllib.parse.urlsplit(base_url) if isinstance(base_url, str) else None
        if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
            raise InvalidArgumentError(
                "base_url must be an http(s) URL up to (not including) /chat/completions, e.g. "
                f"'http://127.0.0.1:8000/v1'; actual value: {base_url!r}."
            )
        if temperature < 0:
            raise InvalidArgumentError(f"temperature must be >= 0, actual value: {temperature}.")
        if not 0 < top_p <= 1:
            raise InvalidArgumentError(f"top_p must be in (0, 1], actual value: {top_p}.")
        if max_new_tokens is not None and max_new_tokens < 1:
            raise InvalidArgumentError(
                f"max_new_tokens must be None or >= 1, actual value: {max_new_tokens}."
            )
        if max_concurrency < 1:
            raise InvalidArgumentError(
                f"max_concurrency must be >= 1, actual value: {max_concurrency}."
            )
        if max_retries < 0:
            raise InvalidArgumentError(f"max_retries must be >= 0, actual value: {max_retries}.")
        if not request_timeout_s > 0:
            raise InvalidArgumentError(
                f"request_timeout_s must be > 0, actual value: {request_timeout_s}."
            )
        if backoff_base_s < 0 or backoff_max_s < 0:
            raise InvalidArgumentError(
                f"backoff_base_s and backoff_max_s must be >= 0, actual values: "
                f"{backoff_base_s}, {backoff_max_s}."
            )
        if extra_body is not None and not isinstance(extra_body, dict):
            raise InvalidArgumentError(
                f"extra_body must be a dict or None, actual type: {type(extra_body).__name__}."
            )
        self.model = model
        self.base_url = base_url.rstrip("/")
        self.api_key_env = api_key_env
        self.temperature = float(temperature)
        self.top_p = float(top_p)
        self.max_new_tokens = max_new_tokens
        self.max_concurrency = int(max_concurrency)
        self.max_retries = int(max_retries)
        self.request_timeout_s = float(request_timeout_s)
        self.seed = seed
        self.extra_body = dict(extra_body or {})
        self.send_tools = bool(send_tools)
        self.backoff_base_s = float(backoff_base_s)
        self.backoff_max_s = float(backoff_max_s)
        self._url = self.base_url + "/chat/completions"
        hint = ""
        if not self.base_url.endswith("/v1"):
            hint = (
                " (base_url is everything before /chat/completions; most servers want it to "
                "end in /v1)"
            )
        self._client = JsonClient(
            self._url,
            headers=self._headers,
            label=f"for model {model!r}",
            hints={404: hint} if hint else None,
            max_concurrency=self.max_concurrency,
            max_retries=self.max_retries,
            request_timeout_s=self.request_timeout_s,
            backoff_base_s=self.backoff_base_s,
            backoff_max_s=self.backoff_max_s,
            max_response_bytes=max_response_bytes,
            seed=seed,
        )
        self.max_response_bytes = self._client.max_response_bytes
        self._requests = 0
        self._requests_lock = threading.Lock()  # act may run on several loops' threads

    @classmethod
    def from_spec(cls, argument: str = "", **options: Any) -> OpenAIPolicy:
        """``openai:MODEL@URL``: ``MODEL`` on the endpoint at ``URL`` (``.../v1``); options go to
        the constructor (``temperature``, ``seed``, ``max_concurrency``...)."""
        model, at, base_url = argument.partition("@")
        if not (model and at and base_url):
            raise InvalidArgumentError(
                f"Expected 'openai:MODEL@URL', for example 'openai:qwen@http://127.0.0.1:8000/v1', "
                f"actual value: 'openai:{argument}'."
            )
        return cls(model=model, base_url=base_url, **options)

    def close(self) -> None:
        """Close the connections of every event loop (a later request opens new ones)."""
        self._client.close()

    async def aclose(self) -> None:
        """:meth:`close`, waiting until the running loop's connections are closed."""
        await self._client.aclose()

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "model": self.model,
            "base_url": self.base_url,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "max_new_tokens": self.max_new_tokens,
            "send_tools": self.send_tools,
            "seed": self.seed,
            "extra_body": self.extra_body,
        }

    # --- requests ---------------------------------------------------------------------------

    def build_payload(self, request: PolicyRequest, seed: int | None = None) -> dict[str, Any]:
        """The JSON body for one request (without network access; handy for inspection)."""
        payload: dict[str, Any] = {
            "model": self.model,
            "messages": build_messages(
                request.messages,
                request.tool_specs,
                request.action_format,
                send_tools=self.send_tools,
            ),
            "temperature": self.temperature,
            "top_p": self.top_p,
        }
        max_tokens = request.max_new_tokens or self.max_new_tokens
        if max_tokens is not None:
            payload["max_tokens"] = int(max_tokens)
        if seed is not None:
            payload["seed"] = seed
        if self.send_tools and request.tool_specs:
            payload["tools"] = [dict(spec) for spec in request.tool_specs]
            if request.tool_choice is not None:
                payload["tool_choice"] = request.tool_choice
        elif request.tool_choice not in (None, "auto", "none"):
            why = (
                "this policy writes them as text in the prompt: use send_tools=True"
                if request.tool_specs
                else "the environment declares none"
            )
            raise InvalidArgumentError(
                f"The episode asks for tool_choice={request.tool_choice!r}, which an endpoint "
                f"enforces only on the tools a request sends; {why}."
            )
        payload.update(self.extra_body)
        return payload

    def _headers(self) -> dict[str, str]:
        headers = {"User-Agent": _USER_AGENT}
        key = os.environ.get(self.api_key_env) if self.api_key_env else None
        if key:
            headers["Authorization"] = f"Bearer {key}"
        return headers

    def _read(
        self, request: PolicyRequest, max_logprob_entries: int, answer: Any
    ) -> tuple[ChatReply, str, str | None]:
        """The answer checked (:func:`parse_chat_completion`) and its text rendered; runs where
        :class:`JsonClient` decodes the answer (off the event loop for a large one)."""
        reply = parse_chat_completion(answer, self._url, max_logprob_entries=max_logprob_entries)
        message = {"content": reply.content, "tool_calls": reply.tool_calls}
        text, tool_call_error = reply_text(message, request.action_format)
        return reply, text, tool_call_error

    async def _one(self, request: PolicyRequest, seed: int | None) -> Generation:
        payload = self.build_payload(request, seed)
        cap = logprob_entries_cap(payload)
        read = functools.partial(self._read, request, cap)
        guard = functools.partial(ReplyGuard, self._url, MAX_TOOL_CALLS, cap)
        answer = await self._client.post(payload, parse=read, watch=guard)
        reply, text, tool_call_error = answer.body
        metadata: dict[str, Any] = {
            "latency_s": answer.latency_s,
            "retries": answer.retries,
            "usage": reply.usage,
            "finish_reason": reply.finish_reason,
        }
        if tool_call_error is not None:
            metadata["tool_call_error"] = tool_call_error
        if reply.reasoning_content:
            metadata["reasoning_content"] = reply.reasoning_content
        if reply.logprobs is not None:
            metadata["logprobs"] = reply.logprobs
        return Generation(
            text=text,
            finish_reason="length" if reply.finish_reason == "length" else "stop",
            metadata=metadata,
        )

    async def act(self, requests: Sequence[PolicyRequest]) -> list[Generation]:
        """One generation per request; see the module docstring (**Failures**) for what a failed
        request does (a :class:`~llm_gym.policies.PolicyBatchError` with every outcome)."""
        if not requests:
            return []
        with self._requests_lock:
            first, self._requests = self._requests, self._requests + len(requests)
        seeds = [None if self.seed is None else self.seed + first + i for i in range(len(requests))]
        tasks = [
            asyncio.ensure_future(self._one(r, s)) for r, s in zip(requests, seeds, strict=True)
        ]
        try:
            await asyncio.wait(tasks)
        finally:  # cancelled: so are the requests, and their connections are closed
            pending = [task for task in tasks if not task.done()]
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
        outcomes: list[Generation | BaseException] = []
        for task in tasks:
            error = asyncio.CancelledError() if task.cancelled() else task.exception()
            if error is not None and not isinstance(error, Exception | asyncio.CancelledError):
                raise error  # KeyboardInterrupt and the like are not a request's outcome
            outcomes.append(task.result() if error is None else error)
        failed = [outcome for outcome in outcomes if isinstance(outcome, BaseException)]
        if not failed:
            return outcomes  # type: ignore[return-value]
        batch_error = PolicyBatchError(
            f"{len(failed)} of {len(outcomes)} requests to {self._url} failed; the first: "
            f"{failed[0]}",
            outcomes,
        )
        batch_error.fatal = any(getattr(error, "fatal", False) for error in failed)
        raise batch_error from failed[0]
