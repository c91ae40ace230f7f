"""``train.py`` on a mixture of environments (a config with ``envs:``): model, an optional SFT
warm start on every environment's demonstrations by weight (:mod:`trainers.mixture.sft`), GRPO
on the mixture, and each environment evaluated before and after GRPO in the leaderboard's format.

The run writes into ``output_dir``: ``leaderboard.json`` (one
:class:`~llm_gym.eval.leaderboard.Record` per environment and stage, policies ``before-grpo``
and ``after-grpo``; ``after-sft`` and ``after-grpo`` with a warm start), ``leaderboard.md``
(the table, environments as rows), ``eval_<stage>_<env>.json`` (each report), ``summary.json``
and ``step_log.jsonl`` (every logged record of GRPO).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from llm_gym.errors import InvalidArgumentError
from llm_gym.policies.pretrained import resolve_model_path
from trainers.mixture.config import mixture_envs
from trainers.mixture.env import MixtureEnv
from trainers.mixture.sft import check_mixture_sft, mixture_sft_dataset
from trainers.pipeline.config import PipelineConfig, build_grpo_config, has_gpu
from trainers.pipeline.eval import evaluate_model

__all__ = ["SFT_STAGES", "STAGES", "check_mixture_pipeline", "run_mixture_pipeline"]

STAGES = ("before-grpo", "after-grpo")
"""The leaderboard's policy labels of the two evaluations."""
SFT_STAGES = ("after-sft", "after-grpo")
"""The labels with an SFT warm start: the first evaluation is the warm-started model's."""


def check_mixture_pipeline(config: PipelineConfig) -> list[MixtureEnv]:
    """What a mixture run checks before any model work: keys that belong to one environment
    (set them per entry of ``envs``), the entries (ids, splits, task options) and the GRPO
    config. Returns the mixture.

    Raises:
        LlmGymError: what the config gets wrong, named, with where it goes instead.
    """
    assert config.mixture is not None
    misplaced = [
        name
        for name in ("task_options", "task_repeats", "heldout_task_options")
        if getattr(config, name)
    ]
    if misplaced:
        raise InvalidArgumentError(
            f"{misplaced} read one environment's tasks; with envs give each entry its own "
            "(envs: [{id: ToolUseGame-v0, task_options: {world_seed: varied}}])."
        )
    if config.sft is not None:
        check_mixture_sft(config.sft)
    envs = mixture_envs(config.mixture, config.val_tasks, config.grpo.get("max_turns"))
    turns = config.grpo.get("max_turns") or max(env.max_turns or 1 for env in envs)
    build_grpo_config(config, config.model, max_turns=turns, use_cpu=not has_gpu())
    return envs


def run_mixture_pipeline(config: PipelineConfig, command: str = "train.py") -> dict[str, Any]:
    """Build or load the model, evaluate each environment, train GRPO on the mixture,
    evaluate again; write the leaderboard and the summary (see the module docstring)."""
    from trainers import train_multi_turn

    out = Path(config.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    envs = check_mixture_pipeline(config)
    assert config.mixture is not None
    ids = {spec.label: spec.id for spec in config.mixture}
    summary: dict[str, Any] = {
        "envs": {env.name: {"id": ids[env.name], "weight": env.weight} for env in envs}
    }
    started = time.perf_counter()
    if config.model == "tiny":
        from llm_gym.models import build_tiny_model

        print("== building the tiny model (tokenizer on every env's text)", flush=True)
        tiny_args = {"envs": sorted(set(ids.values())), **config.tiny_model}
        model_path = str(build_tiny_model(seed=config.seed, **tiny_args))
        summary["build_seconds"] = time.perf_counter() - started
    else:
        model_path = resolve_model_path(config.model)
    stages = STAGES
    if config.sft is not None:
        stages = SFT_STAGES
        t = time.perf_counter()
        model_path, summary["sft_rows"] = _warm_start(config, envs, model_path, out)
        summary["sft_seconds"] = time.perf_counter() - t
    summary["start_model"] = model_path
    records: list[Any] = []

    def evaluate(path: str, stage: str) -> None:
        if config.evaluation is None:
            return
        print(f"== held-out evaluation {stage} ({len(envs)} envs)", flush=True)
        for env in envs:
            records.append(_evaluate_env(config, env, ids[env.name], path, stage, command))
            rate = records[-1].success_rate
            print(f"   {env.name}: success {rate:.3f}", flush=True)

    t = time.perf_counter()
    evaluate(model_path, stages[0])
    summary["evaluation_seconds"] = {stages[0]: time.perf_counter() - t}
    weights = ", ".join(f"{env.name} x{env.weight:g}" for env in envs)
    print(f"== multi-turn GRPO on a mixture ({weights})", flush=True)
    turns = config.grpo.get("max_turns") or max(env.max_turns or 1 for env in envs)
    grpo_config = build_grpo_config(config, model_path, max_turns=turns, use_cpu=not has_gpu())
    t = time.perf_counter()
    trainer = train_multi_turn(grpo_config, envs=envs)
    summary["grpo_seconds"] = time.perf_counter() - t
    final_path = out / "final"
    trainer.save_model(str(final_path))
    trainer.processing_class.save_pretrained(str(final_path))
    summary["final_model"] = str(final_path)
    summary["validation_history"] = trainer.validation_history
    summary["precision"] = trainer.precision.as_json()  # dtype: the choice, the probe's times
    if trainer.best_point is not None:  # grpo.keep_best: the model is the best validation point
        summary["best_point"] = trainer.best_point.as_json()
        print(f"   {trainer.best_point.describe()}", flush=True)
    summary["train_log"] = [r for r in trainer.state.log_history if "reward" in r]
    step_log = (json.dumps(record, default=str) + "\n" for record in trainer.state.log_history)
    (out / "step_log.jsonl").write_text("".join(step_log))
    t = time.perf_counter()
    evaluate(str(final_path), stages[1])
    summary["evaluation_seconds"][stages[1]] = time.perf_counter() - t
    if records:
        summary["evaluation"] = _write_leaderboard(config, records, envs, out, stages)
    summary["total_seconds"] = time.perf_counter() - started
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    print(f"Total time: {summary['total_seconds'] / 60:.1f} min. Wrote {out / 'summary.json'}.")
    return summary


def _evaluate_env(
    config: PipelineConfig, env: MixtureEnv, env_id: str, path: str, stage: str, command: str
) -> Any:
    """One environment's evaluation as a leaderboard record (greedy, one episode per task)."""
    from llm_gym.core.registry import env_entry
    from llm_gym.eval.leaderboard import Job
    from llm_gym.eval.leaderboard_run import record_from_report
    from llm_gym.eval.model_hash import model_files_hash

    settings = config.evaluation
    assert settings is not None
    turns = settings.max_turns or env.val_max_turns or env.max_turns or 1
    entry = env_entry(env_id)
    report = evaluate_model(
        path,
        entry,
        settings,
        seed=config.seed,
        output_dir=config.output_dir,
        max_turns=turns,
        label=f"{stage}_{env.name}",
        chat_template=config.grpo.get("chat_template"),
    )
    job = Job(
        env_id=env.name,
        policy=stage,
        split=settings.split,
        k=1,
        episodes=settings.episodes,
        seed=config.seed,
        max_turns=turns,
        sampling={"temperature": 0.0, "max_new_tokens": settings.max_new_tokens},
        spec=f"hf:{path}",
        env_version=entry.version,
        model_path=path,
        model_hash=model_files_hash(Path(path)),
        command=command,
    )
    return record_from_report(report, job)


def _warm_start(
    config: PipelineConfig, envs: list[MixtureEnv], model_path: str, out: Path
) -> tuple[str, dict[str, int]]:
    """The SFT warm start on every environment's demonstrations by weight: the warm-started
    model's path and the rows each environment gave."""
    from transformers import AutoTokenizer

    from llm_gym.policies.chat_templates import resolve_chat_template
    from trainers.sft.train import sft_warm_start

    sft, grpo = config.sft, config.grpo
    assert sft is not None and config.mixture is not None
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    if grpo.get("chat_template") is not None:  # the template the run gives the model
        given = resolve_chat_template(grpo["chat_template"])
        tokenizer.chat_template = given if isinstance(given, str) else given.template
    print(f"== SFT warm start on {sft.episodes} demonstrations by weight", flush=True)
    dataset, made = mixture_sft_dataset(
        envs, config.mixture, sft, config.seed, grpo.get("action_format"), tokenizer
    )
    print("   rows: " + ", ".join(f"{name} {rows}" for name, rows in made.items()), flush=True)
    path = sft_warm_start(
        model_path, out / "sft", dataset, sft, seed=config.seed,
        action_format=grpo.get("action_format") or "auto",
        chat_template=grpo.get("chat_template"), health_action=grpo.get("health_action", "warn"),
    )  # fmt: skip
    return str(path), made


def _write_leaderboard(
    config: PipelineConfig,
    records: list[Any],
    envs: list[MixtureEnv],
    out: Path,
    labels: tuple[str, str] = STAGES,
) -> dict[str, Any]:
    """``leaderboard.json`` and ``leaderboard.md`` of the run; each env's success before and
    after (with its 95% interval) for the summary."""
    from llm_gym.eval.files import write_atomic
    from llm_gym.eval.leaderboard import Registry, View, add_records, build_table
    from llm_gym.eval.leaderboard_render import render_markdown

    settings = config.evaluation
    assert settings is not None
    add_records(out / "leaderboard.json", records)
    names = [env.name for env in envs]
    turns = {r.env_id: r.max_turns for r in records}
    now = Registry(
        env_versions={r.env_id: str(r.env_version) for r in records},
        env_turns=turns,
        model_hashes={r.model_path: r.model_hash for r in records if r.model_path},
    )
    view = View(settings.split, 1, settings.episodes, config.seed, None)
    sampling = {
        stage: {"temperature": 0.0, "max_new_tokens": settings.max_new_tokens} for stage in labels
    }
    stages = [s for s in labels if any(r.policy == s for r in records)]
    table = build_table(records, names, stages, view, now, sampling)
    write_atomic(out / "leaderboard.md", render_markdown(table, stages, view))
    return {
        r.env_id + "/" + r.policy: {"success_rate": r.success_rate, "success_ci": r.success_ci}
        for r in records
    }
