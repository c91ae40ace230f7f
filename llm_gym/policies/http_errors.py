"""The errors of :mod:`llm_gym.policies.http`, and what a refusal's status, body and headers say."""

from __future__ import annotations

import email.utils
import json
import time

from llm_gym.errors import LlmGymError

__all__ = [
    "FATAL_STATUSES",
    "EndpointError",
    "EndpointTimeoutError",
    "MalformedResponseError",
    "retry_after_s",
    "server_message",
]

FATAL_STATUSES = frozenset({401, 403, 404})
"""Refusals that concern every request to the endpoint (credentials, the model, the URL)."""


class EndpointError(LlmGymError, RuntimeError):
    """The endpoint refused a request, failed, or answered something unusable.

    Attributes:
        status: The HTTP status (``None`` for connection errors and timeouts).
        server_message: The server's own error message, when it sent one.
        fatal: No request to this endpoint can succeed as configured (HTTP 401, 403, 404, or
            request headers that cannot be sent).
    """

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        server_message: str | None = None,
        fatal: bool = False,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.server_message = server_message
        self.fatal = fatal


class EndpointTimeoutError(EndpointError, TimeoutError):
    """A request missed its deadline twice (``request_timeout_s``); nothing it said was used."""


class MalformedResponseError(EndpointError):
    """The endpoint answered 2xx with something unusable: too large, compressed, not JSON, or
    JSON of the wrong shape.

    Attributes:
        field: Where in the JSON the answer was wrong (``"choices[0].message"``), when the body
            parsed.
    """

    def __init__(self, message: str, *, status: int | None = None, field: str | None = None):
        super().__init__(message, status=status)
        self.field = field


def server_message(data: bytes) -> str:
    """The server's error message: OpenAI's ``error.message``, FastAPI's ``detail``, or the text."""
    text = data.decode("utf-8", errors="replace").strip()
    try:
        body = json.loads(text)
    except (ValueError, RecursionError):
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


def retry_after_s(value: str | None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header: a number, or an HTTP date."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = email.utils.parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError, OverflowError):
            return None
    return max(seconds, 0.0) if seconds == seconds else None  # NaN: ignored
