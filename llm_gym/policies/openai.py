"""``OpenAIPolicy``: any OpenAI-compatible chat-completions endpoint behind the policy interface.

Works with vLLM, SGLang, ``transformers serve``, ``llm-gym serve`` (:mod:`llm_gym.serving`),
OpenAI itself and the like. It needs no extra package: requests go out with the standard
library's ``http.client`` in worker threads, at most ``max_concurrency`` at a time.

**Endpoint.** ``base_url`` is everything before ``/chat/completions``, so for most servers it
ends in ``/v1`` (``http://127.0.0.1:8000/v1``); nothing is appended to it. The API key is read,
at every request, from the environment variable named by ``api_key_env`` (default
``OPENAI_API_KEY``) and sent as ``Authorization: Bearer ...``; without that variable no
``Authorization`` header is sent (local servers need none). The key is never stored or
described. Every request opens its own connection; proxy environment variables are not used.

**Tools.** With ``send_tools=False`` (the default) the model sees the tools as text, the way the
episode's action format writes them: ``action_format.render_tool_specs(tool_specs)`` is appended
to the first system message (a system message holding only it is inserted when the conversation
has none), earlier assistant turns are sent as the text the model wrote
(``action_format.render_message``: content plus rendered tool calls), and tool results as
``user`` messages rendered with ``action_format.render_tool_result`` (consecutive results merged
into one message, as the Qwen/Hermes chat layout does). This works with any plain chat model and
keeps the prompt identical to what a local ``HFPolicy`` renders for Hermes-style models.
With ``send_tools=True`` the tool specs go in the request's native ``tools`` field, assistant turns
carry native ``tool_calls`` and tool results are ``role="tool"`` messages with their
``tool_call_id``; the server's chat template then renders them. Either way, when a response holds
native ``tool_calls`` (servers that parse tool calls out of the text do this even without
``tools``) they are rendered back into text with ``action_format.render_tool_calls``, so the
episode loop parses them like any other reply.

**Failures.** Connection errors, HTTP 429 and 5xx are retried up to ``max_retries`` times with
exponential backoff and jitter (a ``Retry-After`` header is honoured up to the backoff cap).
Other 4xx answers raise :class:`EndpointError` at once, naming the status and the server's own
message. ``request_timeout_s`` is a deadline per request: a request that has not answered by
then is aborted (its connection closed, its output, if any ever comes, discarded: timed-out output
is never sent to the environment) and sent again exactly once; a second timeout raises
:class:`EndpointTimeoutError`. Any error fails the whole ``act`` call (the loop then stops the
collection with a ``PolicyError``), and the batch's other in-flight requests are cancelled.

**Seeds.** ``seed`` seeds the backoff jitter. When it is not ``None``, every request also carries
``seed = seed + n`` (``n`` counts the requests this policy has built, in order), so a server that
honours seeds samples reproducibly while the episodes of a group still differ; a retried request
keeps its seed.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import http.client
import json
import os
import random
import socket
import threading
import time
import urllib.parse
import weakref
from collections.abc import Sequence
from typing import Any

from llm_gym.actions import ActionFormat
from llm_gym.core.types import Message, ToolCall
from llm_gym.errors import InvalidArgumentError, LlmGymError
from llm_gym.policies.base import Generation, Policy, PolicyRequest

__all__ = [
    "DEFAULT_API_KEY_ENV",
    "DEFAULT_BACKOFF_BASE_S",
    "DEFAULT_BACKOFF_MAX_S",
    "DEFAULT_MAX_CONCURRENCY",
    "DEFAULT_MAX_NEW_TOKENS",
    "DEFAULT_MAX_RETRIES",
    "DEFAULT_REQUEST_TIMEOUT_S",
    "DEFAULT_SEND_TOOLS",
    "DEFAULT_TEMPERATURE",
    "DEFAULT_TOP_P",
    "TIMEOUT_RETRIES",
    "EndpointError",
    "EndpointTimeoutError",
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
DEFAULT_MAX_CONCURRENCY = 8
"""Requests in flight at once (per event loop)."""
DEFAULT_MAX_RETRIES = 3
"""Retries of a request after a connection error, HTTP 429 or 5xx."""
DEFAULT_REQUEST_TIMEOUT_S = 600.0
"""Deadline of one request, in seconds."""
DEFAULT_SEND_TOOLS = False
"""Tools as text in the system prompt (False) or in the native ``tools`` field (True)."""
DEFAULT_BACKOFF_BASE_S = 0.5
"""First retry delay; doubles on every retry, times a jitter factor in [0.5, 1.5)."""
DEFAULT_BACKOFF_MAX_S = 30.0
"""Longest delay between two attempts."""
TIMEOUT_RETRIES = 1
"""A timed-out request is sent again this many times, then the policy fails."""

_RETRY_STATUSES = frozenset({429})
_USER_AGENT = "llm-gym-openai-policy"


class EndpointError(LlmGymError, RuntimeError):
    """The chat-completions endpoint refused a request, failed, or answered something unusable.

    Attributes:
        status: The HTTP status (``None`` for connection errors and timeouts).
        server_message: The server's own error message, when it sent one.
    """

    def __init__(
        self, message: str, *, status: int | None = None, server_message: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.server_message = server_message


class EndpointTimeoutError(EndpointError, TimeoutError):
    """A request missed its deadline twice (``request_timeout_s``); nothing it said was used."""


class _Retryable(Exception):
    """An attempt that failed in a way worth another try."""

    def __init__(
        self, reason: str, status: int | None = None, retry_after: float | None = None
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status
        self.retry_after = retry_after


class _Call:
    """One HTTP exchange, abortable from the event loop while a worker thread blocks on it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._connection: http.client.HTTPConnection | None = None
        self._aborted = False

    def attach(self, connection: http.client.HTTPConnection) -> None:
        with self._lock:
            self._connection = connection
        self.check()

    def check(self) -> None:
        if self._aborted:
            raise ConnectionAbortedError("the request was aborted (deadline or cancellation)")

    def abort(self) -> None:
        with self._lock:
            self._aborted = True
            connection = self._connection
        sock = getattr(connection, "sock", None)
        if sock is not None:
            # Wakes a recv blocked in the worker thread; the worker then closes the connection.
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


def _server_message(data: bytes) -> str:
    """The server's error message: OpenAI's ``error.message``, FastAPI's ``detail``, or the text."""
    text = data.decode("utf-8", errors="replace").strip()
    try:
        body = json.loads(text)
    except ValueError:
        return text[:500] or "(empty body)"
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])[:500]
        for key in ("error", "detail", "message"):
            if body.get(key):
                value = body[key]
                return (value if isinstance(value, str) else json.dumps(value))[:500]
    return text[:500]


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None  # an HTTP date: rare for these servers; fall back to our own backoff
    return seconds if seconds >= 0 else None


def _tool_results_text(messages: Sequence[Message], action_format: ActionFormat) -> str:
    return "\n".join(action_format.render_tool_result(m) for m in messages)


def build_messages(
    messages: Sequence[Message],
    tool_specs: Sequence[Any],
    action_format: ActionFormat,
    *,
    send_tools: bool = DEFAULT_SEND_TOOLS,
) -> list[dict[str, Any]]:
    """The ``messages`` of a chat-completions request for an episode's conversation.

    See the module docstring (**Tools**) for how tools, assistant turns and tool results are
    written with and without ``send_tools``.
    """
    out: list[dict[str, Any]] = []
    pending_results: list[Message] = []

    def flush_results() -> None:
        if pending_results:
            out.append(
                {"role": "user", "content": _tool_results_text(pending_results, action_format)}
            )
            pending_results.clear()

    for message in messages:
        role = message.get("role", "user")
        content = message.get("content") or ""
        if role == "tool":
            if send_tools:
                item: dict[str, Any] = {"role": "tool", "content": content}
                if message.get("tool_call_id"):
                    item["tool_call_id"] = message["tool_call_id"]
                out.append(item)
            else:
                pending_results.append(message)
            continue
        flush_results()
        if role == "assistant":
            if send_tools:
                item = {"role": "assistant", "content": content}
                if message.get("tool_calls"):
                    item["tool_calls"] = [dict(call) for call in message["tool_calls"]]
                out.append(item)
            else:
                out.append({"role": "assistant", "content": action_format.render_message(message)})
            continue
        out.append({"role": role, "content": content})
    flush_results()
    if not send_tools and tool_specs:
        tools_text = action_format.render_tool_specs(tool_specs)
        if tools_text:
            if out and out[0]["role"] == "system":
                system = out[0]["content"]
                out[0] = {
                    "role": "system",
                    "content": f"{system}\n\n{tools_text}" if system else tools_text,
                }
            else:
                out.insert(0, {"role": "system", "content": tools_text})
    return out


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
        self._parts = urllib.parse.urlsplit(self.base_url)
        self._path = (self._parts.path or "") + "/chat/completions"
        self._url = self.base_url + "/chat/completions"
        self._rng = random.Random(seed)
        self._requests = 0
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._executor_lock = threading.Lock()
        self._semaphores: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = (
            weakref.WeakKeyDictionary()
        )

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
        """Stop the worker threads (idle ones; a later request starts new ones)."""
        with self._executor_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

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
        payload.update(self.extra_body)
        return payload

    def _headers(self) -> dict[str, str]:
        headers = {
            "Content-Type": "application/json",
            "Accept": "application/json",
            "User-Agent": _USER_AGENT,
        }
        key = os.environ.get(self.api_key_env) if self.api_key_env else None
        if key:
            headers["Authorization"] = f"Bearer {key}"
        return headers

    def _exchange(self, call: _Call, body: bytes) -> tuple[int, str | None, bytes]:
        """One blocking POST (in a worker thread): ``(status, Retry-After, body)``."""
        cls = (
            http.client.HTTPSConnection
            if self._parts.scheme == "https"
            else http.client.HTTPConnection
        )
        connection = cls(self._parts.hostname, self._parts.port, timeout=self.request_timeout_s)
        try:
            call.attach(connection)
            connection.connect()
            call.check()  # an abort that came while connecting found no socket to shut down
            connection.request("POST", self._path, body=body, headers=self._headers())
            response = connection.getresponse()
            data = response.read()
            return response.status, response.getheader("Retry-After"), data
        finally:
            connection.close()

    def _backoff(self, retry: int, retry_after: float | None) -> float:
        delay = self.backoff_base_s * (2 ** (retry - 1)) * (0.5 + self._rng.random())
        if retry_after is not None:
            delay = max(delay, retry_after)
        return min(delay, self.backoff_max_s)

    async def _attempt(self, body: bytes) -> dict[str, Any]:
        """One attempt; raises ``_Retryable``, ``TimeoutError`` or :class:`EndpointError`."""
        call = _Call()
        loop = asyncio.get_running_loop()
        try:
            status, retry_after, data = await asyncio.wait_for(
                loop.run_in_executor(self._executor(), self._exchange, call, body),
                self.request_timeout_s,
            )
        except (TimeoutError, asyncio.CancelledError):  # the deadline (or the socket's own)
            call.abort()
            raise
        except (OSError, http.client.HTTPException) as exc:
            raise _Retryable(f"connection error: {exc!r}") from exc
        if status in _RETRY_STATUSES or status >= 500:
            raise _Retryable(
                f"HTTP {status}: {_server_message(data)}",
                status=status,
                retry_after=_retry_after(retry_after),
            )
        if not 200 <= status < 300:
            message = _server_message(data)
            hint = ""
            if status == 404 and not self.base_url.endswith("/v1"):
                hint = (
                    " (base_url is everything before /chat/completions; most servers want it to "
                    "end in /v1)"
                )
            raise EndpointError(
                f"{self._url} answered HTTP {status} for model {self.model!r}: {message}{hint}",
                status=status,
                server_message=message,
            )
        try:
            answer = json.loads(data)
        except ValueError as exc:
            raise EndpointError(
                f"{self._url} answered HTTP 200 with a body that is not JSON: {data[:200]!r}",
                status=status,
            ) from exc
        return answer

    async def _complete(self, payload: dict[str, Any]) -> tuple[dict[str, Any], int]:
        """POST with retries; returns ``(response JSON, retries used)``."""
        body = json.dumps(payload, ensure_ascii=False).encode("utf-8")
        retries = timeouts = 0
        while True:
            try:
                return await self._attempt(body), retries + timeouts
            except TimeoutError as exc:
                timeouts += 1
                if timeouts > TIMEOUT_RETRIES:
                    raise EndpointTimeoutError(
                        f"{self._url} did not answer within request_timeout_s="
                        f"{self.request_timeout_s:g} s ({timeouts} attempts; each timed-out "
                        "request was aborted and its output discarded). Raise request_timeout_s, "
                        "lower max_new_tokens or max_concurrency, or check the server."
                    ) from exc
            except _Retryable as exc:
                retries += 1
                if retries > self.max_retries:
                    raise EndpointError(
                        f"{self._url} failed after {retries + timeouts} attempts "
                        f"(max_retries={self.max_retries}); last error: {exc.reason}",
                        status=exc.status,
                    ) from exc
                await asyncio.sleep(self._backoff(retries, exc.retry_after))

    def _generation(
        self, request: PolicyRequest, answer: dict[str, Any], retries: int, latency: float
    ) -> Generation:
        choices = answer.get("choices") if isinstance(answer, dict) else None
        if not choices or not isinstance(choices[0], dict):
            raise EndpointError(
                f"{self._url} answered without choices: {json.dumps(answer)[:300]}", status=200
            )
        choice = choices[0]
        message = choice.get("message") or {}
        content = message.get("content") or ""
        if isinstance(content, list):  # content parts
            content = "".join(
                str(part.get("text", "")) for part in content if isinstance(part, dict)
            )
        tool_calls: list[ToolCall] = message.get("tool_calls") or []
        raw_finish = choice.get("finish_reason")
        metadata: dict[str, Any] = {
            "latency_s": latency,
            "retries": retries,
            "usage": answer.get("usage"),
            "finish_reason": raw_finish,
        }
        text = str(content)
        if tool_calls:
            try:
                text = request.action_format.render_tool_calls(tool_calls, text)
            except (InvalidArgumentError, TypeError, AttributeError) as exc:
                # The model's own malformed call (arguments that are not a JSON object, say):
                # the episode sees the raw calls as text, the record keeps why.
                metadata["tool_call_error"] = str(exc)
                raw = json.dumps(tool_calls, ensure_ascii=False, default=str)
                text = f"{text}\n{raw}" if text else raw
        if message.get("reasoning_content"):
            metadata["reasoning_content"] = message["reasoning_content"]
        return Generation(
            text=text,
            finish_reason="length" if raw_finish == "length" else "stop",
            metadata=metadata,
        )

    def _executor(self) -> concurrent.futures.ThreadPoolExecutor:
        # Our own threads, so a busy default executor never eats into a request's deadline
        # (two spare workers for aborted requests that are still unwinding).
        with self._executor_lock:
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(
                    max_workers=self.max_concurrency + 2, thread_name_prefix="llm_gym-openai"
                )
            return self._pool

    def _semaphore(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        semaphore = self._semaphores.get(loop)
        if semaphore is None:
            semaphore = self._semaphores[loop] = asyncio.Semaphore(self.max_concurrency)
        return semaphore

    async def _one(self, request: PolicyRequest, seed: int | None) -> Generation:
        payload = self.build_payload(request, seed)
        async with self._semaphore():
            start = time.perf_counter()
            answer, retries = await self._complete(payload)
            latency = time.perf_counter() - start
        return self._generation(request, answer, retries, latency)

    async def act(self, requests: Sequence[PolicyRequest]) -> list[Generation]:
        if not requests:
            return []
        seeds: list[int | None] = []
        for _ in requests:
            seeds.append(None if self.seed is None else self.seed + self._requests)
            self._requests += 1
        tasks = [
            asyncio.ensure_future(self._one(r, s)) for r, s in zip(requests, seeds, strict=True)
        ]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        finally:
            pending = [t for t in tasks if not t.done()]
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
        for task in tasks:  # the first failure, in request order
            if not task.cancelled() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
        return [task.result() for task in tasks]
