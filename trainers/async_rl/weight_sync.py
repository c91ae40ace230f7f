"""The seeds' three weight-sync modes, and how each reaches a generator.

``WEIGHT_SYNC_TYPE_SYNCHRONOUS`` publishes inline: the trainer waits until every generator holds
the new weights. ``WEIGHT_SYNC_TYPE_BACKGROUND_PUBLISH`` and ``WEIGHT_SYNC_TYPE_PIPELINE`` defer
publication and return at once; under BACKGROUND_PUBLISH a turn the generator is sampling
finishes under the old weights, under PIPELINE it goes on under the new ones (each token keeps
the version, and the logprob, of the weights that sampled it).

Two publishers:

- :class:`InProcessPublisher`: generator replicas of the continuous-batching ``HFPolicy`` engine
  in this process (CPU or GPU). Publication copies the trainable tensors into each replica's
  staging buffer; the replica's stream swaps them in between forward passes
  (:class:`llm_gym.policies.weights.VersionedWeights`). SYNCHRONOUS also waits for the swap.
- :class:`CallbackPublisher`: a backend that syncs with one call, TRL's
  ``vllm_generation.sync_weights()`` (server or colocate). SYNCHRONOUS calls it inline; the
  deferred modes call it on a background thread, joined before the next optimizer step changes
  the weights it reads. The sync holds the generation's lock, which every ``generate`` call
  holds too (a call sets the sampler's fields, and colocate mode shares one engine), so an
  update lands between requests: under vLLM both deferred modes behave as BACKGROUND_PUBLISH
  (a request in flight finishes under the old weights), and every token's version is exact.
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from llm_gym.policies.weights import VersionedWeights

__all__ = ["CallbackPublisher", "InProcessPublisher", "WeightSyncType"]


class WeightSyncType(enum.StrEnum):
    """How new weights reach the generators after each optimizer step (the seeds' names)."""

    SYNCHRONOUS = "WEIGHT_SYNC_TYPE_SYNCHRONOUS"
    BACKGROUND_PUBLISH = "WEIGHT_SYNC_TYPE_BACKGROUND_PUBLISH"
    PIPELINE = "WEIGHT_SYNC_TYPE_PIPELINE"

    @property
    def swap(self) -> str:
        """Where a generator swaps the new version in (``VersionedWeights.swap``)."""
        return "between_passes" if self is WeightSyncType.PIPELINE else "between_turns"


_POLL_S = 0.5


class InProcessPublisher:
    """Publishes a trainer model's trainable tensors to in-process generator replicas.

    Args:
        model: The trainer's (unwrapped) model.
        replicas: Each generator's versioned weights (a deep copy of ``model``).
        mode: The weight-sync mode.
        check: Called while a SYNCHRONOUS publication waits (raises when the generators died).
    """

    def __init__(
        self,
        model: Any,
        replicas: Sequence[VersionedWeights],
        mode: WeightSyncType,
        check: Callable[[], None] = lambda: None,
    ) -> None:
        self.model = model
        self.replicas = list(replicas)
        self.mode = mode
        self.check = check

    @property
    def version(self) -> int:
        """The oldest version a replica holds."""
        return min(w.version for w in self.replicas)

    def publish(self, version: int) -> float:
        """Publish the model's weights as ``version``; the seconds the trainer spent."""
        start = time.perf_counter()
        tensors = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]
        for weights in self.replicas:
            weights.stage(tensors, version)
        if self.mode is WeightSyncType.SYNCHRONOUS:
            for weights in self.replicas:
                if not weights.streamed:  # no stream swaps it in: swap it here
                    with weights.in_use:
                        weights.apply()
                while not weights.wait_for(version, timeout=_POLL_S):
                    self.check()
        return time.perf_counter() - start

    def join(self) -> None:
        """Nothing runs in the background: staging is done when :meth:`publish` returns."""


class CallbackPublisher:
    """Publishes with a backend's own sync call (TRL's ``vllm_generation.sync_weights``).

    Args:
        sync: Sends the trainer's current weights to the generator.
        mode: SYNCHRONOUS calls it inline; the deferred modes on a background thread.
        version: The version the generator holds at the start.
        lock: Held around every sync; the generator holds it around every ``generate`` call,
            so a sync lands between requests and a request's version is known exactly.
    """

    def __init__(
        self,
        sync: Callable[[], None],
        mode: WeightSyncType,
        version: int = 0,
        lock: threading.Lock | None = None,
    ) -> None:
        self.sync = sync
        self.mode = mode
        self.version = version
        self.lock = lock or threading.Lock()
        self._pending: int | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    @property
    def latest(self) -> int:
        """The version the next request will be sampled with: a sync that holds the lock
        finishes before any request starts."""
        pending = self._pending
        return self.version if pending is None else pending

    def _sync_locked(self, version: int) -> None:
        with self.lock:
            self._pending = version
            try:
                self.sync()
                self.version = version
            finally:
                self._pending = None

    def publish(self, version: int) -> float:
        """Publish the trainer's weights as ``version``; the seconds the trainer spent."""
        start = time.perf_counter()
        self.join()
        if self.mode is WeightSyncType.SYNCHRONOUS:
            self._sync_locked(version)
            return time.perf_counter() - start

        def run() -> None:
            try:
                self._sync_locked(version)
            except BaseException as exc:  # re-raised on the trainer's thread by join()
                self._error = exc

        self._thread = threading.Thread(target=run, name="llm-gym-weight-publish", daemon=True)
        self._thread.start()
        return time.perf_counter() - start

    def join(self) -> None:
        """Wait for a background publication (before the weights it reads change)."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise RuntimeError(f"Publishing weights to the generator failed: {error!r}") from error
