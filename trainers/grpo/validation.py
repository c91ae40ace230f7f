"""Validation during GRPO: when it runs, and one run over the validation tasks.

With ``validation_interval`` set, :class:`ValidationCallback` validates before the first step,
after every ``validation_interval``-th step and after the last one (on every process). In a
mixture of environments each environment keeps its own interval, validation tasks and turn
limit (:class:`~trainers.mixture.env.MixtureEnv`), and is logged under ``val/<name>/``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from accelerate.utils import gather_object
from transformers import TrainerCallback

from llm_gym.core.task import Task
from llm_gym.eval.metrics import summarize_episodes
from trainers.grpo.metrics import validation_metrics

__all__ = ["ValidationCallback", "ValidationMixin"]


class ValidationCallback(TrainerCallback):
    """Validates what is due at the start, after each step and after the last step."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.trainer.validate_due(lambda every: True)  # logged with the first step's record

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.trainer.validate_due(lambda every: state.global_step % every == 0)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.trainer.validate_due(lambda every: state.global_step % every != 0):
            self.trainer.log({})  # a record of its own: no step follows to carry it


class ValidationMixin:
    """The trainer's validation (mixed into
    :class:`~trainers.grpo.trainer.MultiTurnGRPOTrainer`)."""

    def validate_due(self, when: Callable[[int], bool]) -> bool:
        """Validate every target whose interval ``when`` accepts; whether any ran."""
        mixture = self.mixture  # type: ignore[attr-defined]
        if mixture is not None:
            due = mixture.validation_due(when)
            for env in due:
                self.validate(env=mixture.names[env])
            return bool(due)
        every = self.args.validation_interval  # type: ignore[attr-defined]
        if self.val_tasks and every and when(every):  # type: ignore[attr-defined]
            self.validate()
            return True
        return False

    def validate(
        self, tasks: Sequence[Task] | None = None, *, env: str | None = None
    ) -> dict[str, float]:
        """Run the validation tasks once each (greedy by default) and log ``val/...`` metrics;
        in a mixture, environment ``env``'s (its own tasks by default), logged under
        ``val/<env>/``."""
        args = self.args  # type: ignore[attr-defined]
        mixture = self.mixture  # type: ignore[attr-defined]
        index = None
        if env is not None:
            index = mixture.names.index(env)
            tasks = list(tasks if tasks is not None else mixture.envs[index].val_tasks)
        tasks = list(tasks if tasks is not None else self.val_tasks)  # type: ignore[attr-defined]
        accelerator = self.accelerator  # type: ignore[attr-defined]
        mine = tasks[accelerator.process_index :: accelerator.num_processes]
        # Every process collects, also one with no tasks: generation may be collective.
        groups = self._collect(  # type: ignore[attr-defined]
            mine,
            episodes_per_task=1,
            temperature=args.val_temperature,
            max_turns=args.validation_max_turns or 1,
            sequential=args.sequential_validation,
            envs=None if index is None else [index] * len(mine),
            validation=True,
        )
        episodes = [e for part in gather_object([[e for g in groups for e in g]]) for e in part]
        summary = summarize_episodes(episodes)
        step = self.state.global_step  # type: ignore[attr-defined]
        record = {"step": step, **({"env": env} if env is not None else {}), **summary}
        self.validation_history.append(record)  # type: ignore[attr-defined]
        # logged with the step's own record (TRL averages _metrics lists)
        for key, value in validation_metrics(summary, env).items():
            self._metrics["train"][key].append(value)  # type: ignore[attr-defined]
        return summary
