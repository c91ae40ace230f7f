"""``train.py`` on a mixture of environments (a config with ``envs:``): model, GRPO on the
mixture, and each environment evaluated before and after GRPO in the leaderboard's format.

The run writes into ``output_dir``: ``leaderboard.json`` (one
:class:`~llm_gym.eval.leaderboard.Record` per environment and stage, policies ``before-grpo``
and ``after-grpo``), ``leaderboard.md`` (the table, environments as rows),
``eval_<stage>_<env>.json`` (each report) and ``summary.json``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from llm_gym.errors import InvalidArgumentError
from llm_gym.policies.pretrained import resolve_model_path
from trainers.mixture import MixtureEnv
from trainers.mixture_config import mixture_envs
from trainers.pipeline_config import PipelineConfig, build_grpo_config, has_gpu
from trainers.pipeline_eval import evaluate_model

__all__ = ["STAGES", "check_mixture_pipeline", "run_mixture_pipeline"]

STAGES = ("before-grpo", "after-grpo")
"""The leaderboard's policy labels of the two evaluations."""


def check_mixture_pipeline(config: PipelineConfig) -> list[MixtureEnv]:
    """What a mixture run checks before any model work: keys that belong to one environment
    (set them per entry of ``envs``), the entries (ids, splits, task options) and the GRPO
    config. Returns the mixture.

    Raises:
        LlmGymError: what the config gets wrong, named, with where it goes instead.
    """
    assert config.mixture is not None
    misplaced = [name for name in ("task_options", "task_repeats") if getattr(config, name)]
    if misplaced:
        raise InvalidArgumentError(
            f"{misplaced} read one environment's tasks; with envs give each entry its own "
            "(envs: [{id: ToolUseGame-v0, task_options: {world_seed: varied}}])."
        )
    if config.sft is not None:
        raise InvalidArgumentError(
            "sft with envs: the warm start reads one environment's demonstrations. Warm-start "
            "in a run of its own (env: ..., grpo.num_steps: 0) and name its final model as "
            "model:, or set sft: null."
        )
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

        print("== 1/4 building the tiny model (tokenizer on every env's text)", flush=True)
        tiny_args = {"envs": sorted(set(ids.values())), **config.tiny_model}
        model_path = str(build_tiny_model(seed=config.seed, **tiny_args))
    else:
        model_path = resolve_model_path(config.model)
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

    evaluate(model_path, STAGES[0])
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
    summary["train_log"] = [r for r in trainer.state.log_history if "reward" in r]
    evaluate(str(final_path), STAGES[1])
    if records:
        summary["evaluation"] = _write_leaderboard(config, records, envs, out)
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
        sampling={"max_new_tokens": settings.max_new_tokens},
        spec=f"hf:{path}",
        env_version=entry.version,
        model_path=path,
        model_hash=model_files_hash(Path(path)),
        command=command,
    )
    return record_from_report(report, job)


def _write_leaderboard(
    config: PipelineConfig, records: list[Any], envs: list[MixtureEnv], out: Path
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
    sampling = {stage: {"max_new_tokens": settings.max_new_tokens} for stage in STAGES}
    stages = [s for s in STAGES if any(r.policy == s for r in records)]
    table = build_table(records, names, stages, view, now, sampling)
    write_atomic(out / "leaderboard.md", render_markdown(table, stages, view))
    return {
        r.env_id + "/" + r.policy: {"success_rate": r.success_rate, "success_ci": r.success_ci}
        for r in records
    }
