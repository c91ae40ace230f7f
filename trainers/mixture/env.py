"""A weighted mixture of environments in one GRPO run: its records and its draw.

A run on several environments gives each a weight; every step's groups are drawn from them by a
*stratified* rule rather than at random, so an environment's share of the groups stays within
one group of its weight's share at every point of the run and a small weight still appears
(:func:`stratified_slots`). The run's groups form one sequence of *slots*: slot ``n`` (from 0)
goes to an environment by that rule, and each environment plays its own tasks in a seeded
shuffle, reshuffled every epoch (:func:`~trainers.async_rl.rollout.task_order`). A lockstep step
``s`` of ``B`` groups plays slots ``s*B`` to ``s*B + B - 1``; process ``r`` of ``w`` plays the
slots ``n`` with ``n % w == r``; async collection plays them in order as its groups start.
:class:`MixtureDraw` walks the sequence; its position is the whole of its state, so a resumed
run continues the same draw (the checkpoint keeps the position: :func:`save_mixture_state`).

Dynamic-sampling refills draw outside the sequence: by weight at random, seeded by the run's
task seed, the step, the attempt and the rank (:func:`refill_slots`).
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

from llm_gym.core.factories import EnvFactory, Oracle, as_task
from llm_gym.core.task import Task
from llm_gym.errors import InvalidArgumentError
from trainers.async_rl.rollout import task_order

__all__ = [
    "MIXTURE_STATE_FILE",
    "MixtureDraw",
    "MixtureEnv",
    "check_mixture",
    "load_mixture_state",
    "refill_slots",
    "save_mixture_state",
    "stratified_slots",
]

MIXTURE_STATE_FILE = "mixture_state-{rank}.json"
"""The file of a checkpoint that holds a process's position in the mixture's draw."""

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$")


@dataclass
class MixtureEnv:
    """One environment of a mixture, with its own settings (None: the run's)."""

    name: str
    """Its name in metrics (``env/<name>/reward``) and records: the env id, or another name
    when one id appears twice (with other task options)."""
    env_factory: EnvFactory | Any
    """Builds each episode's environment (``task -> Env``; a class, an id or a
    ``"module:attr"`` string works too)."""
    tasks: Sequence[Task] | Any
    """Its training tasks: a list of ``Task`` (or dicts), or a ``datasets.Dataset`` (a JSONL
    file: :func:`trainers.load_tasks` reads it)."""
    weight: float = 1.0
    """Its share of the groups: ``weight / sum of the weights`` (> 0)."""
    max_turns: int | None = None
    """Its turn limit (None: the config's ``max_turns``)."""
    action_format: str | None = None
    """How its replies are parsed (None: the config's ``action_format``)."""
    val_tasks: Sequence[Task] | Any = field(default_factory=list)
    """Its validation tasks, as ``tasks`` (none: not validated)."""
    validation_interval: int | None = None
    """Validate it every this many steps (None: the config's ``validation_interval``)."""
    val_max_turns: int | None = None
    """Its turn limit in validation (None: its ``max_turns`` when set, else the config's
    ``val_max_turns`` or ``max_turns``)."""
    oracle: Oracle | None = None
    """Its scripted expert (scripted policies only)."""

    def __post_init__(self) -> None:
        where = f"envs[{self.name!r}]"
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise InvalidArgumentError(
                "A mixture's env name must be letters, digits and _ . : - (it names metrics, "
                f"env/<name>/reward), actual value: {self.name!r:.80}."
            )
        weight = self.weight
        if isinstance(weight, bool) or not isinstance(weight, int | float) or not weight > 0:
            raise InvalidArgumentError(
                f"{where}.weight must be a number > 0 (its share of the groups is weight / the "
                f"sum of the weights), actual value: {weight!r:.80}."
            )
        if weight == float("inf"):
            raise InvalidArgumentError(f"{where}.weight must be finite, actual value: inf.")
        for name in ("max_turns", "validation_interval", "val_max_turns"):
            value = getattr(self, name)
            if value is not None and (type(value) is not int or value < 1):
                raise InvalidArgumentError(
                    f"{where}.{name} must be an integer >= 1 or None (the run's), actual "
                    f"value: {value!r:.80}."
                )
        self.tasks = _task_list(self.tasks, f"{where}.tasks")
        self.val_tasks = _task_list(self.val_tasks, f"{where}.val_tasks")
        if not self.tasks:
            raise InvalidArgumentError(
                f"{where} has no training tasks; give it tasks (or leave it out of the mixture)."
            )


def _task_list(tasks: Any, where: str) -> list[Task]:
    """Tasks from a sequence of ``Task`` (or dicts, prompts) or a ``datasets.Dataset``."""
    if isinstance(tasks, str | Path) or not isinstance(tasks, Iterable):
        raise InvalidArgumentError(
            f"{where} must be a list of Task (or dicts) or a datasets.Dataset, actual value: "
            f"{tasks!r:.80}; read a JSONL file with trainers.load_tasks(path)."
        )
    return [as_task(task, f"{where}[{i}]") for i, task in enumerate(tasks)]


def check_mixture(envs: Sequence[MixtureEnv]) -> list[MixtureEnv]:
    """``envs`` as a list, checked: at least one, each a :class:`MixtureEnv`, names distinct.

    Raises:
        InvalidArgumentError: naming what is wrong and the fix.
    """
    envs = list(envs) if isinstance(envs, Sequence) and not isinstance(envs, str) else [envs]
    if not envs:
        raise InvalidArgumentError("envs must name at least one environment, actual value: [].")
    for i, env in enumerate(envs):
        if not isinstance(env, MixtureEnv):
            raise InvalidArgumentError(
                f"envs[{i}] must be a trainers.MixtureEnv (name, env_factory, tasks, weight, "
                f"...), actual type: {type(env).__name__}."
            )
    names = [env.name for env in envs]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise InvalidArgumentError(
            f"A mixture's env names must be distinct; {twice} appear twice: give each entry "
            "its own name (name: ToolUseGame-v0-hard)."
        )
    return envs


def _shares(weights: Sequence[float]) -> list[Fraction]:
    """Each weight's exact share of the total (decimal weights as written: 0.1 is 1/10)."""
    exact = [Fraction(repr(float(w))) for w in weights]
    total = sum(exact)
    return [w / total for w in exact]


def stratified_slots(weights: Sequence[float], drawn: Sequence[int], count: int) -> list[int]:
    """The environments of the next ``count`` slots, after ``drawn[i]`` slots went to each.

    The rule (earliest deadline among those behind their share): with ``p_i`` the shares and
    ``n = sum(drawn)`` the slot, the slot goes to the environment with the smallest
    ``(drawn[i] + 1) / p_i`` among those with ``drawn[i] < (n + 1) * p_i``, ties to the first.
    After any ``n`` slots every environment has had ``n * p_i`` of them within one
    (``|n * p_i - drawn[i]| < 1``), so a weight of 1/20 at 4 groups a step appears once in
    every 5 steps. Exact arithmetic: decimal weights give exact shares.

    Example:
        >>> stratified_slots([2, 1, 1], [0, 0, 0], 8)
        [0, 1, 0, 2, 0, 1, 0, 2]
        >>> stratified_slots([2, 1, 1], [2, 1, 1], 4)  # the same sequence, from slot 4
        [0, 1, 0, 2]
    """
    shares = _shares(weights)
    counts = list(drawn)
    out = []
    for _ in range(count):
        slot = sum(counts) + 1
        behind = [i for i, share in enumerate(shares) if counts[i] < slot * share]
        best = min(behind, key=lambda i: ((counts[i] + 1) / shares[i], i))
        counts[best] += 1
        out.append(best)
    return out


def refill_slots(
    weights: Sequence[float], task_counts: Sequence[int], count: int, seed: tuple[int, ...]
) -> list[tuple[int, int]]:
    """``count`` ``(env, task)`` pairs for a dynamic-sampling refill: each environment by
    weight and each of its tasks uniformly, at random, seeded by ``seed`` (the run's task seed,
    the step, the attempt and the rank: a resumed run draws the same ones).

    Example:
        >>> refill_slots([1, 1], [3, 2], 3, (0, 1, 1, 0)) == refill_slots([1, 1], [3, 2], 3,
        ...                                                            (0, 1, 1, 0))
        True
    """
    rng = random.Random(hash(seed))
    shares = [float(share) for share in _shares(weights)]
    envs = rng.choices(range(len(shares)), weights=shares, k=count)
    return [(env, rng.randrange(task_counts[env])) for env in envs]


class MixtureDraw:
    """One process's walk along the mixture's slot sequence (see the module docstring).

    Args:
        weights: The environments' weights.
        task_counts: How many training tasks each has.
        seed: Seeds each environment's task order (with its index).
        rank: This process's index: it plays the slots ``n`` with ``n % world == rank``.
        world: The number of processes.
        position: Slots of this process already played (a resumed run's saved position).
    """

    def __init__(
        self,
        weights: Sequence[float],
        task_counts: Sequence[int],
        seed: Any = 0,
        *,
        rank: int = 0,
        world: int = 1,
        position: int = 0,
    ) -> None:
        self.weights = list(weights)
        self.task_counts = list(task_counts)
        self.seed = seed
        self.rank, self.world = rank, world
        self.seek(position)

    def seek(self, position: int) -> None:
        """Stand before this process's ``position``-th slot (replayed from the start)."""
        if type(position) is not int or position < 0:
            raise InvalidArgumentError(
                f"A mixture position is an integer >= 0, actual value: {position!r:.80}."
            )
        self._drawn = [0] * len(self.weights)
        self._orders = [
            task_order(n, (self.seed, "mixture", i)) for i, n in enumerate(self.task_counts)
        ]
        self.position = 0
        self._slot = 0  # the global slot next played, by any process
        if position:
            self.take(position)

    def take(self, count: int) -> list[tuple[int, int]]:
        """This process's next ``count`` slots as ``(env index, task index within it)``."""
        out: list[tuple[int, int]] = []
        while len(out) < count:
            (env,) = stratified_slots(self.weights, self._drawn, 1)
            self._drawn[env] += 1
            task = next(self._orders[env])  # every process's slot moves the env's order
            if self._slot % self.world == self.rank:
                out.append((env, task))
                self.position += 1
            self._slot += 1
        return out

    def __iter__(self) -> Iterator[tuple[int, int]]:
        while True:
            yield self.take(1)[0]

    @property
    def drawn(self) -> list[int]:
        """Slots each environment has had so far (every process's)."""
        return list(self._drawn)


def save_mixture_state(
    folder: str | Path, rank: int, position: int, names: list[str], weights: list[float]
) -> Path:
    """Write process ``rank``'s ``position`` and the mixture it belongs to (its names and
    weights) into checkpoint ``folder``; :func:`load_mixture_state` reads it back."""
    path = Path(folder) / MIXTURE_STATE_FILE.format(rank=rank)
    state = {"position": position, "names": names, "weights": weights}
    path.write_text(json.dumps(state) + "\n")
    return path


def load_mixture_state(
    folder: str | Path, rank: int, names: list[str], weights: list[float]
) -> int | None:
    """The position saved in checkpoint ``folder`` for ``rank`` (None: the checkpoint has
    none, as one written by a run without a mixture).

    Raises:
        InvalidArgumentError: The checkpoint's mixture has other environments or weights (its
            position would continue another draw) or its file is not a saved state.
    """
    path = Path(folder) / MIXTURE_STATE_FILE.format(rank=rank)
    if not path.is_file():
        return None
    try:
        state = json.loads(path.read_text())
        position, saved_names, saved_weights = state["position"], state["names"], state["weights"]
    except (ValueError, KeyError, TypeError) as exc:
        raise InvalidArgumentError(f"{path}: not a mixture state ({exc}).") from None
    if saved_names != names or saved_weights != weights:
        saved = dict(zip(saved_names, saved_weights, strict=False))
        raise InvalidArgumentError(
            f"{path}: the checkpoint's mixture is {saved}, this run's "
            f"{dict(zip(names, weights, strict=True))}; resume with the same envs and weights, "
            "or start a new run."
        )
    if type(position) is not int or position < 0:
        raise InvalidArgumentError(f"{path}: position must be an integer >= 0, got {position!r}.")
    return position
