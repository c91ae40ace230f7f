"""The tiny agent for the whole suite: ``configs/suite_tiny.yaml`` estimated, then run.

1. ``--estimate``: measure the unit costs on this machine with a probe run of the config
   (a few SFT steps of each phase, two GRPO steps at the config's batch, a few evaluation
   episodes per environment) and print the estimate of the whole recipe
   (:func:`estimate_seconds`). Writes nothing.
2. Without it: the run itself (``train.py`` on the config, through
   :func:`trainers.pipeline.run.run_pipeline`), timed, with the machine's conditions; writes
   ``suite_tiny.md`` (each environment's success after SFT and after GRPO on the test split,
   with 95% intervals: the run's leaderboard), ``suite_tiny.json`` (the records and the summary)
   and ``suite_tiny.png`` (the reward per environment over the GRPO steps).

    python -m benchmarks.suite_tiny --estimate     # ~4 min
    python -m benchmarks.suite_tiny                # the run: ~35 min on 2 quiet cores
    python -m benchmarks.suite_tiny --render results/suite_tiny.json   # the report again
"""

from __future__ import annotations

import argparse
import json
import tempfile
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

NAME = "suite_tiny"
CONFIG = ROOT / "configs" / "suite_tiny.yaml"
PROBE = {
    "sft.short_context_steps": 24,
    "sft.max_steps": 6,
    "grpo.num_steps": 2,
    "evaluation.episodes": 6,
}
"""The probe run's shrunk settings (the rest, the batch sizes included, are the config's)."""


def estimate_seconds(
    costs: dict[str, float], recipe: dict[str, float], envs: int
) -> dict[str, float]:
    """The recipe's seconds by phase from measured unit costs.

    ``costs``: ``demonstration`` (making one SFT transcript, the model's loading shared out),
    ``short_step`` and ``full_step`` (one SFT step of each phase), ``grpo_step`` (one GRPO step
    at the recipe's batch), ``eval_episode`` (one evaluation episode, over the environments).
    ``recipe``: ``episodes``, ``short_steps``, ``full_steps``, ``grpo_steps``,
    ``eval_episodes`` (per environment and evaluation; there are two evaluations).

    Example:
        >>> costs = {"demonstration": 0.01, "short_step": 1.0, "full_step": 4.0,
        ...          "grpo_step": 30.0, "eval_episode": 0.5}
        >>> recipe = {"episodes": 1000, "short_steps": 100, "full_steps": 10,
        ...           "grpo_steps": 10, "eval_episodes": 50}
        >>> estimate_seconds(costs, recipe, envs=6)
        {'sft': 150.0, 'grpo': 300.0, 'evaluation': 300.0, 'total': 750.0}
    """
    sft = (
        recipe["episodes"] * costs["demonstration"]
        + recipe["short_steps"] * costs["short_step"]
        + recipe["full_steps"] * costs["full_step"]
    )
    grpo = recipe["grpo_steps"] * costs["grpo_step"]
    evaluation = 2 * envs * recipe["eval_episodes"] * costs["eval_episode"]
    return {"sft": sft, "grpo": grpo, "evaluation": evaluation, "total": sft + grpo + evaluation}


def _recipe(config: Any) -> dict[str, float]:
    return {
        "episodes": config.sft.episodes,
        "short_steps": config.sft.short_context_steps,
        "full_steps": config.sft.max_steps,
        "grpo_steps": config.grpo["num_steps"],
        "eval_episodes": config.evaluation.episodes,
    }


def unit_costs(summary: dict[str, Any], out: Path, recipe: dict[str, float]) -> dict[str, float]:
    """The unit costs of :func:`estimate_seconds` from a probe run's outputs (``summary.json``
    and each SFT phase's ``sft_info.json`` in ``out``; ``recipe``: the probe's)."""
    short = json.loads((out / "sft_short_context" / "sft_info.json").read_text())
    full = json.loads((out / "sft" / "sft_info.json").read_text())
    training = short["train_seconds"] + full["train_seconds"]
    envs = len(summary["envs"])
    evaluated = sum(summary["evaluation_seconds"].values())
    return {
        "demonstration": (summary["sft_seconds"] - training) / recipe["episodes"],
        "short_step": short["train_seconds"] / short["steps"],
        "full_step": full["train_seconds"] / full["steps"],
        "grpo_step": summary["grpo_seconds"] / recipe["grpo_steps"],
        "eval_episode": evaluated / (2 * envs * recipe["eval_episodes"]),
        "build": summary.get("build_seconds", 0.0),
    }


def estimate(config_path: Path, threads: dict[str, Any] | None = None) -> dict[str, Any]:
    """The probe run and the estimate (see the module docstring); prints both."""
    from trainers.pipeline.run import load_config, run_pipeline

    full = load_config(config_path, {})
    with tempfile.TemporaryDirectory(prefix="llm_gym_suite_probe_") as tmp:
        episodes = full.sft.batch_size * (PROBE["sft.short_context_steps"] + 1)
        probe = load_config(config_path, {**PROBE, "sft.episodes": episodes, "output_dir": tmp})
        summary = run_pipeline(probe)
        costs = unit_costs(summary, Path(tmp), _recipe(probe))
    envs = len(summary["envs"])
    seconds = estimate_seconds(costs, _recipe(full), envs)
    seconds["total"] += costs["build"]
    print("\nUnit costs (s): " + ", ".join(f"{k} {v:.3f}" for k, v in costs.items()))
    print(
        f"Estimate of {config_path.name} ({envs} envs): SFT {seconds['sft']:.0f} s, GRPO "
        f"{seconds['grpo']:.0f} s, evaluations {seconds['evaluation']:.0f} s; total "
        f"{seconds['total'] / 60:.1f} min"
    )
    return {
        "unit_costs": costs,
        "estimate_seconds": seconds,
        "recipe": _recipe(full),
        "threads": threads,
    }


def run(config_path: Path, threads: dict[str, Any]) -> dict[str, Any]:
    """The recipe, timed: the run's summary, its leaderboard records and the conditions
    (``threads``: :func:`~benchmarks.common.pin_threads`'s settings)."""
    from trainers.pipeline.run import load_config, run_pipeline

    conditions = Conditions.start(NAME, threads=threads, settings={})
    config = load_config(config_path, {})
    summary = run_pipeline(config)
    conditions.finish()
    out = Path(config.output_dir)
    records = json.loads((out / "leaderboard.json").read_text())
    table = (out / "leaderboard.md").read_text()
    return {
        "conditions": conditions.as_json(),
        "config": str(config_path.relative_to(ROOT))
        if config_path.is_relative_to(ROOT)
        else str(config_path),
        "summary": summary,
        "leaderboard": records,
        "table": table,
    }


def validation_points(
    history: list[dict[str, Any]], envs: list[str]
) -> list[tuple[int, dict[str, float], float | None]]:
    """The validation history as ``(step, success by env, mean over envs)`` in step order; the
    mean only where every env validated at that step (``keep_best``'s points).

    Example:
        >>> history = [{"step": 0, "env": "a", "success_rate": 0.5},
        ...            {"step": 0, "env": "b", "success_rate": 0.25},
        ...            {"step": 5, "env": "a", "success_rate": 0.75}]
        >>> validation_points(history, ["a", "b"])
        [(0, {'a': 0.5, 'b': 0.25}, 0.375), (5, {'a': 0.75}, None)]
    """
    from trainers.grpo.best_point import mixture_point

    steps: dict[int, dict[str, float]] = {}
    for record in history:
        if "success_rate" in record:
            steps.setdefault(int(record["step"]), {})[record["env"]] = record["success_rate"]
    return [(step, values, mixture_point(values, envs)) for step, values in sorted(steps.items())]


def _validation_lines(summary: dict[str, Any]) -> list[str]:
    """The validation table and the kept point (none when the run did not validate)."""
    envs = list(summary["envs"])
    points = validation_points(summary.get("validation_history", []), envs)
    if not points:
        return []
    kept = summary.get("best_point")
    lines = [
        "Validation during GRPO (greedy success on each env's val split; the mean where every "
        "env validated is `keep_best`'s point):",
        "",
        "| step | " + " | ".join(envs) + " | mean |",
        "| ---: | " + " | ".join("---:" for _ in envs) + " | ---: |",
    ]
    for step, values, mean in points:
        cells = [f"{values[e]:.3f}" if e in values else "" for e in envs]
        shown = "" if mean is None else f"{mean:.3f}"
        if kept is not None and step == kept["step"] and mean is not None:
            shown = f"**{shown}** (kept)"
        lines.append(f"| {step} | " + " | ".join(cells) + f" | {shown} |")
    if kept is not None:
        lines += [
            "",
            f"The model after GRPO holds the weights of step {kept['step']} (mean validation "
            f"success {kept['value']:.3f}; the last step, {kept['final_step']}, had "
            f"{kept['final_value']:.3f}): the settings and the kept step were chosen on val, the "
            "leaderboard above reports the test split.",
        ]
    return ["", *lines]


def report(result: dict[str, Any]) -> str:
    """``suite_tiny.md``: conditions, timings, the leaderboard table, the rows that stay at 0."""
    summary = result["summary"]
    seconds = summary.get("evaluation_seconds", {})
    rows = summary.get("sft_rows", {})
    at_zero = sorted(
        {key.split("/")[0] for key, v in summary["evaluation"].items() if v["success_rate"] == 0}
        - {key.split("/")[0] for key, v in summary["evaluation"].items() if v["success_rate"] > 0}
    )
    table = result["table"].split("\n", 1)[1].lstrip()  # its own title dropped
    lines = [
        "# The tiny agent for the whole suite (CPU)",
        "",
        Conditions(**result["conditions"]).describe(),
        "",
        f"Config: `{result['config']}`: the embedded tiny model (its tokenizer fitted to the "
        f"{len(summary['envs'])} environments' text), an SFT warm start on their oracles' "
        "demonstrations by weight, then GRPO on the same mixture. Weights: "
        + ", ".join(f"{name} {env['weight']:g}" for name, env in summary["envs"].items())
        + ". SFT rows by environment: "
        + ", ".join(f"{name} {count}" for name, count in rows.items())
        + ".",
        "",
        f"Time: **{summary['total_seconds'] / 60:.1f} min** in all (SFT "
        f"{summary.get('sft_seconds', 0):.0f} s, GRPO {summary['grpo_seconds']:.0f} s, "
        + ", ".join(f"evaluation {stage} {s:.0f} s" for stage, s in seconds.items())
        + "; target < 45 min).",
        "",
        table.rstrip(),
        *_validation_lines(summary),
        "",
        "Stays at 0.000 after SFT and after GRPO: "
        + (", ".join(at_zero) if at_zero else "none")
        + ".",
    ]
    return "\n".join(lines) + "\n"


def plot(result: dict[str, Any], path: Path) -> None:
    """The train reward of each environment over the GRPO steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = result["summary"]
    log = summary["train_log"]
    envs = list(summary["envs"])
    validation = validation_points(summary.get("validation_history", []), envs)
    fig, axes = plt.subplots(1, 2 if validation else 1, figsize=(12 if validation else 7, 4))
    ax = axes[0] if validation else axes
    for name in envs:
        key = f"env/{name}/reward"
        points = [(r["step"], r[key]) for r in log if key in r and "step" in r]
        if points:
            ax.plot(*zip(*points, strict=True), marker="o", label=name)
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("train reward (mean of the step's episodes)")
    ax.set_title("The tiny agent on the suite: reward per environment")
    ax.legend(fontsize=8)
    if validation:
        ax = axes[1]
        for name in envs:
            points = [(step, values[name]) for step, values, _ in validation if name in values]
            ax.plot(*zip(*points, strict=True), marker="o", label=name)
        means = [(step, mean) for step, _, mean in validation if mean is not None]
        ax.plot(*zip(*means, strict=True), "k--", marker="s", label="mean (keep_best)")
        ax.set_xlabel("GRPO step")
        ax.set_ylabel("greedy validation success")
        ax.set_title("Validation (val split)")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=CONFIG)
    parser.add_argument("--estimate", action="store_true", help="probe and estimate only")
    parser.add_argument("--out-dir", type=Path, default=None)
    parser.add_argument("--no-write", dest="write", action="store_false")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch's intra-op threads (default: torch's; 1 on a machine shared with other "
        "work, where two threads wait on each other)",
    )
    parser.add_argument(
        "--render",
        type=Path,
        default=None,
        help="render the markdown and PNG from a suite_tiny.json, without running",
    )
    args = parser.parse_args(argv)
    threads = pin_threads(args.threads)
    if args.estimate:
        return estimate(args.config, threads)
    result = json.loads(args.render.read_text()) if args.render else run(args.config, threads)
    out = output_dir(False, args.out_dir, args.write)
    if out is not None and args.render is None:
        write_json(NAME, result, out)
    text = report(result)
    print(text)
    if out is not None:
        write_markdown(NAME, text, out)
        plot(result, out / f"{NAME}.png")
    return result


if __name__ == "__main__":
    main()
