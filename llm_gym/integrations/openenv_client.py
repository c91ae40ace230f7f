"""OpenEnv servers played as llm_gym environments: :class:`RemoteEnv`.

One episode is one OpenEnv WebSocket session (openenv-core's ``GenericEnvClient``): ``reset``
opens it, every step is one message with a per-call deadline, and ``close`` (which the loop
always calls) ends it. A server that dies, hangs or answers with an error raises
:class:`~llm_gym.errors.RemoteEnvError`, which the episode driver turns into the end of that
episode only (cause ``ENV``, the error recorded); the session is dropped either way.

Two kinds of server are understood, told apart by the first observation:

* an llm_gym server (``llm-gym serve-env``, :mod:`llm_gym.integrations.openenv_server`):
  messages, tool specs, rewards and truncation cross unchanged, so a remote episode is the same
  episode as an in-process one (tool calls parsed by our action format, the same rewards);
* any other OpenEnv environment, played as text: the assistant's reply goes into one action
  field (``action_field``, default ``"message"``), the observation comes back as a user message
  (``observation_field``, or the observation's JSON), ``done`` ends the episode, and its reward
  is the last step's (or the sum: ``reward="sum"``).

Tasks come from the server (:class:`RemoteTasks`: ``GET /llm_gym/tasks`` on ours; seeds on any
other, ``train`` 0..n-1, ``val`` from 1,000,000, ``test`` from 2,000,000: each server decides
what a seed means). :func:`register_remote_env` registers a server under an id, so
``gym.make``, ``collect_groups``, ``run_and_report`` and the trainer take it like a local env;
``gym.make("OpenEnv-v0", base_url=...)`` does the same without an id.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Mapping
from typing import Any

import httpx

from llm_gym.core.env import Env, StepResult
from llm_gym.core.task import Task
from llm_gym.core.types import Message, ToolSpec
from llm_gym.errors import InvalidArgumentError, RemoteEnvError
from llm_gym.gym.registration import register_env
from llm_gym.gym.text_env import TextEnv

try:
    from openenv.core.generic_client import GenericEnvClient
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "llm_gym's OpenEnv integration needs openenv-core: pip install -e '.[interop]'"
    ) from exc

__all__ = ["RemoteEnv", "RemoteEnvFactory", "RemoteTasks", "make_text_env", "register_remote_env"]

DEFAULT_CALL_TIMEOUT_S = 30.0
DEFAULT_CONNECT_TIMEOUT_S = 10.0
SEED_OFFSETS = {"train": 0, "val": 1_000_000, "test": 2_000_000}
"""Where each split's seeds start on a server that lists no tasks."""
DEFAULT_SEED_TASKS = 64
REWARD_MODES = ("last", "sum")


class _Client(GenericEnvClient):
    """openenv's dict client, with a close that lets the server end the session first."""

    async def close_session(self) -> None:
        """Send ``close`` and wait for the server to close the socket (it ends the session
        then), so neither side closes into the other (a server-side error in the log)."""
        ws, self._ws = self._ws, None
        if ws is None:
            return
        try:
            await ws.send(json.dumps({"type": "close"}))
            await asyncio.wait_for(ws.wait_closed(), 5.0)
        finally:
            await ws.close()


def _ws_errors() -> tuple[type[BaseException], ...]:
    from websockets.exceptions import WebSocketException

    return (OSError, RuntimeError, WebSocketException, json.JSONDecodeError)


class RemoteEnv(Env):
    """An OpenEnv server's environment as an llm_gym :class:`~llm_gym.core.Env`.

    Args:
        base_url: The server (``http://host:port``; the client adds ``/ws``).
        call_timeout_s: Seconds each ``reset`` and ``step`` may take (the per-call deadline).
        connect_timeout_s: Seconds to open the session.
        action_field: A text server's action field that receives the reply.
        observation_field: A text server's observation field shown to the model (default: the
            whole observation as JSON, or its only text field).
        reward: A text server's episode reward: the ``"last"`` step's or the ``"sum"``.
    """

    def __init__(
        self,
        base_url: str,
        *,
        call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
        action_field: str = "message",
        observation_field: str | None = None,
        reward: str = "last",
    ) -> None:
        if not isinstance(base_url, str) or not base_url.startswith(("http", "ws")):
            raise InvalidArgumentError(
                f"base_url must be an http(s):// or ws(s):// URL, actual value: {base_url!r:.100}."
            )
        for name, value in (("call_timeout_s", call_timeout_s), ("connect", connect_timeout_s)):
            if not (isinstance(value, int | float) and value > 0):
                raise InvalidArgumentError(f"{name} must be > 0 seconds, actual value: {value!r}.")
        if reward not in REWARD_MODES:
            raise InvalidArgumentError(f"reward must be one of {REWARD_MODES}, actual: {reward!r}.")
        self.base_url = base_url.rstrip("/")
        self.call_timeout_s = float(call_timeout_s)
        self.connect_timeout_s = float(connect_timeout_s)
        self.action_field = action_field
        self.observation_field = observation_field
        self.reward_mode = reward
        self.raw_text_actions = False  # set per episode: True for a text server
        self._client: Any = None
        self._messages: list[Message] = []
        self._tool_specs: list[ToolSpec] = []
        self._native = True
        self._reward = 0.0
        self._task: Task | None = None

    # --- the session --------------------------------------------------------------------------
    async def _call(self, coro: Any, what: str) -> Any:
        """Await one exchange within the deadline; any failure drops the session."""
        try:
            return await asyncio.wait_for(coro, self.call_timeout_s)
        except TimeoutError:
            await self._drop()
            raise RemoteEnvError(
                f"{self.base_url}: {what} did not answer within call_timeout_s="
                f"{self.call_timeout_s} s; the session was dropped."
            ) from None
        except _ws_errors() as exc:
            await self._drop()
            hint = ""
            if type(exc).__name__.startswith("ConnectionClosed"):
                hint = " (the server closed the session; one at its session limit does so)"
            raise RemoteEnvError(f"{self.base_url}: {what} failed: {exc}"[:2000] + hint) from exc

    async def _drop(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client.close_session(), 2.0)

    async def close(self) -> None:
        """End the session (a ``close`` message, then the socket); safe to call again."""
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client.close_session(), min(self.call_timeout_s, 5.0) + 1)

    # --- the episode --------------------------------------------------------------------------
    async def reset(self, task: Task) -> list[Message]:
        await self.close()
        self._client = _Client(
            base_url=self.base_url,
            connect_timeout_s=self.connect_timeout_s,
            message_timeout_s=self.call_timeout_s,
        )
        arguments = task.metadata.get("reset")
        if not isinstance(arguments, Mapping):
            arguments = {"task_id": task.id}
            if isinstance(task.metadata.get("split"), str):
                arguments["split"] = task.metadata["split"]
        await self._call(self._client.connect(), "connect")
        result = await self._call(self._client.reset(**dict(arguments)), "reset")
        observation = result.observation if isinstance(result.observation, dict) else {}
        self._task, self._reward = task, 0.0
        self._native = isinstance(observation.get("messages"), list) and "start" in observation
        self.raw_text_actions = not self._native
        if self._native:
            self._messages = [dict(m) for m in observation["messages"] if isinstance(m, dict)]
            self._tool_specs = list(observation.get("tool_specs") or [])
        else:
            self._tool_specs = []
            text = self._observation_text(observation)
            opening = f"{task.prompt}\n\n{text}" if task.prompt else text
            self._messages = [{"role": "user", "content": opening}]
        return self.messages

    async def step(self, message: Message) -> StepResult:
        if self._client is None:
            raise RemoteEnvError(f"{self.base_url}: step without a session (reset first).")
        if self._native:
            action: dict[str, Any] = {"role": "assistant", "content": message.get("content") or ""}
            if message.get("tool_calls"):
                action["tool_calls"] = message["tool_calls"]
            result = await self._call(self._client.step({"message": action}), "step")
            return self._native_result(result)
        content = str(message.get("content") or "")
        result = await self._call(self._client.step({self.action_field: content}), "step")
        observation = result.observation if isinstance(result.observation, dict) else {}
        reward = _number(result.reward)
        self._reward = self._reward + reward if self.reward_mode == "sum" else reward
        self._messages.append({"role": "assistant", "content": content})
        if not result.done:
            self._messages.append({"role": "user", "content": self._observation_text(observation)})
        return StepResult(bool(result.done), False, self.messages, reward=self._reward)

    def _native_result(self, result: Any) -> StepResult:
        observation = result.observation if isinstance(result.observation, dict) else {}
        start = observation.get("start")
        tail = observation.get("messages")
        if not isinstance(start, int) or not isinstance(tail, list) or start > len(self._messages):
            raise RemoteEnvError(
                f"{self.base_url}: a step's observation is not an llm_gym one (start={start!r}, "
                f"messages of type {type(tail).__name__})."
            )
        self._messages[start:] = [dict(m) for m in tail if isinstance(m, dict)]
        truncated = bool(observation.get("truncated"))
        done = bool(result.done)
        metrics = observation.get("metrics")
        return StepResult(
            terminated=done and not truncated,
            truncated=truncated,
            messages=self.messages,
            reward=_number(result.reward) if done else 0.0,
            metrics=metrics if isinstance(metrics, dict) else {},
        )

    def _observation_text(self, observation: Mapping[str, Any]) -> str:
        shown = {k: v for k, v in observation.items() if k not in ("done", "reward", "metadata")}
        if self.observation_field is not None:
            if self.observation_field not in shown:
                raise RemoteEnvError(
                    f"{self.base_url}: the observation has no field {self.observation_field!r} "
                    f"(fields: {sorted(shown)[:20]})."
                )
            value = shown[self.observation_field]
        else:
            texts = [v for v in shown.values() if isinstance(v, str)]
            value = texts[0] if len(shown) == 1 and texts else shown
        return value if isinstance(value, str) else json.dumps(value, default=str)

    @property
    def tool_specs(self) -> list[ToolSpec]:
        return list(self._tool_specs)

    @property
    def messages(self) -> list[Message]:
        return [dict(m) for m in self._messages]  # type: ignore[misc]


def _number(value: Any) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


class RemoteEnvFactory:
    """``task -> RemoteEnv`` for one server (picklable; what an id registers)."""

    def __init__(self, base_url: str, **options: Any) -> None:
        RemoteEnv(base_url, **options)  # check the options now
        self.base_url, self.options = base_url, options

    def __call__(self, task: Task) -> RemoteEnv:
        return RemoteEnv(self.base_url, **self.options)


class RemoteTasks:
    """A server's task source ``split -> tasks``: its listing (an llm_gym server), else
    ``n_seed_tasks`` seeds per split (see the module docstring)."""

    def __init__(
        self, base_url: str, *, n_seed_tasks: int = DEFAULT_SEED_TASKS, timeout_s: float = 30.0
    ) -> None:
        self.base_url, self.n_seed_tasks, self.timeout_s = (
            base_url.rstrip("/"),
            n_seed_tasks,
            timeout_s,
        )
        self._cache: dict[str, list[Task]] = {}
        self.listing: dict[str, Any] | None = None

    def fetch(self, split: str) -> dict[str, Any] | None:
        """The server's listing of ``split`` (None when it has no ``/llm_gym/tasks``)."""
        url = self.base_url.replace("ws://", "http://", 1).replace("wss://", "https://", 1)
        try:
            answer = httpx.get(
                f"{url}/llm_gym/tasks", params={"split": split}, timeout=self.timeout_s
            )
        except httpx.HTTPError as exc:
            raise RemoteEnvError(f"{self.base_url}: listing the tasks failed: {exc}") from exc
        if answer.status_code == 404:
            return None
        if answer.status_code != 200:
            raise RemoteEnvError(
                f"{self.base_url}: GET /llm_gym/tasks?split={split} answered "
                f"{answer.status_code}: {answer.text[:300]}"
            )
        listing = answer.json()
        if not isinstance(listing, dict) or not isinstance(listing.get("tasks"), list):
            raise RemoteEnvError(f"{self.base_url}: the task listing is not llm_gym's.")
        return listing

    def __call__(self, split: str) -> list[Task]:
        if split not in SEED_OFFSETS:
            raise InvalidArgumentError(f"split must be one of {tuple(SEED_OFFSETS)}: {split!r}.")
        if split not in self._cache:
            listing = self.fetch(split)
            if listing is None:
                offset = SEED_OFFSETS[split]
                self._cache[split] = [
                    Task("", id=f"openenv/{split}/{i}", metadata={"reset": {"seed": offset + i}})
                    for i in range(self.n_seed_tasks)
                ]
            else:
                self.listing = {k: v for k, v in listing.items() if k != "tasks"}
                self._cache[split] = [
                    Task(str(t.get("prompt", "")), id=str(t.get("id")), metadata={"split": split})
                    for t in listing["tasks"]
                    if isinstance(t, dict)
                ]
        return list(self._cache[split])


def _served_settings(tasks: RemoteTasks) -> dict[str, Any]:
    """The turn limit and action format an llm_gym server announces (else the defaults)."""
    listing = tasks.fetch("train")
    if listing is None:
        return {}
    settings: dict[str, Any] = {}
    if isinstance(listing.get("max_turns"), int):
        settings["max_turns"] = listing["max_turns"]
    if isinstance(listing.get("action_format"), str):
        settings["action_format"] = listing["action_format"]
    return settings


def register_remote_env(
    env_id: str,
    base_url: str,
    *,
    description: str = "",
    n_seed_tasks: int = DEFAULT_SEED_TASKS,
    **options: Any,
) -> Any:
    """Register the OpenEnv server at ``base_url`` as ``env_id``; returns its ``EnvEntry``.

    The turn limit and action format are the server's (an llm_gym server announces them);
    pass ``max_turns=`` or ``action_format=`` to override. Other ``options`` go to
    :class:`RemoteEnv` (``call_timeout_s``, ``action_field``, ...).
    """
    tasks = RemoteTasks(base_url, n_seed_tasks=n_seed_tasks)
    settings = _served_settings(tasks)
    for key in ("max_turns", "action_format"):
        if key in options:
            settings[key] = options.pop(key)
    return register_env(
        env_id,
        env=RemoteEnvFactory(base_url, **options),
        tasks=tasks,
        description=description or f"The OpenEnv server at {base_url}.",
        **settings,
    )


def make_text_env(base_url: str, *, n_seed_tasks: int = DEFAULT_SEED_TASKS, **kwargs: Any) -> Any:
    """``gym.make("OpenEnv-v0", base_url=...)``: a :class:`~llm_gym.gym.TextEnv` over the server.

    ``kwargs`` go to :class:`RemoteEnv` when they are its options (``call_timeout_s``,
    ``action_field``, ...), else to ``TextEnv`` (``split``, ``max_turns``, ``render_mode``, ...).
    """
    remote = {
        k: kwargs.pop(k)
        for k in (
            "call_timeout_s",
            "connect_timeout_s",
            "action_field",
            "observation_field",
            "reward",
        )
        if k in kwargs
    }
    tasks = RemoteTasks(base_url, n_seed_tasks=n_seed_tasks)
    settings = {**_served_settings(tasks), **kwargs}
    return TextEnv(RemoteEnvFactory(base_url, **remote), tasks, **settings)
