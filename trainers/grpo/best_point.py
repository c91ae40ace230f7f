"""Keeping the best point: a run ends with the weights of its best validation point.

With ``keep_best`` set to a validation metric (``val/success_rate`` in the main job), the run's
model is the checkpoint best on validation, as transformers' ``load_best_model_at_end`` with
``metric_for_best_model`` gives for its own evaluation loop; here for the validation the trainer
runs (:mod:`trainers.grpo.validation`: before the first step, every ``validation_interval``
steps and after the last). The rule (:func:`improves`, :func:`best_point`):

- a validation point becomes the best when its value is strictly higher than every earlier
  point's, so of equal values the earliest is kept (transformers compares the same way);
- the validation before the first step is a point like the others: a run whose validation never
  rises above it ends with the weights it started from;
- a validation without the metric (no episodes ran) is not a point;
- in a mixture of environments (each validated on its own interval) a point is a step at which
  every validated environment has a value, and its value is their unweighted mean
  (:func:`mixture_point`): the start, the last step and the common multiples of the intervals.
  The macro mean weighs each environment as the leaderboard does, whatever its training weight.

:class:`KeepBestCallback` copies the trainable weights (a LoRA run's: the adapter) to CPU memory
at each new best and copies them back into the model when ``train`` ends, so the model holds
bitwise the weights that were validated; ``trainer.best_point`` then says which step was kept
(:class:`BestPoint`), and the step log gets a ``best/step`` and ``best/<metric>`` record. Each
process keeps its own parameters (every process validates on the gathered episodes, so all
choose the same step). A resumed run keeps the best point since it resumed. Generators that
hold their own copy of the weights (vLLM's) keep the last step's.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from transformers import TrainerCallback

from llm_gym.errors import InvalidArgumentError

if TYPE_CHECKING:
    from trainers.grpo.trainer import MultiTurnGRPOTrainer

__all__ = [
    "BestPoint",
    "KeepBestCallback",
    "best_point",
    "improves",
    "mixture_point",
    "point_value",
]


@dataclass(frozen=True)
class BestPoint:
    """Which validation point a run kept, and where it ended."""

    metric: str
    """The metric chosen on (``keep_best``, e.g. ``val/success_rate``)."""
    step: int
    """The step whose weights the model holds (0: the weights the run started from)."""
    value: float
    """The metric's value there."""
    final_step: int
    """The last validated step (the run's last step)."""
    final_value: float
    """The metric's value there."""

    def as_json(self) -> dict[str, Any]:
        """The record as a JSON object (``summary.json``'s ``best_point``)."""
        return asdict(self)

    def describe(self) -> str:
        """One line for a run's log.

        Example:
            >>> BestPoint("val/success_rate", 10, 0.75, 20, 0.5).describe()
            'kept the weights of step 10 (val/success_rate 0.750; the last step, 20, had 0.500)'
        """
        return (
            f"kept the weights of step {self.step} ({self.metric} {self.value:.3f}; the last "
            f"step, {self.final_step}, had {self.final_value:.3f})"
        )


def improves(value: float, best: float | None) -> bool:
    """Whether a validation point's ``value`` replaces the ``best`` so far (None: no point
    yet): strictly higher; NaN never.

    Example:
        >>> improves(0.5, None), improves(0.5, 0.5), improves(0.6, 0.5)
        (True, False, True)
        >>> improves(float("nan"), None)
        False
    """
    if math.isnan(value):
        return False
    return best is None or value > best


def best_point(history: Iterable[tuple[int, float]]) -> tuple[int, float] | None:
    """The ``(step, value)`` kept from a validation history of ``(step, value)`` points in the
    order they ran: the earliest point of the highest value (None: no point).

    Example:
        >>> best_point([(0, 0.25), (10, 0.75), (20, 0.5)])
        (10, 0.75)
        >>> best_point([(0, 0.5), (10, 0.5), (20, 0.25)])  # ties: the earliest; here the start
        (0, 0.5)
    """
    best = None
    for step, value in history:
        if improves(value, None if best is None else best[1]):
            best = (step, value)
    return best


def point_value(record: Mapping[str, Any], metric: str) -> float | None:
    """The value of ``metric`` (``val/<key>``) in a validation record (a
    ``trainer.validation_history`` entry: ``step`` and the summary's keys); None when the record
    lacks it (a validation without episodes).

    Example:
        >>> point_value({"step": 10, "success_rate": 0.75}, "val/success_rate")
        0.75
    """
    value = record.get(metric.removeprefix("val/"))
    return None if value is None else float(value)


def mixture_point(values: Mapping[str, float], envs: Sequence[str]) -> float | None:
    """A mixture's value at one step from its environments' ``values`` there: the unweighted
    mean over ``envs`` (those validated), None while one of them has no value yet.

    Example:
        >>> mixture_point({"Math-v0": 0.5, "Maze-v0": 0.25}, ["Math-v0", "Maze-v0"])
        0.375
        >>> mixture_point({"Math-v0": 0.5}, ["Math-v0", "Maze-v0"]) is None  # not a point
        True
    """
    if not envs or any(env not in values for env in envs):
        return None
    return sum(values[env] for env in envs) / len(envs)


class KeepBestCallback(TrainerCallback):
    """Copies the weights at each new best validation point and restores the best at the end.

    Added after :class:`~trainers.grpo.validation.ValidationCallback`, it reads the validation
    records that callback's hooks append to ``trainer.validation_history``.

    Raises:
        InvalidArgumentError: ``keep_best`` is set and the trainer has no validation tasks (in a
            mixture: no environment has any).
    """

    def __init__(self, trainer: MultiTurnGRPOTrainer) -> None:
        self.trainer = trainer
        self.metric = trainer.grpo_args.keep_best
        mixture = trainer.mixture
        self.envs: list[str] | None = None  # a mixture's validated environments
        if mixture is not None:
            self.envs = [
                name for i, name in enumerate(mixture.names) if mixture.interval(i) is not None
            ]
        if self.metric is not None and not (trainer.val_tasks if mixture is None else self.envs):
            raise InvalidArgumentError(
                f"keep_best={self.metric!r} chooses among validation points, and the trainer has "
                "no validation tasks; pass val_tasks (train.py: val_tasks > 0; a mixture: an "
                "entry's val_tasks) or set keep_best=None."
            )
        self.seen = 0  # validation records read
        self.pending: dict[int, dict[str, float]] = {}  # a mixture's step: values so far
        self.best: tuple[int, float] | None = None
        self.last: tuple[int, float] | None = None
        self.weights: dict[str, Any] = {}  # the best point's, on CPU

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._read()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._read()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._read()
        if self.metric is None or self.best is None or self.last is None:
            return
        step, value = self.best
        if step != self.last[0]:
            self._restore()
        self.trainer.best_point = BestPoint(self.metric, step, value, *self.last)
        self.trainer.log({"best/step": float(step), f"best/{self.metric}": value})

    def _read(self) -> None:
        """Take the validation records appended since the last look: each is the last point so
        far; a new best copies the weights."""
        if self.metric is None:
            return
        history = self.trainer.validation_history
        fresh, self.seen = history[self.seen :], len(history)
        for record in fresh:
            value = point_value(record, self.metric)
            if value is None:
                continue
            step = int(record["step"])
            if self.envs is not None:  # a mixture: a point once every environment has a value
                values = self.pending.setdefault(step, {})
                values[str(record.get("env"))] = value
                self.pending = {step: values}  # earlier steps can no longer complete
                value = mixture_point(values, self.envs)
                if value is None:
                    continue
            self.last = (step, value)
            if improves(value, None if self.best is None else self.best[1]):
                self.best = self.last
                self.weights = {
                    name: p.detach().to("cpu", copy=True)
                    for name, p in self.trainer.model.named_parameters()
                    if p.requires_grad
                }

    def _restore(self) -> None:
        import torch

        with torch.no_grad():
            for name, p in self.trainer.model.named_parameters():
                if name in self.weights:
                    p.copy_(self.weights[name])
