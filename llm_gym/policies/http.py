"""A small asyncio client for JSON-over-HTTP model endpoints: retries, backoff, deadlines.

It uses the standard library's :mod:`http.client` on purpose, so the base install needs no extra
dependency for it.

:class:`JsonClient` POSTs JSON bodies to one URL and returns the decoded JSON answer:

* **One exchange per attempt.** Every attempt opens its own connection (proxy environment
  variables are not used) and runs as one blocking exchange in a worker thread of the client's
  own pool, at most ``max_concurrency`` at a time per event loop. The event loop can abort an
  attempt at any moment (its deadline, or the caller's cancellation): the socket is shut down,
  the worker unwinds, and whatever it read is discarded.
* **Retries.** Connection errors, HTTP 429 and 5xx are retried up to ``max_retries`` times with
  exponential backoff and jitter; a ``Retry-After`` header (in seconds) is honoured up to the
  backoff cap. Other non-2xx answers raise :class:`EndpointError` at once, naming the status and
  the server's own message.
* **Deadlines.** ``request_timeout_s`` bounds one attempt. A timed-out attempt is aborted and sent
  again :data:`TIMEOUT_RETRIES` time(s); one more timeout raises :class:`EndpointTimeoutError`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import http.client
import json
import random
import socket
import threading
import time
import urllib.parse
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from llm_gym.errors import InvalidArgumentError, LlmGymError

__all__ = [
    "DEFAULT_BACKOFF_BASE_S",
    "DEFAULT_BACKOFF_MAX_S",
    "DEFAULT_MAX_CONCURRENCY",
    "DEFAULT_MAX_RETRIES",
    "DEFAULT_REQUEST_TIMEOUT_S",
    "TIMEOUT_RETRIES",
    "EndpointError",
    "EndpointTimeoutError",
    "JsonClient",
    "JsonReply",
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
TIMEOUT_RETRIES = 1
"""A timed-out request is sent again this many times, then the client fails."""

_RETRY_STATUSES = frozenset({429})
_SPARE_WORKERS = 2
"""Worker threads beyond ``max_concurrency``, for aborted attempts that are still unwinding."""


class EndpointError(LlmGymError, RuntimeError):
    """The endpoint refused a request, failed, or answered something unusable.

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


@dataclass(frozen=True)
class JsonReply:
    """A successful answer of :meth:`JsonClient.post`."""

    body: Any
    """The decoded JSON body."""
    retries: int
    """Attempts before the one that answered (retried failures and timeouts together)."""
    latency_s: float
    """Seconds from the first attempt's start to the answer (waits for a free slot excluded)."""


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
        seed: Seeds the backoff jitter.
        thread_name_prefix: Names the worker threads.
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
        seed: int | None = None,
        thread_name_prefix: str = "llm_gym-http",
    ) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise InvalidArgumentError(f"Expected an http(s) URL, actual value: {url!r}.")
        self.url = url
        self.headers = headers
        self.label = label
        self.hints = dict(hints or {})
        self.max_concurrency = int(max_concurrency)
        self.max_retries = int(max_retries)
        self.request_timeout_s = float(request_timeout_s)
        self.backoff_base_s = float(backoff_base_s)
        self.backoff_max_s = float(backoff_max_s)
        self.thread_name_prefix = thread_name_prefix
        self._parts = parts
        self._target = parts.path + (f"?{parts.query}" if parts.query else "")
        self._rng = random.Random(seed)
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._executor_lock = threading.Lock()
        self._semaphores: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = (
            weakref.WeakKeyDictionary()
        )

    async def post(self, payload: Any) -> JsonReply:
        """POST ``payload`` as JSON, with retries; raises :class:`EndpointError` (or its
        :class:`EndpointTimeoutError`) when no attempt gave a usable answer."""
        async with self._semaphore():
            start = time.perf_counter()
            body, retries = await self._complete(payload)
            return JsonReply(body=body, retries=retries, latency_s=time.perf_counter() - start)

    def close(self) -> None:
        """Stop the worker threads (idle ones; a later request starts new ones)."""
        with self._executor_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    # --- attempts ---------------------------------------------------------------------------

    def _request_headers(self) -> dict[str, str]:
        return {
            "Content-Type": "application/json",
            "Accept": "application/json",
            **self.headers(),
        }

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
            connection.request("POST", self._target, body=body, headers=self._request_headers())
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

    async def _attempt(self, body: bytes) -> Any:
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
            label = f" {self.label}" if self.label else ""
            raise EndpointError(
                f"{self.url} answered HTTP {status}{label}: {message}{self.hints.get(status, '')}",
                status=status,
                server_message=message,
            )
        try:
            return json.loads(data)
        except ValueError as exc:
            raise EndpointError(
                f"{self.url} answered HTTP 200 with a body that is not JSON: {data[:200]!r}",
                status=status,
            ) from exc

    async def _complete(self, payload: Any) -> tuple[Any, int]:
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

    def _executor(self) -> concurrent.futures.ThreadPoolExecutor:
        # Our own threads, so a busy default executor never eats into a request's deadline.
        with self._executor_lock:
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(
                    max_workers=self.max_concurrency + _SPARE_WORKERS,
                    thread_name_prefix=self.thread_name_prefix,
                )
            return self._pool

    def _semaphore(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        semaphore = self._semaphores.get(loop)
        if semaphore is None:
            semaphore = self._semaphores[loop] = asyncio.Semaphore(self.max_concurrency)
        return semaphore
