"""OpenEnv servers played as llm_gym environments: :class:`RemoteEnv`.

One episode is one OpenEnv WebSocket session (openenv-core's ``GenericEnvClient``): ``reset``
opens it, every step is one message with a per-call deadline, and ``close`` (which the loop
always calls) ends it, within a bound even when the server ignores the close. The server is
hostile: a server that dies, hangs, answers with an error or answers nonsense (every frame is
read by :func:`~llm_gym.integrations.openenv.protocol.read_frame`, an llm_gym server's
observation checked by :func:`~llm_gym.integrations.openenv.protocol.check_observation`: no
NaN reward, no message that is not OpenAI's, no ``start`` outside the conversation) raises
:class:`~llm_gym.errors.RemoteEnvError`, which the episode driver turns into the end of that
episode only (cause ``ENV``, the error recorded); the session is dropped (cut off) then.
Each session is a :class:`SessionClient`: openenv-core's ``GenericEnvClient`` with every frame
read that way, a close bounded in time, and a connection cheap to open (one per episode).

Two kinds of server are understood, told apart by the first observation:

* an llm_gym server (``llm-gym serve-env``, :mod:`llm_gym.integrations.openenv.server`):
  messages, tool specs, rewards and truncation cross unchanged, so a remote episode is the same
  episode as an in-process one (tool calls parsed by our action format, the same rewards);
* any other OpenEnv environment, played as text: the assistant's reply goes into one action
  field (``action_field``, default ``"message"``), the observation comes back as a user message
  (``observation_field``, or the observation's JSON), ``done`` ends the episode, and its reward
  is the last step's (or the sum: ``reward="sum"``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from llm_gym.core.env import Env, StepResult, finite_reward
from llm_gym.core.task import Task
from llm_gym.core.types import Message, ToolSpec
from llm_gym.errors import InvalidArgumentError, RemoteEnvError
from llm_gym.integrations.openenv.protocol import MAX_FRAME_BYTES, check_observation, read_frame

try:
    from openenv.core.generic_client import GenericEnvClient
    from websockets.asyncio.client import connect as ws_connect
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "llm_gym's OpenEnv integration needs openenv-core: pip install -e '.[interop]'"
    ) from exc

__all__ = ["LOOPBACK_HOSTS", "RemoteEnv", "SessionClient", "is_loopback"]

DEFAULT_CALL_TIMEOUT_S = 30.0
DEFAULT_CONNECT_TIMEOUT_S = 10.0
REWARD_MODES = ("last", "sum")


# --- one session, seen from the client ---------------------------------------------------------

LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
"""Hosts that are this machine (never reached through a proxy)."""


def is_loopback(url: str) -> bool:
    """Whether ``url``'s host is this machine (never reached through a proxy)."""
    return (urlsplit(url).hostname or "").lower() in LOOPBACK_HOSTS


def _json_type(value: Any) -> str:
    """``value``'s JSON type in words (``a JSON list``; ``nothing`` for a missing value)."""
    if value is None:
        return "nothing (null or missing)"
    names = {dict: "object", list: "list", str: "string", bool: "boolean"}
    return f"a JSON {names.get(type(value), 'number')}"


class SessionClient(GenericEnvClient):
    """openenv's dict client: every frame read by ``read_frame``, its ``type`` the one its
    request calls for (``observation``, or ``error``) and its ``data`` an object (with an
    ``observation`` object), a close bounded in time."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options, max_message_size_mb=MAX_FRAME_BYTES / 2**20)
        self._asked = "reset"
        """The type of the last message sent (its answer's type follows from it)."""

    async def _send(self, message: dict[str, Any]) -> None:
        self._asked = str(message.get("type"))
        await super()._send(message)

    async def connect(self) -> SessionClient:
        """Open the WebSocket as openenv's ``connect`` does, but cheaper per session (one per
        episode): openenv sets and restores ``NO_PROXY`` around every loopback connection (a
        process-wide change that overlapping connections leave behind), where this tells the
        connection itself: no proxy and no keepalive pings on loopback (other hosts keep
        websockets' proxy lookup and pings; every call has its deadline anyway); and frames
        are not compressed (permessage-deflate cost the client about a tenth of its CPU per
        call, for frames of a few KB)."""
        if self._ws is not None:
            return self
        local = is_loopback(self._ws_url)
        try:
            self._ws = await ws_connect(
                self._ws_url,
                open_timeout=self._connect_timeout,
                max_size=self._max_message_size,
                compression=None,
                proxy=None if local else True,
                ping_interval=None if local else 20.0,
            )
        except Exception as exc:
            raise ConnectionError(f"Failed to connect to {self._ws_url}: {exc}") from exc
        return self

    async def _receive(self) -> dict[str, Any]:
        assert self._ws is not None
        async with asyncio.timeout(self._message_timeout):  # no task per call, as wait_for has
            raw = await self._ws.recv()
        frame = read_frame(raw)[0]
        kind, data = frame.get("type"), frame.get("data")
        expected = "state" if self._asked == "state" else "observation"
        if kind not in (expected, "error"):
            raise InvalidArgumentError(
                f"The answer to {self._asked!r:.20} must be a frame of type {expected!r} (or "
                f"'error'), actual: type {kind!r:.40}."
            )
        if not isinstance(data, dict):
            raise InvalidArgumentError(
                f"The frame's data must be a JSON object, actual: {_json_type(data)}."
            )
        if kind == "observation" and not isinstance(data.get("observation"), dict):
            raise InvalidArgumentError(
                "The frame's data.observation must be a JSON object, actual: "
                f"{_json_type(data.get('observation'))}."
            )
        return frame

    async def close_session(self, timeout_s: float) -> None:
        """Send ``close`` and wait up to ``timeout_s`` for the server to close the socket (it
        ends the session then), so neither side closes into the other (a server-side error in
        the log); then, or at once when ``timeout_s`` is 0, the connection is cut."""
        ws, self._ws = self._ws, None
        if ws is None:
            return
        try:
            if timeout_s > 0:
                async with asyncio.timeout(timeout_s):
                    await ws.send(json.dumps({"type": "close"}))
                    await ws.wait_closed()
        except Exception:  # a server that does not close in time is cut off below
            pass
        finally:
            ws.transport.abort()


# --- the environment ---------------------------------------------------------------------------


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
