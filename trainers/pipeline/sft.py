"""The pipeline's SFT warm start (``sft:`` in a ``train.py`` config): its tasks, its
demonstrators or document 002's ``sft_completion`` targets, and its two phases."""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Any

from llm_gym.errors import InvalidArgumentError
from trainers.sft.settings import SFTSettings

__all__ = [
    "check_sft_source",
    "demonstrator",
    "multi_turn_environment",
    "sft_completion_dataset",
    "sft_stage",
    "sft_tasks",
    "short_share",
]


def sft_stage(
    model_path: str,
    out: Path,
    dataset: Any,
    sft: SFTSettings,
    seed: int,
    short: Any = None,
    action_format: str = "auto",
    chat_template: str | None = None,
    health_action: str = "warn",
) -> str:
    """The SFT warm start: the short-context phase (if any, on ``short``'s transcripts), then
    the full transcripts of ``dataset`` (``health_action``: :mod:`trainers.grpo.health`'s, for
    both)."""
    from trainers.sft.data import short_context_dataset
    from trainers.sft.train import sft_warm_start

    budget = sft.time_budget_s
    common = dict(
        learning_rate=sft.learning_rate,
        per_device_train_batch_size=sft.batch_size,
        seed=seed,
        action_format=action_format,
        lora=sft.lora,
        chat_template=chat_template,  # the run's (the grpo table's), for a model without one
        health_action=health_action,
    )
    warmup = sft.warmup_steps
    if sft.short_context_steps > 0:
        t = time.perf_counter()
        print(f"   phase 1: {sft.short_context_steps} steps without the system prompt", flush=True)
        model_path = str(
            sft_warm_start(
                model_path,
                out / "sft_short_context",
                short_context_dataset(short if short is not None else dataset),
                max_steps=sft.short_context_steps,
                lr_scheduler_type="constant",
                warmup_steps=warmup,
                time_budget_s=budget * short_share(sft) if budget is not None else None,
                **common,
            )
        )
        warmup = 0
        if budget is not None:
            budget = max(budget - (time.perf_counter() - t), 0.1 * budget)
        print("   phase 2: the full transcripts", flush=True)
    return str(
        sft_warm_start(
            model_path,
            out / "sft",
            dataset,
            num_train_epochs=sft.epochs,
            max_steps=sft.max_steps,
            lr_scheduler_type=sft.lr_scheduler_type,  # type: ignore[arg-type]
            warmup_steps=warmup,
            time_budget_s=budget,
            **common,
        )
    )


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


def short_share(sft: SFTSettings) -> float:
    """The share of the SFT time budget the short-context phase may use: its share of the steps
    (its steps are the cheaper ones, so the full phase keeps at least its share of the time), or
    half when the full phase runs by epochs."""
    if sft.max_steps is None:
        return 0.5
    return sft.short_context_steps / (sft.short_context_steps + sft.max_steps)


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
