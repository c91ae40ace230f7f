"""The trainer's side of a mixture of environments: which groups a step plays, how each
environment's episodes run, when each is validated, and the position a checkpoint keeps.

:class:`MixtureRun` is built by :class:`~trainers.grpo.trainer.MultiTurnGRPOTrainer` from its
``envs`` (:class:`~trainers.mixture.env.MixtureEnv`); the draw itself is
:mod:`trainers.mixture.env`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from llm_gym.core.factories import EnvFactory, as_env_factory
from llm_gym.core.task import Task
from llm_gym.errors import InvalidArgumentError
from trainers.grpo.rollouts import MixturePart
from trainers.mixture.env import (
    MixtureDraw,
    MixtureEnv,
    check_mixture,
    load_mixture_state,
    refill_slots,
    save_mixture_state,
)

__all__ = ["MixtureRun"]


class MixtureRun:
    """A run's mixture (see the module docstring).

    Args:
        envs: The environments and their settings.
        args: The run's :class:`~trainers.MultiTurnGRPOConfig` (defaults of each env's
            settings, the task seed).
        rank: This process's index.
        world: The number of processes.
    """

    def __init__(self, envs: Sequence[MixtureEnv], args: Any, rank: int = 0, world: int = 1):
        self.envs = check_mixture(envs)
        self.args = args
        self.rank, self.world = rank, world
        self.names = [env.name for env in self.envs]
        self.weights = [float(env.weight) for env in self.envs]
        self.factories: dict[str, EnvFactory] = {
            env.name: as_env_factory(env.env_factory) for env in self.envs
        }
        self.offsets = [0, *itertools.accumulate(len(env.tasks) for env in self.envs)]
        self.draw = self._new_draw(0)
        self.async_draw: MixtureDraw | None = None
        self.resume_position: int | None = None
        """The position a resumed run's checkpoint saved (async collection starts there)."""

    @classmethod
    def or_one_env(
        cls, envs: Any, env_factory: Any, tasks: Any, val_tasks: Any, args: Any
    ) -> tuple[MixtureRun | None, Any, list[Task]]:
        """The trainer's arguments checked: ``(mixture, env_factory, tasks)`` of a mixture
        (``envs``; its first env's factory, every env's tasks) or of one environment."""
        if envs is not None:
            if env_factory is not None or tasks is not None or val_tasks is not None:
                raise InvalidArgumentError(
                    "Pass envs (a mixture, each env with its own tasks) or env_factory with "
                    "tasks and val_tasks, not both."
                )
            if getattr(args, "difficulty_sampling", None) is not None:
                raise InvalidArgumentError(
                    "difficulty_sampling draws the tasks of one environment; a mixture draws by "
                    "weight (envs): leave difficulty_sampling unset with envs."
                )
            mixture = cls(envs, args)
            return mixture, mixture.envs[0].env_factory, mixture.tasks
        if env_factory is None or tasks is None:
            raise InvalidArgumentError("Pass env_factory and tasks, or envs (a mixture).")
        return None, env_factory, list(tasks)

    def set_process(self, rank: int, world: int) -> None:
        """Play process ``rank``'s share of ``world`` (the draw starts over)."""
        self.rank, self.world = rank, world
        self.draw = self._new_draw(0)

    def _new_draw(self, position: int) -> MixtureDraw:
        counts = [len(env.tasks) for env in self.envs]
        seed = self.args.task_seed
        return MixtureDraw(
            self.weights, counts, seed, rank=self.rank, world=self.world, position=position
        )

    @property
    def tasks(self) -> list[Task]:
        """Every environment's training tasks, one list (environment by environment)."""
        return [task for env in self.envs for task in env.tasks]

    # --- the draw ------------------------------------------------------------------------------

    def step_picks(self, step: int, wanted: int) -> list[tuple[int, Task]]:
        """Lockstep step ``step``'s ``(env index, task)`` for this process: its ``wanted``
        slots from position ``step * wanted`` (a resumed run continues the same draw)."""
        if self.draw.position != step * wanted:
            self.draw.seek(step * wanted)
        return [(env, self.envs[env].tasks[task]) for env, task in self.draw.take(wanted)]

    def refill_picks(self, count: int, seed: tuple[int, ...]) -> list[tuple[int, Task]]:
        """A dynamic-sampling refill's ``(env index, task)`` pairs
        (:func:`~trainers.mixture.env.refill_slots`)."""
        counts = [len(env.tasks) for env in self.envs]
        picks = refill_slots(self.weights, counts, count, seed)
        return [(env, self.envs[env].tasks[task]) for env, task in picks]

    def async_order(self) -> Iterator[int]:
        """Indices into :attr:`tasks` in the order async collection starts groups, from the
        resumed position (or the start)."""
        self.async_draw = draw = self._new_draw(self.resume_position or 0)
        return (self.offsets[env] + task for env, task in draw)

    def locate(self, index: int) -> tuple[int, Task]:
        """``(env index, task)`` of index ``index`` of :attr:`tasks`."""
        env = next(i for i in range(len(self.envs)) if index < self.offsets[i + 1])
        return env, self.envs[env].tasks[index - self.offsets[env]]

    def save(self, checkpoint: str) -> None:
        """Write this process's position into the checkpoint folder ``checkpoint``."""
        save_mixture_state(checkpoint, self.rank, self.position, self.names, self.weights)

    def resume(self, checkpoint: str | bool | None, output_dir: str) -> None:
        """Continue the draw from ``checkpoint`` (True: the last one in ``output_dir``; None or
        False: start afresh)."""
        if checkpoint is True:
            from transformers.trainer_utils import get_last_checkpoint

            checkpoint = get_last_checkpoint(output_dir)
        if checkpoint:
            state = load_mixture_state(str(checkpoint), self.rank, self.names, self.weights)
            self.resume_position = state

    @property
    def position(self) -> int:
        """This process's position in the draw: slots started (async) or played (lockstep)."""
        return (self.async_draw or self.draw).position

    # --- how episodes run ----------------------------------------------------------------------

    def max_turns(self, env: int, validation: bool) -> int:
        """Environment ``env``'s turn limit in training or in validation."""
        spec, args = self.envs[env], self.args
        if validation:
            own = spec.val_max_turns or spec.max_turns
            return own or args.validation_max_turns or 1
        return spec.max_turns or args.max_turns or 1

    def parts(self, picks: Sequence[tuple[int, Task]], validation: bool) -> list[MixturePart]:
        """The picks as one :class:`~trainers.grpo.rollouts.MixturePart` per environment, in the
        mixture's order."""
        args = self.args
        out = []
        for index, spec in enumerate(self.envs):
            tasks = [task for env, task in picks if env == index]
            if not tasks:
                continue
            turns = self.max_turns(index, validation)
            settings = args.rollout_settings(turns, spec.action_format)
            factory = self.factories[spec.name]
            out.append(MixturePart(spec.name, factory, tasks, settings, spec.oracle))
        return out

    # --- validation ----------------------------------------------------------------------------

    def interval(self, env: int) -> int | None:
        """Environment ``env``'s validation interval (None: not validated)."""
        if not self.envs[env].val_tasks:
            return None
        return self.envs[env].validation_interval or self.args.validation_interval

    def validation_due(self, when: Callable[[int], bool]) -> list[int]:
        """The environments validated now: those with an interval that ``when`` accepts."""
        intervals = [(env, self.interval(env)) for env in range(len(self.envs))]
        return [env for env, every in intervals if every is not None and when(every)]
