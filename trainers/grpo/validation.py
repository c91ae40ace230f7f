"""Validation during GRPO: when it runs, and one run over the validation tasks.

With ``validation_interval`` set, :class:`ValidationCallback` validates before the first step,
after every ``validation_interval``-th step and after the last one (on every process). In a
mixture of environments each environment keeps its own interval, validation tasks and turn
limit (:class:`~trainers.mixture.env.MixtureEnv`), and is logged under ``val/<name>/``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from accelerate.utils import gather_object
from transformers import TrainerCallback

from llm_gym.core.task import Task
from llm_gym.errors import InvalidArgumentError
from llm_gym.eval.metrics import summarize_episodes
from trainers.grpo.metrics import validation_metrics

if TYPE_CHECKING:
    from trainers.grpo.trainer import MultiTurnGRPOTrainer

__all__ = ["ValidationCallback", "validate", "validate_due"]


class ValidationCallback(TrainerCallback):
    """Validates what is due at the start, after each step and after the last step."""

    def __init__(self, trainer: MultiTurnGRPOTrainer) -> None:
        self.trainer = trainer

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        validate_due(self.trainer, lambda every: True)  # logged with the first step's record

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        validate_due(self.trainer, lambda every: state.global_step % every == 0)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if validate_due(self.trainer, lambda every: state.global_step % every != 0):
            self.trainer.log({})  # a record of its own: no step follows to carry it


def validate_due(trainer: MultiTurnGRPOTrainer, when: Callable[[int], bool]) -> bool:
    """Validate every target whose interval ``when`` accepts; whether any ran."""
    mixture = trainer.mixture
    if mixture is not None:
        due = mixture.validation_due(when)
        for env in due:
            trainer.validate(env=mixture.names[env])
        return bool(due)
    every = trainer.grpo_args.validation_interval
    if trainer.val_tasks and every and when(every):
        trainer.validate()
        return True
    return False


def validate(
    trainer: MultiTurnGRPOTrainer, tasks: Sequence[Task] | None, env: str | None
) -> dict[str, float]:
    """:meth:`MultiTurnGRPOTrainer.validate`: one greedy (by default) run over the validation
    tasks, its ``val/...`` metrics logged with the step's own record and returned."""
    args = trainer.grpo_args
    mixture = trainer.mixture
    index = None
    if env is not None:
        if mixture is None or env not in mixture.names:
            names = mixture.names if mixture is not None else []
            raise InvalidArgumentError(
                f"validate(env={env!r}): expected one of the mixture's environments {names}."
            )
        index = mixture.names.index(env)
        tasks = list(tasks if tasks is not None else mixture.envs[index].val_tasks)
    tasks = list(tasks if tasks is not None else trainer.val_tasks)
    accelerator = trainer.accelerator
    mine = tasks[accelerator.process_index :: accelerator.num_processes]
    # Every process collects, also one with no tasks: generation may be collective.
    groups = trainer.collect(
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
    step = trainer.state.global_step
    record = {"step": step, **({"env": env} if env is not None else {}), **summary}
    trainer.validation_history.append(record)
    # logged with the step's own record (TRL averages _metrics lists)
    for key, value in validation_metrics(summary, env).items():
        trainer._metrics["train"][key].append(value)
    return summary
