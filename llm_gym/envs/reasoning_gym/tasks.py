"""reasoning-gym's procedural datasets as llm_gym task sources: seeded, split disjointly.

`reasoning-gym <https://github.com/open-thought/reasoning-gym>`_ generates question/answer
entries procedurally (``reasoning_gym.create_dataset(name, seed=..., size=...)``; entry ``i`` of a
dataset seeded ``s`` is drawn from ``random.Random(s + i)``). This module turns one dataset into
the ``split -> tasks`` source every llm_gym environment has:

* Each split draws from its own seed range (``task_seed + SPLIT_SEED_OFFSETS[split]``, far
  enough apart that no two splits ever draw the same reasoning-gym index).
* Seeds alone do not keep a small family's splits apart (two seeds can give the same question),
  so the splits are also disjoint on the question text: ``test`` is drawn first, ``val`` skips
  every ``test`` question, ``train`` skips both, and no split holds a question twice. Asking for
  ``test`` therefore never builds ``train``.
* Task ids read ``reasoning_gym/<dataset>/<split>/<i>`` (``i`` counts from 0 in the split).
* reasoning-gym's generators run in a child process, each dataset build and each entry within
  ``generation_timeout_s`` (:mod:`llm_gym.envs.reasoning_gym.generation`), and no split is
  larger than :data:`MAX_SPLIT_SIZE`: options that would generate for minutes are refused.

reasoning-gym is imported on first use, never at ``import llm_gym``: registering the environments
stores only ``"module:attr"`` strings.
"""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import Mapping
from typing import Any

from llm_gym.core.factories import SPLITS
from llm_gym.core.task import Task
from llm_gym.envs.reasoning_gym.generation import (
    GENERATION_TIMEOUT_S,
    INSTALL_HINT,
    check_timeout,
    generate_entries,
    load_reasoning_gym,
    make_dataset,
)
from llm_gym.errors import InvalidArgumentError, did_you_mean

__all__ = [
    "DEFAULT_DATASET",
    "DEFAULT_MAX_ATTEMPTS",
    "DatasetTasks",
    "EXCLUDED_DATASETS",
    "GENERATION_TIMEOUT_S",
    "INSTALL_HINT",
    "MAX_ATTEMPTS_LIMIT",
    "MAX_SPLIT_SIZE",
    "REVIEWED_SCORERS",
    "SPLIT_SEED_OFFSETS",
    "SPLIT_SIZES",
    "safe_scorer",
    "TASK_SEED",
    "basic_arithmetic_tasks",
    "chain_sum_tasks",
    "check_dataset",
    "config_key",
    "dataset_config",
    "dataset_names",
    "family_relationships_tasks",
    "get_tasks",
    "load_reasoning_gym",
    "make_dataset",
    "spell_backward_tasks",
    "word_sorting_tasks",
]

# --- constants ------------------------------------------------------------------------------------

DEFAULT_DATASET = "basic_arithmetic"
"""The dataset of ``ReasoningGym-v0`` when no ``dataset`` option is given."""
EXCLUDED_DATASETS = {
    "composite": "it mixes other datasets and needs their list in its config",
}
"""reasoning-gym datasets these environments refuse, with the reason."""

REVIEWED_SCORERS = frozenset(
    {"chain_sum", "family_relationships", "spell_backward", "word_sorting"}
)
"""Datasets whose own ``score_answer`` was read and found safe on hostile text (string
comparisons, ``Decimal`` parsing, bounded loops). Together with every dataset that keeps
reasoning-gym's base scorer (an exact or substring comparison), they are the datasets offered:
other scorers may run code on the answer (``countdown``, ``puzzle24`` and the polynomial and
integration datasets parse it with sympy, which calls ``eval``) or compute without bound on it,
in the process that serves every other episode. A dataset joins this set once its scorer has
been read."""
UNREVIEWED_SCORER = (
    "its own score_answer is not reviewed for hostile answers (some reasoning-gym scorers parse "
    "the answer with sympy, which runs it as code)"
)

SPLIT_SIZES = {"train": 2000, "val": 200, "test": 200}
"""Tasks per split by default (``sizes=`` overrides any of them)."""
MAX_SPLIT_SIZE = 100_000
"""The most tasks one split may ask for, checked before anything is generated (100,000 entries
of ``basic_arithmetic`` take about 15 s to generate and a few hundred MB to hold)."""
TASK_SEED = 20261217
"""The default ``task_seed``: the same seed always gives the same tasks in the same splits."""
MAX_TASK_SEED = 2**31 - 1
"""The largest ``task_seed`` (its split seeds stay below 2**32, which every generator takes)."""
SPLIT_SEED_OFFSETS = {"train": 0, "val": 100_000_000, "test": 200_000_000}
"""Where each split's reasoning-gym seeds start, from ``task_seed``: a split draws at most
``DRAW_FACTOR * MAX_SPLIT_SIZE`` consecutive seeds, so the ranges never meet."""
SPLIT_ORDER = ("test", "val", "train")
"""The order splits claim questions in: a later split skips the questions of the earlier ones."""
DRAW_FACTOR = 10
"""A split gives up after ``DRAW_FACTOR * size`` draws (duplicates and claimed questions)."""

DEFAULT_MAX_ATTEMPTS = 1
"""Answers per episode by default: one, as reasoning-gym's own evaluation scores a model, so the
rewards compare with its published numbers. ``max_attempts=3`` turns on retry with feedback."""
MAX_ATTEMPTS_LIMIT = 10
"""The most answers an episode may allow (and the registered turn limit of these envs)."""

# --- the datasets offered ------------------------------------------------------------------------


@functools.cache
def dataset_names() -> tuple[str, ...]:
    """Every reasoning-gym dataset these environments accept, sorted (all but
    :data:`EXCLUDED_DATASETS`)."""
    registered = load_reasoning_gym().factory.DATASETS
    return tuple(
        sorted(name for name in set(registered) - set(EXCLUDED_DATASETS) if safe_scorer(name))
    )


def safe_scorer(name: str) -> bool:
    """Whether reasoning-gym's dataset ``name`` scores with the base scorer or a reviewed one
    (:data:`REVIEWED_SCORERS`)."""
    reasoning_gym = load_reasoning_gym()
    base = reasoning_gym.dataset.ProceduralDataset.score_answer
    dataset_class = reasoning_gym.factory.DATASETS[name][0]
    return dataset_class.score_answer is base or name in REVIEWED_SCORERS


@functools.cache
def _accepted() -> frozenset[str]:
    return frozenset(dataset_names())


def check_dataset(name: Any) -> str:
    """``name`` when it names an accepted reasoning-gym dataset; else an error listing them."""
    if isinstance(name, str) and name in _accepted():
        return name
    if isinstance(name, str) and name in EXCLUDED_DATASETS:
        reason = f" {name!r} is not offered: {EXCLUDED_DATASETS[name]}."
    elif isinstance(name, str) and name in load_reasoning_gym().factory.DATASETS:
        reason = f" {name!r} is not offered: {UNREVIEWED_SCORER}."
    else:
        reason = did_you_mean(name, dataset_names())
    raise InvalidArgumentError(
        f"dataset must name a reasoning-gym dataset, actual value: {name!r}.{reason} "
        f"Allowed: {list(dataset_names())}."
    )


def dataset_config(
    dataset: str, config: Mapping[str, Any] | None, timeout_s: float = GENERATION_TIMEOUT_S
) -> str:
    """``config`` (keyword arguments of the dataset's config class) checked and written as the
    canonical JSON text every cache and task carries (``"{}"`` for None). reasoning-gym builds
    the dataset from it in a child process, within ``timeout_s`` (:func:`generate_entries`)."""
    if config is None:
        return "{}"
    if not isinstance(config, Mapping) or not all(isinstance(k, str) for k in config):
        raise InvalidArgumentError(
            f"config must be a dict of {dataset!r}'s config fields, actual value: {config!r:.200}."
        )
    reserved = sorted({"seed", "size"} & set(config))
    if reserved:
        raise InvalidArgumentError(
            f"config may not set {reserved}: use the task_seed and sizes options instead."
        )
    try:
        text = json.dumps(dict(config), sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(
            f"config values must be JSON values (numbers, strings, lists, dicts): {exc}."
        ) from None
    for _ in generate_entries(dataset, text, seed=0, size=0, timeout_s=timeout_s):
        pass  # building the dataset fails here, by name, when a field is wrong or it is too slow
    return text


# --- the splits ---------------------------------------------------------------------------------


def _checked_int(name: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidArgumentError(
            f"{name} must be an int in [{low}, {high}], actual value: {value!r:.80}."
        )
    return value


def _split_sizes(sizes: Mapping[str, int] | None) -> tuple[int, ...]:
    """The size of every split, in :data:`SPLITS` order, with ``sizes`` over the defaults."""
    if sizes is None:
        sizes = {}
    if not isinstance(sizes, Mapping) or not set(sizes) <= set(SPLITS):
        raise InvalidArgumentError(
            f"sizes must be a dict from split ({list(SPLITS)}) to a number of tasks, actual "
            f"value: {sizes!r:.200}."
        )
    merged = {**SPLIT_SIZES, **sizes}
    return tuple(_checked_int(f"sizes[{s!r}]", merged[s], 1, MAX_SPLIT_SIZE) for s in SPLITS)


@functools.lru_cache(maxsize=64)
def _split_entries(
    dataset: str,
    config: str,
    task_seed: int,
    sizes: tuple[int, ...],
    split: str,
    timeout_s: float = GENERATION_TIMEOUT_S,
) -> tuple[tuple[int, int, dict[str, Any]], ...]:
    """``(reasoning-gym seed, index, entry)`` of each task of ``split``, in draw order; each
    chunk generated in a child process within ``timeout_s`` an entry (:func:`generate_entries`)."""
    claimed: set[str] = set()
    for earlier in SPLIT_ORDER[: SPLIT_ORDER.index(split)]:
        drawn = _split_entries(dataset, config, task_seed, sizes, earlier, timeout_s)
        claimed.update(entry["question"] for _, _, entry in drawn)
    size = sizes[SPLITS.index(split)]
    seed = task_seed + SPLIT_SEED_OFFSETS[split]
    found: list[tuple[int, int, dict[str, Any]]] = []
    # A chunk of `size` entries from `seed` is entries seed..seed+size-1 of the seed range; the
    # child draws chunk after chunk and is stopped once the split is full.
    draws = generate_entries(
        dataset, config, seed=seed, size=size, chunks=DRAW_FACTOR, timeout_s=timeout_s
    )
    with contextlib.closing(draws):
        for drawn in draws:
            question = drawn[2]["question"]
            if question not in claimed:
                claimed.add(question)
                found.append(drawn)
                if len(found) == size:
                    return tuple(found)
    raise InvalidArgumentError(
        f"reasoning-gym's {dataset!r} gave only {len(found)} of {size} distinct questions for "
        f"the {split!r} split in {DRAW_FACTOR * size} draws (the others repeated a question of "
        f"this split or of {list(SPLIT_ORDER[: SPLIT_ORDER.index(split)])}); ask for fewer tasks "
        "(sizes={...}) or use a config with more variety."
    )


@functools.lru_cache(maxsize=64)
def _split_tasks(
    dataset: str,
    config: str,
    task_seed: int,
    sizes: tuple[int, ...],
    max_attempts: int,
    split: str,
    timeout_s: float = GENERATION_TIMEOUT_S,
    partial_credit: bool = True,
) -> tuple[Task, ...]:
    tasks = []
    config_dict = json.loads(config)
    for i, (seed, index, entry) in enumerate(
        _split_entries(dataset, config, task_seed, sizes, split, timeout_s)
    ):
        metadata = {
            "dataset": dataset,
            "config": config_dict,
            "max_attempts": max_attempts,
            "rg_seed": seed,
            "rg_index": index,
            "entry": entry,
        }
        if not partial_credit:  # the default is left out: default tasks stay as they are
            metadata["partial_credit"] = False
        task_id = f"reasoning_gym/{dataset}/{split}/{i}"
        tasks.append(Task(entry["question"], entry["answer"], metadata, id=task_id))
    return tuple(tasks)


def get_tasks(
    split: str = "train",
    *,
    dataset: str = DEFAULT_DATASET,
    config: Mapping[str, Any] | None = None,
    task_seed: int = TASK_SEED,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    sizes: Mapping[str, int] | None = None,
    generation_timeout_s: float = GENERATION_TIMEOUT_S,
    partial_credit: bool = True,
) -> tuple[Task, ...]:
    """The tasks of ``split`` from one reasoning-gym dataset (``ReasoningGym-v0``'s source).

    Args:
        split: ``"train"``, ``"val"`` or ``"test"``; no question appears in two splits.
        dataset: The reasoning-gym dataset's name (:func:`dataset_names` lists them).
        config: Fields of the dataset's config class (``{"min_terms": 3}`` for ``chain_sum``),
            as JSON values; ``seed`` and ``size`` are set by ``task_seed`` and ``sizes``.
        task_seed: Seeds every split (int in [0, 2**31 - 1]); the same seed, the same tasks.
        max_attempts: Answers an episode allows (1 to :data:`MAX_ATTEMPTS_LIMIT`); with more
            than one, a wrong answer gets feedback and another try.
        sizes: Tasks per split over :data:`SPLIT_SIZES` (``{"train": 500}``), each at most
            :data:`MAX_SPLIT_SIZE`.
        generation_timeout_s: The most seconds reasoning-gym may take to build the dataset or
            to generate one entry (:data:`GENERATION_TIMEOUT_S` by default); past it the
            generation is stopped and the options refused. It does not change the tasks.
        partial_credit: The reward is reasoning-gym's score, partial credit included (True),
            or 1.0 for an accepted answer and 0.0 for any other (False: success alone, for
            a reward a partly right answer cannot farm).

    Each task's ``prompt`` is the entry's question, ``target`` its answer, ``metadata`` holds
    ``dataset``, ``config``, ``max_attempts``, the reasoning-gym seed and index it came from
    (``rg_seed``, ``rg_index``) and the whole ``entry`` (question, answer, metadata) that
    reasoning-gym's scorer reads.

    reasoning-gym's generators run in a child process (:mod:`.generation`), once per split and
    process: the tasks are cached.
    """
    if split not in SPLITS:
        raise InvalidArgumentError(f"split must be one of {SPLITS}, actual value: {split!r}.")
    timeout_s = check_timeout(generation_timeout_s)
    return _split_tasks(
        check_dataset(dataset),
        config_key(dataset, config, timeout_s),
        _checked_int("task_seed", task_seed, 0, MAX_TASK_SEED),
        _split_sizes(sizes),
        _checked_int("max_attempts", max_attempts, 1, MAX_ATTEMPTS_LIMIT),
        split,
        timeout_s,
        _checked_bool("partial_credit", partial_credit),
    )


def _checked_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise InvalidArgumentError(f"{name} must be true or false, actual value: {value!r:.80}.")
    return value


def config_key(
    dataset: str, config: Mapping[str, Any] | None, timeout_s: float = GENERATION_TIMEOUT_S
) -> str:
    """:func:`dataset_config`, remembered: a config checked once is not built again (every
    reset reads the tasks, and every episode's env reads its task's config). No config (None
    or ``{}``) is reasoning-gym's default one, ``"{}"``."""
    if config is None or (isinstance(config, Mapping) and not config):
        return "{}"
    try:
        key = json.dumps(dict(config), sort_keys=True, allow_nan=False)
    except (TypeError, ValueError):
        key = None
    if key is not None and (dataset, key) in _CHECKED_CONFIGS:
        return key
    key = dataset_config(dataset, config, timeout_s)
    _CHECKED_CONFIGS.add((dataset, key))
    return key


_CHECKED_CONFIGS: set[tuple[str, str]] = set()


class DatasetTasks:
    """The task source of one reasoning-gym dataset (a per-family id's ``tasks``): ``split ->
    tasks`` with the options of :func:`get_tasks` except ``dataset`` (picklable)."""

    def __init__(self, dataset: str) -> None:
        self.dataset = dataset

    def __call__(
        self,
        split: str = "train",
        *,
        config: Mapping[str, Any] | None = None,
        task_seed: int = TASK_SEED,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        sizes: Mapping[str, int] | None = None,
        generation_timeout_s: float = GENERATION_TIMEOUT_S,
        partial_credit: bool = True,
    ) -> tuple[Task, ...]:
        return get_tasks(
            split,
            dataset=self.dataset,
            config=config,
            task_seed=task_seed,
            max_attempts=max_attempts,
            sizes=sizes,
            generation_timeout_s=generation_timeout_s,
            partial_credit=partial_credit,
        )

    def __repr__(self) -> str:
        return f"DatasetTasks({self.dataset!r})"


# The per-family ids' task sources (llm_gym/envs/builtin.py names them).
basic_arithmetic_tasks = DatasetTasks("basic_arithmetic")
chain_sum_tasks = DatasetTasks("chain_sum")
spell_backward_tasks = DatasetTasks("spell_backward")
word_sorting_tasks = DatasetTasks("word_sorting")
family_relationships_tasks = DatasetTasks("family_relationships")
