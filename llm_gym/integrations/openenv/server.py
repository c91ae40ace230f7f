"""Any registered llm_gym environment served as an OpenEnv environment: ``llm-gym serve-env``.

OpenEnv (``openenv-core``) is the standard for environments that run as servers: one FastAPI app
per environment, a WebSocket session per client (``/ws``: ``reset``, ``step``, ``state``,
``close``), each session with its own environment instance, plus ``/health``, ``/schema`` and
``/metadata``. We use its server as it is (``openenv.core.env_server.HTTPEnvServer``) and
only describe our episodes in its terms:

* the action is the assistant's message (:class:`EnvAction`: ``{"message": {"role":
  "assistant", "content": ..., "tool_calls": [...]}}``, OpenAI's format, validated with limits),
  or its text (``{"message": "..."}``); a message without ``tool_calls`` is parsed with the
  env's action format as ``TextEnv.step`` parses it (a ``<tool_call>`` block becomes a tool
  call; text that fails to parse ends the episode: truncated, ``failed_parse_reward``, the
  reason in ``metrics["parse_error"]``), unless the env reads raw text itself;
* the observation (:class:`EnvObservation`) carries the conversation's new messages
  (``messages`` from index ``start``: a client splices them in, so a step sends only the
  tail), the tool specs (at reset), ``done``, ``reward`` (when done), ``truncated`` and the
  episode's ``metrics``;
* ``reset`` takes ``task_id`` (and ``split``, default ``"train"``), or a ``seed`` (task ``seed
  mod n`` of the split; it also seeds the session's draws), or nothing: a random task of the
  split, drawn as gymnasium draws (from the last seed given, else fresh entropy); the task
  source's options (``task_options``) are fixed when the server starts: a client cannot
  rewrite tasks or their answers;
* ``GET /llm_gym/tasks?split=val`` lists the split's task ids and prompts (never targets), so a
  client (:class:`~llm_gym.integrations.openenv.client.RemoteEnv`) can build its task list.

Only this machine's clients and web pages are served unless ``access`` allows more
(:mod:`llm_gym.serving.access`; ``--allowed-hosts`` and ``--allowed-origins`` on the command
line): a WebSocket handshake or request whose ``Host`` names another host is refused (400), one
from a web page of another origin too (403), before any session exists; a body that is not JSON
is a 415.

Each step runs on the server's event loop (our envs are async), within ``step_timeout_s``.
Clients are hostile: at most ``max_connections`` connections are served at once (one more gets
a 503 before any session or env exists); a connection whose request head (or HTTP body) does
not arrive within ``request_timeout_s`` is closed;
:class:`~llm_gym.integrations.openenv.guard.FrameGuard` reads every frame first (a bad one
gets an error, the session goes on) and closes a connection silent for ``idle_timeout_s``; a
reset is checked before the running episode is touched. So is the env: an env that fails,
hangs (even one that ignores its cancellation) or returns nonsense (``check_step``, a finite
reward, an observation past the protocol's limits:
:func:`~llm_gym.integrations.openenv.session.sendable`) has its episode closed. MCP is not
served. Any OpenEnv client plays it:

    from openenv.core import GenericEnvClient
    with GenericEnvClient(base_url="http://127.0.0.1:8001").sync() as env:
        first = env.reset(task_id="tool_use_game/val/0", split="val")
        result = env.step({"message": {"role": "assistant", "content": "42"}})
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

from llm_gym.core.factories import SPLITS
from llm_gym.core.registry import as_env_entry
from llm_gym.core.task import Task, task_key
from llm_gym.errors import InvalidArgumentError
from llm_gym.integrations.openenv.guard import FrameGuard, clip_validation_errors
from llm_gym.integrations.openenv.protocol import MAX_FRAME_BYTES, EnvAction, EnvObservation
from llm_gym.integrations.openenv.session import (
    ServedEnv,
    ServedEnvError,
    finish_closing,
)
from llm_gym.serving.access import AccessGuard, AccessPolicy
from llm_gym.serving.threaded import (
    ThreadedServer,
    connection_limit,
    head_timeout_protocol,
    http_url,
)

try:
    from fastapi import FastAPI, HTTPException, Request
    from fastapi.exception_handlers import http_exception_handler
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from openenv.core.env_server import HTTPEnvServer
    from openenv.core.env_server.types import ConcurrencyConfig
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "llm_gym's OpenEnv integration needs openenv-core: pip install -e '.[interop]'"
    ) from exc

__all__ = [
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_MAX_SESSIONS",
    "EnvAction",
    "EnvObservation",
    "EnvServer",
    "ServedEnv",
    "ServedEnvError",
    "build_env_app",
    "serve_env",
]

DEFAULT_STEP_TIMEOUT_S = 60.0
DEFAULT_MAX_SESSIONS = 256
"""WebSocket sessions at once (each one env instance)."""
DEFAULT_MAX_CONNECTIONS = 2 * DEFAULT_MAX_SESSIONS
"""Connections at once, HTTP and WebSocket together (a session holds one): past it a request
gets a 503 and a WebSocket handshake a 503 with the reason, before any session or env exists
(HTTP ``/reset`` and ``/step`` make an env per request)."""
DEFAULT_REQUEST_TIMEOUT_S = 30.0
"""Seconds a connection may take to send a request's head (and an HTTP body)."""


def build_env_app(
    env: Any,
    *,
    max_sessions: int = DEFAULT_MAX_SESSIONS,
    task_options: Mapping[str, Any] | None = None,
    step_timeout_s: float = DEFAULT_STEP_TIMEOUT_S,
    idle_timeout_s: float | None = 600.0,
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
    access: AccessPolicy | None = None,
) -> Any:
    """The FastAPI app (OpenEnv's) that serves ``env``.

    Args:
        env: A registered id (``"ToolUseGame-v0"``) or its ``EnvEntry``.
        max_sessions: Concurrent sessions (each one env instance); one more is refused with
            OpenEnv's ``CAPACITY_REACHED`` error.
        task_options: Options of the task source (``{"world_seed": 1}``), fixed for the server.
        step_timeout_s: Seconds a ``reset`` or ``step`` may take before its episode is closed.
        idle_timeout_s: Seconds a connection may stay silent before it is closed (None: never).
        request_timeout_s: Seconds an HTTP request's body may take to arrive (a 408 after;
            :func:`serve_env` also closes a connection whose request head takes longer).
        access: The hosts and web origins served (default: loopback only).
    """
    entry = as_env_entry(env)
    if not isinstance(max_sessions, int) or isinstance(max_sessions, bool) or max_sessions < 1:
        raise InvalidArgumentError(f"max_sessions must be an int >= 1, actual: {max_sessions!r}.")
    if not step_timeout_s > 0:
        raise InvalidArgumentError(f"step_timeout_s must be > 0, actual: {step_timeout_s!r}.")
    if idle_timeout_s is not None and not idle_timeout_s > 0:
        raise InvalidArgumentError(f"idle_timeout_s must be None or > 0: {idle_timeout_s!r}.")
    if not (isinstance(request_timeout_s, int | float) and request_timeout_s > 0):
        raise InvalidArgumentError(f"request_timeout_s must be > 0: {request_timeout_s!r}.")
    options = dict(task_options or {})
    entry.tasks("train", **options)  # fail now, not in the first session, on a bad option

    @functools.cache
    def catalog(split: str) -> tuple[Sequence[Task], Mapping[str, Task]]:
        tasks = tuple(entry.tasks(split, **options))
        return tasks, {task_key(t, i): t for i, t in enumerate(tasks)}

    # A partial of the class, not a function: OpenEnv reads the class's settings through it
    # (ServedEnv.REQUIRES_SINGLE_THREAD_EXECUTOR).
    factory = functools.partial(ServedEnv, entry, options, step_timeout_s, catalog)

    # OpenEnv's server and routes (/ws, /reset, /step, /state, /schema, /metadata, /health),
    # on a plain FastAPI app: create_app would add the optional Gradio UI, and we need the
    # server object itself for /llm_gym/sessions. FrameGuard keeps the idle timeout (OpenEnv's
    # reaper frees the slot but leaves the socket playing) and refuses /mcp (MCP sessions over
    # HTTP that nobody closes).
    app = FastAPI(title=f"llm_gym {entry.id} (OpenEnv)", version=str(entry.version or "0"))
    server = HTTPEnvServer(
        factory,
        EnvAction,
        EnvObservation,
        concurrency_config=ConcurrencyConfig(max_concurrent_envs=max_sessions),
    )
    server.register_routes(app)
    # After OpenEnv's own shutdown step (which drains the thread that ends sessions).
    app.router.on_shutdown.append(functools.partial(finish_closing, step_timeout_s + 1))
    for error, status in ((InvalidArgumentError, 422), (TimeoutError, 504), (ServedEnvError, 500)):
        app.add_exception_handler(error, functools.partial(_error_answer, status))
    for error in (RequestValidationError, HTTPException):
        app.add_exception_handler(error, _validation_answer)
    app.add_middleware(
        FrameGuard, idle_timeout_s=idle_timeout_s, body_timeout_s=float(request_timeout_s)
    )
    # Outermost: a refused handshake never reaches FrameGuard or OpenEnv (no session is made).
    app.add_middleware(AccessGuard, policy=access or AccessPolicy())
    app.state.env_server = server

    @app.get("/llm_gym/sessions", tags=["llm_gym"])
    def sessions() -> dict[str, int]:
        """Sessions open now, and the most the server allows."""
        return {"active": server.active_sessions, "max": server.max_concurrent_envs}

    @app.get("/llm_gym/tasks", tags=["llm_gym"])
    def list_tasks(split: str = "train") -> dict[str, Any]:
        """The split's tasks: ids and prompts (targets stay on the server)."""
        if split not in SPLITS:
            raise HTTPException(422, f"split must be one of {SPLITS}, actual: {split!r:.60}.")
        tasks = catalog(split)[0]
        return {
            "env_id": entry.id,
            "split": split,
            "max_turns": entry.max_turns,
            "action_format": entry.action_format,
            "tasks": [{"id": task_key(t, i), "prompt": t.prompt} for i, t in enumerate(tasks)],
        }

    return app


async def _validation_answer(request: Request, exc: Exception) -> JSONResponse:
    """A 422 for a body FastAPI's models refuse (``RequestValidationError``) or OpenEnv's action
    model does (an ``HTTPException`` with pydantic's errors), without the input pydantic echoes
    (a 16 MB ``episode_id`` came back whole): :func:`clip_validation_errors`."""
    if isinstance(exc, RequestValidationError):
        return JSONResponse({"detail": clip_validation_errors(exc.errors())}, 422)
    assert isinstance(exc, HTTPException)
    if isinstance(exc.detail, list):
        return JSONResponse({"detail": clip_validation_errors(exc.detail)}, exc.status_code)
    return await http_exception_handler(request, exc)


async def _error_answer(status: int, request: Request, exc: Exception) -> JSONResponse:
    """The HTTP answer to a refused request (``/reset``, ``/step``): the status and the reason."""
    return JSONResponse({"detail": str(exc)[:1000]}, status)


class EnvServer:
    """A running ``serve-env`` server (uvicorn in a thread); build it with :func:`serve_env`."""

    def __init__(
        self,
        app: Any,
        host: str,
        port: int,
        log: bool,
        request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
    ) -> None:
        import uvicorn

        config = uvicorn.Config(
            app, host=host, port=port, loop="asyncio", lifespan="on", ws="websockets-sansio",
            http=head_timeout_protocol(request_timeout_s, max_connections),
            limit_concurrency=connection_limit(max_connections),
            ws_max_size=MAX_FRAME_BYTES, timeout_graceful_shutdown=5, access_log=log,
            log_level="info" if log else "warning", **({} if log else {"log_config": None}),
        )  # fmt: skip
        self._running = ThreadedServer(config, "llm_gym-env")
        self._closed = False

    @property
    def port(self) -> int:
        servers = getattr(self._running.server, "servers", None) or []
        for server in servers:
            for sock in server.sockets:
                return int(sock.getsockname()[1])
        return int(self._running.server.config.port)

    @property
    def url(self) -> str:
        """The base URL clients use (``http://HOST:PORT``; OpenEnv clients add ``/ws``)."""
        return http_url(self._running.server.config.host, self.port)

    def wait(self) -> None:
        """Block until :meth:`close` (from another thread) or Ctrl-C."""
        self._running.wait()

    def close(self) -> None:
        """Stop serving and release the port (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._running.stop()

    def __enter__(self) -> EnvServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def serve_env(
    env: Any,
    host: str = "127.0.0.1",
    port: int = 8001,
    *,
    log: bool = False,
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
    **options: Any,
) -> EnvServer:
    """Serve ``env`` over OpenEnv in a background thread; returns the running server.

    ``options`` go to :func:`build_env_app` (``max_sessions``, ``task_options``,
    ``step_timeout_s``, ``idle_timeout_s``, ``request_timeout_s``, ``access``: by default
    loopback, and ``host`` when it is one address). Port 0 takes any free port
    (``server.url``). A connection whose request head (an HTTP request, or a WebSocket
    handshake) has not arrived within ``request_timeout_s`` of its opening or of its previous
    answer is closed. At most ``max_connections`` connections (HTTP and WebSocket together)
    are served at once: past it an HTTP request gets uvicorn's 503 and a WebSocket handshake a
    503 that says why, before any session or env is made (``max_sessions`` caps the sessions
    among them).
    """
    if (
        not isinstance(max_connections, int)
        or isinstance(max_connections, bool)
        or max_connections < 1
    ):
        raise InvalidArgumentError(
            f"max_connections must be an int >= 1, actual: {max_connections!r:.80}."
        )
    options.setdefault("access", AccessPolicy.local(host))
    timeout = options.get("request_timeout_s", DEFAULT_REQUEST_TIMEOUT_S)
    return EnvServer(build_env_app(env, **options), host, port, log, timeout, max_connections)
