"""The continuous-batching session of an :class:`~llm_gym.policies.hf.HFPolicy`.

A driver task runs :class:`~llm_gym.policies.hf_engine.DecodeEngine` steps in a worker thread (the
event loop stays free for the environments), admits before each step every turn that arrived
meanwhile, and, when the policy's weights are versioned (async training), swaps a staged version
in at the point its sync mode allows (:mod:`llm_gym.policies.weights`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Hashable
from typing import TYPE_CHECKING

from llm_gym.policies.base import Generation, PolicyRequest, PolicyStream

if TYPE_CHECKING:
    from llm_gym.policies.constraint import LogitsConstraint
    from llm_gym.policies.hf import HFPolicy

__all__ = ["HFStream"]

_ADMISSION_YIELDS = 16
"""Event-loop turns the stream waits, after handing out finished turns, for those episodes to
step their environments and come back before the next forward pass. Environments that do not
await real I/O are back within a few, so batches (and seeded samples) are reproducible; slower
ones rejoin a later step instead of holding the batch."""


class HFStream(PolicyStream):
    """One collection's session on a :class:`~llm_gym.policies.hf_engine.DecodeEngine`.

    A driver task runs engine steps in a worker thread (the event loop stays free for the
    environments) and admits, before each step, every turn that arrived meanwhile.
    """

    def __init__(self, policy: HFPolicy) -> None:
        from llm_gym.policies.hf_engine import DecodeEngine

        self.policy = policy
        seed = None if policy.seed is None else policy.seed + policy._batches
        policy._batches += 1
        self.engine = DecodeEngine(
            policy.model,
            eos_ids=policy._eos_ids(),
            pad_id=policy._pad_id(),
            temperature=policy.temperature,
            top_p=policy.top_p,
            seed=seed,
            kv_budget_bytes=policy.kv_budget_bytes,
        )
        self.engine.max_rows = policy.engine_rows(self.engine.kv_budget_bytes)
        self.batch_sizes = self.engine.rows_per_pass
        self._admits: list[tuple[Hashable, list[int], int]] = []
        self._releases: list[Hashable] = []
        self._constraints: dict[Hashable, LogitsConstraint | None] = {}
        self._futures: dict[Hashable, asyncio.Future[Generation]] = {}
        self._out: set[Hashable] = set()  # handed a turn, not back yet
        self._wake = asyncio.Event()
        self._driver: asyncio.Task[None] | None = None
        self._closed = False
        self._error: BaseException | None = None
        self.idle_seconds = 0.0
        """Seconds the driver waited with no turn to sample."""
        weights = policy.weights
        if weights is not None:  # a staged version must be applied even while nobody acts
            self.engine.version = weights.version
            loop = asyncio.get_running_loop()
            self._listener = lambda: loop.call_soon_threadsafe(self._wake.set)
            weights.listen(self._listener)
            self._driver = loop.create_task(self._drive())

    @property
    def calls(self) -> int:  # type: ignore[override]
        return self.engine.forward_passes

    async def act(self, key: Hashable, request: PolicyRequest) -> Generation:
        if self._error is not None:
            raise self._error
        if self._closed:
            raise RuntimeError("The stream is closed.")
        future: asyncio.Future[Generation] = asyncio.get_running_loop().create_future()
        self._futures[key] = future
        self._out.discard(key)
        budget = request.max_new_tokens or self.policy.max_new_tokens
        self._admits.append((key, self.policy._prompt_ids(request), budget))
        self._constraints[key] = self.policy.constraint_for(request)
        self._wake.set()
        if self._driver is None:
            self._driver = asyncio.get_running_loop().create_task(self._drive())
        return await future

    def release(self, key: Hashable) -> None:
        self._out.discard(key)
        self._releases.append(key)
        self._wake.set()

    async def aclose(self) -> None:
        self._closed = True
        self._wake.set()
        if self._driver is not None:
            with contextlib.suppress(Exception):  # a failure already reached the episodes
                await self._driver
        self.engine.close()
        self.policy.forward_passes += self.engine.forward_passes
        self.policy.prefilled_tokens += self.engine.prefilled_tokens
        self.policy.shared_prefix_tokens = len(self.engine.prefix_ids or [])
        self.policy.idle_seconds += self.idle_seconds
        if self.policy.weights is not None:
            self.policy.weights.unlisten(self._listener)

    async def _swap_weights(self) -> bool:
        """Apply a staged weight version when the sync mode allows it now; True while new
        turns must wait (a version waits for the turns in flight to finish). The engine then
        drops the keys and values the old weights computed, so every sampled token's logprob
        is the new weights' over the whole context, as the trainer scores it."""
        weights = self.policy.weights
        if weights is None or not weights.pending:
            return False
        if weights.swap == "between_passes" or not self.engine.busy:
            if weights.apply():
                self.engine.version = weights.version
                await asyncio.to_thread(self.engine.invalidate)
            return False
        return True

    async def _drive(self) -> None:
        engine = self.engine
        try:
            while True:
                for _ in range(_ADMISSION_YIELDS):
                    if not self._out:
                        break
                    await asyncio.sleep(0)
                hold = await self._swap_weights()
                if not ((self._admits and not hold) or self._releases or engine.busy):
                    if self._closed:
                        return
                    self._wake.clear()
                    idle_from = time.perf_counter()
                    await self._wake.wait()
                    self.idle_seconds += time.perf_counter() - idle_from
                    continue
                admits, self._admits = ([], self._admits) if hold else (self._admits, [])
                releases, self._releases = self._releases, []
                constraints = {k: self._constraints.pop(k, None) for k, *_ in admits}
                constraints = {k: c for k, c in constraints.items() if c is not None}
                step = (admits, releases, constraints) if constraints else (admits, releases)
                finished = await asyncio.to_thread(engine.step, *step)
                for turn in finished:
                    future = self._futures.pop(turn.key)
                    self._out.add(turn.key)
                    if not future.done():
                        versions = turn.versions if self.policy.weights is not None else None
                        future.set_result(
                            self.policy._generation(
                                turn.token_ids, turn.logprobs, turn.finish_reason, versions
                            )
                        )
        except BaseException as exc:
            self._error = exc if isinstance(exc, Exception) else RuntimeError(repr(exc))
            for future in self._futures.values():
                if not future.done():
                    future.set_exception(self._error)
            self._futures.clear()
            raise
