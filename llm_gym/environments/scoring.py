"""Scoring document-002 episodes from async code: one episode or a whole group.

:func:`score_episodes_async` scores a group with an overridden ``score_episodes`` in one call,
else with ``score_episode`` per episode (sync hooks in worker threads, at most
``max_score_concurrency`` at a time). :func:`score_each` does the same but lets a failing
``score_episode`` fail only its own episode. :func:`call_hook` runs any hook, sync or async.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Sequence
from typing import Any

from llm_gym.environments.multi_turn import EnvironmentMultiTurn
from llm_gym.environments.records import EnvironmentEpisode, RewardResult, TaskExample
from llm_gym.errors import InvalidArgumentError

__all__ = ["call_hook", "score_each", "score_episodes_async"]


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
    results = await score_each(environment, example, list(episodes), offload)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results  # type: ignore[return-value]


async def score_each(
    environment: EnvironmentMultiTurn,
    example: TaskExample,
    items: list[EnvironmentEpisode],
    offload: bool,
) -> list[RewardResult | BaseException]:
    """Like :func:`score_episodes_async`, but a failing ``score_episode`` fails only its own
    item (its exception takes the item's place). An overridden ``score_episodes`` that fails
    raises."""
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
