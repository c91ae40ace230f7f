"""``envs:`` in a ``train.py`` config: a mixture of registered environments, each with its own
settings, and how it becomes the trainer's :class:`~trainers.mixture.env.MixtureEnv` list::

    envs:
      - {id: ToolUseGame-v0, weight: 2, max_turns: 6, task_options: {world_seed: varied}}
      - {id: GuessNumber-v0, weight: 1, val_max_turns: 10, validation_interval: 5}

Each entry is a :class:`MixtureEntry`; a key it does not have is refused by name.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from llm_gym.errors import InvalidArgumentError, did_you_mean
from trainers.grpo.config.field_types import check_field_types
from trainers.mixture.env import MixtureEnv, check_mixture

__all__ = ["MixtureEntry", "mixture_entries", "mixture_envs"]


@dataclass
class MixtureEntry:
    """One environment of a config's ``envs:`` list."""

    id: str
    """A registered environment id (``ToolUseGame-v0``)."""
    name: str | None = None
    """Its name in metrics and records (None: the id); needed when one id appears twice."""
    weight: float = 1.0
    """Its share of each step's groups: ``weight / the sum of the weights`` (> 0)."""
    max_turns: int | None = None
    """Its turn limit in training (None: the env's registered one)."""
    task_options: dict[str, Any] = field(default_factory=dict)
    """Options of its task source for the training tasks (``{"world_seed": "varied"}``)."""
    split: str = "train"
    """The split its training tasks come from."""
    action_format: str | None = None
    """How its replies are parsed (None: ``grpo.action_format``)."""
    val_tasks: int | None = None
    """Validation tasks from its ``val`` split (None: the config's ``val_tasks``; 0: none)."""
    validation_interval: int | None = None
    """Validate it every this many steps (None: ``grpo.validation_interval``)."""
    val_max_turns: int | None = None
    """Its turn limit in validation and the final evaluation (None: its ``max_turns``)."""

    def __post_init__(self) -> None:
        where = f"envs[{self.id!r}]."
        check_field_types(self, where)
        if not isinstance(self.task_options, dict):
            raise InvalidArgumentError(
                f"{where}task_options must be a mapping of options, actual value: "
                f"{self.task_options!r:.80}."
            )
        if self.val_tasks is not None and self.val_tasks < 0:
            raise InvalidArgumentError(
                f"{where}val_tasks must be an integer >= 0, actual value: {self.val_tasks!r}."
            )

    @property
    def label(self) -> str:
        """Its name in metrics and records."""
        return self.name or self.id


def mixture_entries(data: Any) -> list[MixtureEntry]:
    """A config's ``envs:`` value as entries: a list of mappings, each with an ``id``.

    Raises:
        InvalidArgumentError: not a non-empty list of mappings, an entry without ``id``, a key
            an entry does not have (with the closest one), or a value of the wrong type.
    """
    if not isinstance(data, list) or not data:
        raise InvalidArgumentError(
            "envs must be a non-empty list of environments ([{id: ToolUseGame-v0, weight: 2}, "
            f"{{id: GuessNumber-v0}}]), actual value: {data!r:.80}."
        )
    names = [f.name for f in dataclasses.fields(MixtureEntry)]
    entries = []
    for i, item in enumerate(data):
        if isinstance(item, str):
            item = {"id": item}
        if not isinstance(item, dict) or "id" not in item:
            raise InvalidArgumentError(
                f"envs[{i}] must be a mapping with an id ({{id: GuessNumber-v0, weight: 1}}), "
                f"actual value: {item!r:.80}."
            )
        unknown = sorted(set(item) - set(names))
        if unknown:
            raise InvalidArgumentError(
                f"Unknown key(s) {unknown} in envs[{i}]; allowed: {names}."
                f"{did_you_mean(str(unknown[0]), names)}"
            )
        entries.append(MixtureEntry(**item))
    labels = [entry.label for entry in entries]
    twice = sorted({label for label in labels if labels.count(label) > 1})
    if twice:
        raise InvalidArgumentError(
            f"envs names {twice} more than once; give each entry of one id a name of its own "
            "(name: ToolUseGame-v0-hard)."
        )
    return entries


def mixture_envs(
    entries: list[MixtureEntry], val_tasks: int, max_turns: int | None = None
) -> list[MixtureEnv]:
    """The trainer's mixture: each entry's registry entry resolved, its training tasks read
    (``split`` with ``task_options``) and its validation tasks (the first ``val_tasks`` of its
    ``val`` split; ``val_tasks``: the config's default). Its turn limit: its own, else
    ``max_turns`` (``grpo.max_turns``), else the env's registered one."""
    from llm_gym.core.registry import env_entry

    envs = []
    for spec in entries:
        entry = env_entry(spec.id)
        count = spec.val_tasks if spec.val_tasks is not None else val_tasks
        envs.append(
            MixtureEnv(
                name=spec.label,
                env_factory=entry.env_factory(),
                tasks=entry.tasks(spec.split, **spec.task_options),
                weight=spec.weight,
                max_turns=spec.max_turns or max_turns or entry.max_turns,
                action_format=spec.action_format,
                val_tasks=entry.tasks("val")[:count] if count else [],
                validation_interval=spec.validation_interval,
                val_max_turns=spec.val_max_turns,
                oracle=entry.oracle(),
            )
        )
    return check_mixture(envs)
