"""An asyncio JSON-over-HTTP client for model endpoints, on httpx: retries, deadlines, caps.

Why httpx (a base dependency): pooled connections with HTTP/1.1 keep-alive (one TCP and TLS
handshake per connection, not per request), timeouts at every stage, and request and response
parsing by a well-kept stack (the ``openai`` package is built on it) instead of a hand-driven
``http.client`` exchange in a worker thread. It is imported on first use, so ``import llm_gym``
does not pay for it.

:class:`JsonClient` POSTs JSON bodies to one URL and returns the decoded JSON answer:

* **A client per event loop.** An ``httpx.AsyncClient`` and its connections belong to the loop
  that opened them, so each running loop gets its own (the async trainer's worker thread, the
  thread of :func:`~llm_gym.aio.run_sync`, successive ``asyncio.run`` calls), with at most
  ``max_concurrency`` requests in flight on it. It is closed when its loop shuts down its async
  generators (``asyncio.run`` and the async trainer do), or by :meth:`JsonClient.close`. Proxy
  environment variables are not used (``trust_env=False``).
* **Retries.** Connection errors, HTTP 429 and 5xx are retried up to ``max_retries`` times with
  exponential backoff and jitter; a ``Retry-After`` header (seconds or a date) is honoured up to
  the backoff cap. Other non-2xx answers raise :class:`EndpointError` at once, naming the status
  and the server's own message; 401, 403 and 404 (bad credentials, an unknown model, a wrong
  URL: no request can succeed) are ``fatal``.
* **Deadlines.** ``request_timeout_s`` bounds one attempt, reading the answer included. A
  timed-out attempt is cancelled (its connection closed, whatever it read discarded) and sent
  again :data:`TIMEOUT_RETRIES` time(s); one more timeout raises :class:`EndpointTimeoutError`.
  Cancelling :meth:`JsonClient.post` closes the attempt's connection the same way.
* **Answers.** A 2xx answer must be JSON (its ``Content-Type``, when it has one, says so) of at
  most ``max_response_bytes`` bytes, read as a stream and dropped past the cap. Requests ask for
  the ``identity`` encoding and compressed answers are refused, so no decompression can outgrow
  the cap. Strings in the answer are made valid UTF-8 (:func:`~llm_gym.core.text.clean_json`).
  An unusable answer raises :class:`MalformedResponseError`.
* **Off the loop.** An answer over :data:`OFF_LOOP_BYTES` is decoded, and checked by the caller's
  ``parse`` (:meth:`JsonClient.post`), on a worker thread (:func:`asyncio.to_thread`), its JSON
  decoder handing the interpreter lock back to the event loop between objects, so a large
  answer never stalls the other coroutines of the loop. A smaller answer is decoded on the loop,
  where it takes less than the thread hop. The caller's ``watch`` sees each object as it is
  decoded and may refuse the answer there, before the rest of it is built (a reply past its
  caps then costs neither the time nor the memory of decoding it whole).
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
import traceback
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from llm_gym.actions.codec import json_error_reason
from llm_gym.core.text import clean_json
from llm_gym.errors import InvalidArgumentError
from llm_gym.policies.http_errors import (
    FATAL_STATUSES,
    EndpointError,
    EndpointTimeoutError,
    MalformedResponseError,
    retry_after_s,
    server_message,
)
from llm_gym.policies.http_loops import LoopClients

if TYPE_CHECKING:
    import httpx

__all__ = [
    "DEFAULT_BACKOFF_BASE_S",
    "DEFAULT_BACKOFF_MAX_S",
    "DEFAULT_MAX_CONCURRENCY",
    "DEFAULT_MAX_RESPONSE_BYTES",
    "DEFAULT_MAX_RETRIES",
    "DEFAULT_REQUEST_TIMEOUT_S",
    "ERROR_BODY_BYTES",
    "KEEPALIVE_EXPIRY_S",
    "FATAL_STATUSES",
    "OFF_LOOP_BYTES",
    "TIMEOUT_RETRIES",
    "EndpointError",
    "EndpointTimeoutError",
    "JsonClient",
    "JsonReply",
    "MalformedResponseError",
    "ObjectHook",
]

DEFAULT_MAX_CONCURRENCY = 8
"""Requests in flight at once (per event loop)."""
DEFAULT_MAX_RETRIES = 3
"""Retries of a request after a connection error, HTTP 429 or 5xx."""
DEFAULT_REQUEST_TIMEOUT_S = 600.0
"""Deadline of one request, in seconds."""
DEFAULT_BACKOFF_BASE_S = 0.5
"""First retry delay; doubles on every retry, times a jitter factor in [0.5, 1.5)."""
DEFAULT_BACKOFF_MAX_S = 30.0
"""Longest delay between two attempts."""
DEFAULT_MAX_RESPONSE_BYTES = 16 * 2**20
"""Largest 2xx answer read, in bytes (16 MiB); a larger one is a :class:`MalformedResponseError`."""
ERROR_BODY_BYTES = 64 * 2**10
"""How much of a non-2xx answer is read for the server's message (the rest is dropped)."""
TIMEOUT_RETRIES = 1
"""A timed-out request is sent again this many times, then the client fails."""
OFF_LOOP_BYTES = 64 * 2**10
"""Answers larger than this (bytes) are decoded and parsed on a worker thread, the smaller ones on
the event loop (64 KiB: about a millisecond of decoding, the price of a thread hop)."""
KEEPALIVE_EXPIRY_S = 4.0
"""Idle seconds after which a pooled connection is dropped: below the 5 s after which uvicorn
(vLLM, SGLang, ``llm-gym serve``) closes it, so a request rarely meets a closing connection."""

_RETRY_STATUSES = frozenset({429})
_SPARE_CONNECTIONS = 2
"""Connections beyond ``max_concurrency``, for cancelled attempts still closing theirs."""


@dataclass(frozen=True)
class JsonReply:
    """A successful answer of :meth:`JsonClient.post`."""

    body: Any
    """The decoded JSON body, or what ``parse`` made of it (:meth:`JsonClient.post`)."""
    retries: int
    """Attempts before the one that answered (retried failures and timeouts together)."""
    latency_s: float
    """Seconds from the first attempt's start to the answer (waits for a free slot excluded)."""


ObjectHook = Callable[[dict[str, Any]], Any]
"""``json.loads``'s ``object_hook``: called with each decoded JSON object, returns what stands for
it."""


@dataclass(frozen=True)
class _Reader:
    """What :meth:`JsonClient.post` does with a decoded answer (see there)."""

    parse: Callable[[Any], Any] | None = None
    """Turns the decoded answer into the reply's ``body`` (``None``: the answer itself)."""
    watch: Callable[[], ObjectHook] | None = None
    """Makes, for each answer, the ``object_hook`` its decoding calls (``None``: none)."""


class _Retryable(Exception):
    """An attempt that failed in a way worth another try."""

    def __init__(
        self, reason: str, status: int | None = None, retry_after: float | None = None
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status
        self.retry_after = retry_after


def _let_the_loop_run(obj: dict[str, Any]) -> dict[str, Any]:
    """``json.loads``'s ``object_hook``: returns each object unchanged. Being Python code, it lets
    a worker thread hand the interpreter lock to the event loop between objects (the C decoder
    holds it for the whole answer otherwise)."""
    return obj


def _httpx() -> Any:
    import httpx  # imported on first use (see the module docstring)

    return httpx


class JsonClient:
    """POSTs JSON bodies to one URL with retries and deadlines (see the module docstring).

    Args:
        url: The ``http`` or ``https`` URL every request goes to.
        headers: Called at every attempt for extra request headers (so a secret read from the
            environment is never stored); ``Content-Type`` and ``Accept`` are JSON.
        label: Words naming what was asked, written after the status in refusal messages
            (``"for model 'qwen'"``).
        hints: Advice appended to the refusal message of a given HTTP status.
        max_concurrency: Requests in flight at once, per event loop.
        max_retries: Retries after connection errors, HTTP 429 and 5xx.
        request_timeout_s: Deadline of one attempt; a timed-out attempt is retried
            :data:`TIMEOUT_RETRIES` time(s).
        backoff_base_s: First retry delay (doubles per retry, with jitter).
        backoff_max_s: Longest retry delay.
        max_response_bytes: Largest 2xx answer read.
        seed: Seeds the backoff jitter.
    """

    def __init__(
        self,
        url: str,
        *,
        headers: Callable[[], Mapping[str, str]] = dict,
        label: str = "",
        hints: Mapping[int, str] | None = None,
        max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
        max_retries: int = DEFAULT_MAX_RETRIES,
        request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
        backoff_base_s: float = DEFAULT_BACKOFF_BASE_S,
        backoff_max_s: float = DEFAULT_BACKOFF_MAX_S,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        seed: int | None = None,
    ) -> None:
        parts = urllib.parse.urlsplit(url) if isinstance(url, str) else None
        if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
            raise InvalidArgumentError(f"Expected an http(s) URL, actual value: {url!r}.")
        for name, value in (
            ("max_response_bytes", max_response_bytes),
            ("max_concurrency", max_concurrency),
        ):
            if isinstance(value, bool) or not (isinstance(value, int) and value >= 1):
                raise InvalidArgumentError(f"{name} must be an int >= 1, actual value: {value!r}.")
        self.url = url
        self.headers = headers
        self.label = label
        self.hints = dict(hints or {})
        self.max_concurrency = int(max_concurrency)
        self.max_retries = int(max_retries)
        self.request_timeout_s = float(request_timeout_s)
        self.backoff_base_s = float(backoff_base_s)
        self.backoff_max_s = float(backoff_max_s)
        self.max_response_bytes = max_response_bytes
        self._rng = random.Random(seed)
        self._rng_lock = threading.Lock()
        self._clients = LoopClients(self._new_client, self.max_concurrency)

    async def post(
        self,
        payload: Any,
        parse: Callable[[Any], Any] | None = None,
        watch: Callable[[], ObjectHook] | None = None,
    ) -> JsonReply:
        """POST ``payload`` as JSON, with retries; raises :class:`EndpointError` (or its
        subclasses) when no attempt gave a usable answer.

        ``parse``, when given, turns the decoded answer into the reply's ``body`` where the
        answer is decoded (on a worker thread for one over :data:`OFF_LOOP_BYTES`). ``watch``,
        when given, makes for each answer the ``object_hook`` of its decoding: it sees every
        JSON object as it is decoded, and returns it or raises to refuse the answer before the
        rest of it is built. Either raises :class:`MalformedResponseError` for an answer it
        refuses (which is not retried).
        """
        _, semaphore = await self._clients.get()
        async with semaphore:
            start = time.perf_counter()
            body, retries = await self._complete(payload, _Reader(parse, watch))
            return JsonReply(body=body, retries=retries, latency_s=time.perf_counter() - start)

    def close(self) -> None:
        """Close the connections of every event loop (a later request opens new ones)."""
        self._clients.close()

    async def aclose(self) -> None:
        """:meth:`close`, awaiting the running loop's client."""
        await self._clients.aclose()

    # --- attempts ---------------------------------------------------------------------------

    def _new_client(self) -> httpx.AsyncClient:
        httpx = _httpx()
        return httpx.AsyncClient(
            timeout=httpx.Timeout(self.request_timeout_s),
            limits=httpx.Limits(
                max_connections=self.max_concurrency + _SPARE_CONNECTIONS,
                max_keepalive_connections=self.max_concurrency,
                keepalive_expiry=KEEPALIVE_EXPIRY_S,
            ),
            trust_env=False,
            follow_redirects=False,
        )

    def _encode(self, payload: Any) -> bytes:
        try:
            return json.dumps(payload, ensure_ascii=False, allow_nan=False).encode("utf-8")
        except (TypeError, ValueError, RecursionError) as exc:  # UnicodeEncodeError included
            raise EndpointError(
                f"The request to {self.url} cannot be sent as JSON: {exc}. Every string must be "
                "valid UTF-8 and every number finite (llm_gym.core.clean_json cleans text)."
            ) from exc

    def _backoff(self, retry: int, retry_after: float | None) -> float:
        with self._rng_lock:
            jitter = 0.5 + self._rng.random()
        delay = self.backoff_base_s * (2 ** (retry - 1)) * jitter
        if retry_after is not None:
            delay = max(delay, retry_after)
        return min(delay, self.backoff_max_s)

    async def _exchange(self, client: httpx.AsyncClient, body: bytes) -> tuple[int, Any, bytes]:
        """One POST: ``(status, headers, body)``, the body read up to its cap."""
        headers = {
            "Content-Type": "application/json",
            "Accept": "application/json",
            "Accept-Encoding": "identity",
            **self.headers(),
        }
        for name, value in headers.items():
            if not (value.isascii() and value.isprintable()):
                raise self._bad_header(name)
        try:
            request = client.build_request("POST", self.url, content=body, headers=headers)
        except (UnicodeError, ValueError):
            raise self._bad_header("?") from None
        if client.is_closed:  # closed by close() since this attempt got it
            raise ConnectionAbortedError("the client was closed (close() was called)")
        response = await client.send(request, stream=True)
        try:
            return response.status_code, response.headers, await self._read(response)
        finally:
            await response.aclose()

    async def _read(self, response: httpx.Response) -> bytes:
        status = response.status_code
        ok = 200 <= status < 300
        limit = self.max_response_bytes if ok else ERROR_BODY_BYTES
        if ok:
            encoding = response.headers.get("Content-Encoding", "identity").strip().lower()
            if encoding not in ("", "identity"):
                raise MalformedResponseError(
                    f"{self.url} answered HTTP {status} with Content-Encoding {encoding!r}; "
                    "the request asked for 'identity' (compressed answers are refused).",
                    status=status,
                )
            declared = response.headers.get("Content-Length", "")
            if declared.isascii() and declared.isdigit() and int(declared[:20]) > limit:
                raise self._too_large(status, f"Content-Length: {declared}")
        chunks: list[bytes] = []
        size = 0
        async for chunk in response.aiter_raw():
            if size + len(chunk) > limit:
                if ok:
                    raise self._too_large(status, "its body went past it")
                chunks.append(chunk[: limit - size])  # enough for the server's message
                break
            size += len(chunk)
            chunks.append(chunk)
        return b"".join(chunks)

    def _too_large(self, status: int, what: str) -> MalformedResponseError:
        return MalformedResponseError(
            f"{self.url} answered HTTP {status} with more than max_response_bytes="
            f"{self.max_response_bytes} bytes ({what}); the rest was not read. Raise "
            "max_response_bytes if answers this large are expected.",
            status=status,
        )

    def _bad_header(self, name: str) -> EndpointError:
        # The value is not repeated: it may be a secret (the API key).
        return EndpointError(
            f"The request header {name!r} for {self.url} cannot be sent: header values (the API "
            "key, say) must be printable ASCII.",
            fatal=True,
        )

    def _decode(self, status: int, headers: Any, data: bytes, reader: _Reader) -> Any:
        content_type = headers.get("Content-Type", "")
        media = content_type.split(";")[0].strip().lower()
        if media and media != "application/json" and not media.endswith("+json"):
            raise MalformedResponseError(
                f"{self.url} answered HTTP {status} with Content-Type {content_type!r}, not "
                f"JSON: {data[:200]!r}",
                status=status,
            )
        hook = reader.watch() if reader.watch is not None else None
        if hook is None and len(data) > OFF_LOOP_BYTES:
            hook = _let_the_loop_run
        try:
            body = clean_json(json.loads(data, object_hook=hook))
        except (ValueError, RecursionError) as exc:  # invalid UTF-8 and JSON, too deep a nest
            raise MalformedResponseError(
                f"{self.url} answered HTTP {status} with a body that is not JSON "
                f"({json_error_reason(exc)}): {data[:200]!r}",
                status=status,
            ) from exc
        return body if reader.parse is None else reader.parse(body)

    def _decode_off_loop(self, status: int, headers: Any, data: bytes, reader: _Reader) -> Any:
        """:meth:`_decode` on a worker thread. A refusal's traceback leaves its frames cleared,
        so the refused answer is freed here, not on the event loop that receives the error."""
        try:
            return self._decode(status, headers, data, reader)
        except Exception as exc:
            traceback.clear_frames(exc.__traceback__)
            raise

    async def _attempt(self, body: bytes, reader: _Reader) -> Any:
        """One attempt; raises ``_Retryable``, ``TimeoutError`` or :class:`EndpointError`."""
        httpx = _httpx()
        client, _ = await self._clients.get()  # a new one after close()
        try:
            status, headers, data = await asyncio.wait_for(
                self._exchange(client, body), self.request_timeout_s
            )
        except TimeoutError:  # the deadline (an OSError: it must come first)
            raise
        except httpx.TimeoutException as exc:  # httpx's own stage timeouts: the same deadline
            raise TimeoutError(str(exc)) from exc
        except httpx.LocalProtocolError:  # a header h11 will not send (its text may hold it)
            raise self._bad_header("?") from None
        except (httpx.TransportError, OSError) as exc:
            raise _Retryable(f"connection error: {exc!r}") from exc
        if status in _RETRY_STATUSES or status >= 500:
            raise _Retryable(
                f"HTTP {status}: {server_message(data)}",
                status=status,
                retry_after=retry_after_s(headers.get("Retry-After")),
            )
        if not 200 <= status < 300:
            message = server_message(data)
            label = f" {self.label}" if self.label else ""
            raise EndpointError(
                f"{self.url} answered HTTP {status}{label}: {message}{self.hints.get(status, '')}",
                status=status,
                server_message=message,
                fatal=status in FATAL_STATUSES,
            )
        if len(data) <= OFF_LOOP_BYTES:
            return self._decode(status, headers, data, reader)
        return await asyncio.to_thread(self._decode_off_loop, status, headers, data, reader)

    async def _complete(self, payload: Any, reader: _Reader) -> tuple[Any, int]:
        """POST with retries; returns ``(response JSON, retries used)``."""
        body = self._encode(payload)
        retries = timeouts = 0
        while True:
            try:
                return await self._attempt(body, reader), retries + timeouts
            except TimeoutError as exc:
                timeouts += 1
                if timeouts > TIMEOUT_RETRIES:
                    raise EndpointTimeoutError(
                        f"{self.url} did not answer within request_timeout_s="
                        f"{self.request_timeout_s:g} s ({timeouts} attempts; each timed-out "
                        "request was aborted and its output discarded). Raise request_timeout_s, "
                        "lower max_new_tokens or max_concurrency, or check the server."
                    ) from exc
            except _Retryable as exc:
                retries += 1
                if retries > self.max_retries:
                    raise EndpointError(
                        f"{self.url} failed after {retries + timeouts} attempts "
                        f"(max_retries={self.max_retries}); last error: {exc.reason}",
                        status=exc.status,
                    ) from exc
                await asyncio.sleep(self._backoff(retries, exc.retry_after))
