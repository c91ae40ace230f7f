"""``train_multi_turn``: the seeds' one-call entry point."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llm_gym.core.factories import as_task
from llm_gym.core.input_files import InputLimit, check_json_depth, input_lines
from llm_gym.core.task import Task
from llm_gym.errors import InvalidArgumentError
from trainers.grpo.config.multi_turn import MultiTurnGRPOConfig

if TYPE_CHECKING:
    from trainers.mixture.env import MixtureEnv

__all__ = ["MAX_TASK_FILE_BYTES", "train_multi_turn", "load_tasks"]

MAX_TASK_FILE_BYTES = 1 << 30
"""The largest task file read (JSONL, one task a line; read a line at a time): a path to a
device, a FIFO or an unrelated huge file is refused rather than read until memory runs out."""


def load_tasks(tasks: Any) -> list[Task]:
    """Tasks from a list of ``Task`` (or dicts), a ``datasets.Dataset`` or a JSONL path.

    Rows need a ``prompt`` (or ``input``) and may carry ``target`` (or ``output``), ``metadata``
    and ``id``.

    Raises:
        InvalidArgumentError: A path that is not a regular file (a directory, a device, a
            FIFO), one over :data:`MAX_TASK_FILE_BYTES`, or a line that is not a task (named
            ``path:line``; JSON nested past
            :data:`~llm_gym.core.input_files.MAX_JSON_DEPTH` included).
    """
    if isinstance(tasks, str | Path):
        return _read_task_file(Path(tasks))
    if hasattr(tasks, "column_names") and hasattr(tasks, "__getitem__"):  # datasets.Dataset
        return [Task.from_dict(dict(row)) for row in tasks]
    if isinstance(tasks, Sequence):
        return [as_task(t, f"tasks[{i}]") for i, t in enumerate(tasks)]
    raise InvalidArgumentError(
        "tasks must be a list of Task, a datasets.Dataset or a JSONL path, "
        f"actual type: {type(tasks).__name__}."
    )


def _read_task_file(path: Path) -> list[Task]:
    limit = InputLimit(
        "task file", MAX_TASK_FILE_BYTES, "trainers.grpo.train.MAX_TASK_FILE_BYTES", "a JSONL file"
    )
    tasks = []
    for number, raw in input_lines(path, limit):
        try:
            line = raw.decode("utf-8-sig" if number == 1 else "utf-8")
            if line.strip():
                check_json_depth(line)
                tasks.append(Task.from_dict(json.loads(line)))
        except ValueError as exc:  # JSON, UTF-8, digits, depth, the task
            reason = str(exc).rstrip(".")
            raise InvalidArgumentError(f"{path}:{number}: not a valid task ({reason}).") from None
    return tasks


def train_multi_turn(
    config: MultiTurnGRPOConfig,
    *,
    tasks: Any = None,
    env_factory: Callable[[Task], Any] | None = None,
    val_tasks: Any = None,
    envs: Sequence[MixtureEnv] | None = None,
    model: Any = None,
    processing_class: Any = None,
    oracle: Any = None,
    callbacks: list[Any] | None = None,
    resume_from_checkpoint: str | bool | None = None,
    reward_funcs: Any = None,
    agent: Any = None,
    agent_scorer: Any = None,
) -> Any:
    """Train ``config.model`` with multi-turn GRPO on ``tasks``; returns the trainer.

    Args:
        config: A :class:`MultiTurnGRPOConfig` (``max_turns`` is required).
        tasks: Training tasks: a list of ``Task``, a ``datasets.Dataset`` or a JSONL path.
        env_factory: Builds a fresh environment for each episode (``task -> Env``).
        val_tasks: Validation tasks, run every ``validation_interval`` steps.
        envs: A weighted mixture of environments instead of ``tasks``, ``env_factory`` and
            ``val_tasks``: :class:`~trainers.mixture.env.MixtureEnv` s, each with its weight,
            tasks, validation tasks and settings (:mod:`trainers.mixture.env`).
        model: A model object instead of ``config.model``.
        processing_class: The tokenizer (default: from the model's path).
        oracle: The environment's scripted expert (only for scripted policies).
        callbacks: Extra ``TrainerCallback`` s.
        resume_from_checkpoint: A checkpoint path, or True for the last one in ``output_dir``.
        reward_funcs: TRL-style reward functions added to the environment's reward,
            ``env_reward + sum_k reward_weights[k] * f_k(prompts, completions, **kwargs)``
            (:mod:`trainers.grpo.rewards`).
        agent: Your agent instead of the episode loop: ``async def agent(base_url, task)``
            returning a reward or a final answer (graded by ``agent_scorer(task, answer)``,
            else by the environment); it runs ``episodes_per_task`` times per task against the
            policy served as a recording OpenAI-compatible endpoint at ``base_url``
            (:mod:`trainers.grpo.agent_rollouts`). None: the config's ``agent`` reference, else the
            loop.
        agent_scorer: Grades an agent's final answer (None: the environment).
    """
    from trainers.grpo.trainer import MultiTurnGRPOTrainer

    if not isinstance(config, MultiTurnGRPOConfig):
        raise InvalidArgumentError(
            "config must be a MultiTurnGRPOConfig (trainers.GRPOConfig), "
            f"got {type(config).__name__}."
        )
    if config.max_turns is None:
        raise InvalidArgumentError("train_multi_turn needs config.max_turns (the turn limit).")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    trainer = MultiTurnGRPOTrainer(
        model=model,
        args=config,
        env_factory=env_factory,
        tasks=load_tasks(tasks) if tasks is not None else None,
        envs=envs,
        val_tasks=load_tasks(val_tasks) if val_tasks is not None else None,
        processing_class=processing_class,
        oracle=oracle,
        callbacks=callbacks,
        reward_funcs=reward_funcs,
        agent=agent,
        agent_scorer=agent_scorer,
    )
    trainer.train(resume_from_checkpoint=resume_from_checkpoint)
    return trainer
