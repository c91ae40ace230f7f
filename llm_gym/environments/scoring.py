"""Scoring document-002 episodes from async code: one episode, a group, or a wave batched.

:func:`score_episodes_async` scores a group with an overridden ``score_episodes`` in one call,
else with ``score_episode`` per episode (sync hooks in worker threads, at most
``max_score_concurrency`` at a time). :class:`ScoreBatcher` gathers the episodes of one task
that end in the same wave of the loop and scores them with one such call. :func:`call_hook`
runs any hook, sync or async.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
from collections.abc import Callable, Sequence
from typing import Any

from llm_gym.core.task import Task
from llm_gym.environments.multi_turn import EnvironmentMultiTurn
from llm_gym.environments.records import EnvironmentEpisode, RewardResult, TaskExample
from llm_gym.errors import InvalidArgumentError

__all__ = ["BATCH_WINDOW_TICKS", "ScoreBatcher", "call_hook", "score_episodes_async"]

BATCH_WINDOW_TICKS = 2
"""Event-loop iterations a scoring batch stays open for episodes ending in the same wave."""


async def call_hook(fn: Callable[..., Any], *args: Any, offload: bool = False) -> Any:
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
        results = await call_hook(environment.score_episodes, example, items, offload=offload)
        results = list(results) if isinstance(results, Sequence) else results
        if not isinstance(results, list) or len(results) != len(items):
            raise InvalidArgumentError(
                f"{name}.score_episodes must return one RewardResult per episode "
                f"({len(items)}), actual value: {results!r:.200}."
            )
        return [_as_reward(r, f"{name}.score_episodes") for r in results]
    if len(items) == 1:
        try:
            result = await call_hook(environment.score_episode, example, items[0], offload=offload)
            return [_as_reward(result, f"{name}.score_episode")]
        except Exception as exc:
            return [exc]
    limit = asyncio.Semaphore(max(1, int(getattr(environment, "max_score_concurrency", 8))))

    async def one(episode: EnvironmentEpisode) -> RewardResult:
        async with limit:
            result = await call_hook(environment.score_episode, example, episode, offload=True)
            return _as_reward(result, f"{name}.score_episode")

    gathered = await asyncio.gather(*(one(e) for e in items), return_exceptions=True)
    for result in gathered:
        if isinstance(result, BaseException) and not isinstance(result, Exception):
            raise result  # a cancellation
    return list(gathered)


class ScoreBatcher:
    """Collects episodes of the same task that end together and scores them in one call.

    An episode handed to :meth:`score` waits :data:`BATCH_WINDOW_TICKS` event-loop iterations
    for others of the same task (and event loop); the batch is then scored as by
    :func:`score_episodes_async`, and a failing ``score_episode`` fails only its own episode.

    Args:
        environment: The shared environment that scores.
        offload: Run synchronous hooks in worker threads.
    """

    def __init__(self, environment: EnvironmentMultiTurn, offload: bool) -> None:
        self.environment = environment
        self.offload = offload
        self._pending: dict[tuple[int, int], tuple[TaskExample, list[Any]]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.batch_sizes: collections.deque[int] = collections.deque(maxlen=1024)
        """Sizes of the most recent ``score_episodes`` batches (for tests and logs)."""

    async def score(self, task: Task, example: TaskExample, episode: EnvironmentEpisode) -> Any:
        """The :class:`RewardResult` of ``episode``, scored with the others of its batch."""
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
        for _ in range(BATCH_WINDOW_TICKS):
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
