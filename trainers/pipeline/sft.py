"""The pipeline's SFT warm start (``sft:`` in a ``train.py`` config): its tasks, its
demonstrators or document 002's ``sft_completion`` targets, and the checks of its source; the
training itself, both phases, is :func:`trainers.sft.train.sft_warm_start`'s."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from llm_gym.errors import InvalidArgumentError
from trainers.sft.settings import SFTSettings

__all__ = [
    "check_sft_source",
    "demonstrator",
    "multi_turn_environment",
    "sft_completion_dataset",
    "sft_tasks",
]


def demonstrator(spec: str | None, options: dict[str, Any] | None, resolve: Any) -> Any:
    """A demonstrator: ``spec`` resolved (called with ``options`` when given); None: the
    environment's registered oracle."""
    if spec is None:
        if options:
            raise InvalidArgumentError("demonstrator options need the demonstrator (the factory).")
        return None
    found = resolve(spec)
    return found(**options) if options else found


def check_sft_source(sft: SFTSettings, entry: Any) -> None:
    """Refuse an ``sft_completion`` or ``episodes`` source that cannot run as configured:
    beside a demonstrator setting (neither runs a demonstrator), ``sft_completion`` for an
    environment that is not a document-002 one (:func:`multi_turn_environment`), ``episodes``
    whose file is missing. Nothing to check for ``oracle``."""
    if sft.source == "oracle":
        return
    demonstrators = ("oracle", "oracle_options", "short_context_oracle",
                     "short_context_oracle_options")  # fmt: skip
    named = [name for name in demonstrators if getattr(sft, name) is not None]
    if named:
        raise InvalidArgumentError(
            f"sft.{named[0]} sets a demonstrator, and sft.source {sft.source!r} runs none "
            "(its transcripts are given); remove it, or set sft.source to 'oracle'."
        )
    if sft.source == "sft_completion":
        multi_turn_environment(entry)
    elif not Path(str(sft.from_episodes)).exists():
        raise InvalidArgumentError(
            f"sft.from_episodes {sft.from_episodes!r:.200} does not exist; name an episodes "
            "JSONL file or folder (llm-gym eval --save-episodes, the trainer's save_episodes)."
        )


def multi_turn_environment(entry: Any) -> tuple[Any, str]:
    """The document-002 environment (an ``EnvironmentMultiTurn``, built for the train split)
    behind the registry entry ``entry``, and the ``prompt_text`` it is registered with.

    Raises:
        InvalidArgumentError: ``entry``'s environment is not a document-002 environment; the
            error names it and the remedies.
    """
    from llm_gym.environments import MultiTurnEnvFactory

    factory = entry.env_factory()
    if not isinstance(factory, MultiTurnEnvFactory):
        raise InvalidArgumentError(
            "sft.source 'sft_completion' reads a document-002 environment's "
            f"sft_completion(example), and {entry.id} is not one (its environment is "
            f"{entry.env_spec!r:.80}, not an EnvironmentMultiTurn); set sft.source to 'oracle' "
            "(the environment's oracle transcripts), or train a document-002 environment "
            "(Refund-v0, or one registered with register_multi_turn_env)."
        )
    return factory.environment_for("train"), factory.prompt_text


def sft_completion_dataset(entry: Any, tasks: list[Any]) -> Any:
    """Document 002's SFT rows of ``tasks`` for ``entry``'s environment:
    ``env.start_episode(example, prompt_text) + env.sft_completion(example)`` each
    (:func:`trainers.sft.data.sft_dataset_from_multi_turn`; SFT runs no ``step_episode``)."""
    from trainers.sft.data import sft_dataset_from_multi_turn

    environment, prompt_text = multi_turn_environment(entry)
    return sft_dataset_from_multi_turn(environment, tasks, prompt_text)


def sft_tasks(
    entry: Any,
    episodes: int,
    seed: int,
    options: dict[str, Any] | None = None,
    generator_options: dict[str, Any] | None = None,
) -> list[Any]:
    """``episodes`` distinct tasks for the SFT warm start, none of them in any split.

    GRPO then trains on the train split, on tasks the warm-started model has never seen: on
    tasks it was fitted to, a success can come from recalling the memorised answer instead of
    reading the tool results, and reinforcing that does not carry over to held-out tasks (we
    measured GRPO on SFT-seen tasks lowering held-out success). The tasks come from the env's
    seeded generator (``generate_tasks(seed, n)`` beside its task source); an env without one
    uses its train split (cycled), and so does the rest of a count the generator cannot reach
    outside the splits (GuessNumber's and Wordle's prompts are all in its splits: their tasks
    differ only in the hidden secret). ``options`` go to both (``{"world_seed": "varied"}``),
    ``generator_options`` to the generator alone (``{"worlds_per_question": 8}``)."""
    import importlib

    from trainers.sft.data import disjoint_tasks

    options = options or {}
    train = entry.tasks("train", **options)
    spec = entry.tasks_spec
    module_name = spec.partition(":")[0] if isinstance(spec, str) else None
    generate = (
        getattr(importlib.import_module(module_name), "generate_tasks", None)
        if module_name
        else None
    )
    if generate is None:
        if generator_options:
            raise InvalidArgumentError(
                f"sft.task_options={generator_options!r} needs a task generator, and "
                f"{entry.id} has none (a generate_tasks beside its task source)."
            )
        return [train[i % len(train)] for i in range(episodes)]
    if options or generator_options:
        generate = functools.partial(generate, **options, **(generator_options or {}))
    held_out = [*train, *entry.tasks("val"), *entry.tasks("test")]
    fresh = disjoint_tasks(generate, episodes, seed=10_000 + seed, exclude=held_out)
    return [*fresh, *(train[i % len(train)] for i in range(episodes - len(fresh)))]
