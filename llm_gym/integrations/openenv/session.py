"""One OpenEnv session's environment on an llm_gym server: :class:`ServedEnv`.

OpenEnv's server makes one per session (its factory is built by
:func:`~llm_gym.integrations.openenv.server.build_env_app`); it plays episodes of one
registered env's tasks on the server's event loop, every call of the env within
``step_timeout_s`` (a deadline that holds even for an env that ignores its cancellation) and
its result checked as the episode driver checks one. What it sends is what the protocol's
clients read (:func:`sendable`): an env whose observation breaks the protocol's limits has its
episode closed with an error that names the rule.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from llm_gym.actions import ParsedAction, ParseKind, get_action_format
from llm_gym.aio import LoopRunner, within
from llm_gym.core.env import StepResult, check_step, step_outcome, turn_cap
from llm_gym.core.factories import SPLITS
from llm_gym.core.task import Task
from llm_gym.core.text import clean_json
from llm_gym.errors import InvalidArgumentError
from llm_gym.integrations.openenv.protocol import (
    MAX_FRAME_BYTES,
    MAX_MESSAGES,
    EnvAction,
    EnvObservation,
    check_observation,
    json_safe,
    read_frame,
)
from llm_gym.rollout.driver import DEFAULT_FAILED_PARSE_REWARD

try:
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.types import EnvironmentMetadata, State
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "llm_gym's OpenEnv integration needs openenv-core: pip install -e '.[interop]'"
    ) from exc

__all__ = [
    "CLOSED",
    "ENVELOPE_BYTES",
    "NO_EPISODE",
    "Catalog",
    "ServedEnv",
    "ServedEnvError",
    "finish_closing",
    "sendable",
]

CLOSED = "This session is closed (idle too long, or the server is stopping): open a new one."
NO_EPISODE = (
    "No episode is running in this session: reset first (the last one ended). Over HTTP each "
    "request is a session of its own: play an episode through the WebSocket (/ws)."
)
ENVELOPE_BYTES = 1024
"""Room left in a frame for OpenEnv's envelope around an observation (type, reward, done)."""
_CLOSING: set[asyncio.Task[Any]] = set()  # closes scheduled on the loop, kept until they finish


class ServedEnvError(RuntimeError):
    """The served env failed (raised, hung, returned nonsense); its episode is closed."""


class _Late(Exception):
    """A call of the env outlasted ``step_timeout_s`` (told apart from a TimeoutError the env
    itself raises)."""


Catalog = Callable[[str], tuple[Sequence[Task], Mapping[str, Task]]]
"""``split -> (its tasks in order, {task id: task})``, built once and shared by the sessions."""


class ServedEnv(Environment):
    """One session's environment: plays episodes of one registered env's tasks.

    Build it with :func:`build_env_app` (one instance per OpenEnv session). Every episode gets
    a fresh llm_gym env from the entry's factory; the previous one is closed first.
    """

    SUPPORTS_CONCURRENT_SESSIONS = True
    REQUIRES_SINGLE_THREAD_EXECUTOR = True
    """OpenEnv then makes and closes every session's ServedEnv on one shared worker thread,
    instead of starting a thread per session (a quarter of the server's CPU when each episode
    is a session). Nothing of ours blocks that thread: the env itself is made, played and
    closed on the event loop, and :meth:`close` only schedules the closing there."""

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
        self._sent: list[Any] = []
        """The conversation as the client last had it (a step sends where it changed)."""
        self._done = True
        self._closed = False
        self._state = State()
        self._draws = random.Random()  # a reset without task or seed: fresh entropy, as gymnasium
        self._parser = get_action_format(entry.action_format)

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
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
            raise InvalidArgumentError(
                "reset takes task_id (split optional), an integer seed (task seed mod n of the "
                "split, default 'train') or neither (a random task of the split), actual: "
                f"seed={seed!r:.40}."
            )
        tasks = self.catalog(split or "train")[0]
        if not tasks:
            raise InvalidArgumentError(f"{self.entry.id}'s {split or 'train'} split is empty.")
        if seed is None:
            return tasks[self._draws.randrange(len(tasks))]
        self._draws = random.Random(seed)  # later resets without arguments follow this seed
        return tasks[seed % len(tasks)]

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
        observation = await self._guarded(lambda: self._opened(env, task, opening, where), where)
        self._done, self._sent = False, list(opening)
        self._state = State(episode_id=episode_id, step_count=0, task_id=task.id, split=split)
        return observation

    async def step_async(
        self, action: EnvAction, timeout_s: float | None = None, **kwargs: Any
    ) -> EnvObservation:
        self._check_open(episode=True)
        env, message = self._env, action.message
        if message is None:  # the client's loop cut the episode: the env scores what it has
            return await self._conclude(str(action.conclude))
        where = f"{self.entry.id}.step"
        sent = message.to_message()
        if not message.tool_calls and not getattr(env, "raw_text_actions", False):
            prefix = f"call_t{self._state.step_count + 1}"  # the driver's ids
            parsed = self._parser.parse(message.content, call_id_prefix=prefix)
            if parsed.kind is ParseKind.PARSE_FAILURE:
                return await self._parse_failure(parsed)
            sent = parsed.message
        result = await self._guarded(lambda: env.step(sent), where)
        observation = await self._guarded(lambda: self._observe(result, where), where)
        self._sent = list(result.messages)
        self._state.step_count += 1
        if observation.done:
            await self._close_episode()
        return observation

    def _opened(self, env: Any, task: Task, opening: Any, where: str) -> EnvObservation:
        """A reset's observation: the opening messages (checked as the episode driver checks
        them), the tool specs and the env's own switches."""
        messages = _countable(check_step(StepResult(False, False, opening), where), where)
        return sendable(EnvObservation(
            messages=_as_json(messages), tool_specs=_as_json(list(env.tool_specs)),
            task_id=task.id, raw_text_actions=bool(getattr(env, "raw_text_actions", False)),
            max_turns=turn_cap(env), concludes=callable(getattr(env, "conclude", None)),
        ), where)  # fmt: skip

    def _observe(self, result: Any, where: str) -> EnvObservation:
        """A step's observation: its result checked as the episode driver checks one."""
        messages = check_step(result, where)
        done = bool(result.terminated or result.truncated)
        reward, metrics = step_outcome(result, where) if done else (None, {})
        start = _first_change(self._sent, messages)
        tail = _countable(messages[start:], where)
        return sendable(EnvObservation(
            messages=_as_json(tail), start=start, done=done, reward=reward,
            truncated=bool(result.truncated), metrics=_as_json(metrics),
            task_id=self._state.task_id,  # type: ignore[attr-defined]
        ), where)  # fmt: skip

    async def _conclude(self, cause: str) -> EnvObservation:
        """End the episode the client cut short: the env's ``conclude(cause)`` result when it
        scores cut episodes (reward and metrics; no messages), else reward None."""
        env, where = self._env, f"{self.entry.id}.conclude"
        conclude = getattr(env, "conclude", None)
        result = None if conclude is None else await self._guarded(lambda: conclude(cause), where)
        observation = await self._guarded(lambda: self._concluded(result, where), where)
        await self._close_episode()
        return observation

    def _concluded(self, result: Any, where: str) -> EnvObservation:
        """The observation of a concluded episode: ``result``'s reward and metrics, checked."""
        reward, metrics = (None, {}) if result is None else step_outcome(result, where)
        return sendable(EnvObservation(
            start=len(self._sent), done=True, reward=reward, truncated=True,
            metrics=_as_json(metrics), task_id=self._state.task_id,  # type: ignore[attr-defined]
        ), where)  # fmt: skip

    async def _parse_failure(self, parsed: ParsedAction) -> EnvObservation:
        """End the episode on text the action format cannot parse, as the episode driver does:
        the env never sees it; truncated, ``failed_parse_reward``, the reason in
        ``metrics["parse_error"]``."""
        observation = sendable(EnvObservation(
            messages=[parsed.message], start=len(self._sent), done=True,
            reward=DEFAULT_FAILED_PARSE_REWARD, truncated=True,
            metrics={"parse_error": parsed.error, "truncation_cause": "parse_failure"},
            task_id=self._state.task_id,  # type: ignore[attr-defined]
        ), f"{self.entry.id}.step")  # fmt: skip
        await self._close_episode()
        return observation

    def _check_open(self, episode: bool = False) -> None:
        if self._closed or (episode and (self._env is None or self._done)):
            raise InvalidArgumentError(CLOSED if self._closed else NO_EPISODE)

    async def _guarded(self, call: Callable[[], Any], where: str) -> Any:
        """``call()`` (awaited within ``step_timeout_s`` when it is a coroutine); on any failure
        (a raise, a timeout, a malformed result) the episode is closed, the error names
        ``where``."""
        late = f"{where} did not return within {self.step_timeout_s} s; the episode is closed."
        try:
            result = call()
            if asyncio.iscoroutine(result):
                result = await within(result, self.step_timeout_s, lambda: _Late(late))
            return result
        except _Late:
            await self._close_episode()
            raise TimeoutError(late) from None
        except Exception as exc:
            await self._close_episode()
            raise ServedEnvError(
                f"{where} failed: {type(exc).__name__}: {str(exc)[:500]} (the episode is closed)"
            ) from exc

    async def _close_episode(self) -> None:
        env, self._env, self._done = self._env, None, True
        if env is not None:
            with contextlib.suppress(Exception):
                await within(env.close(), self.step_timeout_s, TimeoutError)

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
        """End the session: the running episode's env is closed on the loop it was started on
        (OpenEnv calls this from its worker thread when the session ends; the closing is
        scheduled there, not waited for, so one slow close holds up no other session); later
        resets and steps are refused."""
        self._closed = True
        if self._env is None:
            return
        loop = self._loop
        if loop is not None and loop.is_running():
            if _running_loop() is loop:
                self._schedule_close()
            else:
                loop.call_soon_threadsafe(self._schedule_close)
            return
        LoopRunner().run(self._close_episode())

    def _schedule_close(self) -> None:
        task = asyncio.get_running_loop().create_task(self._close_episode())
        _CLOSING.add(task)  # kept until it finishes
        task.add_done_callback(_CLOSING.discard)


async def finish_closing(timeout_s: float) -> None:
    """Wait, up to ``timeout_s``, for the episode closes that ended sessions scheduled on this
    loop (:meth:`ServedEnv.close` does not wait for them): the server's last shutdown step, so
    an env that holds resources is closed before its loop goes away."""
    await asyncio.sleep(0)  # closes handed over from OpenEnv's thread get scheduled first
    loop = asyncio.get_running_loop()
    pending = [task for task in _CLOSING if task.get_loop() is loop and not task.done()]
    if pending:
        await asyncio.wait(pending, timeout=timeout_s)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def sendable(observation: EnvObservation, where: str) -> EnvObservation:
    """``observation`` when a client that keeps the protocol's rules can read it, as
    :class:`~llm_gym.integrations.openenv.client.RemoteEnv` reads it: its JSON within a frame
    (:data:`MAX_FRAME_BYTES`, less :data:`ENVELOPE_BYTES`), read by :func:`read_frame` (count
    of values, depth) and :func:`check_observation` (at most :data:`MAX_MESSAGES` messages in
    OpenAI's format, tool specs); the server keeps the rules it holds its clients to.

    Raises:
        InvalidArgumentError: naming ``where`` (the env's call) and the rule it broke.
    """
    text = observation.model_dump_json(exclude={"reward", "done", "metadata"})
    if (size := len(text.encode())) > MAX_FRAME_BYTES - ENVELOPE_BYTES:
        raise InvalidArgumentError(
            f"{where} returned an observation of {size:,} bytes as JSON; a frame carries at "
            f"most {MAX_FRAME_BYTES - ENVELOPE_BYTES:,} (shorten its messages or metrics)."
        )
    try:
        check_observation(read_frame(text, "observation")[0])
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(
            f"{where} returned an observation no client reads: {exc}"
        ) from None
    return observation


def _countable(messages: Sequence[Any], where: str) -> Sequence[Any]:
    """``messages`` when one observation may carry them (at most :data:`MAX_MESSAGES`), checked
    before they are copied as JSON; :func:`sendable` checks the rest."""
    if len(messages) > MAX_MESSAGES:
        raise InvalidArgumentError(
            f"{where} returned {len(messages):,} new messages; an observation carries at most "
            f"{MAX_MESSAGES:,}."
        )
    return messages


def _as_json(value: Any) -> Any:
    """What an env said, as JSON: non-JSON values as text, lone surrogates replaced."""
    return clean_json(json_safe(value))


def _first_change(sent: Sequence[Any], messages: Sequence[Any]) -> int:
    """Where ``messages`` first differs from what the client has (``sent``): its length when
    the env only appended (the usual case: one C-level compare, identity first), else the first
    message the env rewrote, so a client's copy follows an env that rewrites its history."""
    known = min(len(sent), len(messages))
    if sent[:known] == messages[:known]:
        return known
    return next(i for i in range(known) if sent[i] != messages[i])
