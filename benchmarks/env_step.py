"""Median microseconds per ``step`` of every registered environment, through ``gym.make``.

Each step is timed alone (``perf_counter_ns`` around ``env.step``): parsing the action text,
running the tools, bookkeeping and the ``info`` dict. Actions come from the environment's oracle,
so steps are the ones a competent agent takes; they are grouped by what the action did (the tool
it called, or ``final_answer``).

    python -m benchmarks.env_step              # all environments, writes results/env_step.md
    python -m benchmarks.env_step --episodes 50 --no-write
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym

import llm_gym
from benchmarks.common import RESULTS_DIR, machine_description, write_markdown
from llm_gym.gym import registered_envs

TARGETS_US = {("ToolUseGame-v0", "lookup"): 50.0}
"""Targets from the issues: median µs per step."""


@dataclass
class Args:
    envs: list[str] | None = None
    """Environment ids (default: every registered one)."""
    episodes: int = 400
    """Oracle episodes per environment (tasks cycle through the val split)."""
    repeats: int = 3
    """Passes over the episodes; the median is over every timed step of every pass."""
    out_dir: Path = RESULTS_DIR
    """Where env_step.md and env_step.png go."""
    write: bool = True
    """Write the results files (off for smoke tests)."""


def _action_kind(info: dict) -> str:
    message = next(m for m in reversed(info["messages"]) if m.get("role") == "assistant")
    calls = message.get("tool_calls") or []
    if not calls:
        return "final_answer"
    counts: dict[str, int] = defaultdict(int)
    for call in calls:
        counts[call["function"]["name"]] += 1
    return " + ".join(f"{name} x{n}" if n > 1 else name for name, n in sorted(counts.items()))


def time_env(env_id: str, episodes: int, repeats: int) -> dict[str, list[float]]:
    """Step times in µs, grouped by action kind."""
    env = gym.make(env_id)
    unwrapped = env.unwrapped
    n_tasks = len(unwrapped.tasks("val"))
    times: dict[str, list[float]] = defaultdict(list)
    for _ in range(repeats):
        for episode in range(episodes):
            env.reset(seed=episode, options={"split": "val", "index": episode % n_tasks})
            while True:
                action = unwrapped.oracle_action()
                start = time.perf_counter_ns()
                _, _, terminated, truncated, info = env.step(action)
                elapsed = (time.perf_counter_ns() - start) / 1000
                times[_action_kind(info)].append(elapsed)
                if terminated or truncated:
                    break
    env.close()
    return times


def _plot(rows: list[tuple[str, str, float, int]], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    labels = [f"{env}\n{kind}" for env, kind, _, _ in rows]
    values = [median for _, _, median, _ in rows]
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(rows)), 4.5))
    bars = ax.bar(range(len(rows)), values, color="#4C72B0")
    for (env, kind, _, _), bar in zip(rows, bars, strict=True):
        target = TARGETS_US.get((env, kind))
        if target is not None:
            ax.hlines(
                target,
                bar.get_x(),
                bar.get_x() + bar.get_width(),
                colors="#C44E52",
                linestyles="--",
                label=f"target {env} {kind}: {target:g} µs",
            )
    ax.bar_label(bars, fmt="%.1f", label_type="center", color="white", fontsize=9)
    ax.set_xticks(range(len(rows)), labels, fontsize=8)
    ax.set_ylabel("median µs per step")
    ax.set_title("llm_gym env.step through gym.make (oracle actions)")
    if any((env, kind) in TARGETS_US for env, kind, _, _ in rows):
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def main(args: Args) -> list[tuple[str, str, float, int]]:
    env_ids = args.envs or [entry.id for entry in registered_envs()]
    rows: list[tuple[str, str, float, int]] = []
    for env_id in env_ids:
        for kind, values in sorted(time_env(env_id, args.episodes, args.repeats).items()):
            rows.append((env_id, kind, statistics.median(values), len(values)))
    lines = [
        "# env.step: median µs per step",
        "",
        f"Machine: {machine_description()}. llm_gym {llm_gym.__version__}, "
        f"gymnasium {gym.__version__}.",
        f"Command: `python -m benchmarks.env_step --episodes {args.episodes} "
        f"--repeats {args.repeats}`.",
        "",
        "| env | action | median µs | steps timed | target |",
        "| --- | --- | ---: | ---: | --- |",
    ]
    for env_id, kind, median, count in rows:
        target = TARGETS_US.get((env_id, kind))
        verdict = (
            "" if target is None else f"≤ {target:g} µs: {'met' if median <= target else 'MISSED'}"
        )
        lines.append(f"| {env_id} | {kind} | {median:.1f} | {count} | {verdict} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.write:
        write_markdown("env_step", text, args.out_dir)
        if _plot(rows, args.out_dir / "env_step.png"):
            lines.append("")
        print(f"wrote {args.out_dir / 'env_step.md'}")
    return rows


def parse_args(argv: list[str] | None = None) -> Args:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--envs", nargs="*", default=None)
    parser.add_argument("--episodes", type=int, default=Args.episodes)
    parser.add_argument("--repeats", type=int, default=Args.repeats)
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--no-write", dest="write", action="store_false")
    ns = parser.parse_args(argv)
    return Args(
        envs=ns.envs, episodes=ns.episodes, repeats=ns.repeats, out_dir=ns.out_dir, write=ns.write
    )


if __name__ == "__main__":
    main(parse_args())
