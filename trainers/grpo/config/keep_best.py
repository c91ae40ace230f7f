"""The field of :class:`~trainers.grpo.config.multi_turn.MultiTurnGRPOConfig` that keeps the best
validation point (:mod:`trainers.grpo.best_point`), and its check."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from llm_gym.errors import InvalidArgumentError, did_you_mean

__all__ = ["KEEP_BEST_METRICS", "KeepBestFields", "check_keep_best"]

KEEP_BEST_METRICS = ("val/success_rate", "val/success_ci_low", "val/reward_mean")
"""The validation metrics ``keep_best`` may name, as the step log names them; higher is better
for each."""


@dataclass
class KeepBestFields:
    """``keep_best`` (a base of the trainer's config)."""

    keep_best: str | None = field(
        default=None,
        metadata={
            "help": "Keep the best validation point: a validation metric (val/success_rate, "
            "val/success_ci_low or val/reward_mean). Each validation that scores strictly "
            "higher than every earlier one (the one before the first step included) copies the "
            "trainable weights in memory; when train ends the model gets back those of the best "
            "point (ties: the earliest; no improvement: the start), logged as best/step and "
            "best/<metric> (transformers' load_best_model_at_end with metric_for_best_model, "
            "for the validation this trainer runs; trainers.grpo.best_point). Needs "
            "validation_interval and validation tasks. A mixture's point is a step where every "
            "validated environment has a value, valued at their unweighted mean. None: the last "
            "step's weights."
        },
    )


def check_keep_best(config: Any, refuse: Any) -> None:
    """``keep_best``: None or one of :data:`KEEP_BEST_METRICS`, with a validation interval and
    without transformers' own ``load_best_model_at_end``."""
    metric = config.keep_best
    if metric is None:
        return
    if metric not in KEEP_BEST_METRICS:
        raise InvalidArgumentError(
            f"keep_best must be None or one of {list(KEEP_BEST_METRICS)}, actual value: "
            f"{metric!r:.80}.{did_you_mean(metric, KEEP_BEST_METRICS)}"
        )
    if not config.validation_interval:
        refuse(
            "validation_interval",
            config.validation_interval,
            "an int >= 1 with keep_best (the best point is chosen among the validations), or "
            "set keep_best=None",
        )
    if config.load_best_model_at_end:
        refuse(
            "load_best_model_at_end",
            True,
            "False with keep_best (keep_best restores the best point of this trainer's "
            "validation; transformers' option reads the eval_ metrics of its evaluation loop)",
        )
