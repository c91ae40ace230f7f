"""Episode groups for a training or validation step, collected with the current policy.

The trainer builds the generation policy (TRL's model unwrapped for generation, or its vLLM
engine) and hands it here with the run's rollout settings; this module runs the groups through
:func:`llm_gym.rollout.collect_groups_async`, all at once or, for sequential validation, one
episode at a time; a mixture's environments together (:func:`collect_mixture_groups`);
:func:`save_step_episodes` writes a step's episodes as data
(``save_episodes``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from llm_gym.aio import run_sync
from llm_gym.core.factories import EnvFactory, Oracle
from llm_gym.core.registry import as_env_entry, entry_of_factory
from llm_gym.core.task import Task
from llm_gym.eval.episode_files import episode_record, write_episodes
from llm_gym.policies import Policy
from llm_gym.rollout.episode import Episode
from llm_gym.rollout.loop import collect_groups_async
from llm_gym.rollout.settings import RolloutSettings

__all__ = [
    "MixturePart",
    "collect_episode_groups",
    "collect_mixture_groups",
    "save_step_episodes",
    "step_episodes_path",
    "torch_threads",
]


@dataclasses.dataclass(frozen=True)
class MixturePart:
    """The groups one environment of a mixture plays in one collection."""

    name: str
    """The environment's name in the mixture (each episode's ``env_id``)."""
    env_factory: EnvFactory | Any
    """Builds its episodes' environments."""
    tasks: Sequence[Task]
    """Its tasks, one group each."""
    settings: RolloutSettings
    """How its episodes run (its turn limit, how its replies are parsed)."""
    oracle: Oracle | None = None
    """Its scripted expert (scripted policies only)."""


@contextlib.contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """Run the block with ``threads`` torch intra-op threads (None: as they are), then restore.

    Threads the block starts (the engine's worker threads) take the setting too. Small decode
    steps on CPU often run faster on one thread than on several.
    """
    if threads is None:
        yield
        return
    import torch

    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


def collect_episode_groups(
    env_factory: EnvFactory,
    tasks: Sequence[Task],
    policy: Policy,
    settings: RolloutSettings,
    *,
    episodes_per_task: int,
    oracle: Oracle | None,
    tokenizer: Any,
    sequential: bool = False,
) -> list[list[Episode]]:
    """``groups[i]``: ``episodes_per_task`` episodes of ``tasks[i]``.

    With ``sequential`` every episode runs alone (the seeds' ``sequential_validation``: no
    batching effects on the numbers), else every episode of every group runs concurrently.
    """

    async def collect(chunk: Sequence[Task], per_task: int) -> list[list[Episode]]:
        return await collect_groups_async(
            env_factory, chunk, policy, settings,
            episodes_per_task=per_task, oracle=oracle, tokenizer=tokenizer,
        )  # fmt: skip

    if not sequential:
        return run_sync(collect(tasks, episodes_per_task))
    return [
        [run_sync(collect([task], 1))[0][0] for _ in range(episodes_per_task)] for task in tasks
    ]


def collect_mixture_groups(
    parts: Sequence[MixturePart],
    policy: Policy,
    *,
    episodes_per_task: int,
    oracle: Oracle | None,
    tokenizer: Any,
    sequential: bool = False,
) -> list[list[Episode]]:
    """Groups of a mixture's environments: ``parts`` says, for each environment that plays,
    its tasks and how it runs; the groups come back part by part, in the parts' order, each
    episode's ``env_id`` set to its part's name.

    A policy that streams (``HFPolicy``) serves every environment at once on one stream, so
    generation batches across them; any other policy serves the parts one after another (one
    collection's waves at a time, as a vLLM or remote engine is driven elsewhere).
    """

    async def one(part: MixturePart, stream: Any, key: Any) -> list[list[Episode]]:
        groups = await collect_groups_async(
            part.env_factory, part.tasks, policy, part.settings,
            episodes_per_task=episodes_per_task, oracle=part.oracle or oracle,
            tokenizer=tokenizer, stream=stream, key_space=key,
        )  # fmt: skip
        for group in groups:
            for episode in group:
                episode.env_id = part.name
        return groups

    async def together() -> list[list[list[Episode]]]:
        open_stream = getattr(policy, "open_stream", None)
        if open_stream is None:
            return [await one(part, None, None) for part in parts]
        stream = open_stream()
        try:
            return list(await asyncio.gather(*(one(p, stream, i) for i, p in enumerate(parts))))
        finally:
            await stream.aclose()

    if sequential:  # every episode alone: one part, one task, one episode at a time
        return [
            [
                run_sync(one(dataclasses.replace(part, tasks=[task]), None, None))[0][0]
                for _ in range(episodes_per_task)
            ]
            for part in parts
            for task in part.tasks
        ]
    return [group for part_groups in run_sync(together()) for group in part_groups]


def step_episodes_path(folder: str | Path, step: int) -> Path:
    """The file of the episodes that train optimizer step ``step`` (from 1).

    Example:
        >>> step_episodes_path("runs/eps", 3).name
        'step-000003.jsonl'
    """
    return Path(folder) / f"step-{step:06d}.jsonl"


def save_step_episodes(
    folder: str | Path,
    step: int,
    episodes: Sequence[Episode],
    env_factory: EnvFactory | Mapping[str, EnvFactory],
    policy: dict[str, Any],
) -> Path:
    """Write the episodes that train optimizer step ``step`` to
    :func:`step_episodes_path` as JSONL (:mod:`llm_gym.eval.episode_files`): the environment
    named by its registry entry (else the factory's name, no version), ``policy_version`` the
    step whose weights sampled them (``step - 1``; the per-token versions of async training
    are in each turn's and sample's ``policy_versions``). In a mixture ``env_factory`` maps
    each environment's name to its factory and every episode is named by its own
    (``episode.env_id``)."""

    def name(factory: EnvFactory) -> tuple[str, str | None]:
        entry = entry_of_factory(factory)
        return (entry.id, entry.version) if entry else (as_env_entry(factory).id, None)

    mixed = isinstance(env_factory, Mapping)
    factories = env_factory if isinstance(env_factory, Mapping) else {None: env_factory}
    names = {key: name(factory) for key, factory in factories.items()}
    records = (
        episode_record(
            e,
            env_id=names[e.env_id if mixed else None][0],
            env_version=names[e.env_id if mixed else None][1],
            policy=policy,
            policy_version=step - 1,
        )
        for e in episodes
    )
    return write_episodes(step_episodes_path(folder, step), records)
