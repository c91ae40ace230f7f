"""The main job, measured: the README's training run, then its GRPO phase again with other seeds.

1. The job exactly as a newcomer runs it (``train.py --config configs/tool_use_game_tiny.yaml``,
   here through :func:`trainers.pipeline.run.run_pipeline`): the tiny model, the SFT warm start, the
   held-out evaluations before GRPO, GRPO with seed 0, the evaluations after. Its wall time is the
   job's time.
2. The GRPO phase again from the same SFT model with GRPO seeds 1, 2, ... (the evaluation seed
   stays the job's), so the gains come with their spread over seeds.

The job's outputs stay in the benchmark cache (``~/.cache/llm_gym/main-job``): the other
benchmarks start from its SFT model (``benchmarks.common.default_model``).

Every evaluation reads the config's split (the untouched test split: settings were chosen on
val) and each ``evaluation.variants`` entry (a new world: the same questions over a fact table
no training task has seen). Writes ``main_job.md``, ``main_job.json`` (``test_split`` and
``new_world`` sections, per seed) and ``main_job_reward_curve.png``.

    python -m benchmarks.main_job                       # 16 to 34 min on 2 cores
    python -m benchmarks.main_job --quick --model PATH  # smoke run, writes nothing
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.common import (
    ROOT,
    Conditions,
    cache_dir,
    output_dir,
    thread_settings,
    write_json,
    write_markdown,
)

NAME = "main_job"
CONFIG = ROOT / "configs" / "tool_use_game_tiny.yaml"
GAIN_KEYS = ("tasks", "episodes", "success_before", "success_after", "gain", "gain_ci",
             "gain_significant")  # fmt: skip
QUICK = {
    "sft.episodes": 16,
    "sft.max_steps": 2,
    "sft.short_context_steps": 1,
    "sft.batch_size": 4,
    "grpo.num_steps": 1,
    "grpo.batch_size": 2,
    "grpo.episodes_per_task": 2,
    "grpo.max_turns": 2,
    "grpo.max_tokens_per_turn": 8,
    "grpo.validation_interval": None,
    "grpo.keep_best": None,
    "val_tasks": 0,
    "evaluation.episodes": 2,
    "evaluation.samples": 2,
    "evaluation.max_new_tokens": 8,
}


def run(args: argparse.Namespace) -> dict[str, Any]:
    from trainers.pipeline.run import load_config, run_pipeline

    conditions = Conditions.start(
        NAME,
        threads=thread_settings(),
        settings={k: str(v) for k, v in vars(args).items()},
        quick=args.quick,
    )
    overrides: dict[str, Any] = dict(QUICK) if args.quick else {}
    if args.model:
        overrides["model"] = args.model
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="llm_gym_main_job_") as tmp:
        # The job's own outputs are kept (the other benchmarks read its SFT model from there).
        job_dir = f"{tmp}/seed0" if args.quick else str(cache_dir() / "main-job")
        first = load_config(args.config, {**overrides, "output_dir": job_dir})
        print(f"== the main job, GRPO seed {args.seeds[0]}", flush=True)
        first.grpo.setdefault("seed", args.seeds[0])
        runs.append(run_pipeline(first))
        for seed in args.seeds[1:]:
            print(f"== the GRPO phase again, seed {seed}, from the same SFT model", flush=True)
            config = load_config(
                args.config,
                {
                    **overrides,
                    "model": runs[0]["start_model"],
                    "output_dir": f"{tmp}/seed{seed}",
                    "grpo.seed": seed,
                },
            )
            config.sft = None
            runs.append(run_pipeline(config))
    conditions.finish()
    return summarize(first, args.seeds, runs, conditions)


def _section(runs: list[dict[str, Any]], seeds: list[int], pick: Any) -> dict[str, Any]:
    """Per seed: success after SFT and after GRPO and the gain with its interval, sampled and
    greedy; and the spread of the gains over seeds."""
    per_seed = []
    for seed, summary in zip(seeds, runs, strict=True):
        evaluation = pick(summary["evaluation"])
        per_seed.append(
            {
                "grpo_seed": seed,
                **{
                    mode: {key: evaluation[mode][key] for key in GAIN_KEYS}
                    for mode in ("sampled", "greedy")
                    if mode in evaluation
                },
            }
        )
    spread = {}
    for mode in ("sampled", "greedy"):
        gains = [s[mode]["gain"] for s in per_seed if mode in s]
        if gains:
            spread[mode] = {
                "gain_median": statistics.median(gains),
                "gain_min": min(gains),
                "gain_max": max(gains),
                "seeds_with_interval_above_zero": sum(
                    s[mode]["gain_ci"][0] > 0 for s in per_seed if mode in s
                ),
            }
    return {"per_seed": per_seed, "over_seeds": spread}


def summarize(
    config: Any, seeds: list[int], runs: list[dict[str, Any]], conditions: Conditions
) -> dict[str, Any]:
    evaluation = runs[0]["evaluation"]
    sections = {"test_split": _section(runs, seeds, lambda e: e)}
    for name in evaluation.get("variants", {}):
        sections[name] = _section(runs, seeds, lambda e, n=name: e["variants"][n])
    job = runs[0]
    return {
        "benchmark": NAME,
        "conditions": conditions.as_json(),
        "split": evaluation["split"],
        "variants": {n: v["task_options"] for n, v in evaluation.get("variants", {}).items()},
        "seeds": seeds,
        "samples": config.evaluation.samples,
        "job": {
            "total_minutes": job["total_seconds"] / 60,
            "sft_seconds": job.get("sft_seconds"),
            "grpo_seconds": job["grpo_seconds"],
            "grpo_seconds_per_seed": [r["grpo_seconds"] for r in runs],
        },
        **sections,
        "train_log": {seed: r["train_log"] for seed, r in zip(seeds, runs, strict=True)},
        # grpo.keep_best: the validation point each seed's model after GRPO holds
        "best_point": {seed: r.get("best_point") for seed, r in zip(seeds, runs, strict=True)},
    }


def _row(name: str, entry: dict[str, Any], mode: str) -> str:
    g = entry[mode]
    low, high = g["gain_ci"]
    return (
        f"| {name} | {entry['grpo_seed']} | {g['success_before']:.3f} | {g['success_after']:.3f} "
        f"| **{g['gain']:+.3f}** [{low:+.3f}, {high:+.3f}] |"
    )


def _shown(path: Path) -> str:
    return str(path.resolve().relative_to(ROOT) if path.resolve().is_relative_to(ROOT) else path)


def report(result: dict[str, Any], config_path: Path) -> str:
    job = result["job"]
    lines = [
        "# The main job: the tiny agent on ToolUseGame-v0 (CPU)",
        "",
        Conditions(**{k: v for k, v in result["conditions"].items()}).describe(),
        "",
        f"Config: `{_shown(config_path)}`. "
        f"The job as the README runs it took **{job['total_minutes']:.1f} min** (SFT "
        f"{job['sft_seconds'] or 0:.0f} s, GRPO {job['grpo_seconds']:.0f} s; target <= 15 min). "
        f"Then its GRPO phase again from the same SFT model with seeds {result['seeds'][1:]} "
        f"(GRPO {', '.join(f'{s:.0f} s' for s in job['grpo_seconds_per_seed'][1:])}).",
        "",
        f"Held-out success on the **{result['split']} split** (untouched while settings were "
        "chosen on val) and on each variant; the gain is paired by task with its 95% interval.",
    ]
    kept = {seed: p for seed, p in (result.get("best_point") or {}).items() if p}
    if kept:
        metric = next(iter(kept.values()))["metric"]
        points = "; ".join(
            f"seed {seed}, step {p['step']} ({p['value']:.3f}; the last step, {p['final_step']}: "
            f"{p['final_value']:.3f})"
            for seed, p in kept.items()
        )
        lines += ["", f"The model after GRPO is each seed's best validation point on {metric} "
                      f"(`keep_best`): {points}."]  # fmt: skip
    names = {"test_split": f"{result['split']} split"}
    names.update({n: f"{n} {opts}" for n, opts in result["variants"].items()})
    for mode, how in (
        ("sampled", f"sampled ({result.get('samples', 8)} episodes a task at the training "
                    "temperature: the policy GRPO trains)"),
        ("greedy", "greedy (one episode a task)"),
    ):  # fmt: skip
        lines += [
            "",
            f"### {how}",
            "",
            "| tasks | GRPO seed | after SFT | after GRPO | gain [95% CI] |",
            "| --- | ---: | ---: | ---: | --- |",
        ]
        for key, label in names.items():
            for entry in result[key]["per_seed"]:
                if mode in entry:
                    lines.append(_row(label, entry, mode))
        for key, label in names.items():
            over = result[key]["over_seeds"].get(mode)
            if over:
                lines.append(
                    f"\n{label}: gain over seeds median {over['gain_median']:+.3f} (min "
                    f"{over['gain_min']:+.3f}, max {over['gain_max']:+.3f}); interval above zero "
                    f"in {over['seeds_with_interval_above_zero']} of {len(result['seeds'])} seeds."
                )
    lines += ["", *HOW_TO_READ]
    return "\n".join(lines) + "\n"


HOW_TO_READ = [
    "## How the job is built, and why",
    "",
    "- **No fact can be memorised.** Every SFT and GRPO task lives in a world of its own "
    "(`task_options: {world_seed: varied}`, a re-seeded fact table per task), so the only way to "
    "answer is to read the tool results. The test split's world and the new world (`world_seed: "
    "1`) are both worlds no training task was drawn from; the two rows measure the same skill on "
    "two fact tables. (Trained on the default world alone, as the job was before, a model scores "
    "better on that world than on any other: it answers from memory.)",
    "- **SFT, phase 1**: the oracle's transcripts without system prompt and tool specs, each "
    "question asked in 8 worlds (`sft.task_options: {worlds_per_question: 8}`: other facts, other "
    "answer, so the answer must be copied from the tool results, not recalled from the question), "
    "at lr 5e-4. At the 2e-3 the job used before, the tiny model learnt tool names and keys but "
    "never learnt to copy a number (its loss stalled near 0.2, and every success was on the "
    "two-way `compare` questions); at 5e-4 copying appears after about 500 steps.",
    "- **SFT, phase 2**: the full transcripts of an imperfect demonstrator "
    "(`HastyOracle(guess_rate=0.3, mental_rate=0.7)`): on 30% of the tasks it answers with a "
    "plausible guess instead of looking anything up, and on 70% of the rest that need arithmetic "
    "it does the sum in its head instead of calling the calculator (right for it, not for a "
    "2M-parameter model). The warm-started agent keeps both habits; GRPO is to correct them.",
    "- **GRPO**: 20 steps of 16 tasks x 8 episodes, Dr. GRPO advantages (`scale_rewards: none`), "
    "dapo loss, lr 2e-4 after 5 warmup steps, temperature 1.0, each plain lookup 4 times in its "
    "task list (`task_repeats: {lookup: 4}`: at 1x, 12% of the train split, GRPO's calculator "
    "habit spread to them and they were unlearnt). The SFT learning rate, the demonstrator's "
    "rates, the number of GRPO steps and the repeats were chosen on the val split and on a "
    "second unseen world (`world_seed: 2`), never on the rows above. The model GRPO hands on "
    "is the best of its validation points (`keep_best: val/success_rate`: greedy on 32 val "
    "tasks before the first step and at steps 10 and 20; ties keep the earliest).",
    "- The gains are paired by task (each task counts once, with its success rate over its "
    "samples), so the interval does not treat a task's samples as independent.",
]


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for i, (seed, log) in enumerate(result["train_log"].items()):
        steps = [r["step"] for r in log]
        rewards = [r["reward"] for r in log]
        color = f"C{i}"
        left.plot(steps, rewards, color=color, alpha=0.3, linewidth=0.8)
        window = 8  # the steps' tasks differ: a moving mean shows the trend
        smooth = [
            statistics.fmean(rewards[max(0, j - window + 1) : j + 1]) for j in range(len(rewards))
        ]
        left.plot(steps, smooth, color=color, linewidth=2,
                  label=f"GRPO seed {seed} (mean of the last {window} steps)")  # fmt: skip
    left.set_xlabel("GRPO step")
    left.set_ylabel("mean reward of the step's episodes")
    left.set_title("GRPO train reward (each seed from the same SFT model)")
    left.grid(alpha=0.3)
    left.legend(fontsize=8)
    names = ["test_split", *result["variants"]]
    width = 0.8 / (2 * len(result["seeds"]))
    for i, key in enumerate(names):
        for j, entry in enumerate(result[key]["per_seed"]):
            g = entry["sampled"]
            x = i + (2 * j - len(result["seeds"])) * width
            right.bar(x, g["success_before"], width, color="#BBBBBB",
                      label="after SFT" if i == j == 0 else None)  # fmt: skip
            right.bar(x + width, g["success_after"], width, color="#4C72B0",
                      label="after GRPO" if i == j == 0 else None)  # fmt: skip
    right.set_xticks(range(len(names)), [n.replace("_", " ") for n in names])
    right.set_ylabel("held-out success, sampled")
    right.set_title("Held-out success per GRPO seed")
    right.legend(fontsize=8)
    right.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=CONFIG)
    parser.add_argument("--model", default=None, help="start from this model (default: tiny)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--quick", action="store_true", help="tiny sizes; writes nothing")
    parser.add_argument("--out-dir", type=Path, default=None)
    parser.add_argument("--no-write", dest="write", action="store_false")
    parser.add_argument(
        "--from-json", type=Path, default=None, help="re-render the markdown and PNG of a run"
    )
    args = parser.parse_args(argv)
    if args.from_json is not None:
        result = json.loads(args.from_json.read_text())
        out = args.out_dir or args.from_json.parent
        write_markdown(NAME, report(result, args.config), out)
        plot(result, out / "main_job_reward_curve.png")
        return result
    if not args.quick and len(args.seeds) < 3:
        parser.error("a result needs at least 3 GRPO seeds (or --quick)")
    result = run(args)
    text = report(result, args.config)
    print(text)
    out = output_dir(args.quick, args.out_dir, args.write)
    if out is not None:
        write_markdown(NAME, text, out)
        write_json(NAME, result, out)
        plot(result, out / "main_job_reward_curve.png")
    return result


if __name__ == "__main__":
    main()
