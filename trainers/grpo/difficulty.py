"""Online difficulty filtering: draw the tasks whose groups are likely to carry a learning signal.

GRPO learns nothing from a group whose episodes all succeed or all fail (zero variance). With
``difficulty_sampling`` set, the trainer keeps, for every training task, a pass-rate estimate from
the episodes it has already run, and draws each step's tasks in proportion to a weight:

* **estimate** ``p = (s + prior) / (n + 2 prior)``, where ``s`` and ``n`` are the task's
  discounted successes and episodes: each new group of the task first multiplies both by
  ``memory`` (1: every episode counts alike; 0.5: the latest group weighs as much as all before);
  a task never run has no estimate;
* **weight** ``w = max(floor, 1 - p^G - (1 - p)^G)`` for a group of ``G`` episodes: the chance
  the group is *not* zero-variance if its episodes succeed independently with probability ``p``;
  a task never run weighs 1 (the most);
* **draw**: ``count`` distinct tasks, task ``i`` first with probability ``w_i / sum w`` (weighted
  draw without replacement, Efraimidis-Spirakis keys ``u^(1/w)``), seeded by the run's task seed,
  the step and the process, so a rerun draws the same tasks.

The **floor** keeps every task drawn now and then, so an estimate of 0 or 1 is revisited as the
policy changes (a task solved at step 5 may be failed at step 50, and the reverse).

**Saved groups** (``difficulty/zero_variance_saved``): for each draw, the zero-variance groups
a uniform draw of as many tasks would expect minus those this draw expects, both from the
estimates at draw time (a task never run counts as ``p = 1/2``)::

    saved = count * (mean_i z_i - sum_i pi_i z_i),   z = p^G + (1 - p)^G,   pi_i = w_i / sum w

(the draw without replacement taken as independent draws with probabilities ``pi``).
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from llm_gym.errors import InvalidArgumentError
from llm_gym.eval.metrics import is_success

__all__ = [
    "DifficultySampler",
    "DifficultySettings",
    "draw_tasks",
    "draw_weight",
    "group_outcomes",
    "pass_rate",
    "zero_variance_chance",
]


@dataclass(frozen=True)
class DifficultySettings:
    """The rule's settings (the config's ``difficulty_sampling`` mapping)."""

    floor: float = 0.05
    """The least weight of a task (the most is 1): a task at the floor is drawn
    ``floor / w`` times as often as a task of weight ``w``. In (0, 1]."""
    prior: float = 0.0
    """Pseudo-successes and pseudo-failures added to every estimate (0: the plain pass rate)."""
    memory: float = 0.5
    """What a task's earlier episodes are multiplied by when a new group of it comes. In [0, 1]."""

    def __post_init__(self) -> None:
        for name, low, high, low_open in (("floor", 0.0, 1.0, True), ("prior", 0.0, math.inf,
                                          False), ("memory", 0.0, 1.0, False)):  # fmt: skip
            value = getattr(self, name)
            ok = isinstance(value, int | float) and not isinstance(value, bool)
            ok = ok and (low < value if low_open else low <= value) and value <= high
            if not ok:
                bounds = f"{'(' if low_open else '['}{low:g}, {high:g}]"
                raise InvalidArgumentError(
                    f"difficulty_sampling.{name} must be a number in {bounds}, actual value: "
                    f"{value!r:.40}."
                )

    @classmethod
    def of(cls, spec: Any) -> DifficultySettings:
        """Settings from the config's mapping (``{}``: the defaults)."""
        if isinstance(spec, DifficultySettings):
            return spec
        names = sorted(f.name for f in fields(cls))
        if not isinstance(spec, Mapping) or set(spec) - set(names):
            raise InvalidArgumentError(
                f"difficulty_sampling must be None (off) or a mapping with keys among {names} "
                f"({{}}: the defaults), actual value: {spec!r:.100}."
            )
        return cls(**spec)


def pass_rate(successes: float, episodes: float, prior: float = 0.0) -> float | None:
    """The estimate ``(s + prior) / (n + 2 prior)``; None for a task never run.

    Example:
        >>> pass_rate(3, 4), pass_rate(0, 4, prior=1.0), pass_rate(0, 0)
        (0.75, 0.16666666666666666, None)
    """
    if episodes <= 0:
        return None
    return (successes + prior) / (episodes + 2 * prior)


def zero_variance_chance(p: float, group_size: int) -> float:
    """``p^G + (1 - p)^G``: the chance a group of ``G`` is all successes or all failures.

    Example:
        >>> zero_variance_chance(0.5, 4), zero_variance_chance(1.0, 4)
        (0.125, 1.0)
    """
    return p**group_size + (1 - p) ** group_size


def draw_weight(p: float | None, group_size: int, floor: float) -> float:
    """``max(floor, 1 - p^G - (1 - p)^G)``; 1 for a task never run (``p`` None).

    Example:
        >>> draw_weight(0.5, 4, 0.05), draw_weight(0.0, 4, 0.05), draw_weight(None, 4, 0.05)
        (0.875, 0.05, 1.0)
    """
    if p is None:
        return 1.0
    return max(floor, 1.0 - zero_variance_chance(p, group_size))


def draw_tasks(weights: Sequence[float], count: int, rng: random.Random) -> list[int]:
    """``count`` task indices drawn by weight without replacement (Efraimidis-Spirakis: the
    ``count`` largest keys ``u^(1/w)``, ``u`` uniform in (0, 1)); when ``count`` exceeds the
    tasks, every task once and the rest drawn again the same way.

    Example:
        >>> draw_tasks([1.0, 0.0001, 1.0], 2, random.Random(0))
        [0, 2]
    """
    out: list[int] = []
    while len(out) < count:
        keys = [(rng.random() ** (1.0 / w), i) for i, w in enumerate(weights)]
        keys.sort(reverse=True)
        out.extend(i for _, i in keys[: count - len(out)])
    return out


def group_outcomes(
    indices: Sequence[int], groups: Sequence[Sequence[Any]]
) -> list[tuple[int, int, int]]:
    """``(task index, successes, episodes)`` of each collected group (one group per index, in
    order); success as evaluation counts it (:func:`llm_gym.eval.metrics.is_success`)."""
    return [(i, sum(map(is_success, g)), len(g)) for i, g in zip(indices, groups, strict=True)]


class DifficultySampler:
    """The per-task estimates and the draw of one run (see the module docstring).

    Example:
        >>> sampler = DifficultySampler(3, group_size=4, settings=DifficultySettings())
        >>> sampler.update(0, successes=4, episodes=4)  # solved: p = 1, weight at the floor
        >>> sampler.update(1, successes=2, episodes=4)  # p = 0.5: weight 0.875
        >>> sampler.weights()
        [0.05, 0.875, 1.0]
    """

    def __init__(self, num_tasks: int, group_size: int, settings: DifficultySettings) -> None:
        self.settings = settings
        self.group_size = group_size
        self.successes = [0.0] * num_tasks
        """Each task's discounted successes."""
        self.episodes = [0.0] * num_tasks
        """Each task's discounted episodes."""
        self.saved_total = 0.0
        """Zero-variance groups saved over the run (expected; the module docstring)."""

    @classmethod
    def of(cls, config: Any, num_tasks: int) -> DifficultySampler | None:
        """The sampler of a trainer config's ``difficulty_sampling`` over ``num_tasks`` tasks
        in groups of its ``episodes_per_task`` (None when it is off)."""
        if config.difficulty_sampling is None:
            return None
        settings = DifficultySettings.of(config.difficulty_sampling)
        return cls(num_tasks, config.episodes_per_task, settings)

    def estimate(self, index: int) -> float | None:
        """The task's pass-rate estimate (None: never run)."""
        return pass_rate(self.successes[index], self.episodes[index], self.settings.prior)

    def weights(self) -> list[float]:
        """Every task's draw weight."""
        floor, size = self.settings.floor, self.group_size
        return [draw_weight(self.estimate(i), size, floor) for i in range(len(self.episodes))]

    def draw(self, count: int, seed: tuple[int, ...]) -> tuple[list[int], float]:
        """``count`` task indices for a step, and the zero-variance groups the draw saves
        (expected, against a uniform draw)."""
        weights = self.weights()
        chances = [
            zero_variance_chance(0.5 if p is None else p, self.group_size)
            for p in map(self.estimate, range(len(weights)))
        ]
        total = sum(weights)
        uniform = sum(chances) / len(chances)
        drawn = sum(w * z for w, z in zip(weights, chances, strict=True)) / total
        saved = count * (uniform - drawn)
        self.saved_total += saved
        return draw_tasks(weights, count, random.Random(hash(seed))), saved

    def update(self, index: int, successes: float, episodes: float) -> None:
        """Add a group of the task: ``s = memory * s + successes``, likewise ``n``."""
        memory = self.settings.memory
        self.successes[index] = memory * self.successes[index] + successes
        self.episodes[index] = memory * self.episodes[index] + episodes

    def add(self, outcomes: Sequence[tuple[int, float, float]]) -> None:
        """:meth:`update` with each ``(task index, successes, episodes)``."""
        for index, successes, episodes in outcomes:
            self.update(index, successes, episodes)

    def metrics(self, saved: float) -> dict[str, float]:
        """``difficulty/...``: the step's and the run's saved groups, the tasks run so far, the
        share of tasks at the floor, and the mean estimate of the tasks run."""
        seen = [p for p in map(self.estimate, range(len(self.episodes))) if p is not None]
        at_floor = sum(w <= self.settings.floor for w in self.weights())
        return {
            "difficulty/zero_variance_saved": saved,
            "difficulty/zero_variance_saved_total": self.saved_total,
            "difficulty/tasks_seen": float(len(seen)),
            "difficulty/at_floor_ratio": at_floor / max(1, len(self.episodes)),
            "difficulty/estimate_mean": sum(seen) / len(seen) if seen else math.nan,
        }
