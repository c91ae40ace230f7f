"""The SFT warm start of a mixture run (``sft:`` beside ``envs:`` in a ``train.py`` config):
each environment's oracle demonstrations, in shares by weight.

The ``sft.episodes`` transcripts are split among the environments by the rule that splits
GRPO's groups (:func:`~trainers.mixture.env.stratified_slots`): transcript ``n`` goes to an
environment by that rule, so each environment gets ``episodes * weight / sum(weights)`` of
them within one (:func:`sft_episode_counts`). Each environment's registered oracle plays its
share on tasks outside every split (:func:`~trainers.pipeline.sft.sft_tasks`, with the entry's
``task_options``), in the entry's action format. The rows are laid out in slot order
(:func:`interleaved_rows`), so any prefix of the data (a run its time budget stops) holds every
environment at its share.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llm_gym.errors import InvalidArgumentError
from trainers.mixture.env import stratified_slots
from trainers.sft.settings import SFTSettings

__all__ = [
    "check_mixture_sft",
    "interleaved_rows",
    "mixture_sft_dataset",
    "sft_episode_counts",
]

ONE_ENV_SETTINGS = (
    "oracle",
    "oracle_options",
    "short_context_oracle",
    "short_context_oracle_options",
    "task_options",
)
"""``sft`` keys that name one environment's demonstrator or task generator."""


def sft_episode_counts(weights: Sequence[float], episodes: int) -> list[int]:
    """Each environment's share of ``episodes`` transcripts: the count of the first
    ``episodes`` slots of the stratified rule that goes to it (each within one of
    ``episodes * weight / sum(weights)``, the counts sum to ``episodes``).

    Example:
        >>> sft_episode_counts([2, 1, 1], 8)
        [4, 2, 2]
        >>> sft_episode_counts([4, 2, 2, 1, 1], 7)
        [3, 2, 1, 1, 0]
    """
    counts = [0] * len(weights)
    for env in stratified_slots(weights, counts, episodes):
        counts[env] += 1
    return counts


def interleaved_rows(weights: Sequence[float], made: Sequence[int]) -> list[int]:
    """Indices into the environments' rows laid end to end (``made[i]`` rows of environment
    ``i``, in the mixture's order) in slot order: the stratified sequence, each environment's
    rows in their order, an environment that has none left skipped.

    Example:
        >>> interleaved_rows([2, 1, 1], [4, 2, 2])  # rows 0-3, 4-5, 6-7
        [0, 4, 1, 6, 2, 5, 3, 7]
        >>> interleaved_rows([1, 1], [1, 3])  # the first ran out (failed demonstrations dropped)
        [0, 1, 2, 3]
    """
    starts = [sum(made[:i]) for i in range(len(made))]
    taken = [0] * len(made)
    order: list[int] = []
    drawn = [0] * len(weights)
    while len(order) < sum(made):
        env = stratified_slots(weights, drawn, 1)[0]
        drawn[env] += 1
        if taken[env] < made[env]:
            order.append(starts[env] + taken[env])
            taken[env] += 1
    return order


def check_mixture_sft(sft: SFTSettings) -> None:
    """Refuse ``sft`` settings a mixture's warm start cannot honour: a source other than the
    oracles, or a key that names one environment's demonstrator or task generator (each
    environment plays its registered oracle on its entry's ``task_options``)."""
    if sft.source != "oracle":
        raise InvalidArgumentError(
            f"sft.source {sft.source!r} with envs: a mixture's warm start reads each "
            "environment's oracle demonstrations (sft.source: oracle). Warm-start from "
            "transcripts in a run of its own (env: ..., grpo.num_steps: 0) and name its final "
            "model as model:."
        )
    named = [name for name in ONE_ENV_SETTINGS if getattr(sft, name) is not None]
    if named:
        raise InvalidArgumentError(
            f"sft.{named[0]} names one environment's demonstrator or task generator; with envs "
            "each environment plays its registered oracle on its entry's task_options. Remove "
            f"sft.{named[0]}, or warm-start in a run of its own (env: ...)."
        )


def mixture_sft_dataset(
    envs: Sequence[Any],
    entries: Sequence[Any],
    sft: SFTSettings,
    seed: int,
    default_format: str | None,
    tokenizer: Any,
) -> tuple[Any, dict[str, int]]:
    """The warm start's transcripts of a mixture (see the module docstring) and the rows each
    environment made (fewer than its share where ``sft.only_successful`` drops failures).

    Args:
        envs: The run's :class:`~trainers.mixture.env.MixtureEnv` s (names, weights, formats).
        entries: Their config entries (:class:`~trainers.mixture.config.MixtureEntry`: ids,
            task options), in the same order.
        sft: The warm start's settings (``episodes``, ``only_successful``).
        seed: The run's seed (the SFT tasks' generator).
        default_format: The action format of an entry without its own (``grpo.action_format``).
        tokenizer: The model's tokenizer (its template chooses an ``"auto"`` format).
    """
    from datasets import Dataset

    from llm_gym.core.registry import env_entry
    from trainers.pipeline.sft import sft_tasks
    from trainers.sft.data import oracle_sft_dataset

    weights = [float(env.weight) for env in envs]
    counts = sft_episode_counts(weights, sft.episodes)
    parts, made = [], {}
    for env, spec, count in zip(envs, entries, counts, strict=True):
        if count == 0:
            made[env.name] = 0
            continue
        entry = env_entry(spec.id)
        tasks = sft_tasks(entry, count, seed, spec.task_options)
        rows = oracle_sft_dataset(
            entry,
            tasks,
            action_format=env.action_format or default_format or entry.requested_action_format,
            max_turns=env.max_turns,
            only_successful=sft.only_successful,
            tokenizer=tokenizer,
        )
        made[env.name] = len(rows)
        if len(rows):
            parts.append(rows)
    if not parts:
        raise InvalidArgumentError(
            f"The mixture's warm start made no transcript ({sft.episodes} episodes by weight "
            f"{dict(zip(made, counts, strict=True))}); raise sft.episodes, or set "
            "sft.only_successful: false."
        )
    # One Arrow table from the rows: the environments' ``messages`` differ in their fields (a
    # tool message's ``name``), which concatenating their tables refuses.
    rows = [row for part in parts for row in part]
    order = interleaved_rows(weights, list(made.values()))
    return Dataset.from_list([rows[i] for i in order]), made
