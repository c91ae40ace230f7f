"""Versioned weights: a generator's own copy of a policy, updated between its forward passes.

Async training keeps the generator sampling while the trainer updates. The generator owns a
copy of the model; the trainer :meth:`~VersionedWeights.stage` s each new version into a staging
buffer (one copy of the trainable tensors, on the trainer's thread) and returns; the generator's
stream :meth:`~VersionedWeights.apply` s it between two forward passes by swapping the staged
tensors with its own (a pointer swap per tensor: the staging buffer then holds the old weights
and is overwritten by the next version, so nothing is allocated after the first publication).

When the swap happens is the weight-sync mode's business (``swap``):

- ``"between_turns"``: the stream stops admitting new turns, lets the turns it is sampling finish
  under the old weights, then swaps. Every turn is sampled by a single version.
- ``"between_passes"``: the stream swaps before its next forward pass; turns in flight go on
  under the new weights (their cached keys and values stay those of the old weights, as in
  PipelineRL's in-flight updates). Every token records the version that sampled it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from llm_gym.errors import InvalidArgumentError

__all__ = ["SWAP_POINTS", "VersionedWeights"]

SWAP_POINTS = ("between_turns", "between_passes")


class VersionedWeights:
    """A model the generator samples from, and the version of the weights it holds.

    Args:
        model: The generator's copy of the policy (parameters are swapped in place).
        version: The version it holds now (the trainer's optimizer step).
        swap: When a staged version replaces the current one: one of :data:`SWAP_POINTS`.
    """

    def __init__(self, model: Any, *, version: int = 0, swap: str = "between_turns") -> None:
        if swap not in SWAP_POINTS:
            raise InvalidArgumentError(
                f"swap must be one of {SWAP_POINTS}, actual value: {swap!r}."
            )
        self.model = model
        self.version = int(version)
        self.swap = swap
        self._params = dict(model.named_parameters())
        self._lock = threading.Condition()
        self._staged: dict[str, Any] | None = None
        self._staged_version: int | None = None
        self._listeners: list[Callable[[], None]] = []
        self.in_use = threading.Lock()
        """Held by a batched ``generate`` call: a version swapped in outside a stream waits
        for it."""
        self.swaps = 0
        """Versions applied so far."""
        self.apply_seconds = 0.0
        """Seconds the generator spent swapping weights in."""

    @property
    def pending(self) -> bool:
        """A staged version waits to be applied."""
        return self._staged_version is not None

    @property
    def latest(self) -> int:
        """The newest version this generator will sample with: the staged one when a version
        waits (a turn that starts now waits for it, or is sampled by it), else the current."""
        staged = self._staged_version
        return self.version if staged is None else staged

    def listen(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (from the staging thread) whenever a version is staged: a
        continuous-batching stream uses it to wake its idle loop, and applies versions itself."""
        self._listeners.append(callback)

    def unlisten(self, callback: Callable[[], None]) -> None:
        """Stop calling ``callback`` (its stream closed)."""
        if callback in self._listeners:
            self._listeners.remove(callback)

    @property
    def streamed(self) -> bool:
        """A stream applies staged versions (else whoever publishes applies them under
        :attr:`in_use`)."""
        return bool(self._listeners)

    def stage(self, tensors: Iterable[tuple[str, Any]], version: int) -> None:
        """Copy ``(name, tensor)`` pairs of the new version into the staging buffer.

        Names are the generator model's parameter names; tensors not named stay as they are
        (a LoRA run stages only the adapter). A version staged before the previous one was
        applied replaces it: the generator always moves to the newest weights.
        """
        pairs = list(tensors)
        for name, tensor in pairs:  # all checked first: a bad one leaves nothing half-staged
            target = self._params.get(name)
            if target is None:
                raise KeyError(f"The generator model has no parameter {name!r}.")
            if tuple(tensor.shape) != tuple(target.shape):
                raise ValueError(
                    f"Parameter {name!r}: staged shape {tuple(tensor.shape)} differs from "
                    f"the generator's {tuple(target.shape)}."
                )
        with self._lock:
            staged = self._staged if self._staged is not None else {}
            for name, tensor in pairs:
                target = self._params[name]
                buffer = staged.get(name)
                if buffer is None:
                    buffer = target.detach().clone()
                    staged[name] = buffer
                buffer.copy_(tensor.detach())
            self._staged = staged
            self._staged_version = int(version)
        for callback in list(self._listeners):
            callback()

    def apply(self) -> bool:
        """Swap the staged version in (the generator's thread, between forward passes).
        Returns False when nothing was staged."""
        start = time.perf_counter()
        with self._lock:
            if self._staged_version is None or self._staged is None:
                return False
            for name, buffer in self._staged.items():
                param = self._params[name]
                old = param.data
                param.data = buffer
                self._staged[name] = old
            self.version = self._staged_version
            self._staged_version = None
            self.swaps += 1
            self._lock.notify_all()
        self.apply_seconds += time.perf_counter() - start
        return True

    def take_latest(self) -> int:
        """Swap a staged version in, if one waits, and return the version held: what a
        generation outside a stream calls first, holding :attr:`in_use` (a generation is a swap
        point in both sync modes; a version staged meanwhile waits for it to end)."""
        self.apply()
        return self.version

    def wait_for(self, version: int, timeout: float | None = None) -> bool:
        """Block until the generator holds ``version`` or newer (False on timeout)."""
        with self._lock:
            return self._lock.wait_for(lambda: self.version >= version, timeout=timeout)
