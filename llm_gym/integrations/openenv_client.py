"""OpenEnv servers played as llm_gym environments: :class:`RemoteEnv`.

One episode is one OpenEnv WebSocket session (openenv-core's ``GenericEnvClient``): ``reset``
opens it, every step is one message with a per-call deadline, and ``close`` (which the loop
always calls) ends it, within a bound even when the server ignores the close. The server is
hostile: a server that dies, hangs, answers with an error or answers nonsense (every frame is
read by :func:`~llm_gym.integrations.openenv_protocol.read_frame`, an llm_gym server's
observation checked by :func:`~llm_gym.integrations.openenv_checks.check_observation`: no
NaN reward, no message that is not OpenAI's, no ``start`` outside the conversation) raises
:class:`~llm_gym.errors.RemoteEnvError`, which the episode driver turns into the end of that
episode only (cause ``ENV``, the error recorded); the session is dropped (cut off) then.

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
import time
from collections.abc import Mapping
from typing import Any

import httpx

from llm_gym.core.env import Env, StepResult, finite_reward
from llm_gym.core.task import Task
from llm_gym.core.types import Message, ToolSpec
from llm_gym.errors import InvalidArgumentError, RemoteEnvError
from llm_gym.gym.registration import register_env
from llm_gym.gym.text_env import TextEnv
from llm_gym.integrations.openenv_checks import check_listing, check_observation
from llm_gym.integrations.openenv_connection import SessionClient, is_loopback
from llm_gym.integrations.openenv_protocol import read_frame

__all__ = ["RemoteEnv", "RemoteEnvFactory", "RemoteTasks", "make_text_env", "register_remote_env"]

DEFAULT_CALL_TIMEOUT_S = 30.0
DEFAULT_CONNECT_TIMEOUT_S = 10.0
SEED_OFFSETS = {"train": 0, "val": 1_000_000, "test": 2_000_000}
"""Where each split's seeds start on a server that lists no tasks."""
DEFAULT_SEED_TASKS = 64
REWARD_MODES = ("last", "sum")
MAX_LISTING_BYTES = 64 * 1024 * 1024
"""The largest task listing read (``GET /llm_gym/tasks``)."""
MAX_LISTING_VALUES = 1_000_000
"""The most JSON values in a task listing (counted before it is parsed)."""


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
        for name, value in (
            ("call_timeout_s", call_timeout_s),
            ("connect_timeout_s", connect_timeout_s),
        ):
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
        self._concludes = False
        self._reward = 0.0
        self._task: Task | None = None

    # --- the session --------------------------------------------------------------------------
    async def _call(self, coro: Any, what: str, timeout_name: str = "call_timeout_s") -> Any:
        """Await one exchange within its deadline (``timeout_name``'s); any failure drops the
        session."""
        limit = getattr(self, timeout_name)
        try:
            async with asyncio.timeout(limit):
                return await coro
        except TimeoutError:
            await self._drop()
            raise RemoteEnvError(
                f"{self.base_url}: {what} did not answer within {timeout_name}={limit} s; the "
                "session was dropped."
            ) from None
        except Exception as exc:  # whatever broke in the exchange, the server broke it
            await self._drop()
            hint = ""
            if type(exc).__name__.startswith("ConnectionClosed"):
                hint = " (the server closed the session; one at its session limit does so)"
            failure = f"{self.base_url}: {what} failed: {type(exc).__name__}: {exc}"
            raise RemoteEnvError(failure[:2000] + hint) from exc

    async def _answer(self, coro: Any, what: str) -> tuple[dict[str, Any], float | None, bool]:
        """One exchange's observation, reward and ``done``, checked; else RemoteEnvError."""
        result = await self._call(coro, what)
        observation, reward, done = result.observation, result.reward, result.done
        try:
            if not isinstance(observation, dict):
                raise InvalidArgumentError(
                    f"observation must be a JSON object, actual: {observation!r:.60}"
                )
            if what == "reset":  # an llm_gym server's observation, or any other server's
                self._native = "messages" in observation and "start" in observation
            if not isinstance(done, bool):
                raise InvalidArgumentError(f"done={done!r:.40}; done must be true or false")
            reward = None if reward is None else finite_reward(reward)
            if self._native:
                observation = check_observation(observation)
                start = observation["start"]
                if what == "step" and start > len(self._messages):
                    raise InvalidArgumentError(
                        f"start={start} is past the {len(self._messages)} messages so far"
                    )
        except InvalidArgumentError as exc:
            await self._drop()
            raise RemoteEnvError(f"{self.base_url}: {what} answered nonsense: {exc}") from None
        return observation, reward, done

    async def _drop(self) -> None:
        """Cut the session off (no close handshake: the server failed us)."""
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):
                await client.close_session(0)

    async def close(self) -> None:
        """End the session (a ``close`` message, then the socket, cut off when the server has
        not closed it within ``min(call_timeout_s, 5)`` s); safe to call again."""
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):
                await client.close_session(min(self.call_timeout_s, 5.0))

    # --- the episode --------------------------------------------------------------------------
    async def reset(self, task: Task) -> list[Message]:
        await self.close()
        self._client = SessionClient(
            base_url=self.base_url,
            connect_timeout_s=self.connect_timeout_s,
            message_timeout_s=self.call_timeout_s,
        )
        arguments = task.metadata.get("reset")
        if not isinstance(arguments, Mapping):
            arguments = {"task_id": task.id}
            if isinstance(task.metadata.get("split"), str):
                arguments["split"] = task.metadata["split"]
        await self._call(self._client.connect(), "connect", "connect_timeout_s")
        self._messages, self._tool_specs = [], []
        observation, _, _ = await self._answer(self._client.reset(**dict(arguments)), "reset")
        self._task, self._reward = task, 0.0
        self.raw_text_actions = not self._native
        self.max_turns = None
        self._concludes = False
        if self._native:
            self._messages = observation["messages"]
            self._tool_specs = observation["tool_specs"]  # type: ignore[assignment]
            # The served env's own switches (the driver reads them after reset).
            self.raw_text_actions = bool(observation.get("raw_text_actions"))
            self.max_turns = observation.get("max_turns")
            self._concludes = bool(observation.get("concludes"))
        else:
            self._tool_specs = []
            text = self._observation_text(observation)
            opening = f"{task.prompt}\n\n{text}" if task.prompt else text
            self._messages = [{"role": "user", "content": opening}]
        return self.messages

    async def conclude(self, cause: str) -> StepResult | None:
        """The served env's score of an episode our loop cut short (its ``conclude``), when it
        has one; else None (the driver keeps its own ending)."""
        if not (self._native and self._concludes and self._client is not None):
            return None
        observation, reward, _ = await self._answer(
            self._client.step({"conclude": str(cause)[:64]}), "conclude"
        )
        if reward is None:
            return None
        return StepResult(False, True, self.messages, reward=reward, metrics=observation["metrics"])

    async def step(self, message: Message) -> StepResult:
        if self._client is None:
            raise RemoteEnvError(f"{self.base_url}: step without a session (reset first).")
        if self._native:
            action: dict[str, Any] = {"role": "assistant", "content": message.get("content") or ""}
            if message.get("tool_calls"):
                action["tool_calls"] = message["tool_calls"]
            observation, reward, done = await self._answer(
                self._client.step({"message": action}), "step"
            )
            self._messages[observation["start"] :] = observation["messages"]
            truncated = observation["truncated"]
            return StepResult(
                terminated=done and not truncated,
                truncated=truncated,
                messages=self.messages,
                reward=(reward or 0.0) if done else 0.0,
                metrics=observation["metrics"],
            )
        content = str(message.get("content") or "")
        observation, reward, done = await self._answer(
            self._client.step({self.action_field: content}), "step"
        )
        reward = reward or 0.0
        self._reward = self._reward + reward if self.reward_mode == "sum" else reward
        self._messages.append({"role": "assistant", "content": content})
        if not done:
            self._messages.append({"role": "user", "content": self._observation_text(observation)})
        return StepResult(done, False, self.messages, reward=self._reward)

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
        """The server's listing of ``split`` (None when it has no ``/llm_gym/tasks``), read
        within ``timeout_s`` (all of it) and :data:`MAX_LISTING_BYTES`, and checked
        (:func:`~llm_gym.integrations.openenv_checks.check_listing`)."""
        url = self.base_url.replace("ws://", "http://", 1).replace("wss://", "https://", 1)
        where = f"{self.base_url}: GET /llm_gym/tasks?split={split}"
        deadline, body = time.monotonic() + self.timeout_s, bytearray()
        try:
            with httpx.stream("GET", f"{url}/llm_gym/tasks", params={"split": split},
                              timeout=self.timeout_s,
                              trust_env=not is_loopback(url)) as answer:  # fmt: skip
                if answer.status_code == 404:
                    return None
                for chunk in answer.iter_bytes():
                    body += chunk
                    if len(body) > MAX_LISTING_BYTES:
                        raise RemoteEnvError(f"{where}: over {MAX_LISTING_BYTES:,} bytes.")
                    if time.monotonic() > deadline:
                        raise RemoteEnvError(f"{where}: not read within {self.timeout_s} s.")
        except httpx.HTTPError as exc:
            raise RemoteEnvError(f"{where} failed: {type(exc).__name__}: {exc}") from exc
        if answer.status_code != 200:
            text = body[:300].decode("utf-8", "replace")
            raise RemoteEnvError(f"{where} answered {answer.status_code}: {text}")
        try:
            listing = read_frame(bytes(body), "task listing", MAX_LISTING_VALUES)[0]
            return check_listing(listing)
        except InvalidArgumentError as exc:
            raise RemoteEnvError(f"{where}: {exc}") from None

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
                    Task(t["prompt"], id=t["id"], metadata={"split": split})
                    for t in listing["tasks"]
                ]
        return list(self._cache[split])


def _served_settings(tasks: RemoteTasks) -> dict[str, Any]:
    """The turn limit and action format an llm_gym server announces (else the defaults)."""
    listing = tasks.fetch("train")
    if listing is None:
        return {}
    return {k: listing[k] for k in ("max_turns", "action_format") if listing[k] is not None}


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


def make_text_env(
    base_url: str | None = None, *, n_seed_tasks: int = DEFAULT_SEED_TASKS, **kwargs: Any
) -> Any:
    """``gym.make("OpenEnv-v0", base_url=...)``: a :class:`~llm_gym.gym.TextEnv` over the server.

    ``kwargs`` go to :class:`RemoteEnv` when they are its options (``call_timeout_s``,
    ``action_field``, ...), else to ``TextEnv`` (``split``, ``max_turns``, ``render_mode``, ...).

    Raises:
        InvalidArgumentError: no ``base_url`` (the error says what to pass).
    """
    if base_url is None:
        raise InvalidArgumentError(
            "gym.make('OpenEnv-v0') needs base_url, the URL of an OpenEnv server: "
            "gym.make('OpenEnv-v0', base_url='http://127.0.0.1:8001') (serve one with "
            "`llm-gym serve-env ToolUseGame-v0`)."
        )
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
