"""Dynamic sampling: collected groups without a learning signal are set aside as spares and
the batch is refilled, for at most ``max_sampling_attempts`` collection rounds (DAPO).

What counts as a signal depends on the advantage estimator (:data:`GroupSignal`; the config's
choice in :func:`trainers.grpo.rejection_sampling.group_signal`); the pool, the refills and the
budget are the same for every estimator.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias, TypeVar

from trainers.grpo.advantages import is_zero_variance

__all__ = ["GroupSignal", "varied_rewards", "GroupPool", "refill_tasks"]

T = TypeVar("T")


GroupSignal: TypeAlias = Callable[[Sequence[Any], Sequence[float]], bool]
"""``(episodes, shaped_rewards) -> bool``: whether a collected group carries a learning signal
under the run's advantage estimator (dynamic sampling sets the others aside and refills)."""


def varied_rewards(group: Sequence[Any], rewards_G: Sequence[float]) -> bool:
    """GRPO's signal: the group's shaped rewards are not all equal (:func:`is_zero_variance`),
    so its group-relative advantages are not all zero."""
    return not is_zero_variance(rewards_G)


@dataclass
class GroupPool:
    """Dynamic sampling's collected groups, those with a learning signal first.

    A group without a signal (:attr:`signal`: by default its shaped rewards are all equal, so its
    advantages are all zero) is kept as a spare that only fills the batch when too few groups
    carry a signal.

    Example:
        >>> pool = GroupPool(wanted=2)
        >>> pool.add("a", [1.0, 1.0])
        >>> pool.add("b", [0.0, 1.0])
        >>> pool.deficit, pool.zero_variance, pool.collected
        (1, 1, 2)
        >>> pool.batch()
        (['b', 'a'], [[0.0, 1.0], [1.0, 1.0]])
    """

    wanted: int
    """The groups a batch takes."""
    kept: list[tuple[Any, list[float]]] = field(default_factory=list)
    """The groups with a learning signal, with their shaped rewards, in collection order."""
    spare: list[tuple[Any, list[float]]] = field(default_factory=list)
    """The groups without one, with their shaped rewards, in collection order."""
    signal: GroupSignal = varied_rewards
    """Whether a group carries a learning signal (:func:`varied_rewards` for GRPO; RFT's and
    on-policy distillation's in :func:`trainers.grpo.rejection_sampling.group_signal`)."""

    def add(self, group: Any, rewards_G: list[float]) -> None:
        """Pool a collected group (its episodes) with its shaped rewards."""
        (self.kept if self.signal(group, rewards_G) else self.spare).append((group, rewards_G))

    @property
    def deficit(self) -> int:
        """Groups with a signal still missing from a full batch."""
        return max(0, self.wanted - len(self.kept))

    @property
    def collected(self) -> int:
        """Groups pooled so far."""
        return len(self.kept) + len(self.spare)

    @property
    def zero_variance(self) -> int:
        """Groups without a signal pooled so far (zero-variance ones, for GRPO)."""
        return len(self.spare)

    def batch(self) -> tuple[list[Any], list[list[float]]]:
        """The batch's groups and their shaped rewards: ``wanted`` groups (fewer when fewer
        were collected), signal-carrying ones first."""
        chosen = (self.kept + self.spare)[: self.wanted]
        return [group for group, _ in chosen], [rewards for _, rewards in chosen]


def refill_tasks(tasks: Sequence[T], count: int, seed: tuple[int, ...]) -> list[T]:
    """``count`` tasks drawn with replacement for a dynamic-sampling refill, seeded by ``seed``
    (the run's task seed, step, attempt and rank: a resumed run draws the same ones).

    Example:
        >>> refill_tasks(["a", "b", "c"], 4, (0, 1, 0, 0)) == refill_tasks("abc", 4, (0, 1, 0, 0))
        True
    """
    rng = random.Random(hash(seed))
    return [tasks[rng.randrange(len(tasks))] for _ in range(count)]
