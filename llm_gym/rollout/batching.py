"""How the episode loop hands turns to a policy: in waves, or to a continuous-batching stream.

:class:`Waves` batches the action requests of all live episodes into one ``policy.act`` call per
wave; :class:`Streamed` hands each episode's turns to a :class:`~llm_gym.policies.PolicyStream`.
Both can :meth:`abort` a turn whose generation missed its deadline.

A failure reaches only the turns it concerns, as a :class:`~llm_gym.policies.PolicyError`: a
stream fails the one episode's turn; a wave's batched call that raises a
:class:`~llm_gym.policies.PolicyBatchError` fails the requests it names and delivers the rest;
one that raises anything else is sent again one request per call (concurrently), since a
backend may fail a whole batch for one bad request, and each request that fails alone fails its
own turn. A ``fatal`` error fails the whole wave at once, without the second try.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable

from llm_gym.policies.base import (
    Generation,
    Policy,
    PolicyBatchError,
    PolicyError,
    PolicyRequest,
    PolicyStream,
)

__all__ = ["Streamed", "Waves", "as_policy_error"]


def as_policy_error(exc: BaseException, policy: Policy, what: str) -> PolicyError:
    """``exc`` itself when it is a :class:`PolicyError`, else one that names the policy and
    chains ``exc``."""
    if isinstance(exc, PolicyError):
        return exc
    error = PolicyError(f"{type(policy).__name__}{what} failed: {exc!r}")
    error.__cause__ = exc
    return error


class Waves:
    """Batches the action requests of all live episodes into one policy call per wave."""

    def __init__(self, policy: Policy, live: int) -> None:
        self.policy = policy
        self.live = live
        self.pending: list[tuple[PolicyRequest, asyncio.Future[Generation]]] = []
        self.calls = 0
        self.batch_sizes: list[int] = []

    async def act(self, request: PolicyRequest, key: Hashable = None) -> Generation:
        future: asyncio.Future[Generation] = asyncio.get_running_loop().create_future()
        self.pending.append((request, future))
        self._maybe_flush()
        return await future

    def episode_done(self, key: Hashable = None) -> None:
        self.live -= 1
        self._maybe_flush()

    def abort(self, key: Hashable = None) -> None:
        """A request timed out (its future was cancelled): drop it from the next wave."""
        self.pending = [(r, f) for r, f in self.pending if not f.done()]

    def _maybe_flush(self) -> None:
        if self.pending and len(self.pending) >= self.live:
            batch, self.pending = self.pending, []
            asyncio.get_running_loop().create_task(self._run(batch))

    async def _run(self, batch: list[tuple[PolicyRequest, asyncio.Future[Generation]]]) -> None:
        self.calls += 1
        self.batch_sizes.append(len(batch))
        try:
            generations = await self.policy.act([request for request, _ in batch])
            if len(generations) != len(batch):
                raise RuntimeError(
                    f"{type(self.policy).__name__}.act returned {len(generations)} generations "
                    f"for {len(batch)} requests."
                )
        except PolicyBatchError as exc:  # the backend says which requests failed
            if len(exc.outcomes) == len(batch) and not exc.fatal:
                for (_, future), outcome in zip(batch, exc.outcomes, strict=True):
                    if future.done():
                        continue
                    if isinstance(outcome, BaseException):
                        future.set_exception(as_policy_error(outcome, self.policy, ".act"))
                    else:
                        future.set_result(outcome)
                return
            await self._failed(batch, exc)
        except Exception as exc:  # the policy failed: each turn it concerns fails
            await self._failed(batch, exc)
        else:
            for (_, future), generation in zip(batch, generations, strict=True):
                if not future.done():
                    future.set_result(generation)

    async def _failed(
        self, batch: list[tuple[PolicyRequest, asyncio.Future[Generation]]], exc: Exception
    ) -> None:
        error = as_policy_error(exc, self.policy, ".act")
        live = [item for item in batch if not item[1].done()]
        if len(live) > 1 and not error.fatal:  # which request(s)? each alone, once
            await asyncio.gather(*(self._run([item]) for item in live))
            return
        for _, future in live:
            future.set_exception(error)


class Streamed:
    """Hands each episode's turns to a continuous-batching :class:`PolicyStream`."""

    def __init__(self, policy: Policy, stream: PolicyStream) -> None:
        self.policy = policy
        self.stream = stream

    @property
    def calls(self) -> int:
        return self.stream.calls

    @property
    def batch_sizes(self) -> list[int]:
        return list(self.stream.batch_sizes)

    async def act(self, request: PolicyRequest, key: Hashable = None) -> Generation:
        try:
            return await self.stream.act(key, request)
        except PolicyError:
            raise
        except Exception as exc:  # the policy failed this episode's turn
            raise as_policy_error(exc, self.policy, " stream") from exc

    def episode_done(self, key: Hashable = None) -> None:
        self.stream.release(key)

    def abort(self, key: Hashable = None) -> None:
        """A turn timed out: the stream drops the episode's row (its retry comes under a new
        key and prefills the context again)."""
        self.stream.release(key)
