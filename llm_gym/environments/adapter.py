"""Run an :class:`EnvironmentMultiTurn` as an llm_gym :class:`~llm_gym.core.Env`.

:class:`MultiTurnEnvAdapter` plays document 002's episode loop one ``step`` at a time, so a
document-002 environment runs in ``collect_groups``, ``run_and_report``, ``TextEnv`` /
``gym.make`` and the trainer, unchanged:

* ``reset(task)``: ``start_episode(TaskExample.from_task(task), prompt_text)``; the turn cap is
  ``max_episode_turns(example)``.
* ``step(message)``: appends ``{"role": "assistant", "content": <raw text>}`` and calls
  ``step_episode``. Document 002 environments parse the raw assistant text themselves, so the
  adapter declares ``raw_text_actions = True`` and the loop and ``TextEnv`` hand it the sampled
  text unparsed. (A parsed message with ``tool_calls`` is rendered back to Hermes text.)
* The episode ends on ``done`` (``terminated=True``) or after ``max_episode_turns`` actions
  (``truncated=True``). Either way it is scored, as in document 002's loop: the ending
  ``StepResult`` carries ``reward = score`` and metrics (``score``, ``success`` when the
  :class:`RewardResult` has a threshold, ``per_turn_rewards`` from its metadata).

:class:`MultiTurnEnvFactory` builds adapters that share one environment object (document 002's
environments are stateless and shared by concurrent rollouts) and batch scoring: the episodes of
one task that end in the same wave of the loop are scored by one ``score_episodes`` call.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

from llm_gym.core.env import Env, StepResult
from llm_gym.core.factories import as_task, register_env_adapter, resolve
from llm_gym.core.task import Task
from llm_gym.core.types import Message, ToolSpec
from llm_gym.environments.multi_turn import EnvironmentMultiTurn
from llm_gym.environments.records import (
    ChatMessage,
    EnvironmentEpisode,
    EnvironmentStepResult,
    EnvironmentTurn,
    RewardResult,
    TaskExample,
)
from llm_gym.environments.replay import SAMPLED_KEY
from llm_gym.errors import InvalidArgumentError

__all__ = [
    "MultiTurnEnvAdapter",
    "MultiTurnEnvFactory",
    "MultiTurnTaskSource",
    "score_episodes_async",
]

_RESERVED_METRICS = frozenset(
    {"score", "success", "threshold", "per_turn_rewards", "actions", "turn_cap_reached"}
)
_BATCH_WINDOW_TICKS = 2
"""Event-loop iterations a scoring batch stays open for episodes ending in the same wave."""


async def _call(fn: Callable[..., Any], *args: Any, offload: bool = False) -> Any:
    """Call a hook: ``async def`` hooks are awaited; sync ones run inline, or in a worker thread
    when ``offload``."""
    if inspect.iscoroutinefunction(fn):
        return await fn(*args)
    result = await asyncio.to_thread(fn, *args) if offload else fn(*args)
    if inspect.isawaitable(result):
        result = await result
    return result


def _as_reward(value: Any, where: str) -> RewardResult:
    if isinstance(value, RewardResult):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return RewardResult(score=float(value))
    raise InvalidArgumentError(f"{where} must return a RewardResult, actual value: {value!r:.200}.")


async def score_episodes_async(
    environment: EnvironmentMultiTurn,
    example: TaskExample,
    episodes: Sequence[EnvironmentEpisode],
    *,
    offload: bool = False,
) -> list[RewardResult]:
    """Score ``episodes`` of ``example`` from async code.

    An overridden ``score_episodes`` is called once with all of them. Otherwise ``score_episode``
    runs for each, up to ``max_score_concurrency`` at a time (sync hooks in worker threads, so
    the event loop keeps running); a single episode is scored inline unless ``offload``.
    """
    results = await _score_each(environment, example, list(episodes), offload)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results  # type: ignore[return-value]


async def _score_each(
    environment: EnvironmentMultiTurn,
    example: TaskExample,
    items: list[EnvironmentEpisode],
    offload: bool,
) -> list[RewardResult | BaseException]:
    """Like :func:`score_episodes_async`, but a failing ``score_episode`` fails only its own
    item (its exception takes the item's place)."""
    name = type(environment).__qualname__
    if getattr(type(environment), "score_episodes", None) is not (
        EnvironmentMultiTurn.score_episodes
    ):
        results = await _call(environment.score_episodes, example, items, offload=offload)
        results = list(results) if isinstance(results, Sequence) else results
        if not isinstance(results, list) or len(results) != len(items):
            raise InvalidArgumentError(
                f"{name}.score_episodes must return one RewardResult per episode "
                f"({len(items)}), actual value: {results!r:.200}."
            )
        return [_as_reward(r, f"{name}.score_episodes") for r in results]
    if len(items) == 1:
        try:
            result = await _call(environment.score_episode, example, items[0], offload=offload)
            return [_as_reward(result, f"{name}.score_episode")]
        except Exception as exc:
            return [exc]
    limit = asyncio.Semaphore(max(1, int(getattr(environment, "max_score_concurrency", 8))))

    async def one(episode: EnvironmentEpisode) -> RewardResult:
        async with limit:
            result = await _call(environment.score_episode, example, episode, offload=True)
            return _as_reward(result, f"{name}.score_episode")

    gathered = await asyncio.gather(*(one(e) for e in items), return_exceptions=True)
    for result in gathered:
        if isinstance(result, BaseException) and not isinstance(result, Exception):
            raise result  # a cancellation
    return list(gathered)


class _ScoreBatcher:
    """Collects episodes of the same task that end together and scores them in one call."""

    def __init__(self, environment: EnvironmentMultiTurn, offload: bool) -> None:
        self.environment = environment
        self.offload = offload
        self._pending: dict[tuple[int, int], tuple[TaskExample, list[Any]]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.batch_sizes: collections.deque[int] = collections.deque(maxlen=1024)
        """Sizes of the most recent ``score_episodes`` batches (for tests and logs)."""

    async def score(self, task: Task, example: TaskExample, episode: EnvironmentEpisode) -> Any:
        loop = asyncio.get_running_loop()
        key = (id(loop), id(task))
        future: asyncio.Future[RewardResult] = loop.create_future()
        batch = self._pending.get(key)
        if batch is None:
            batch = (example, [])
            self._pending[key] = batch
            flush = loop.create_task(self._flush(key, batch))
            self._tasks.add(flush)
            flush.add_done_callback(self._tasks.discard)
        batch[1].append((episode, future))
        return await future

    async def _flush(self, key: tuple[int, int], batch: tuple[TaskExample, list[Any]]) -> None:
        for _ in range(_BATCH_WINDOW_TICKS):
            await asyncio.sleep(0)
        if self._pending.get(key) is batch:
            del self._pending[key]
        example, items = batch
        self.batch_sizes.append(len(items))
        try:
            results = await _score_each(
                self.environment, example, [e for e, _ in items], self.offload
            )
        except asyncio.CancelledError:
            for _, future in items:
                future.cancel()
            raise
        except Exception as exc:  # score_episodes itself failed: so does every episode
            for _, future in items:
                if not future.done():
                    future.set_exception(exc)
            return
        for (_, future), result in zip(items, results, strict=True):
            if future.done():
                continue
            if isinstance(result, BaseException):
                future.set_exception(result)
            else:
                future.set_result(result)


def _public(message: ChatMessage) -> Message:
    """The message without the adapter's ``sampled`` marker (what the policy sees)."""
    if SAMPLED_KEY in message and message.get("role") == "assistant":
        message = {k: v for k, v in message.items() if k != SAMPLED_KEY}
    return message  # type: ignore[return-value]


def _check_messages(value: Any, where: str) -> list[ChatMessage]:
    if isinstance(value, Mapping) or not isinstance(value, Sequence) or isinstance(value, str):
        raise InvalidArgumentError(
            f"{where} must be a list or tuple of message dicts, actual value: {value!r:.200}."
        )
    out: list[ChatMessage] = []
    for i, message in enumerate(value):
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            raise InvalidArgumentError(
                f"{where}[{i}] must be a dict with a string 'role', actual value: {message!r:.200}."
            )
        out.append(dict(message))
    return out


class MultiTurnEnvAdapter(Env):
    """An :class:`EnvironmentMultiTurn` as an async llm_gym :class:`Env` (one episode at a time).

    Args:
        environment: The document-002 environment (shared; it must keep no per-episode state).
        prompt_text: Passed to ``start_episode`` (document 002's configured prompt text).
        offload_hooks: Run synchronous hooks in worker threads, so slow hooks (a service call, a
            judge) do not hold up the event loop the other episodes run on.
        scorer: Batches scoring across adapters (set by :class:`MultiTurnEnvFactory`).

    After the episode ends, :attr:`environment_episode` and :attr:`reward_result` hold what was
    scored.
    """

    raw_text_actions: ClassVar[bool] = True
    """The loop and ``TextEnv`` hand ``step`` the raw sampled text (the env parses it itself)."""

    def __init__(
        self,
        environment: EnvironmentMultiTurn,
        prompt_text: str = "",
        *,
        offload_hooks: bool = False,
        scorer: _ScoreBatcher | None = None,
    ) -> None:
        if not isinstance(environment, EnvironmentMultiTurn):
            raise InvalidArgumentError(
                f"Expected an EnvironmentMultiTurn instance, actual value: {environment!r:.200}."
            )
        if not isinstance(prompt_text, str):
            raise InvalidArgumentError(
                f"prompt_text must be a str, actual type: {type(prompt_text).__name__}."
            )
        self.environment = environment
        self.prompt_text = prompt_text
        self.offload_hooks = bool(offload_hooks)
        self._scorer = scorer
        self._task: Task | None = None
        self._example: TaskExample | None = None
        self._transcript: list[ChatMessage] = []
        self._public: list[Message] = []
        self._prompt_length = 0
        self._cap: int | None = None
        self._actions = 0
        self._steps: list[dict[str, Any]] = []
        self._response_text = ""
        self._done = False
        self._start = 0.0
        self.environment_episode: EnvironmentEpisode | None = None
        """The scored episode, once the episode has ended."""
        self.reward_result: RewardResult | None = None
        """Its :class:`RewardResult`, once the episode has ended."""

    # --- the Env contract ----------------------------------------------------------------------
    async def reset(self, task: Task) -> list[Message]:
        task = as_task(task)
        example = TaskExample.from_task(task)
        env = self.environment
        name = type(env).__qualname__
        opening = await _call(
            env.start_episode, example, self.prompt_text, offload=self.offload_hooks
        )
        messages = _check_messages(opening, f"{name}.start_episode(...)")
        cap = await _call(env.max_episode_turns, example, offload=self.offload_hooks)
        if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
            raise InvalidArgumentError(
                f"{name}.max_episode_turns must return an int >= 1, actual value: {cap!r}."
            )
        self._task, self._example, self._cap = task, example, cap
        self._transcript, self._public = [], []
        self._append_env(messages)
        self._prompt_length = len(messages)
        self._actions = 0
        self._steps = []
        self._response_text = ""
        self._done = False
        self._start = time.perf_counter()
        self.environment_episode = None
        self.reward_result = None
        return list(self._public)

    async def step(self, message: Message) -> StepResult:
        if self._example is None or self._task is None:
            raise InvalidArgumentError("Call reset(task) before step(message).")
        if self._done:
            raise InvalidArgumentError("The episode has ended; call reset(task) to start another.")
        text = self._raw_text(message)
        env, example = self.environment, self._example
        name = type(env).__qualname__
        action: ChatMessage = {"role": "assistant", "content": text, SAMPLED_KEY: True}
        self._transcript.append(action)
        self._public.append(_public(action))
        self._actions += 1
        result = await _call(
            env.step_episode,
            example,
            [dict(m) for m in self._transcript],
            text,
            offload=self.offload_hooks,
        )
        if not isinstance(result, EnvironmentStepResult):
            raise InvalidArgumentError(
                f"{name}.step_episode must return an EnvironmentStepResult, actual value: "
                f"{result!r:.200}."
            )
        self._append_env(_check_messages(result.messages, f"{name}.step_episode(...).messages"))
        if result.final_response_text is not None:
            self._response_text = str(result.final_response_text)
        else:
            self._response_text = text
        self._steps.append(dict(result.metadata or {}))
        assert self._cap is not None
        if not result.done and self._actions < self._cap:
            return StepResult(terminated=False, truncated=False, messages=list(self._public))
        return await self._finish(done=bool(result.done))

    @property
    def tool_specs(self) -> list[ToolSpec]:
        """``[]``: document 002's protocol is plain text (unless the environment declares
        ``tool_specs``)."""
        specs = getattr(self.environment, "tool_specs", None)
        if callable(specs):
            specs = specs()
        return list(specs or [])

    @property
    def messages(self) -> list[Message]:
        return list(self._public)

    @property
    def synchronous(self) -> bool:
        return not self.offload_hooks

    # --- extras --------------------------------------------------------------------------------
    @property
    def max_turns(self) -> int | None:
        """``max_episode_turns`` of the current example (``None`` before ``reset``)."""
        return self._cap

    @property
    def example(self) -> TaskExample | None:
        """The current episode's example."""
        return self._example

    @property
    def transcript(self) -> list[ChatMessage]:
        """The conversation as the hooks see it (sampled actions marked ``"sampled": True``)."""
        return [dict(m) for m in self._transcript]

    # --- internals -----------------------------------------------------------------------------
    @staticmethod
    def _raw_text(message: Message) -> str:
        if not isinstance(message, Mapping):
            raise InvalidArgumentError(
                f"step takes an assistant message dict, actual value: {message!r:.200}."
            )
        if message.get("tool_calls"):
            # A loop that parsed the text itself: render it back as the model would write it.
            from llm_gym.actions import get_action_format

            return get_action_format("hermes").render_message(message)
        content = message.get("content")
        return content if isinstance(content, str) else ""

    def _append_env(self, messages: list[ChatMessage]) -> None:
        for message in messages:
            if message.get("role") == "assistant":
                message[SAMPLED_KEY] = False  # a demonstration or an env reply, never sampled
            self._transcript.append(message)
            self._public.append(_public(message))

    def _build_episode(self, *, turn_cap_reached: bool) -> EnvironmentEpisode:
        turns = []
        action = -1
        for message in self._transcript[self._prompt_length :]:
            sampled = message.get("role") == "assistant" and message.get(SAMPLED_KEY) is True
            action += sampled
            content = message.get("content")
            turns.append(
                EnvironmentTurn(
                    role=str(message.get("role")),
                    content=content if isinstance(content, str) else "",
                    name=message.get("name"),
                    metadata={"sampled": sampled, "action": max(action, 0)},
                )
            )
        return EnvironmentEpisode(
            messages=tuple(dict(m) for m in self._transcript),
            response_text=self._response_text,
            turns=tuple(turns),
            metadata={
                "steps": list(self._steps),
                "max_episode_turns": self._cap,
                "turn_cap_reached": turn_cap_reached,
            },
            latency_ms=int((time.perf_counter() - self._start) * 1000),
        )

    async def _finish(self, *, done: bool) -> StepResult:
        self._done = True
        assert self._example is not None and self._task is not None
        episode = self._build_episode(turn_cap_reached=not done)
        self.environment_episode = episode
        if self._scorer is not None:
            reward = await self._scorer.score(self._task, self._example, episode)
        else:
            [reward] = await score_episodes_async(
                self.environment, self._example, [episode], offload=self.offload_hooks
            )
        self.reward_result = reward
        return StepResult(
            terminated=done,
            truncated=not done,
            messages=list(self._public),
            reward=reward.score,
            metrics=self._metrics(reward, done),
        )

    def _metrics(self, reward: RewardResult, done: bool) -> dict[str, Any]:
        metrics: dict[str, Any] = {
            "score": reward.score,
            "actions": self._actions,
            "turn_cap_reached": 0 if done else 1,
        }
        for key, value in reward.metadata.items():
            if (
                key not in _RESERVED_METRICS
                and isinstance(value, int | float)
                and not isinstance(value, bool)
                and math.isfinite(value)
            ):
                metrics[key] = value
        if reward.threshold is not None:
            metrics["success"] = bool(reward.passed)
            metrics["threshold"] = reward.threshold
        per_turn = reward.metadata.get("per_turn_rewards")
        if per_turn is not None:
            # Validated by the loop against its assistant turns (invalid: ignored with a warning).
            metrics["per_turn_rewards"] = (
                list(per_turn) if isinstance(per_turn, tuple) else per_turn
            )
        return metrics


def _accepts(fn: Callable[..., Any], name: str) -> bool:
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == name or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


def _describe(environment: Any) -> str:
    if isinstance(environment, str):
        return environment.rsplit(":", 1)[-1]
    if isinstance(environment, EnvironmentMultiTurn):
        return type(environment).__qualname__
    return getattr(environment, "__qualname__", None) or type(environment).__name__


class MultiTurnEnvFactory:
    """``task -> MultiTurnEnvAdapter`` over one shared :class:`EnvironmentMultiTurn`.

    Args:
        environment: An ``EnvironmentMultiTurn`` instance, a subclass, a ``load_environment``-style
            function returning one, or a ``"module:attr"`` string naming either. Classes and
            functions are called once, lazily, with ``environment_kwargs`` (plus ``split=`` when
            they accept it).
        prompt_text: Passed to ``start_episode``.
        split: The split the environment is built for.
        environment_kwargs: Keyword arguments for the class or function.
        offload_hooks: Run synchronous hooks in worker threads (see :class:`MultiTurnEnvAdapter`).
        batch_scoring: Score the episodes of a task that end in the same wave with one
            ``score_episodes`` call (document 002's group scoring); False: one call per episode.

    Picklable and comparable (registration compares entries), so it can be a ``gym.make`` kwarg.
    """

    def __init__(
        self,
        environment: Any,
        *,
        prompt_text: str = "",
        split: str = "train",
        environment_kwargs: Mapping[str, Any] | None = None,
        offload_hooks: bool = False,
        batch_scoring: bool = True,
    ) -> None:
        if not (isinstance(environment, str | EnvironmentMultiTurn) or callable(environment)):
            raise InvalidArgumentError(
                "environment must be an EnvironmentMultiTurn, a subclass, a function returning "
                f"one, or a 'module:attr' string, actual value: {environment!r:.200}."
            )
        if isinstance(environment, EnvironmentMultiTurn) and environment_kwargs:
            raise InvalidArgumentError(
                "environment_kwargs need a class or a function; an instance is used as it is."
            )
        self.environment = environment
        self.prompt_text = prompt_text
        self.split = split
        self.environment_kwargs = dict(environment_kwargs or {})
        self.offload_hooks = bool(offload_hooks)
        self.batch_scoring = bool(batch_scoring)
        self.__qualname__ = _describe(environment)
        self.version = getattr(environment, "version", None)
        self._init_runtime()

    def _init_runtime(self) -> None:
        self._lock = threading.Lock()
        self._instances: dict[str, EnvironmentMultiTurn] = {}
        self._scorer: _ScoreBatcher | None = None

    def _key(self) -> tuple[Any, ...]:
        kwargs = tuple(sorted(self.environment_kwargs.items(), key=lambda kv: kv[0]))
        return (self.environment, self.prompt_text, self.split, kwargs, self.offload_hooks,
                self.batch_scoring)  # fmt: skip

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, MultiTurnEnvFactory):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash((type(self), repr(self.environment), self.prompt_text, self.split))

    def __repr__(self) -> str:
        return f"MultiTurnEnvFactory({self.environment!r}, prompt_text={self.prompt_text!r})"

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for key in ("_lock", "_instances", "_scorer"):
            state.pop(key, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_runtime()

    def environment_for(self, split: str | None = None) -> EnvironmentMultiTurn:
        """The shared environment object built for ``split`` (default: :attr:`split`)."""
        split = self.split if split is None else split
        with self._lock:
            if split not in self._instances:
                self._instances[split] = self._build(split)
            return self._instances[split]

    def _build(self, split: str) -> EnvironmentMultiTurn:
        target = resolve(self.environment)
        if isinstance(target, EnvironmentMultiTurn):
            return target
        if not callable(target):
            raise InvalidArgumentError(
                f"{self.environment!r} is neither an EnvironmentMultiTurn nor callable."
            )
        kwargs = dict(self.environment_kwargs)
        if _accepts(target, "split"):
            kwargs.setdefault("split", split)
        built = target(**kwargs)
        if not isinstance(built, EnvironmentMultiTurn):
            raise InvalidArgumentError(
                f"{_describe(target)}(...) must return an EnvironmentMultiTurn, actual value: "
                f"{built!r:.200}."
            )
        return built

    @property
    def scorer(self) -> _ScoreBatcher | None:
        """The shared scoring batcher (``None`` with ``batch_scoring=False``)."""
        if not self.batch_scoring:
            return None
        environment = self.environment_for()
        with self._lock:
            if self._scorer is None:
                self._scorer = _ScoreBatcher(environment, self.offload_hooks)
            return self._scorer

    def __call__(self, task: Task) -> MultiTurnEnvAdapter:
        return MultiTurnEnvAdapter(
            self.environment_for(),
            self.prompt_text,
            offload_hooks=self.offload_hooks,
            scorer=self.scorer,
        )

    def tasks(self, split: str | None = None) -> list[Task]:
        """The environment's own dataset (its ``dataset`` attribute) for ``split``, as Tasks."""
        environment = self.environment_for(split)
        dataset = getattr(environment, "dataset", None)
        if dataset is None:
            raise InvalidArgumentError(
                f"{type(environment).__qualname__} has no 'dataset' attribute; pass tasks=... ."
            )
        return [as_task(row) for row in dataset]


class MultiTurnTaskSource:
    """``split -> tasks`` read from a document-002 environment's ``dataset`` (cached per split)."""

    def __init__(self, factory: MultiTurnEnvFactory) -> None:
        self.factory = factory
        self._cache: dict[str, list[Task]] = {}

    def __call__(self, split: str) -> list[Task]:
        if split not in self._cache:
            self._cache[split] = self.factory.tasks(split)
        return self._cache[split]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, MultiTurnTaskSource):
            return NotImplemented
        return self.factory == other.factory

    def __hash__(self) -> int:
        return hash((type(self), self.factory))

    def __getstate__(self) -> dict[str, Any]:
        return {"factory": self.factory, "_cache": {}}


# An EnvironmentMultiTurn (instance or subclass) works wherever an env factory is accepted.
register_env_adapter(EnvironmentMultiTurn, MultiTurnEnvFactory)
