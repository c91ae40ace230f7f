"""The whole recipe behind ``train.py``: model, optional SFT warm start, GRPO, evaluations.

:func:`run_pipeline` runs a :class:`~trainers.pipeline_config.PipelineConfig` (read from YAML by
:func:`~trainers.pipeline_config.load_config`): it builds or loads the model, warm-starts it on
oracle transcripts, trains it with multi-turn GRPO, and evaluates it on held-out tasks before and
after GRPO (:mod:`trainers.pipeline_eval`). The run writes ``summary.json`` (every number it
printed) and ``reward_curve.png`` into ``output_dir``.
"""

from __future__ import annotations

import functools
import json
import time
from pathlib import Path
from typing import Any

from llm_gym.errors import InvalidArgumentError, did_you_mean
from trainers.pipeline_config import (
    EvalSettings,
    PipelineConfig,
    SFTSettings,
    load_config,
    yaml_load,
)
from trainers.pipeline_eval import evaluate_model, paired_gain, plot_reward_curve, task_success

__all__ = [
    "build_grpo_config",
    "check_pipeline",
    "repeat_by_kind",
    "run_pipeline",
    # re-exported: the config (trainers.pipeline_config) and the comparison (pipeline_eval)
    "EvalSettings",
    "PipelineConfig",
    "SFTSettings",
    "load_config",
    "paired_gain",
    "task_success",
    "yaml_load",
]


def check_pipeline(config: PipelineConfig) -> tuple[Any, list[Any], int]:
    """What :func:`run_pipeline` checks before any model work: the env, GRPO's tasks (a
    ``task_options`` or ``task_repeats`` that fits none fails here) and the GRPO config (built
    only as a check: again later, with the model's path). ``train.py`` calls it where a mistake
    is one line rather than a traceback.

    Returns:
        The env's registry entry (resolved once: every step asks it), GRPO's tasks, the turn
        limit.

    Raises:
        LlmGymError: what the config gets wrong, named.
    """
    from llm_gym.core.registry import env_entry

    entry = env_entry(config.env)
    grpo_tasks = repeat_by_kind(entry.tasks("train", **config.task_options), config.task_repeats)
    max_turns = config.grpo.get("max_turns") or entry.max_turns
    build_grpo_config(config, config.model, max_turns=max_turns, use_cpu=not _has_gpu())
    return entry, grpo_tasks, max_turns


def run_pipeline(config: PipelineConfig) -> dict[str, Any]:
    """Build or load the model, warm-start it, train it with GRPO, evaluate before and after."""
    import os

    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    from llm_gym.core.factories import resolve
    from trainers import train_multi_turn

    out = Path(config.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    entry, grpo_tasks, max_turns = check_pipeline(config)
    summary: dict[str, Any] = {"env": config.env, "env_version": entry.version}
    started = time.perf_counter()
    grpo_fields = dict(config.grpo)

    # 1. the model
    if config.model == "tiny":
        from llm_gym.models import build_tiny_model

        print("== 1/5 building the tiny model", flush=True)
        # A tokenizer fitted to the environment it trains on (unless the config says otherwise).
        tiny_args = {"envs": [config.env], **config.tiny_model}
        model_path = str(build_tiny_model(seed=config.seed, **tiny_args))
    else:
        model_path = config.model
    summary["base_model"] = model_path

    # 2. the SFT warm start
    if config.sft is not None:
        from trainers.sft_data import oracle_sft_dataset

        print(f"== 2/5 SFT warm start on {config.sft.episodes} demonstrations", flush=True)
        t = time.perf_counter()
        sft_tasks = _sft_tasks(entry, config.sft.episodes, config.seed, config.task_options,
                               config.sft.task_options)  # fmt: skip
        made: dict[tuple[str | None, str], Any] = {}  # one dataset per distinct demonstrator

        def demonstrations(spec: str | None, options: dict[str, Any] | None) -> Any:
            key = (spec, repr(options))
            if key not in made:
                made[key] = oracle_sft_dataset(
                    entry,
                    sft_tasks,
                    oracle=_demonstrator(spec, options, resolve),
                    only_successful=config.sft.only_successful,
                )
            return made[key]

        sft = config.sft
        full = demonstrations(sft.oracle, sft.oracle_options)
        short = None
        if sft.short_context_steps > 0:
            short = demonstrations(sft.short_context_oracle, sft.short_context_oracle_options)
        model_path = _sft(model_path, out, full, sft, config.seed, short=short)
        summary["sft_seconds"] = time.perf_counter() - t
    summary["start_model"] = model_path

    eval_turns = (
        (config.evaluation.max_turns if config.evaluation else None)
        or grpo_fields.get("val_max_turns")
        or max_turns
    )

    # 3. held-out success before GRPO
    temperature = float(grpo_fields.get("temperature", 1.0))
    top_p = float(grpo_fields.get("top_p", 1.0))
    samples = config.evaluation.samples if config.evaluation is not None else 0

    def evaluate(path: str, when: str, tasks: Any = None, tag: str = "") -> dict[str, Any]:
        assert config.evaluation is not None
        common = dict(
            seed=config.seed, output_dir=config.output_dir, max_turns=eval_turns, tasks=tasks
        )
        label = f"{when}_grpo{tag}"
        reports = {"greedy": evaluate_model(path, entry, config.evaluation, label=label, **common)}
        print(reports["greedy"].format_table(), flush=True)
        if samples > 0:
            reports["sampled"] = evaluate_model(
                path,
                entry,
                config.evaluation,
                label=f"{label}_sampled",
                temperature=temperature,
                top_p=top_p,
                samples=samples,
                **common,
            )
            print(
                f"   sampled (temperature {temperature:g}, {samples} per task): success "
                f"{reports['sampled'].metrics['success_rate']:.3f}",
                flush=True,
            )
        return reports

    def evaluate_all(path: str, when: str) -> dict[str, dict[str, Any]]:
        """The split as registered, then each variant (its tasks read with its options)."""
        assert config.evaluation is not None
        out = {"": evaluate(path, when)}
        for name, options in config.evaluation.variants.items():
            print(f"   variant {name!r} ({options}):", flush=True)
            tasks = entry.tasks(config.evaluation.split, **options)
            out[name] = evaluate(path, when, tasks, tag=f"_{name}")
        return out

    before: dict[str, Any] = {}
    if config.evaluation is not None:
        print(
            f"== 3/5 held-out evaluation before GRPO ({config.evaluation.episodes} "
            f"{config.evaluation.split} tasks: greedy"
            + (f", and {samples} samples each at temperature {temperature:g})" if samples else ")"),
            flush=True,
        )
        t = time.perf_counter()
        before = evaluate_all(model_path, "before")
        summary["evaluation_seconds"] = {"before": time.perf_counter() - t}

    # 4. GRPO
    repeats = "".join(f"; {kind} x{count}" for kind, count in config.task_repeats.items())
    print(f"== 4/5 multi-turn GRPO ({len(grpo_tasks)} tasks{repeats})", flush=True)
    grpo_config = build_grpo_config(config, model_path, max_turns=max_turns, use_cpu=not _has_gpu())
    t = time.perf_counter()
    val_tasks = entry.tasks("val")[: config.val_tasks] if config.val_tasks else None
    trainer = train_multi_turn(
        grpo_config,
        tasks=grpo_tasks,
        env_factory=entry.env_factory(),
        val_tasks=val_tasks,
        oracle=entry.oracle(),
    )
    summary["grpo_seconds"] = time.perf_counter() - t
    summary["grpo_tasks"] = len(grpo_tasks)
    final_path = out / "final"
    trainer.save_model(str(final_path))
    trainer.processing_class.save_pretrained(str(final_path))
    summary["final_model"] = str(final_path)
    summary["validation_history"] = trainer.validation_history
    summary["train_log"] = [
        {
            "step": record["step"],
            "reward": record["reward"],
            "success_rate": record.get("episodes/success_rate"),
        }
        for record in trainer.state.log_history
        if "reward" in record and "step" in record
    ]

    # 5. held-out success after GRPO, and the gain on the same tasks
    after: dict[str, Any] = {}
    if config.evaluation is not None:
        print("== 5/5 held-out evaluation after GRPO", flush=True)
        t = time.perf_counter()
        after = evaluate_all(str(final_path), "after")
        summary["evaluation_seconds"]["after"] = time.perf_counter() - t
        summary["evaluation"] = {"split": config.evaluation.split}
        for name in after:
            gains = {"greedy": paired_gain(before[name]["greedy"], after[name]["greedy"])}
            if samples > 0:
                gains["sampled"] = {
                    "temperature": temperature,
                    "samples_per_task": samples,
                    **paired_gain(before[name]["sampled"], after[name]["sampled"]),
                }
            if name:
                options = config.evaluation.variants[name]
                summary["evaluation"].setdefault("variants", {})[name] = {
                    "task_options": options,
                    **gains,
                }
            else:
                summary["evaluation"].update(gains)
    summary["total_seconds"] = time.perf_counter() - started
    plot_reward_curve(trainer, summary.get("evaluation"), out / "reward_curve.png")
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    evaluation = summary.get("evaluation", {})
    _print_gains(evaluation, f"{evaluation.get('split')} split")
    for name, variant in evaluation.get("variants", {}).items():
        _print_gains(variant, f"{evaluation.get('split')} split, {name} {variant['task_options']}")
    parts = [("SFT", summary.get("sft_seconds")), ("GRPO", summary.get("grpo_seconds"))]
    parts += [(f"evaluation {k}", v) for k, v in summary.get("evaluation_seconds", {}).items()]
    spent = ", ".join(f"{name} {seconds:.0f} s" for name, seconds in parts if seconds is not None)
    print(
        f"Total time: {summary['total_seconds'] / 60:.1f} min ({spent}). Wrote "
        f"{out / 'summary.json'} and {out / 'reward_curve.png'}."
    )
    return summary


def _print_gains(results: dict[str, Any], where: str) -> None:
    for mode in ("greedy", "sampled"):
        if mode not in results:
            continue
        result = results[mode]
        how = (
            "greedy, one episode per task"
            if mode == "greedy"
            else f"{result['samples_per_task']} samples per task at temperature "
            f"{result['temperature']:g}"
        )
        low, high = result["gain_ci"]
        print(
            f"\nHeld-out success, {where}, {result['tasks']} tasks ({how}):\n"
            f"  after SFT:  {result['success_before']:.3f}\n"
            f"  after GRPO: {result['success_after']:.3f}\n"
            f"  gain:       {result['gain']:+.3f}  95% CI [{low:+.3f}, {high:+.3f}] "
            "(paired by task)"
        )


def build_grpo_config(
    config: PipelineConfig, model_path: str, *, max_turns: int | None, use_cpu: bool
) -> Any:
    """The run's :class:`~trainers.MultiTurnGRPOConfig`: the config's ``grpo`` fields as written
    (async ones included), with ``max_turns`` (the environment's when the config has none),
    ``seed`` and ``use_cpu`` as defaults; nothing is loaded."""
    import dataclasses

    from trainers import GRPOConfig

    fields = dict(config.grpo)
    known = {f.name for f in dataclasses.fields(GRPOConfig) if f.init}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise InvalidArgumentError(
            f"Unknown key(s) {unknown} in grpo: not fields of MultiTurnGRPOConfig (its own, TRL's "
            f"GRPOConfig's or TrainingArguments').{did_you_mean(unknown[0], known)}"
        )
    if set_by_run := sorted({"output_dir", "model"} & set(fields)):
        raise InvalidArgumentError(
            f"grpo may not set {set_by_run}: the run sets them (output_dir/grpo under the config's "
            "output_dir, and the model the config's model became)."
        )
    if config.distillation is not None:
        fields.setdefault("distillation", config.distillation)
    fields.setdefault("max_turns", max_turns)
    fields.setdefault("seed", config.seed)
    fields.setdefault("use_cpu", use_cpu)
    output_dir = str(Path(config.output_dir) / "grpo")
    return GRPOConfig(output_dir=output_dir, model=model_path, **fields)


def repeat_by_kind(tasks: Any, repeats: dict[str, int]) -> list[Any]:
    """``tasks`` with each task of a kind named in ``repeats`` (``task.metadata["type"]``) that
    many times in a row, the others once (GRPO's sampler shuffles them). A named kind that no
    task has is refused, with the kinds there are.

    Example:
        >>> from llm_gym import Task
        >>> tasks = [Task(prompt="a", metadata={"type": "x"}), Task(prompt="b")]
        >>> [task.prompt for task in repeat_by_kind(tasks, {"x": 3})]
        ['a', 'a', 'a', 'b']
    """
    tasks = list(tasks)
    if not repeats:
        return tasks
    kinds = [(getattr(task, "metadata", None) or {}).get("type") for task in tasks]
    there = {kind for kind in kinds if isinstance(kind, str)}
    missing = sorted(set(repeats) - there)
    if missing:
        raise InvalidArgumentError(
            f"task_repeats names kind(s) {missing} that no training task has; the kinds "
            f"(task.metadata['type']) there are: {sorted(there) or 'none'}."
        )
    counts = [repeats.get(kind, 1) if isinstance(kind, str) else 1 for kind in kinds]
    return [task for task, count in zip(tasks, counts, strict=True) for _ in range(count)]


def _sft(
    model_path: str, out: Path, dataset: Any, sft: SFTSettings, seed: int, short: Any = None
) -> str:
    """The SFT warm start: the short-context phase (if any, on ``short``'s transcripts), then
    the full transcripts of ``dataset``."""
    from trainers.sft import sft_warm_start
    from trainers.sft_data import short_context_dataset

    budget = sft.time_budget_s
    common = dict(
        learning_rate=sft.learning_rate, per_device_train_batch_size=sft.batch_size, seed=seed
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
                time_budget_s=budget * _short_share(sft) if budget is not None else None,
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


def _demonstrator(spec: str | None, options: dict[str, Any] | None, resolve: Any) -> Any:
    """A demonstrator: ``spec`` resolved (called with ``options`` when given); None: the
    environment's registered oracle."""
    if spec is None:
        if options:
            raise InvalidArgumentError("demonstrator options need the demonstrator (the factory).")
        return None
    found = resolve(spec)
    return found(**options) if options else found


def _short_share(sft: SFTSettings) -> float:
    """The share of the SFT time budget the short-context phase may use: its share of the steps
    (its steps are the cheaper ones, so the full phase keeps at least its share of the time), or
    half when the full phase runs by epochs."""
    if sft.max_steps is None:
        return 0.5
    return sft.short_context_steps / (sft.short_context_steps + sft.max_steps)


def _sft_tasks(
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
    uses its train split (cycled). ``options`` go to both (``{"world_seed": "varied"}``),
    ``generator_options`` to the generator alone (``{"worlds_per_question": 8}``)."""
    import importlib

    from trainers.sft_data import disjoint_tasks

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
    return disjoint_tasks(generate, episodes, seed=10_000 + seed, exclude=held_out)


def _has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()
