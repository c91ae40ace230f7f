"""Online difficulty filtering vs the uniform draw: steps to a held-out success on ToolUseGame.

One SFT warm start of the tiny model (the main job's recipe, all of it: a start at about 0.4
held-out success, where groups of every kind occur), then GRPO from it twice per seed: TRL's
uniform task order, and ``difficulty_sampling: {}`` (:mod:`trainers.grpo.difficulty`). Equal
compute: the same steps, tasks per step and group size (the filter changes which tasks, not how
many episodes).
The arms alternate per seed (ABBA). Every ``--val-every`` steps each run validates greedily on
the val split; the report gives, per arm and seed, the first step whose held-out success reaches
each target, the zero-variance groups actually met per step (``zero_variance_skip_ratio``), the
filter's own estimate of the groups it saved, and the wall time.

    python -m benchmarks.difficulty_sampling   # about 14 min on 2 quiet cores (estimate below)

The estimate, from the main job's timings on the same machine (``main_job.md``: 1250 SFT steps in
523 s; GRPO about 0.035 s an episode): the warm start about 9 min, each GRPO run (24 steps x 64
episodes, 7 greedy validations of 128 tasks) about 85 s, four runs 6 min.
    python -m benchmarks.difficulty_sampling --warm-start outputs/tool_use_game_tiny/sft  # 6 min
    python -m benchmarks.difficulty_sampling --quick --model PATH  # smoke run, writes nothing

Writes ``difficulty_sampling.md``, ``.json`` and ``.png`` to ``benchmarks/results``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import (
    ROOT,
    Conditions,
    output_dir,
    thread_settings,
    write_json,
    write_markdown,
)

NAME = "difficulty_sampling"
CONFIG = ROOT / "configs" / "tool_use_game_tiny.yaml"
ARMS = ("uniform", "difficulty")
WARM_START = {"sft.time_budget_s": None}
"""The warm start: the main job's recipe, all of its steps (a time budget that cuts them short on
a loaded machine leaves a weaker start in one run than in another). A quarter of its steps
leaves a model at about 0.02 held-out success: almost every group is all failures, and neither
draw has anything to learn from (``benchmarks/results/difficulty_sampling.md`` keeps no such
run)."""
QUICK = {
    "sft.episodes": 16,
    "sft.max_steps": 2,
    "sft.short_context_steps": 1,
    "sft.batch_size": 4,
    "grpo.max_turns": 2,
    "grpo.max_tokens_per_turn": 8,
}


def grpo_overrides(args: argparse.Namespace, arm: str, seed: int) -> dict[str, Any]:
    """The config overrides of one GRPO run."""
    return {
        "grpo.num_steps": args.steps,
        "grpo.batch_size": args.batch_size,
        "grpo.episodes_per_task": args.group_size,
        "grpo.validation_interval": args.val_every,
        "grpo.seed": seed,
        "grpo.task_seed": seed,
        "grpo.difficulty_sampling": {} if arm == "difficulty" else None,
        "val_tasks": args.val_tasks,
        "evaluation": None,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    from trainers.pipeline.run import load_config, run_pipeline

    conditions = Conditions.start(
        NAME,
        threads=thread_settings(),
        settings={k: str(v) for k, v in vars(args).items()},
        quick=args.quick,
    )
    base: dict[str, Any] = {**WARM_START, **(QUICK if args.quick else {})}
    if args.model:
        base["model"] = args.model
    runs: list[dict[str, Any]] = []
    start_model = args.warm_start  # None: the first run makes the warm start
    with tempfile.TemporaryDirectory(prefix="llm_gym_difficulty_") as tmp:
        for k, seed in enumerate(args.seeds):
            for arm in ARMS if k % 2 == 0 else ARMS[::-1]:
                overrides = {**base, **grpo_overrides(args, arm, seed)}
                overrides["output_dir"] = f"{tmp}/{arm}-{seed}"
                if start_model is not None:
                    overrides["model"] = start_model
                config = load_config(args.config, overrides)
                if start_model is not None:
                    config.sft = None
                print(f"== GRPO, {arm} draw, seed {seed}", flush=True)
                t = time.perf_counter()
                summary = run_pipeline(config)
                start_model = start_model or summary["start_model"]
                runs.append(
                    {
                        "arm": arm,
                        "seed": seed,
                        "sft_seconds": summary.get("sft_seconds"),
                        "grpo_seconds": summary["grpo_seconds"],
                        "wall_seconds": time.perf_counter() - t,
                        "validation": [
                            {"step": r["step"], "success_rate": r["success_rate"]}
                            for r in summary["validation_history"]
                        ],
                        "train_log": summary["train_log"],
                    }
                )
    conditions.finish()
    return summarize(args, runs, conditions)


def first_step(validation: list[dict[str, Any]], target: float) -> int | None:
    """The first validated step whose held-out success reaches ``target`` (None: never)."""
    return next((r["step"] for r in validation if r["success_rate"] >= target), None)


def summarize(
    args: argparse.Namespace, runs: list[dict[str, Any]], conditions: Conditions
) -> dict[str, Any]:
    """Per run: steps to each target, zero-variance groups met, groups the filter saved."""
    for entry in runs:
        log = entry["train_log"]
        zero = [r.get("zero_variance_skip_ratio") for r in log]
        entry["zero_variance_groups"] = sum((z or 0.0) * args.batch_size for z in zero)
        saved = [
            r["difficulty_saved_total"] for r in log if r.get("difficulty_saved_total") is not None
        ]
        entry["saved_estimate"] = saved[-1] if saved else None
        entry["steps_to"] = {str(t): first_step(entry["validation"], t) for t in args.targets}
        entry["final_success"] = (
            entry["validation"][-1]["success_rate"] if entry["validation"] else None
        )
    per_arm = {}
    for arm in ARMS:
        mine = [r for r in runs if r["arm"] == arm]
        per_arm[arm] = {
            "zero_variance_groups_mean": statistics.fmean(r["zero_variance_groups"] for r in mine),
            "final_success_mean": statistics.fmean(r["final_success"] or 0.0 for r in mine),
            "grpo_seconds_mean": statistics.fmean(r["grpo_seconds"] for r in mine),
        }
    return {
        "conditions": conditions,
        "settings": {
            "steps": args.steps,
            "batch_size": args.batch_size,
            "group_size": args.group_size,
            "val_every": args.val_every,
            "val_tasks": args.val_tasks,
            "seeds": args.seeds,
            "targets": args.targets,
            "sft": WARM_START,
            "warm_start": args.warm_start,
        },
        "runs": runs,
        "per_arm": per_arm,
    }


def report(result: dict[str, Any]) -> str:
    s = result["settings"]
    c = result["conditions"]
    describe = c.describe() if hasattr(c, "describe") else c.get("description", "")
    lines = [
        "# Online difficulty filtering vs the uniform draw (ToolUseGame-v0, tiny model, CPU)",
        "",
        describe,
        "",
        (
            f"The main job's SFT model (`{s['warm_start']}`)"
            if s.get("warm_start")
            else f"An SFT warm start (the main job's recipe, overrides: {s['sft']})"
        )
        + ", then GRPO from it for "
        f"{s['steps']} steps of {s['batch_size']} tasks x {s['group_size']} episodes in each arm "
        f"(equal compute), seeds {s['seeds']}; greedy validation on {s['val_tasks']} val tasks "
        f"every {s['val_every']} steps. Reproduce: `python -m benchmarks.difficulty_sampling"
        + (f" --warm-start {s['warm_start']}`." if s.get("warm_start") else "`."),
        "",
        "| arm | seed | steps to "
        + " | steps to ".join(str(t) for t in s["targets"])
        + " | final held-out success | zero-variance groups met | saved (filter's estimate) "
        "| GRPO s |",
        "| --- | ---: |" + " ---: |" * (len(s["targets"]) + 4),
    ]
    for r in result["runs"]:
        steps = " | ".join(
            "never" if r["steps_to"][str(t)] is None else str(r["steps_to"][str(t)])
            for t in s["targets"]
        )
        saved = "" if r["saved_estimate"] is None else f"{r['saved_estimate']:.1f}"
        lines.append(
            f"| {r['arm']} | {r['seed']} | {steps} | {r['final_success'] or 0:.3f} | "
            f"{r['zero_variance_groups']:.0f} of {s['steps'] * s['batch_size']} | {saved} | "
            f"{r['grpo_seconds']:.0f} |"
        )
    lines += ["", "Held-out success at each validation:", ""]
    for r in result["runs"]:
        curve = ", ".join(f"{v['step']}: {v['success_rate']:.3f}" for v in r["validation"])
        lines.append(f"- {r['arm']}, seed {r['seed']}: {curve}")
    arms = result["per_arm"]
    lines += [
        "",
        "Means over seeds: "
        + "; ".join(
            f"{arm}: final success {a['final_success_mean']:.3f}, zero-variance groups "
            f"{a['zero_variance_groups_mean']:.1f}, GRPO {a['grpo_seconds_mean']:.0f} s"
            for arm, a in arms.items()
        )
        + ".",
        "",
        "A held-out success differs between two greedy validations of "
        f"{s['val_tasks']} tasks by about +-{1.96 * (0.25 / max(1, s['val_tasks'])) ** 0.5:.2f} "
        "(95%, binomial) from sampling alone; the step at which a run crosses a target is "
        "read at the validation grid.",
    ]
    return "\n".join(lines) + "\n"


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    colours = {"uniform": "tab:grey", "difficulty": "tab:blue"}
    for r in result["runs"]:
        steps = [v["step"] for v in r["validation"]]
        rates = [v["success_rate"] for v in r["validation"]]
        left.plot(steps, rates, marker="o", color=colours[r["arm"]], alpha=0.8,
                  label=f"{r['arm']} seed {r['seed']}")  # fmt: skip
        log = [x for x in r["train_log"] if x.get("zero_variance_skip_ratio") is not None]
        ratios = [x["zero_variance_skip_ratio"] for x in log]
        label = f"{r['arm']} seed {r['seed']}"
        right.plot([x["step"] for x in log], ratios, color=colours[r["arm"]], alpha=0.8,
                   label=label)  # fmt: skip
    left.set_xlabel("GRPO step")
    left.set_ylabel("held-out success (val, greedy)")
    left.set_title("Held-out success")
    right.set_xlabel("GRPO step")
    right.set_ylabel("share of the step's groups")
    right.set_title("Zero-variance groups per step")
    for axis in (left, right):
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=CONFIG)
    parser.add_argument("--model", default=None, help="start from this model (default: tiny)")
    parser.add_argument(
        "--warm-start",
        default=None,
        help="an SFT model to start GRPO from, skipping the warm start (e.g. the main job's "
        "outputs/tool_use_game_tiny/sft, which is the same recipe)",
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--val-every", type=int, default=4)
    parser.add_argument("--val-tasks", type=int, default=128)
    parser.add_argument("--targets", type=float, nargs="+", default=[0.5, 0.6, 0.7])
    parser.add_argument("--quick", action="store_true", help="tiny sizes; writes nothing")
    parser.add_argument("--out-dir", type=Path, default=None)
    parser.add_argument("--no-write", dest="write", action="store_false")
    args = parser.parse_args(argv)
    result = run(args)
    text = report(result)
    print(text)
    out = output_dir(args.quick, args.out_dir, args.write)
    if out is not None:
        write_markdown(NAME, text, out)
        write_json(NAME, result, out)
        plot(result, out / f"{NAME}.png")
    return result


if __name__ == "__main__":
    main()
