"""RL on a real pretrained model: the SmolLM2-135M-Instruct recipes, GRPO against rejection-
sampling fine-tuning (RFT) from the same start at the same compute.

For each recipe (a ``train.py`` config: ``configs/tool_use_game_smollm2.yaml``, SFT warm start
then GRPO; ``configs/guess_number_smollm2.yaml``, GRPO straight from the instruct model):

1. the recipe as ``train.py`` runs it (:func:`trainers.pipeline.run.run_pipeline`): held-out success
   at the start (after SFT where there is one), then after GRPO, greedy and sampled, each gain
   paired by task with its 95% interval;
2. RFT from the same start model (the first run's SFT folder, or the base model): the same run
   with ``credit_assignment: rejection_sampling`` (:mod:`trainers.grpo.rejection_sampling`: the SFT
   loss on the model's own successful episodes), so the same tasks, rollouts per step, steps,
   optimizer and learning rate: the same compute (both runs' wall times are reported);
3. GRPO minus RFT after training, paired by task, with its 95% interval.

Settings were chosen on the val split (validation during training); everything here reports
the test split (and, for ToolUseGame, the same questions in a re-seeded world).

    python -m benchmarks.real_model                  # both recipes; writes results/real_model.*
    python -m benchmarks.real_model --recipes guess_number   # one; the others' earlier runs kept
    python -m benchmarks.real_model --quick          # a smoke run of the code path
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from benchmarks.common import (
    ROOT,
    Conditions,
    output_dir,
    pin_threads,
    write_json,
    write_markdown,
)

NAME = "real_model"
RECIPES = {
    "tool_use_game": "configs/tool_use_game_smollm2.yaml",
    "guess_number": "configs/guess_number_smollm2.yaml",
}
QUICK = {  # the smallest run through every stage
    "sft.episodes": 8, "sft.max_steps": 1, "sft.batch_size": 2,
    "grpo.num_steps": 1, "grpo.batch_size": 2, "grpo.episodes_per_task": 2,
    "grpo.max_tokens_per_turn": 8, "grpo.max_turns": 2, "grpo.validation_interval": None,
    "val_tasks": 0, "evaluation.episodes": 2, "evaluation.samples": 1,
    "evaluation.max_new_tokens": 8, "evaluation.max_turns": 2,
}  # fmt: skip


def paired(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    """``after - before`` over the tasks both evaluated (task success rates), with its 95%
    interval (:func:`llm_gym.eval.paired_difference_interval`)."""
    from llm_gym.eval import paired_difference_interval

    keys = sorted(set(before) & set(after))
    diff, low, high = paired_difference_interval(
        [before[k] for k in keys], [after[k] for k in keys]
    )
    return {
        "tasks": len(keys),
        "rft": sum(before[k] for k in keys) / len(keys),
        "grpo": sum(after[k] for k in keys) / len(keys),
        "difference": diff,
        "ci": [low, high],
    }


def run_recipe(name: str, config_path: str, out: Path, quick: bool) -> dict[str, Any]:
    from trainers.pipeline.config import load_config
    from trainers.pipeline.run import run_pipeline

    base = dict(QUICK) if quick else {}
    if load_config(ROOT / config_path).sft is None:  # no SFT stage to shrink
        base = {k: v for k, v in base.items() if not k.startswith("sft.")}
    grpo_config = load_config(ROOT / config_path, {**base, "output_dir": str(out / "grpo")})
    print(f"[{NAME}] {name}: GRPO", flush=True)
    grpo = run_pipeline(grpo_config)
    start = grpo["start_model"]
    overrides = {
        **{k: v for k, v in base.items() if not k.startswith("sft.")},
        "output_dir": str(out / "rft"),
        "model": start,
        "sft": None,
        "grpo.credit_assignment": "rejection_sampling",
    }
    print(f"[{NAME}] {name}: RFT from {start}", flush=True)
    rft = run_pipeline(load_config(ROOT / config_path, overrides))
    comparison: dict[str, Any] = {}
    for label in grpo.get("task_success", {}):
        if label.startswith("after_grpo") and label in rft.get("task_success", {}):
            comparison[label] = paired(rft["task_success"][label], grpo["task_success"][label])
    return {
        "config": config_path,
        "start_model": start,
        "grpo": _brief(grpo),
        "rft": _brief(rft),
        "grpo_minus_rft": comparison,
    }


def _brief(summary: dict[str, Any]) -> dict[str, Any]:
    keep = ("evaluation", "train_log", "validation_history", "sft_seconds", "grpo_seconds",
            "evaluation_seconds", "total_seconds", "task_success")  # fmt: skip
    return {k: summary[k] for k in keep if k in summary}


def render(results: dict[str, Any], conditions: Conditions) -> str:
    lines = [
        "# RL on a real pretrained model: SmolLM2-135M-Instruct",
        "",
        "Each recipe as `train.py` runs it, then RFT (SFT on the model's own successful "
        "episodes: `credit_assignment: rejection_sampling`) from the same start with the same "
        "tasks, rollouts, steps and optimizer. Held-out success on the test split; gains and "
        "differences paired by task, 95% intervals.",
        "",
    ]
    for name, result in results["recipes"].items():
        grpo, rft = result["grpo"], result["rft"]
        lines += [f"## {name} (`{result['config']}`)", ""]
        lines += [
            f"Start: `{result['start_model']}`. Wall time: GRPO phase "
            f"{grpo.get('grpo_seconds', 0) / 60:.1f} min, RFT phase "
            f"{rft.get('grpo_seconds', 0) / 60:.1f} min; the whole GRPO run "
            f"{grpo.get('total_seconds', 0) / 60:.1f} min"
            + (f" (SFT {grpo['sft_seconds']:.0f} s)" if grpo.get("sft_seconds") else "")
            + ".",
            "",
            "| held-out success | start | after GRPO | GRPO gain [95% CI] | after RFT | "
            "RFT gain [95% CI] | GRPO - RFT [95% CI] |",
            "| --- | ---: | ---: | --- | ---: | --- | --- |",
        ]
        for variant, label in _variants(grpo):
            for mode in ("greedy", "sampled"):
                g = _gain(grpo, variant, mode)
                r = _gain(rft, variant, mode)
                if g is None or r is None:
                    continue
                key = f"after_grpo{'_' + variant if variant else ''}"
                key += "_sampled" if mode == "sampled" else ""
                d = result["grpo_minus_rft"].get(key)
                shown = _ci(d["difference"], d["ci"]) if d else "n/a"
                lines.append(
                    f"| {label}, {mode} | {g['success_before']:.3f} | {g['success_after']:.3f} | "
                    f"{_ci(g['gain'], g['gain_ci'])} | {r['success_after']:.3f} | "
                    f"{_ci(r['gain'], r['gain_ci'])} | {shown} |"
                )
        lines.append("")
    lines += [conditions.describe(), ""]
    return "\n".join(lines)


def _variants(summary: dict[str, Any]) -> list[tuple[str, str]]:
    evaluation = summary.get("evaluation", {})
    split = evaluation.get("split", "test")
    out = [("", f"{split} split")]
    out += [(name, f"{split} split, {name}") for name in evaluation.get("variants", {})]
    return out


def _gain(summary: dict[str, Any], variant: str, mode: str) -> dict[str, Any] | None:
    evaluation = summary.get("evaluation", {})
    node = evaluation.get("variants", {}).get(variant, {}) if variant else evaluation
    return node.get(mode)


def _ci(value: float, ci: list[float]) -> str:
    return f"{value:+.3f} [{ci[0]:+.3f}, {ci[1]:+.3f}]"


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    recipes = results["recipes"]
    fig, axes = plt.subplots(1, len(recipes), figsize=(6 * len(recipes), 4), squeeze=False)
    for axis, (name, result) in zip(axes[0], recipes.items(), strict=True):
        for run, style in (("grpo", "-"), ("rft", "--")):
            log = result[run].get("train_log", [])
            steps, rewards = [r["step"] for r in log], [r["reward"] for r in log]
            axis.plot(steps, rewards, style, label=run.upper())
        axis.set_title(f"SmolLM2-135M, {name}: train reward")
        axis.set_xlabel("optimizer step")
        axis.set_ylabel("mean episode reward")
        axis.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipes", nargs="+", choices=list(RECIPES), default=list(RECIPES))
    parser.add_argument("--quick", action="store_true", help="a smoke run; writes nothing")
    parser.add_argument("--work", type=Path, default=ROOT / "outputs" / NAME)
    parser.add_argument("--out-dir", type=Path, default=None)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    threads = pin_threads(args.threads)
    conditions = Conditions.start(NAME, threads=threads, settings=vars(args), quick=args.quick)
    results: dict[str, Any] = {"recipes": {}}
    earlier = args.work / f"{NAME}.json"  # recipes run before (--recipes runs one at a time)
    if earlier.exists() and not args.quick:
        results["recipes"].update(json.loads(earlier.read_text()).get("recipes", {}))
    for name in args.recipes:
        results["recipes"][name] = run_recipe(name, RECIPES[name], args.work / name, args.quick)
        earlier.parent.mkdir(parents=True, exist_ok=True)
        earlier.write_text(json.dumps(results, indent=2, default=str) + "\n")
    conditions.finish()
    report = render(results, conditions)
    print(report)
    out = output_dir(args.quick, args.out_dir, True)
    if out is not None:
        write_markdown(NAME, report, out)
        write_json(NAME, {"conditions": conditions.as_json(), **results}, out)
        plot(results, out / f"{NAME}.png")
    return results


if __name__ == "__main__":
    main()
