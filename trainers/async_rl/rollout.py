"""Continuous rollout workers for async training.

A :class:`RolloutWorker` runs its own event loop on its own thread and keeps up to
``groups_in_flight`` groups of episodes running on its generator replicas while the trainer
updates; the trainer :meth:`~RolloutWorker.take` s finished groups, in the order they finished.
Every group records the weight version its rollout started under (the replica's version then);
its tokens record the version that sampled each of them.

Admission follows AReaL's rule: a group starts only while it could still be taken within the
staleness bound, i.e. while the groups started and not yet taken number fewer than
``(max_steps_off_policy + 1) x batch_size`` minus the groups already taken under the trainer's
current version (or fewer than a waiting trainer still needs, so dynamic sampling never starves).
Workers therefore never run far ahead; a group that is stale all the same (one very slow
episode) is dropped by the trainer and counted.

Task order: a seeded shuffle of the training tasks, reshuffled every epoch, or the order the
worker is given (a mixture's draw: :meth:`trainers.mixture.run.MixtureRun.async_order`).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
import time
import warnings
from collections import deque
from collections.abc import Awaitable, Callable, Hashable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from llm_gym.core.task import Task
from llm_gym.policies import Policy
from llm_gym.policies.base import PolicyStream
from llm_gym.rollout.episode import Episode

__all__ = ["CollectGroup", "RolloutWorker", "task_order"]

CollectGroup = Callable[[Policy, PolicyStream | None, int, Hashable], Awaitable[list[Episode]]]
"""``(policy, stream, task_index, key_space) -> episodes``: one group of episodes of the task
at ``task_index``."""


def task_order(num_tasks: int, seed: Any, rank: int = 0, world: int = 1) -> Iterator[int]:
    """Task indices forever: every epoch a seeded shuffle of ``range(num_tasks)``, the same on
    every process, of which process ``rank`` takes every ``world``-th (disjoint shares).

    Example:
        >>> order = task_order(3, seed=0)
        >>> sorted(next(order) for _ in range(3))
        [0, 1, 2]
        >>> first, second = task_order(4, seed=0, rank=0, world=2), task_order(4, 0, 1, 2)
        >>> sorted([next(first), next(first), next(second), next(second)])
        [0, 1, 2, 3]
    """
    rng = random.Random(str(seed))
    while True:
        indices = list(range(num_tasks))
        rng.shuffle(indices)
        yield from indices[rank::world] or indices[:1]


class RolloutWorkerError(RuntimeError):
    """The rollout worker stopped on an error (re-raised on the trainer's thread)."""


class RolloutWorker:
    """Keeps groups of episodes running on generator replicas (see the module docstring).

    Args:
        policies: One policy per generator replica.
        collect: Runs one group (see :data:`CollectGroup`).
        tasks: The training tasks.
        versions: ``replica -> the weight version it holds now``.
        groups_in_flight: Most groups running at once.
        batch_size: Groups the trainer takes per optimizer step (this process's share).
        max_steps_off_policy: The staleness bound the admission rule keeps to.
        seed: Seeds the task order.
        rank: This process's index (its share of the task order).
        world: The number of processes.
        threads: Torch threads of the worker's compute threads (None: leave as is).
        order: Task indices in the order groups start (None: :func:`task_order` of ``tasks``,
            ``seed``, ``rank`` and ``world``).
    """

    def __init__(
        self,
        policies: Sequence[Policy],
        collect: CollectGroup,
        tasks: Sequence[Task],
        *,
        versions: Callable[[int], int],
        groups_in_flight: int,
        batch_size: int,
        max_steps_off_policy: int,
        seed: Any = 0,
        rank: int = 0,
        world: int = 1,
        threads: int | None = None,
        order: Iterator[int] | None = None,
    ) -> None:
        self.policies = list(policies)
        self.collect = collect
        self.tasks = list(tasks)
        self.versions = versions
        self.groups_in_flight = groups_in_flight
        self.batch_size = batch_size
        self.max_steps_off_policy = max_steps_off_policy
        self.threads = threads
        self._order = order if order is not None else task_order(len(self.tasks), seed, rank, world)
        self._cond = threading.Condition()
        self._done: deque[tuple[int, list[Episode]]] = deque()
        self._error: BaseException | None = None
        self._stopping = False
        self._started = 0
        self._taken = 0
        self._taken_at_version = 0
        self._wanted = 0
        self._running = [0] * len(self.policies)
        self._streams: list[PolicyStream | None] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self.groups_started = 0
        self.groups_finished = 0

    # --- the trainer's side -----------------------------------------------------------------

    def start(self) -> None:
        """Start the worker thread (it starts collecting at once)."""
        ready = threading.Event()
        self._thread = threading.Thread(
            target=self._main, args=(ready,), name="llm-gym-rollout-worker", daemon=True
        )
        self._thread.start()
        ready.wait()

    def take(self, n: int) -> tuple[list[tuple[int, list[Episode]]], float]:
        """The next ``n`` finished groups, each as ``(start_version, episodes)`` (the replica's
        weight version when its rollout started), and the seconds spent waiting for them."""
        start = time.perf_counter()
        out: list[tuple[int, list[Episode]]] = []
        with self._cond:
            while len(out) < n:
                if self._error is not None:
                    raise RolloutWorkerError(
                        f"The rollout worker stopped: {self._error!r}"
                    ) from self._error
                if self._stopping:
                    raise RolloutWorkerError("The rollout worker was stopped.")
                if self._done:
                    out.append(self._done.popleft())
                    self._taken += 1
                    self._taken_at_version += 1
                    continue
                self._wanted = n - len(out)
                self._poke()
                self._cond.wait(timeout=0.5)
            self._wanted = 0
        self._poke()
        return out, time.perf_counter() - start

    def new_version(self) -> None:
        """The trainer moved to a new weight version: its admission budget starts over."""
        with self._cond:
            self._taken_at_version = 0
        self._poke()

    def check(self) -> None:
        """Raise the worker's error, if it stopped on one (or a replica's engine did, even
        between turns, when no group would notice)."""
        error = self._error
        for stream in self._streams:
            error = error or getattr(stream, "_error", None)
        if error is not None:
            raise RolloutWorkerError(f"The rollout worker stopped: {error!r}") from error
        if self._thread is not None and not self._thread.is_alive():
            raise RolloutWorkerError("The rollout worker's thread ended.")

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def idle_seconds(self) -> float:
        """Seconds the replicas' engines waited with nothing to sample (so far, summed)."""
        total = 0.0
        for policy, stream in zip(self.policies, self._streams, strict=False):
            total += float(getattr(policy, "idle_seconds", 0.0))
            total += float(getattr(stream, "idle_seconds", 0.0))
        return total

    def stop(self, timeout: float = 30.0) -> None:
        """Cancel the groups in flight (their environments close), close the streams and
        join the thread (a warning after ``timeout`` seconds). Safe to call twice."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._poke()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():  # a daemon thread: it ends with the process
                warnings.warn(
                    f"The rollout worker did not stop within {timeout} s (an environment's "
                    "close may hang); it is left to end with the process.",
                    stacklevel=2,
                )

    def _poke(self) -> None:
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(wake.set)

    # --- the worker's thread ------------------------------------------------------------------

    def _main(self, ready: threading.Event) -> None:
        initializer = None
        if self.threads is not None:
            import torch

            torch.set_num_threads(self.threads)
            initializer = torch.set_num_threads
        executor = ThreadPoolExecutor(
            max_workers=4,
            thread_name_prefix="llm-gym-rollout",
            initializer=initializer,
            initargs=(self.threads,) if initializer is not None else (),
        )
        loop = asyncio.new_event_loop()
        loop.set_default_executor(executor)
        try:
            loop.run_until_complete(self._run(ready))
        except BaseException as exc:
            with self._cond:
                self._error = self._error or exc
                self._cond.notify_all()
        finally:
            ready.set()
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()
            executor.shutdown(wait=True, cancel_futures=True)

    def _may_start(self) -> bool:
        if self._stopping or sum(self._running) >= self.groups_in_flight:
            return False
        outstanding = self._started - self._taken
        budget = (self.max_steps_off_policy + 1) * self.batch_size - self._taken_at_version
        return outstanding < max(budget, self._wanted)

    async def _run(self, ready: threading.Event) -> None:
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        for policy in self.policies:
            open_stream = getattr(policy, "open_stream", None)
            self._streams.append(open_stream() if open_stream is not None else None)
        ready.set()
        running: set[asyncio.Task[None]] = set()
        try:
            while True:
                with self._cond:
                    if self._stopping or self._error is not None:
                        break
                    while self._may_start():
                        replica = min(range(len(self.policies)), key=self._running.__getitem__)
                        index = next(self._order)
                        self._started += 1
                        self._running[replica] += 1
                        group = self._group(replica, index, self._started)
                        task = asyncio.create_task(group)
                        running.add(task)
                        task.add_done_callback(running.discard)
                self._wake.clear()
                await self._wake.wait()
        finally:
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)
            for stream in self._streams:
                if stream is not None:
                    with contextlib.suppress(Exception):
                        await stream.aclose()
            # what the groups left behind (a policy call in flight): cancelled, not abandoned
            leftovers = asyncio.all_tasks() - {asyncio.current_task()}
            for task in leftovers:
                task.cancel()
            await asyncio.gather(*leftovers, return_exceptions=True)

    async def _group(self, replica: int, index: int, key: int) -> None:
        version = self.versions(replica)
        self.groups_started += 1
        try:
            episodes = await self.collect(
                self.policies[replica], self._streams[replica], index, key
            )
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            with self._cond:
                self._error = self._error or exc
                self._cond.notify_all()
            self._poke()
            return
        finally:
            self._running[replica] -= 1
        with self._cond:
            self._done.append((version, episodes))
            self.groups_finished += 1
            self._cond.notify_all()
        assert self._wake is not None
        self._wake.set()
