"""The whole recipe behind ``train.py``: model, optional SFT warm start, GRPO, evaluations.

:func:`run_pipeline` runs a :class:`~trainers.pipeline.config.PipelineConfig` (read from YAML by
:func:`~trainers.pipeline.config.load_config`): it builds or loads the model, warm-starts it on
oracle transcripts, trains it with multi-turn GRPO, and evaluates it on held-out tasks before and
after GRPO (:mod:`trainers.pipeline.eval`); with ``grpo.keep_best`` the model after GRPO is the
best validation point (:mod:`trainers.grpo.best_point`, ``summary.json``'s ``best_point``). The
run writes ``summary.json`` (every number it printed), ``config.json``, ``step_log.jsonl`` (every
logged record), ``reward_curve.png``, the evaluations' records and episodes, and the run report
``report.html`` (:mod:`llm_gym.eval.run_report`) into ``output_dir``.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from llm_gym.errors import InvalidArgumentError
from llm_gym.eval.run_report import write_run_report
from llm_gym.policies.pretrained import resolve_model_path
from trainers.pipeline.config import (
    EvalSettings,
    PipelineConfig,
    SFTSettings,
    build_grpo_config,
    has_gpu,
    load_config,
    yaml_load,
)
from trainers.pipeline.eval import (
    evaluate_model,
    paired_gain,
    plot_reward_curve,
    task_reward,
    task_success,
)
from trainers.pipeline.sft import (
    check_sft_source,
    demonstrator,
    sft_completion_dataset,
    sft_tasks,
)

__all__ = [
    "build_grpo_config",
    "check_pipeline",
    "MAX_GRPO_TASKS",
    "repeat_by_kind",
    "run_pipeline",
    # re-exported: the config (trainers.pipeline.config) and the comparison (pipeline_eval)
    "EvalSettings",
    "PipelineConfig",
    "SFTSettings",
    "load_config",
    "paired_gain",
    "task_success",
    "yaml_load",
]


MAX_GRPO_TASKS = 10_000_000
"""The longest GRPO task list ``task_repeats`` may make (a list of task references: 80 MB)."""


def validates(config: PipelineConfig) -> bool:
    """Whether GRPO will have validation tasks: ``val_tasks``, or with ``envs`` an entry's own."""
    if config.mixture is None:
        return bool(config.val_tasks)
    return any(
        (entry.val_tasks if entry.val_tasks is not None else config.val_tasks)
        for entry in config.mixture
    )


def check_pipeline(config: PipelineConfig) -> tuple[Any, list[Any], int]:
    """What :func:`run_pipeline` checks before any model work: the env, the SFT demonstrators
    (``"module:attr"`` references resolve only from trusted modules), GRPO's tasks (a
    ``task_options`` or ``task_repeats`` that fits none fails here) and the GRPO config (built
    only as a check: again later, with the model's path). ``train.py`` calls it where a mistake
    is one line rather than a traceback.

    Returns:
        The env's registry entry (resolved once: every step asks it), GRPO's tasks, the turn
        limit; for a mixture (``envs``) None, its :class:`~trainers.mixture.env.MixtureEnv` s and 0
        (:func:`~trainers.pipeline.mixture.check_mixture_pipeline`).

    Raises:
        LlmGymError: what the config gets wrong, named.
    """
    from llm_gym.core.factories import resolve
    from llm_gym.core.registry import env_entry

    out = Path(config.output_dir)
    if out.exists() and not out.is_dir():  # mkdir would fail after the checks, as a traceback
        raise InvalidArgumentError(
            f"output_dir {config.output_dir!r} exists and is not a folder; name a folder (it is "
            "created when missing)."
        )
    if config.grpo.get("keep_best") is not None and not validates(config):
        raise InvalidArgumentError(
            "grpo.keep_best chooses among validation points: it needs validation tasks, "
            f"val_tasks >= 1 (actual value: {config.val_tasks}; with envs, an entry's own "
            "val_tasks counts too); set grpo.keep_best to null to keep the last step's weights."
        )
    if config.envs is not None:  # a mixture: its own checks
        from trainers.pipeline.mixture import check_mixture_pipeline

        return None, check_mixture_pipeline(config), 0
    entry = env_entry(config.env)
    if config.sft is not None:  # a refused or missing demonstrator: here, not after the model
        for spec in (config.sft.oracle, config.sft.short_context_oracle):
            resolve(spec)
        check_sft_source(config.sft, entry)
    grpo_tasks = repeat_by_kind(entry.tasks("train", **config.task_options), config.task_repeats)
    max_turns = config.grpo.get("max_turns") or entry.max_turns
    build_grpo_config(config, config.model, max_turns=max_turns, use_cpu=not has_gpu())
    return entry, grpo_tasks, max_turns


def run_pipeline(config: PipelineConfig) -> dict[str, Any]:
    """Build or load the model, warm-start it, train it with GRPO, evaluate before and after
    (a config with ``envs``: :func:`~trainers.pipeline.mixture.run_mixture_pipeline`)."""
    import os

    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    from llm_gym.core.factories import resolve
    from trainers import train_multi_turn

    if config.envs is not None:  # a weighted mixture of environments
        from trainers.pipeline.mixture import run_mixture_pipeline

        return run_mixture_pipeline(config)
    out = Path(config.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    entry, grpo_tasks, max_turns = check_pipeline(config)
    (out / "config.json").write_text(json.dumps(dataclasses.asdict(config), indent=2, default=str))
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
        model_path = resolve_model_path(config.model)  # a packaged model, a .gguf file: fetched
    summary["base_model"] = model_path

    # 2. the SFT warm start
    if config.sft is not None:
        from trainers.sft.data import oracle_sft_dataset

        what = {
            "oracle": f"{config.sft.episodes} demonstrations",
            "sft_completion": f"{config.sft.episodes} sft_completion targets",
            "episodes": f"the episodes of {config.sft.from_episodes}",
        }[config.sft.source]
        print(f"== 2/5 SFT warm start on {what}", flush=True)
        t = time.perf_counter()
        warm_tasks = (
            sft_tasks(entry, config.sft.episodes, config.seed, config.task_options,
                      config.sft.task_options) if config.sft.source != "episodes" else []
        )  # fmt: skip
        made: dict[tuple[str | None, str], Any] = {}  # one dataset per distinct demonstrator
        action_format = grpo_fields.get("action_format") or entry.requested_action_format  # RL's
        from transformers import AutoTokenizer

        from llm_gym.policies.chat_templates import resolve_chat_template

        tokenizer = AutoTokenizer.from_pretrained(model_path)  # its template: the format
        if grpo_fields.get("chat_template") is not None:  # the template the run gives the model
            given = resolve_chat_template(grpo_fields["chat_template"])
            tokenizer.chat_template = given if isinstance(given, str) else given.template

        def demonstrations(spec: str | None, options: dict[str, Any] | None) -> Any:
            key = (spec, repr(options))
            if key not in made:
                made[key] = oracle_sft_dataset(
                    entry,
                    warm_tasks,
                    oracle=demonstrator(spec, options, resolve),
                    action_format=action_format,
                    only_successful=config.sft.only_successful,
                    tokenizer=tokenizer,
                )
            return made[key]

        sft = config.sft
        short = None
        if sft.source == "sft_completion":  # document 002's rows; both phases read them
            full = sft_completion_dataset(entry, warm_tasks)
        elif sft.source == "episodes":  # rejection sampling: the saved episodes that did well
            from llm_gym.eval.episode_files import episodes_dataset

            full = episodes_dataset(str(sft.from_episodes), min_reward=sft.min_reward)
        else:
            full = demonstrations(sft.oracle, sft.oracle_options)
            if sft.short_context_steps > 0:
                short = demonstrations(sft.short_context_oracle, sft.short_context_oracle_options)
        from trainers.sft.train import sft_warm_start

        warm = sft_warm_start(
            model_path, out / "sft", full, sft, short_dataset=short, seed=config.seed,
            action_format=action_format, chat_template=grpo_fields.get("chat_template"),
            health_action=grpo_fields.get("health_action", "warn"),
        )  # fmt: skip
        model_path = str(warm)
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
            seed=config.seed, output_dir=config.output_dir, max_turns=eval_turns, tasks=tasks,
            chat_template=grpo_fields.get("chat_template"),
        )  # fmt: skip
        label = f"{when}_grpo{tag}"
        reports = {"greedy": evaluate_model(path, entry, config.evaluation, label=label, **common)}
        per_task = summary.setdefault("task_success", {})  # to pair runs by task afterwards
        per_task[label] = task_success(reports["greedy"].episodes)
        rewards = summary.setdefault("task_reward", {})  # partial credit, paired the same way
        rewards[label] = task_reward(reports["greedy"].episodes)
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
            per_task[f"{label}_sampled"] = task_success(reports["sampled"].episodes)
            rewards[f"{label}_sampled"] = task_reward(reports["sampled"].episodes)
            print(
                f"   sampled (temperature {temperature:g}, {samples} per task): success "
                f"{reports['sampled'].metrics['success_rate']:.3f}",
                flush=True,
            )
        return reports

    def evaluate_all(path: str, when: str) -> dict[str, dict[str, Any]]:
        """The split as registered, then each variant (its tasks read with its options)."""
        assert config.evaluation is not None
        split = config.evaluation.split
        heldout = config.heldout_task_options
        out = {"": evaluate(path, when, entry.tasks(split, **heldout) if heldout else None)}
        for name, options in config.evaluation.variants.items():
            print(f"   variant {name!r} ({options}):", flush=True)
            tasks = entry.tasks(split, **{**heldout, **options})
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
    grpo_config = build_grpo_config(config, model_path, max_turns=max_turns, use_cpu=not has_gpu())
    t = time.perf_counter()
    heldout = config.heldout_task_options
    val_tasks = entry.tasks("val", **heldout)[: config.val_tasks] if config.val_tasks else None
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
    summary["precision"] = trainer.precision.as_json()  # dtype: the choice, the probe's times
    if trainer.best_point is not None:  # grpo.keep_best: the model is the best validation point
        summary["best_point"] = trainer.best_point.as_json()
        print(f"   {trainer.best_point.describe()}", flush=True)
    summary["health"] = trainer.health.fired
    step_log = (json.dumps(record, default=str) + "\n" for record in trainer.state.log_history)
    (out / "step_log.jsonl").write_text("".join(step_log))
    summary["train_log"] = [
        {
            "step": record["step"],
            "reward": record["reward"],
            "success_rate": record.get("episodes/success_rate"),
            "zero_variance_skip_ratio": record.get("zero_variance_skip_ratio"),
            "difficulty_saved_total": record.get("difficulty/zero_variance_saved_total"),
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
    report = write_run_report(out)
    evaluation = summary.get("evaluation", {})
    _print_gains(evaluation, f"{evaluation.get('split')} split")
    for name, variant in evaluation.get("variants", {}).items():
        _print_gains(variant, f"{evaluation.get('split')} split, {name} {variant['task_options']}")
    parts = [("SFT", summary.get("sft_seconds")), ("GRPO", summary.get("grpo_seconds"))]
    parts += [(f"evaluation {k}", v) for k, v in summary.get("evaluation_seconds", {}).items()]
    spent = ", ".join(f"{name} {seconds:.0f} s" for name, seconds in parts if seconds is not None)
    print(
        f"Total time: {summary['total_seconds'] / 60:.1f} min ({spent}). Wrote "
        f"{out / 'summary.json'}, {out / 'reward_curve.png'} and the run report {report}."
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


def repeat_by_kind(tasks: Any, repeats: dict[str, int]) -> list[Any]:
    """``tasks`` with each task of a kind named in ``repeats`` (``task.metadata["type"]``) that
    many times in a row, the others once (GRPO's sampler shuffles them). A named kind that no
    task has is refused, with the kinds there are, and so is a list longer than
    :data:`MAX_GRPO_TASKS` (before it is made).

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
    if sum(counts) > MAX_GRPO_TASKS:  # refused before the list is made
        raise InvalidArgumentError(
            f"task_repeats {repeats!r:.120} makes {sum(counts):,} GRPO tasks, more than "
            f"{MAX_GRPO_TASKS:,} (trainers.pipeline.run.MAX_GRPO_TASKS); use smaller counts."
        )
    return [task for task, count in zip(tasks, counts, strict=True) for _ in range(count)]
