"""Any registered llm_gym environment served as an OpenEnv environment: ``llm-gym serve-env``.

OpenEnv (``openenv-core``) is the standard for environments that run as servers: one FastAPI app
per environment, a WebSocket session per client (``/ws``: ``reset``, ``step``, ``state``,
``close``), each session with its own environment instance, plus ``/health``, ``/schema`` and
``/metadata``. We use its server as it is (``openenv.core.env_server.HTTPEnvServer``) and
only describe our episodes in its terms:

* the action is the assistant's message (:class:`EnvAction`: ``{"message": {"role":
  "assistant", "content": ..., "tool_calls": [...]}}``, OpenAI's format, validated with limits);
* the observation (:class:`EnvObservation`) carries the conversation's new messages
  (``messages`` from index ``start``: a client splices them in, so a step sends only the
  tail), the tool specs (at reset), ``done``, ``reward`` (when done), ``truncated`` and the
  episode's ``metrics``;
* ``reset`` takes ``task_id`` (and ``split``, default ``"train"``) or a ``seed`` (task ``seed
  mod n`` of the split), plus the task source's options (``task_options``, fixed when the
  server starts: a client cannot rewrite tasks or their answers);
* ``GET /llm_gym/tasks?split=val`` lists the split's task ids and prompts (never targets), so a
  client (:class:`~llm_gym.integrations.openenv_client.RemoteEnv`) can build its task list.

Each step runs on the server's event loop (our envs are async), within ``step_timeout_s``.
Clients are hostile: :class:`~llm_gym.integrations.openenv_protocol.FrameGuard` reads every
frame first (a bad one gets an error, the session goes on) and closes a connection silent for
``idle_timeout_s``; a reset is checked before the running episode is touched. So is the env: an
env that fails, hangs or returns nonsense (``check_step``, a finite reward) has its episode
closed. MCP is not served. Any OpenEnv client plays it:

    from openenv.core import GenericEnvClient
    with GenericEnvClient(base_url="http://127.0.0.1:8001").sync() as env:
        first = env.reset(task_id="tool_use_game/val/0", split="val")
        result = env.step({"message": {"role": "assistant", "content": "42"}})
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from llm_gym.aio import LoopRunner
from llm_gym.core.env import StepResult, check_step, step_outcome, turn_cap
from llm_gym.core.registry import as_env_entry
from llm_gym.core.task import Task
from llm_gym.core.text import clean_json
from llm_gym.errors import InvalidArgumentError
from llm_gym.integrations.openenv_protocol import (
    MAX_FRAME_BYTES,
    EnvAction,
    EnvObservation,
    FrameGuard,
    json_safe,
)

try:
    from fastapi import FastAPI, HTTPException, Request
    from fastapi.responses import JSONResponse
    from openenv.core.env_server import HTTPEnvServer
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.types import (
        ConcurrencyConfig,
        EnvironmentMetadata,
        State,
    )
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "llm_gym's OpenEnv integration needs openenv-core: pip install -e '.[interop]'"
    ) from exc

__all__ = [
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
SPLITS = ("train", "val", "test")
STARTUP_TIMEOUT_S = 30.0
CLOSED = "This session is closed (idle too long, or the server is stopping): open a new one."
NO_EPISODE = (
    "No episode is running in this session: reset first (the last one ended). Over HTTP each "
    "request is a session of its own: play an episode through the WebSocket (/ws)."
)
_CLOSING: set[asyncio.Task[Any]] = set()  # closes scheduled on the loop, kept until they finish


class ServedEnvError(RuntimeError):
    """The served env failed (raised, hung, returned nonsense); its episode is closed."""


Catalog = Callable[[str], tuple[Sequence[Task], Mapping[str, Task]]]
"""``split -> (its tasks in order, {task id: task})``, built once and shared by the sessions."""


class ServedEnv(Environment):
    """One session's environment: plays episodes of one registered env's tasks.

    Build it with :func:`build_env_app` (one instance per OpenEnv session). Every episode gets
    a fresh llm_gym env from the entry's factory; the previous one is closed first.
    """

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(
        self, entry: Any, task_options: Mapping[str, Any], step_timeout_s: float, catalog: Catalog
    ) -> None:
        super().__init__()
        self.entry = entry
        self.catalog = catalog
        self.task_options = dict(task_options)
        self.step_timeout_s = step_timeout_s
        self._env: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sent = 0
        self._done = True
        self._closed = False
        self._state = State()

    # --- the episode ----------------------------------------------------------------------
    def _task(self, split: Any, task_id: Any, seed: Any) -> Task:
        """The task a reset names; a clear error (and nothing touched) when it names none."""
        if split is not None and (not isinstance(split, str) or split not in SPLITS):
            raise InvalidArgumentError(f"split must be one of {SPLITS}, actual: {split!r:.80}.")
        if task_id is not None:
            if not isinstance(task_id, str):
                raise InvalidArgumentError(
                    "task_id must be a string (GET /llm_gym/tasks lists them), actual: a JSON "
                    f"{type(task_id).__name__}."
                )
            for name in (split,) if split is not None else SPLITS:
                task = self.catalog(name)[1].get(task_id)
                if task is not None:
                    return task
            where = f"{split!r} split" if split is not None else "splits"
            raise InvalidArgumentError(
                f"task_id {task_id[:120]!r} names no task of {self.entry.id}'s {where} "
                "(GET /llm_gym/tasks?split=... lists them)."
            )
        if isinstance(seed, int) and not isinstance(seed, bool):
            tasks = self.catalog(split or "train")[0]
            if not tasks:
                raise InvalidArgumentError(f"{self.entry.id}'s {split or 'train'} split is empty.")
            return tasks[seed % len(tasks)]
        raise InvalidArgumentError(
            "reset needs task_id (split optional) or an integer seed (task seed mod n of the "
            f"split, default 'train'), actual: seed={seed!r:.40}."
        )

    async def reset_async(
        self,
        seed: int | None = None,
        episode_id: str | None = None,
        task_id: str | None = None,
        split: str | None = None,
        **kwargs: Any,
    ) -> EnvObservation:
        self._check_open()
        if kwargs:
            raise InvalidArgumentError(
                f"Unknown reset argument(s) {sorted(kwargs)[:8]!r:.300}; allowed: task_id, "
                "split, seed, episode_id."
            )
        if episode_id is not None and not (isinstance(episode_id, str) and len(episode_id) <= 256):
            raise InvalidArgumentError(
                f"episode_id must be a string of at most 256 characters: {episode_id!r:.60}."
            )
        task = self._task(split, task_id, seed)  # checked first: a refused reset changes nothing
        await self._close_episode()
        self._loop = asyncio.get_running_loop()
        where = f"{self.entry.id}.reset"
        self._env = env = await self._guarded(lambda: self.entry.env_factory()(task), where)
        opening = await self._guarded(lambda: env.reset(task), where)
        observation = await self._guarded(lambda: EnvObservation(
            messages=_as_json(check_step(StepResult(False, False, opening), where)),
            tool_specs=_as_json(list(env.tool_specs)), task_id=task.id,
            raw_text_actions=bool(getattr(env, "raw_text_actions", False)),
            max_turns=turn_cap(env),
        ), where)  # fmt: skip
        self._done, self._sent = False, len(opening)
        self._state = State(episode_id=episode_id, step_count=0, task_id=task.id, split=split)
        return observation

    async def step_async(
        self, action: EnvAction, timeout_s: float | None = None, **kwargs: Any
    ) -> EnvObservation:
        self._check_open(episode=True)
        env, where = self._env, f"{self.entry.id}.step"
        result = await self._guarded(lambda: env.step(action.message.to_message()), where)
        observation = await self._guarded(lambda: self._observe(result, where), where)
        self._sent = len(result.messages)
        self._state.step_count += 1
        if observation.done:
            await self._close_episode()
        return observation

    def _observe(self, result: Any, where: str) -> EnvObservation:
        """A step's observation: its result checked as the episode driver checks one."""
        messages = check_step(result, where)
        done = bool(result.terminated or result.truncated)
        reward, metrics = step_outcome(result, where) if done else (None, {})
        start = min(self._sent, len(messages))
        return EnvObservation(
            messages=_as_json(messages[start:]), start=start, done=done, reward=reward,
            truncated=bool(result.truncated), metrics=_as_json(metrics),
            task_id=self._state.task_id,  # type: ignore[attr-defined]
        )  # fmt: skip

    def _check_open(self, episode: bool = False) -> None:
        if self._closed or (episode and (self._env is None or self._done)):
            raise InvalidArgumentError(CLOSED if self._closed else NO_EPISODE)

    async def _guarded(self, call: Callable[[], Any], where: str) -> Any:
        """``call()`` (awaited within ``step_timeout_s`` when it is a coroutine); on any failure
        (a raise, a timeout, a malformed result) the episode is closed, the error names
        ``where``."""
        try:
            result = call()
            if asyncio.iscoroutine(result):
                result = await asyncio.wait_for(result, self.step_timeout_s)
            return result
        except TimeoutError:
            await self._close_episode()
            raise TimeoutError(
                f"{where} did not return within {self.step_timeout_s} s; the episode is closed."
            ) from None
        except Exception as exc:
            await self._close_episode()
            raise ServedEnvError(
                f"{where} failed: {type(exc).__name__}: {str(exc)[:500]} (the episode is closed)"
            ) from exc

    async def _close_episode(self) -> None:
        env, self._env, self._done = self._env, None, True
        if env is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(env.close(), self.step_timeout_s)

    # --- OpenEnv's synchronous face ---------------------------------------------------------
    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> Any:
        return LoopRunner().run(self.reset_async(seed=seed, episode_id=episode_id, **kwargs))

    def step(self, action: Any, timeout_s: float | None = None, **kwargs: Any) -> Any:
        raise InvalidArgumentError(
            "An llm_gym episode lives in one session: step through the WebSocket (/ws), e.g. "
            "with openenv's GenericEnvClient or llm_gym's RemoteEnv."
        )

    @property
    def state(self) -> State:
        return self._state

    def get_metadata(self) -> EnvironmentMetadata:
        return EnvironmentMetadata(
            name=self.entry.id,
            description=self.entry.description or self.entry.id,
            version=str(self.entry.version or "0"),
        )

    def close(self) -> None:
        """End the session: close the running episode's env, on the loop it was started on
        (OpenEnv calls this from a worker thread when the session ends); later resets and
        steps are refused."""
        self._closed = True
        if self._env is None:
            return
        loop = self._loop
        if loop is not None and loop.is_running():
            if _running_loop() is loop:
                task = loop.create_task(self._close_episode())
                _CLOSING.add(task)
                task.add_done_callback(_CLOSING.discard)
                return
            future = asyncio.run_coroutine_threadsafe(self._close_episode(), loop)
            with contextlib.suppress(Exception):
                future.result(self.step_timeout_s + 1)
            return
        LoopRunner().run(self._close_episode())


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _as_json(value: Any) -> Any:
    """What an env said, as JSON: non-JSON values as text, lone surrogates replaced."""
    return clean_json(json_safe(value))


def build_env_app(
    env: Any,
    *,
    max_sessions: int = DEFAULT_MAX_SESSIONS,
    task_options: Mapping[str, Any] | None = None,
    step_timeout_s: float = DEFAULT_STEP_TIMEOUT_S,
    idle_timeout_s: float | None = 600.0,
) -> Any:
    """The FastAPI app (OpenEnv's) that serves ``env``.

    Args:
        env: A registered id (``"ToolUseGame-v0"``) or its ``EnvEntry``.
        max_sessions: Concurrent sessions (each one env instance); one more is refused with
            OpenEnv's ``CAPACITY_REACHED`` error.
        task_options: Options of the task source (``{"world_seed": 1}``), fixed for the server.
        step_timeout_s: Seconds a ``reset`` or ``step`` may take before its episode is closed.
        idle_timeout_s: Seconds a connection may stay silent before it is closed (None: never).
    """
    entry = as_env_entry(env)
    if not isinstance(max_sessions, int) or isinstance(max_sessions, bool) or max_sessions < 1:
        raise InvalidArgumentError(f"max_sessions must be an int >= 1, actual: {max_sessions!r}.")
    if not step_timeout_s > 0:
        raise InvalidArgumentError(f"step_timeout_s must be > 0, actual: {step_timeout_s!r}.")
    if idle_timeout_s is not None and not idle_timeout_s > 0:
        raise InvalidArgumentError(f"idle_timeout_s must be None or > 0: {idle_timeout_s!r}.")
    options = dict(task_options or {})
    entry.tasks("train", **options)  # fail now, not in the first session, on a bad option

    @functools.cache
    def catalog(split: str) -> tuple[Sequence[Task], Mapping[str, Task]]:
        tasks = tuple(entry.tasks(split, **options))
        return tasks, {str(t.id): t for t in tasks}

    def factory() -> ServedEnv:
        return ServedEnv(entry, options, step_timeout_s, catalog)

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
    for error, status in ((InvalidArgumentError, 422), (TimeoutError, 504), (ServedEnvError, 500)):
        app.add_exception_handler(error, functools.partial(_error_answer, status))
    app.add_middleware(FrameGuard, idle_timeout_s=idle_timeout_s)
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
            "tasks": [{"id": t.id, "prompt": t.prompt} for t in tasks],
        }

    return app


async def _error_answer(status: int, request: Request, exc: Exception) -> JSONResponse:
    """The HTTP answer to a refused request (``/reset``, ``/step``): the status and the reason."""
    return JSONResponse({"detail": str(exc)[:1000]}, status)


class EnvServer:
    """A running ``serve-env`` server (uvicorn in a thread); build it with :func:`serve_env`."""

    def __init__(self, app: Any, host: str, port: int, log: bool) -> None:
        import uvicorn

        config = uvicorn.Config(
            app, host=host, port=port, loop="asyncio", lifespan="on", ws="websockets-sansio",
            ws_max_size=MAX_FRAME_BYTES, timeout_graceful_shutdown=5, access_log=log,
            log_level="info" if log else "warning", **({} if log else {"log_config": None}),
        )  # fmt: skip
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="llm_gym-env", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self._server.should_exit = True
                raise RuntimeError("the env server did not start listening (see the log)")
            time.sleep(0.01)
        self._closed = False

    @property
    def port(self) -> int:
        servers = getattr(self._server, "servers", None) or []
        for server in servers:
            for sock in server.sockets:
                return int(sock.getsockname()[1])
        return int(self._server.config.port)

    @property
    def url(self) -> str:
        """The base URL clients use (``http://HOST:PORT``; OpenEnv clients add ``/ws``)."""
        host = self._server.config.host
        return f"http://{'[' + host + ']' if ':' in host else host}:{self.port}"

    def wait(self) -> None:
        """Block until :meth:`close` (from another thread) or Ctrl-C."""
        while self._thread.is_alive():
            self._thread.join(0.5)

    def close(self) -> None:
        """Stop serving and release the port (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._server.should_exit = True
        self._thread.join(15)

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
    **options: Any,
) -> EnvServer:
    """Serve ``env`` over OpenEnv in a background thread; returns the running server.

    ``options`` go to :func:`build_env_app` (``max_sessions``, ``task_options``,
    ``step_timeout_s``, ``idle_timeout_s``). Port 0 takes any free port (``server.url``).
    """
    return EnvServer(build_env_app(env, **options), host, port, log)
