"""RL on a real pretrained model, built run by run: SmolLM2-135M-Instruct recipes, GRPO against
rejection-sampling fine-tuning (RFT) from the same start at the same sampling budget.

Each invocation runs one thing and merges it into ``results/real_model.json``; a run already
recorded for the same settings is skipped, so the table is built over several invocations:

    python -m benchmarks.real_model --run probe             # where the instruct model starts (val)
    python -m benchmarks.real_model --run chain_sum.grpo    # a recipe's GRPO run (test split)
    python -m benchmarks.real_model --run chain_sum.rft     # its RFT twin
    python -m benchmarks.real_model --run chain_sum.grpo --tune --set grpo.learning_rate=2e-6
    python -m benchmarks.real_model --render                # real_model.md and .png from the JSON
    python -m benchmarks.real_model --quick                 # a smoke run; writes nothing

* ``probe``: the instruct model's success on the val split of each candidate environment
  (:data:`PROBES`), greedy and sampled, so that a recipe starts where it already succeeds
  sometimes (0.1 to 0.7) and GRPO has groups with a signal.
* ``RECIPE.ARM``: the recipe's ``train.py`` config (:data:`RECIPES`) as
  :func:`trainers.pipeline.run.run_pipeline` runs it: held-out success at the start (after the
  SFT warm start where there is one), training, held-out success after, greedy and sampled. The
  ``rft`` arm is the same config with ``credit_assignment: rejection_sampling``
  (:mod:`trainers.grpo.rejection_sampling`: the SFT loss on the model's own successful
  episodes): the same start, tasks, group size, steps, sampling budget and optimizer. Both arms
  record their start model's file hash, so the report can show they started from the same
  weights (an SFT warm start is deterministic at a fixed seed and thread count).
* ``--tune``: the run validated on val only (no test evaluation), recorded apart; the recipes'
  settings are chosen from these, and the test split is read only by the recipes' own runs.

The report (:mod:`benchmarks.real_model_report`) pairs GRPO and RFT by test task (95% interval
of the difference); each record keeps its commit, CPU model and flags, threads, wall time, peak
RSS and settings.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import resource
import time
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS_DIR, ROOT, Conditions, pin_threads, write_markdown
from benchmarks.suite_tiny_tuning import parse_overrides

NAME = "real_model"
MODEL = "smollm2-135m-instruct"
RECIPES = {
    "chain_sum": "configs/chain_sum_smollm2.yaml",
    "tool_use_game": "configs/tool_use_game_smollm2.yaml",
}
ARMS = {"grpo": {}, "rft": {"grpo.credit_assignment": "rejection_sampling"}}
PROBES: dict[str, tuple[str, dict[str, Any]]] = {
    "chain_sum 2 terms, 1 digit": ("RG-ChainSum-v0", {
        "config": {"max_terms": 2, "max_digits": 1},
        "sizes": {"train": 120, "val": 32, "test": 48}}),
    "chain_sum 2 terms, 2 digits": ("RG-ChainSum-v0", {
        "config": {"max_terms": 2, "max_digits": 2}}),
    "chain_sum 3 terms, 2 digits": ("RG-ChainSum-v0", {
        "config": {"max_terms": 3, "max_digits": 2}}),
    "basic_arithmetic +- 2 terms, 2 digits": ("RG-BasicArithmetic-v0", {"config": {
        "max_terms": 2, "max_digits": 2, "operators": ["+", "-"], "allow_parentheses": False,
        "allow_negation": False}}),
    "leg_counting 3 animals": ("ReasoningGym-v0", {
        "dataset": "leg_counting", "config": {"max_animals": 3, "max_instances": 3}}),
    "family_relationships": ("RG-FamilyRelationships-v0", {}),
    "word_sequence_reversal": ("ReasoningGym-v0", {"dataset": "word_sequence_reversal"}),
}  # fmt: skip
PROBE = {"tasks": 32, "samples": 2, "max_new_tokens": 64, "temperature": 1.0}
QUICK = {  # the smallest run through every stage
    "sft.episodes": 8, "sft.max_steps": 1, "sft.batch_size": 2,
    "grpo.num_steps": 1, "grpo.batch_size": 2, "grpo.episodes_per_task": 2,
    "grpo.max_tokens_per_turn": 8, "grpo.max_turns": 2, "grpo.validation_interval": None,
    "val_tasks": 0, "evaluation.episodes": 2, "evaluation.samples": 1,
    "evaluation.max_new_tokens": 8, "evaluation.max_turns": 2,
}  # fmt: skip


def settings_key(name: str, settings: dict[str, Any]) -> str:
    """The record's key: the run's name and a hash of its settings (sorted JSON).

    Example:
        >>> settings_key("chain_sum.grpo", {"b": 1, "a": 2}) == settings_key(
        ...     "chain_sum.grpo", {"a": 2, "b": 1})
        True
        >>> settings_key("probe", {}).split()[0]
        'probe'
    """
    text = json.dumps(settings, sort_keys=True, default=str)
    return f"{name} {hashlib.sha256(text.encode()).hexdigest()[:12]}"


def run_settings(
    recipe: str, arm: str, overrides: dict[str, Any], tune: bool, quick: bool = False
) -> dict[str, Any]:
    """What a recipe run depends on: its config file's text, the arm, the overrides, the mode."""
    config_text = (ROOT / RECIPES[recipe]).read_text()
    return {
        "config": RECIPES[recipe],
        "config_sha256": hashlib.sha256(config_text.encode()).hexdigest()[:16],
        "arm": arm,
        "overrides": overrides,
        "tune": tune,
        "quick": quick,
    }


def peak_rss_mb() -> float:
    """This process's peak resident set size in MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def probe(quick: bool) -> dict[str, Any]:
    """The instruct model's val success on each of :data:`PROBES`: greedy (one episode a task)
    and sampled (``PROBE["samples"]`` a task at GRPO's temperature), with 95% intervals."""
    from llm_gym.core.registry import env_entry
    from llm_gym.eval import run_and_report
    from llm_gym.policies import policy_from_spec
    from trainers.pipeline.run import resolve_model_path

    path = resolve_model_path(MODEL)
    tasks = 2 if quick else PROBE["tasks"]
    tokens = 8 if quick else PROBE["max_new_tokens"]
    out: dict[str, Any] = {}
    for label, (env_id, options) in PROBES.items():
        entry = env_entry(env_id)
        split = entry.tasks("val", **options)
        record: dict[str, Any] = {"env": env_id, "task_options": options}
        started = time.perf_counter()
        for mode, temperature, k in (("greedy", 0.0, 1), ("sampled", PROBE["temperature"],
                                                          PROBE["samples"])):  # fmt: skip
            policy = policy_from_spec(f"hf:{path}", temperature=temperature, max_new_tokens=tokens,
                                      seed=0)  # fmt: skip
            report = run_and_report(entry, policy, tasks=split, episodes=tasks * k, k=k, seed=0,
                                    max_new_tokens=tokens, progress=False,
                                    print_report=False)  # fmt: skip
            metrics = report.metrics
            record[mode] = {
                "success": metrics["success_rate"],
                "ci": [metrics["success_ci_low"], metrics["success_ci_high"]],
                "mean_reward": metrics["reward_mean"],
                "episodes": len(report.episodes),
                "sampled_tokens_per_episode": metrics["completion_tokens_mean"],
            }
        record["seconds"] = time.perf_counter() - started
        print(
            f"[{NAME}] probe {label}: greedy {record['greedy']['success']:.3f}, sampled "
            f"{record['sampled']['success']:.3f} ({record['seconds']:.0f} s)",
            flush=True,
        )
        out[label] = record
    return {"candidates": out, "settings": {**PROBE, "model": MODEL}}


def run_recipe(recipe: str, arm: str, overrides: dict[str, Any], tune: bool, quick: bool,
               work: Path) -> dict[str, Any]:  # fmt: skip
    """One arm of one recipe through the pipeline; the record the report reads
    (:func:`benchmarks.real_model_report.render`)."""
    from llm_gym.eval.model_hash import model_files_hash
    from trainers.pipeline.config import load_config
    from trainers.pipeline.run import run_pipeline

    config_path = ROOT / RECIPES[recipe]
    base = dict(QUICK) if quick else {}
    if load_config(config_path).sft is None:  # no SFT stage to shrink
        base = {k: v for k, v in base.items() if not k.startswith("sft.")}
    fixed = {"output_dir": str(work / f"{recipe}.{arm}{'.tune' if tune else ''}")}
    if tune:
        fixed["evaluation"] = None
    config = load_config(config_path, {**base, **ARMS[arm], **overrides, **fixed})
    summary = run_pipeline(config)
    keep = ("evaluation", "task_success", "task_reward", "train_log", "validation_history",
            "best_point", "sft_seconds", "grpo_seconds", "evaluation_seconds", "total_seconds",
            "precision")  # fmt: skip
    record = {k: summary[k] for k in keep if k in summary}
    record["config_text"] = config_path.read_text()  # what other settings it ran, shown later
    start = Path(summary["start_model"])
    record["start_model"] = MODEL if start == Path(summary["base_model"]) else str(start)
    record["start_hash"] = model_files_hash(start)
    return record


def _names() -> list[str]:
    return ["probe", *(f"{r}.{a}" for r in RECIPES for a in ARMS)]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", choices=_names(), help="the run to make and record")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="config overrides (train.py --set syntax)")  # fmt: skip
    parser.add_argument("--tune", action="store_true", help="validate on val only, no test")
    parser.add_argument("--render", action="store_true", help="render the JSON only")
    parser.add_argument("--quick", action="store_true", help="a smoke run of every path")
    parser.add_argument("--force", action="store_true", help="run even when recorded")
    parser.add_argument("--work", type=Path, default=ROOT / "outputs" / NAME)
    parser.add_argument("--out-dir", type=Path, default=None)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    if not (args.run or args.render or args.quick):
        parser.error("name a --run (" + ", ".join(_names()) + "), or --render, or --quick")
    out = args.out_dir or (None if args.quick else RESULTS_DIR)
    path = None if out is None else out / f"{NAME}.json"
    results = json.loads(path.read_text()) if path is not None and path.exists() else {}
    results.setdefault("runs", {})
    names = _names() if args.quick and not args.run else ([args.run] if args.run else [])
    for name in names:
        results = _run_one(name, args, results)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(results, indent=2, default=str) + "\n")
    from benchmarks.real_model_report import plot, render

    text = render(results, args.quick)
    print(text)
    if out is not None:
        write_markdown(NAME, text, out)
        plot(results, out / f"{NAME}.png", args.quick)
    return results


def _run_one(name: str, args: argparse.Namespace, results: dict[str, Any]) -> dict[str, Any]:
    overrides = parse_overrides(args.set)
    if name == "probe":
        settings = {**PROBE, "model": MODEL, "probes": PROBES, "quick": args.quick}
        done = results.get("probe", {}).get("settings_key") == settings_key(name, settings)
    else:
        recipe, arm = name.split(".")
        settings = run_settings(recipe, arm, overrides, args.tune, args.quick)
        done = settings_key(name, settings) in results["runs"]
    if done and not args.force:
        print(f"[{NAME}] {name}: already recorded for these settings (--force runs it again)")
        return results
    threads = pin_threads(args.threads)
    conditions = Conditions.start(NAME, threads=threads, settings=settings, quick=args.quick)
    print(f"[{NAME}] {name}", flush=True)
    if name == "probe":
        record = probe(args.quick)
    else:
        record = run_recipe(recipe, arm, overrides, args.tune, args.quick, args.work)
    conditions.finish()
    record.update(settings=settings, peak_rss_mb=peak_rss_mb(), conditions=conditions.as_json())
    if name == "probe":
        results["probe"] = {**record, "settings_key": settings_key(name, settings)}
    else:
        results["runs"][settings_key(name, settings)] = record
    return results


if __name__ == "__main__":
    main()
