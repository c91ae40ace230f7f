"""The SFT warm start's clock and learning-rate schedule: a time budget that stops training,
and a warmup-then-decay schedule that follows the larger of the step fraction and the spent share
of that budget (so a run the budget stops ends at the bottom of its schedule)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from transformers import TrainerCallback

from llm_gym.errors import InvalidArgumentError

__all__ = ["TimeBudgetCallback", "lr_schedule"]


class TimeBudgetCallback(TrainerCallback):
    """Stops training after ``budget_s`` seconds of the training loop (checked after each
    optimizer step, so the last step may run past it)."""

    def __init__(self, budget_s: float) -> None:
        if budget_s <= 0:
            raise InvalidArgumentError(f"time_budget_s must be > 0, actual value: {budget_s}.")
        self.budget_s = float(budget_s)
        self.start: float | None = None
        self.stopped = False

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self.start = time.perf_counter()
        return control

    def elapsed(self) -> float:
        return 0.0 if self.start is None else time.perf_counter() - self.start

    def fraction(self) -> float:
        """The spent share of the budget (0 before training starts)."""
        return self.elapsed() / self.budget_s

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if self.elapsed() >= self.budget_s:
            self.stopped = True
            control.should_training_stop = True
        return control


def lr_schedule(
    kind: str,
    warmup_steps: int,
    min_lr_ratio: float,
    total_steps: int,
    budget: TimeBudgetCallback | None,
) -> Callable[[int], float]:
    """The LR multiplier: linear warmup, then ``kind`` over the progress, which is the larger of
    the step fraction and (with a time budget) the spent share of the budget."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / (warmup_steps + 1)
        if kind == "constant":
            return 1.0
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        if budget is not None:
            progress = max(progress, budget.fraction())
        progress = min(1.0, max(0.0, progress))
        shape = 0.5 * (1 + math.cos(math.pi * progress)) if kind == "cosine" else 1 - progress
        return min_lr_ratio + (1 - min_lr_ratio) * shape

    return factor
