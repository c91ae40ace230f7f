"""The HTTP side of :mod:`llm_gym.serving`: a Starlette application over an :class:`Engine`.

:func:`build_app` routes ``POST /v1/chat/completions``, ``POST /v1/responses`` (the same
generation, :mod:`llm_gym.serving.responses_protocol`), ``POST /v1/completions``,
``GET /v1/models``, ``GET /v1/models/{id}`` and ``GET /health``. Every body is read here, with
limits, before anything else looks at it:

* first :class:`~llm_gym.serving.access.AccessGuard` answers a ``Host`` that names no allowed
  host (400), an ``Origin`` that names no allowed origin (403: browser pages of other sites) and
  a body whose ``Content-Type`` is missing or not JSON (415), with the remedy;
* a body over ``max_body_bytes`` is a 413, refused from its ``Content-Length`` before it is read,
  or as soon as a chunked body passes the limit (a malformed ``Content-Length`` never gets here:
  the HTTP layer answers 400 and closes the connection);
* a body that has not arrived ``body_timeout_s`` after its head is a 408;
* the bytes are decoded and checked by :func:`~llm_gym.serving.body.decode_json_body` (in a
  worker thread when large, so the event loop keeps answering).

A client that closes its connection before the answer is ready is not generated for: a queued
request is skipped and a running generation stops at the next token (streams too).

Errors are OpenAI-shaped (``{"error": {...}}``): 4xx name what was wrong, 404 and 405 list the
endpoints, and any other failure is a 500 that says what happened. Each 4xx answer's reason is
logged at info level on :data:`LOG` (``llm-gym serve`` writes it beside the request's line;
a 500's goes out at error level), so the server's log says why a client was refused.
Generation runs in the engine's one worker thread; the event loop only reads, writes and waits.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

from llm_gym.serving.access import AccessGuard, AccessPolicy, Refusal
from llm_gym.serving.body import decode_json_body
from llm_gym.serving.chat_protocol import parse_chat_request
from llm_gym.serving.engine import ClientGone, Engine
from llm_gym.serving.protocol import APIError, parse_completion_request
from llm_gym.serving.responses import dumps
from llm_gym.serving.responses_api import response_events, response_from_chat
from llm_gym.serving.responses_protocol import parse_responses_request, responses_error
from llm_gym.serving.streaming import chat_stream, completion_stream

if TYPE_CHECKING:
    from llm_gym.serving.recording import Recorder

__all__ = ["ENDPOINTS", "LOG", "MAX_BODY_BYTES", "build_app", "log_error", "refusal_body"]

LOG = logging.getLogger("llm_gym.serving")
"""The server's own log: why a request was refused or failed (:func:`log_error`)."""

MAX_BODY_BYTES = 32 * 1024 * 1024
"""The largest request body accepted by default."""
ENDPOINTS = (
    "POST /v1/chat/completions, POST /v1/responses, POST /v1/completions, GET /v1/models, "
    "GET /v1/models/{id} and GET /health"
)
_THREAD_PARSE_BYTES = 64 * 1024
"""Bodies larger than this are decoded in a worker thread, not on the event loop."""


def refusal_body(refusal: Refusal) -> bytes:
    """An :class:`~llm_gym.serving.access.AccessGuard` refusal as an OpenAI-shaped error."""
    error = APIError(refusal.status, refusal.message, refusal.header)
    log_error(error, "a request")
    return dumps(error.body())


def log_error(error: APIError, where: str) -> None:
    """Log why ``where`` (``"POST /v1/chat/completions"``) was answered ``error``: a 4xx at
    info level, anything else at error level; the message is cut at 1000 characters."""
    param = f" (param {error.param!r})" if error.param else ""
    LOG.log(
        logging.INFO if 400 <= error.status < 500 else logging.ERROR,
        "%d on %s: %s%s",
        error.status,
        where[:300],
        error.message[:1000],
        param,
    )


def build_app(
    engine: Engine,
    *,
    max_body_bytes: int = MAX_BODY_BYTES,
    body_timeout_s: float = 30.0,
    access: AccessPolicy | None = None,
    recorder: Recorder | None = None,
) -> Any:
    """The ASGI application serving ``engine`` (see the module docstring); ``access`` says
    which hosts and web origins it answers (default: loopback only). With a ``recorder`` (the
    training endpoint, :mod:`llm_gym.serving.recording`) every chat and Responses call is
    recorded in its episode, and ``/episodes/{id}/v1/...`` serves the same endpoints for
    episode ``id``."""
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.exceptions import HTTPException
    from starlette.middleware import Middleware
    from starlette.requests import Request
    from starlette.responses import Response, StreamingResponse
    from starlette.routing import Route

    def json_response(payload: Any, status: int = 200, headers: Any = None) -> Response:
        return Response(dumps(payload), status, headers, media_type="application/json")

    def error_response(request: Request, error: APIError, headers: Any = None) -> Response:
        log_error(error, f"{request.method} {request.url.path}")
        return json_response(error.body(), error.status, headers)

    async def read_json(request: Request) -> dict[str, Any]:
        too_large = APIError(
            HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
            f"the body is larger than this server's limit of {max_body_bytes} bytes",
        )
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > max_body_bytes:
            raise too_large
        chunks: list[bytes] = []

        async def read() -> int:
            size = 0
            async for chunk in request.stream():
                size += len(chunk)
                if size > max_body_bytes:
                    raise too_large
                chunks.append(chunk)
            return size

        try:
            size = await asyncio.wait_for(read(), body_timeout_s)
        except TimeoutError:
            raise APIError(
                HTTPStatus.REQUEST_TIMEOUT,
                f"the body did not arrive within {body_timeout_s:g} s",
            ) from None
        raw = b"".join(chunks)
        if size > _THREAD_PARSE_BYTES:
            return await run_in_threadpool(decode_json_body, raw)
        return decode_json_body(raw)

    def endpoint(
        handler: Callable[[Request], Awaitable[Response]],
    ) -> Callable[[Request], Awaitable[Response]]:
        async def wrapped(request: Request) -> Response:
            try:
                return await handler(request)
            except APIError as exc:
                # A refused body may be left unread: close the connection rather than read it.
                headers = {"Connection": "close"} if exc.status in (408, 413) else None
                return error_response(request, exc, headers)
            except Exception as exc:  # generation failed: the client sees why
                return error_response(
                    request,
                    APIError(
                        HTTPStatus.INTERNAL_SERVER_ERROR,
                        f"internal error: {type(exc).__name__}: {exc}"[:2000],
                        kind="server_error",
                    ),
                )

        return wrapped

    def stream_response(events: Any) -> Response:
        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        return StreamingResponse(events, media_type="text/event-stream", headers=headers)

    async def answer(request: Request, work: Callable[..., Any], *args: Any) -> Response:
        """Run ``work(*args, cancelled)`` in the engine, cancelled when the client leaves (a
        timed-out client's request is then skipped, not generated for nobody)."""
        gone = threading.Event()

        async def watch() -> None:  # the body is read: the next message is the disconnect
            while (await request.receive())["type"] != "http.disconnect":
                pass
            gone.set()

        watcher = asyncio.ensure_future(watch())
        try:
            return json_response(await engine.submit(work, *args, gone.is_set))
        except asyncio.CancelledError:  # the server is shutting down
            gone.set()
            raise
        except ClientGone:
            return error_response(request, APIError(499, "the client closed the connection"))
        finally:
            watcher.cancel()

    async def recorded(
        request: Request, body: dict[str, Any], chat: Any, finish: Callable[[Any], Any]
    ) -> Response:
        """A call of the training endpoint: recorded in its episode, then ``finish`` ed."""
        assert recorder is not None
        key = recorder.episode_key(request.headers, body, request.path_params.get("episode"))

        async def run(work: Callable[[Callable[[], bool]], Any]) -> Response:
            return await answer(request, lambda cancelled: finish(work(cancelled)))

        return await recorder.serve(key, chat, run)

    def any_model(body: dict[str, Any]) -> dict[str, Any]:
        """The training endpoint serves whatever model name an agent sends."""
        if recorder is not None and isinstance(body, dict):
            body["model"] = engine.model_name
        return body

    @endpoint
    async def chat_completions(request: Request) -> Response:
        body = any_model(await read_json(request))
        parsed = parse_chat_request(body, engine.model_name, engine.chat_template_kwargs)
        if recorder is not None:
            return await recorded(request, body, parsed, lambda chat: chat)
        prompt_ids = await engine.render(parsed)  # in the render pool, never the model's thread
        if parsed.stream:
            return stream_response(await chat_stream(engine, parsed, prompt_ids))
        return await answer(
            request, functools.partial(engine.chat_completion, prompt_ids=prompt_ids), parsed
        )

    def respond(parsed: Any, prompt_ids: list[int], cancelled: Callable[[], bool]) -> Any:
        chat = engine.chat_completion(parsed.chat, cancelled, prompt_ids)
        return response_from_chat(parsed, chat)

    @endpoint
    async def responses(request: Request) -> Response:
        body = any_model(await read_json(request))
        parsed = parse_responses_request(body, engine.model_name, engine.chat_template_kwargs)
        try:  # the chat path's errors, with the Responses field names
            if recorder is not None:
                finish = functools.partial(response_from_chat, parsed)
                return await recorded(request, body, parsed.chat, finish)
            prompt_ids = await engine.render(parsed.chat)
            if parsed.stream:
                chat_events = await chat_stream(engine, parsed.chat, prompt_ids)
                return stream_response(response_events(parsed, chat_events))
            return await answer(request, respond, parsed, prompt_ids)
        except APIError as exc:
            raise responses_error(exc) from None

    @endpoint
    async def completions(request: Request) -> Response:
        parsed = parse_completion_request(await read_json(request), engine.model_name)
        if parsed.stream:
            return stream_response(await completion_stream(engine, parsed))
        return await answer(request, engine.completion, parsed)

    model_card = {
        "id": engine.model_name,
        "object": "model",
        "created": engine.created,
        "owned_by": "llm_gym",
    }

    async def models(request: Request) -> Response:
        return json_response({"object": "list", "data": [model_card]})

    async def model(request: Request) -> Response:
        name = request.path_params["name"]
        if name != engine.model_name:
            return error_response(
                request,
                APIError(
                    HTTPStatus.NOT_FOUND,
                    f"The model {name[:200]!r} does not exist; this server serves "
                    f"{engine.model_name!r}.",
                    "model",
                    code="model_not_found",
                ),
            )
        return json_response(model_card)

    async def health(request: Request) -> Response:
        return json_response({"status": "ok"})

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        where = f"{request.method} {request.url.path}"[:300]
        if exc.status_code == HTTPStatus.METHOD_NOT_ALLOWED:
            message = f"{where} is not allowed; this server has {ENDPOINTS}"
        elif exc.status_code == HTTPStatus.NOT_FOUND:
            message = f"no such endpoint {where}; this server has {ENDPOINTS}"
        else:
            message = str(exc.detail)
        code = "not_found" if exc.status_code == HTTPStatus.NOT_FOUND else None
        return error_response(request, APIError(exc.status_code, message, code=code), exc.headers)

    routes = [
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/responses", responses, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/models/{name:path}", model, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
    ]
    if recorder is not None:  # each episode's own base URL
        routes += [
            Route(f"/episodes/{{episode}}{route.path}", route.endpoint, methods=route.methods)
            for route in routes
            if route.path.startswith("/v1/")
        ]
    guard = Middleware(AccessGuard, policy=access or AccessPolicy(), body=refusal_body)
    return Starlette(
        routes=routes, middleware=[guard], exception_handlers={HTTPException: http_error}
    )
