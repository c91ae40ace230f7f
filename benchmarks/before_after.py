"""Before and after a change, side by side in one run: env steps and rollout throughput of two
source trees (a base revision and the working tree), interleaved and repeated.

Each round runs one fresh interpreter per tree (the order alternates between rounds), and each
interpreter times the same probes with its own tree's code:

* ``env_step``: the median µs of ``env.step`` through ``gym.make`` with oracle actions, per
  environment (``benchmarks.env_step.time_env``, which both trees have), the median of three
  passes after a warm-up;
* ``rollout``: episodes/s and sampled tokens/s of ``collect_groups`` with ``HFPolicy`` on
  ToolUseGame val tasks (``benchmarks.rollout_throughput.run_ours``), one torch thread, the same
  tools-calling model for both trees, the median of three collections after a warm-up.

Reported per probe: each tree's median over rounds and the median of the per-round ratios
after/before with their range (a ratio above 1 is a slowdown for µs, a speed-up for per-second
numbers).

    python -m benchmarks.before_after --base BASE --rounds 5 --model outputs/tool_use_game_tiny/sft
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.common import RESULTS_DIR, machine_description, ratio_interval, write_markdown

ROOT = Path(__file__).resolve().parents[1]

_ENV_STEP_PROBE = r"""
import json, statistics, sys
from benchmarks.env_step import time_env
envs, episodes = sys.argv[1].split(","), int(sys.argv[2])
out = {}
for env_id in envs:
    time_env(env_id, 5, 1)  # warm-up
    passes = [
        statistics.median([t for values in time_env(env_id, episodes, 1).values() for t in values])
        for _ in range(3)
    ]
    out[f"env_step/{env_id} (µs)"] = statistics.median(passes)
print(json.dumps(out))
"""

_ROLLOUT_PROBE = r"""
import json, sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from benchmarks.rollout_throughput import Args, run_ours
from llm_gym.envs.tool_use_game import get_tasks
torch.set_num_threads(1)
path, tasks = sys.argv[1], int(sys.argv[2])
tokenizer = AutoTokenizer.from_pretrained(path)
model = AutoModelForCausalLM.from_pretrained(path).eval()
val = list(get_tasks("val"))
args = Args(model=path, tasks=tasks, write=False, waves=False)
run_ours(model, tokenizer, val[:2], Args(model=path, episodes_per_task=1, max_turns=2))
runs = sorted((run_ours(model, tokenizer, val[:tasks], args, seed=0) for _ in range(3)),
              key=lambda run: run["wall_s"])
run = runs[1]  # the median of three timed collections
print(json.dumps({
    "rollout/episodes per s": run["episodes"] / run["wall_s"],
    "rollout/tokens per s": run["tokens"] / run["wall_s"],
}))
"""


@dataclass
class Args:
    base: str = "HEAD~1"
    """The revision to compare the working tree with."""
    rounds: int = 5
    """Rounds; each runs both trees once, in alternating order."""
    envs: list[str] = field(default_factory=lambda: ["GuessNumber-v0", "ToolUseGame-v0"])
    """Environments of the env_step probe."""
    episodes: int = 200
    """Oracle episodes per environment and round."""
    model: str | None = None
    """A tools-calling model folder for the rollout probe (None: skip it)."""
    tasks: int = 16
    """ToolUseGame val tasks of the rollout probe (x4 episodes each)."""
    out_dir: Path = RESULTS_DIR
    """Where before_after.md/.json/.png go."""
    write: bool = True
    """Write the results files."""


def _run_probe(tree: Path, code: str, argv: list[str]) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONWARNINGS": "ignore"}
    done = subprocess.run(
        [sys.executable, "-c", code, *argv],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"probe failed in {tree}: {done.stderr.strip()[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _probe_all(tree: Path, args: Args) -> dict[str, float]:
    out = _run_probe(tree, _ENV_STEP_PROBE, [",".join(args.envs), str(args.episodes)])
    if args.model:
        model = str(Path(args.model).resolve())
        out.update(_run_probe(tree, _ROLLOUT_PROBE, [model, str(args.tasks)]))
    return out


def compare(rounds: list[dict[str, dict[str, float]]]) -> list[dict[str, object]]:
    """Per metric: both medians, the per-round ratios after/before (median, min, max), and the
    ratio of the medians with its paired bootstrap 95% interval over rounds.

    Example:
        >>> rows = compare([{"before": {"m": 2.0}, "after": {"m": 3.0}},
        ...                 {"before": {"m": 2.0}, "after": {"m": 2.0}}])
        >>> rows[0]["ratio"], rows[0]["ratio_range"]
        (1.25, [1.0, 1.5])
    """
    rows = []
    for metric in rounds[0]["before"]:
        before = [r["before"][metric] for r in rounds]
        after = [r["after"][metric] for r in rounds]
        ratios = [a / b for a, b in zip(after, before, strict=True)]
        rows.append(
            {
                "metric": metric,
                "before": statistics.median(before),
                "after": statistics.median(after),
                "ratio": statistics.median(ratios),
                "ratio_range": [min(ratios), max(ratios)],
                "ratio_of_medians": ratio_interval(after, before).as_json(),
                "rounds": len(rounds),
            }
        )
    return rows


def _ci(estimate: dict[str, object]) -> str:
    low, high = estimate["ci"]  # type: ignore[misc]
    return f"{estimate['median']:.3f} [{low:.3f}, {high:.3f}]"


def _plot(rows: list[dict[str, object]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 0.6 + 0.55 * len(rows)))
    names = [str(r["metric"]) for r in rows]
    ratios = [float(r["ratio"]) for r in rows]  # type: ignore[arg-type]
    low = [float(r["ratio"]) - r["ratio_range"][0] for r in rows]  # type: ignore[index]
    high = [r["ratio_range"][1] - float(r["ratio"]) for r in rows]  # type: ignore[index]
    ax.barh(names, ratios, xerr=[low, high], color="#4C72B0", capsize=3)
    ax.axvline(1.0, color="#C44E52", linestyle="--")
    ax.set_xlabel("after / before (median of rounds; bars: min-max)")
    ax.set_title("Before and after, side by side")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(args: Args) -> list[dict[str, object]]:
    def git(*argv: str) -> str:
        return subprocess.run(
            ["git", *argv], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()

    base, head = git("rev-parse", "--short", args.base), git("rev-parse", "--short", "HEAD")
    changed = git("status", "--porcelain", "--untracked-files=no")
    dirty = " with uncommitted changes" if changed else ""
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "base"
        git("worktree", "add", "--detach", str(tree), base)
        try:
            load_before = os.getloadavg()[0]
            rounds = []
            for r in range(args.rounds):
                order = [("before", tree), ("after", ROOT)]
                result = {}
                for name, where in order if r % 2 == 0 else order[::-1]:
                    result[name] = _probe_all(where, args)
                rounds.append(result)
                print(f"round {r + 1}/{args.rounds}: {json.dumps(result)}", flush=True)
            load_after = os.getloadavg()[0]
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT)
    rows = compare(rounds)
    conditions = (
        f"Machine: {machine_description()}. Base {base} vs {head}{dirty}, {args.rounds} rounds "
        f"alternating the order; each probe in a fresh interpreter; env_step: {args.episodes} "
        f"oracle episodes per env and round; rollout: 1 torch thread, {args.tasks} ToolUseGame val "
        f"tasks x 4 episodes, model `{args.model}`. Load average {load_before:.2f} before, "
        f"{load_after:.2f} after."
    )
    lines = [
        "# Before and after: env steps and rollout throughput",
        "",
        conditions,
        "",
        "| metric | before | after | after / before (median) | range over rounds | "
        "ratio of medians [95% CI] |",
        "| --- | ---: | ---: | ---: | --- | --- |",
    ]
    for row in rows:
        low, high = row["ratio_range"]  # type: ignore[misc]
        lines.append(
            f"| {row['metric']} | {row['before']:.2f} | {row['after']:.2f} | "
            f"{row['ratio']:.3f} | [{low:.3f}, {high:.3f}] | {_ci(row['ratio_of_medians'])} |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if args.write:
        write_markdown("before_after", text, args.out_dir)
        record = {
            "base": base,
            "head": head,
            "conditions": conditions,
            "rows": rows,
            "rounds": rounds,
        }
        (args.out_dir / "before_after.json").write_text(json.dumps(record, indent=2) + "\n")
        _plot(rows, args.out_dir / "before_after.png")
    return rows


def parse_args(argv: list[str] | None = None) -> Args:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--base", default=Args.base)
    parser.add_argument("--rounds", type=int, default=Args.rounds)
    parser.add_argument("--envs", nargs="+", default=None)
    parser.add_argument("--episodes", type=int, default=Args.episodes)
    parser.add_argument("--model", default=None)
    parser.add_argument("--tasks", type=int, default=Args.tasks)
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--no-write", dest="write", action="store_false")
    ns = parser.parse_args(argv)
    values = {k: v for k, v in vars(ns).items() if v is not None}
    return Args(**values)


if __name__ == "__main__":
    main(parse_args())
