"""Median microseconds per ``step`` of every registered environment, through ``gym.make``.

Each step is timed alone (``perf_counter_ns`` around ``env.step``): parsing the action text,
running the tools, bookkeeping and the ``info`` dict. Actions come from the environment's oracle,
so steps are the ones a competent agent takes; they are grouped by what the action did (the tool
it called, or ``final_answer``).

    python -m benchmarks.env_step              # all environments, writes results/env_step.md
    python -m benchmarks.env_step --episodes 50 --no-write

Side by side in the same run, GEM's ``game:GuessTheNumber-v0-easy`` (PyPI ``gem-llm``) is timed
the same way (``perf_counter_ns`` around ``env.step``, a bisection agent reading the feedback),
in a separate virtual environment because gem-llm pins packages of its own::

    python -m venv .venv-peers && .venv-peers/bin/pip install gem-llm
    python -m benchmarks.env_step --peers-python .venv-peers/bin/python   # the default path
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
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

GEM_ENV = "game:GuessTheNumber-v0-easy"
"""GEM's environment timed beside ours."""
GEM_LABEL = f"GEM {GEM_ENV}"
RELATIVE_TARGETS = {"GuessNumber-v0": (GEM_LABEL, 2.0)}
"""Targets relative to a peer: our env's median over all its steps <= factor x the peer's."""
EPISODE_CAPS = {"Code-v0": 40}
"""Environments whose steps run a sandboxed subprocess (~50 ms a step) time fewer episodes."""
DEFAULT_PEERS_PYTHON = Path(__file__).resolve().parents[1] / ".venv-peers" / "bin" / "python"

_GEM_SNIPPET = r"""
import json, re, sys, time
import gem

episodes, repeats = int(sys.argv[1]), int(sys.argv[2])
env = gem.make(sys.argv[3])
number = re.compile(r"between (\d+) and (\d+)")
times = []
for _ in range(repeats):
    for episode in range(episodes):
        observation, _ = env.reset(seed=episode)
        low, high = map(int, number.search(observation).groups())
        while True:
            guess = (low + high) // 2
            start = time.perf_counter_ns()
            observation, _, terminated, truncated, _ = env.step("\\boxed{%d}" % guess)
            times.append((time.perf_counter_ns() - start) / 1000)
            if terminated or truncated:
                break
            if "higher" in observation:
                low = guess + 1
            else:
                high = guess - 1
print(json.dumps(times))
"""


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
    peers: bool = True
    """Time GEM's GuessTheNumber beside ours (skipped, with a note, when gem-llm is missing)."""
    peers_python: str | None = None
    """An interpreter with gem-llm installed (default: ``.venv-peers/bin/python``)."""


def _action_kind(info: dict, done: bool) -> str:
    message = next(m for m in reversed(info["messages"]) if m.get("role") == "assistant")
    calls = message.get("tool_calls") or []
    if not calls:
        return "final_answer" if done else "text"
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
                times[_action_kind(info, terminated or truncated)].append(elapsed)
                if terminated or truncated:
                    break
    env.close()
    return times


def time_gem(python: str | Path | None, episodes: int, repeats: int) -> list[float] | None:
    """GEM's step times in µs, measured by ``python`` (an interpreter with gem-llm installed).

    Returns None when no such interpreter is found (the row is then left out, with a note).
    """
    candidates = [str(python)] if python else []
    if not python and DEFAULT_PEERS_PYTHON.exists():
        candidates.append(str(DEFAULT_PEERS_PYTHON))
    candidates.append(sys.executable)
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    for exe in candidates:
        done = subprocess.run(
            [exe, "-c", _GEM_SNIPPET, str(episodes), str(repeats), GEM_ENV],
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
        if done.returncode == 0:
            return json.loads(done.stdout.strip().splitlines()[-1])
        if python:
            raise RuntimeError(f"GEM timing failed with {exe}: {done.stderr.strip()[-2000:]}")
    return None


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
    by_env: dict[str, dict[str, list[float]]] = {env_id: defaultdict(list) for env_id in env_ids}
    gem_times: list[float] | None = [] if args.peers else None
    # Passes alternate between our environments and GEM's, so both see the same machine load.
    for _ in range(args.repeats):
        for env_id in env_ids:
            episodes = min(args.episodes, EPISODE_CAPS.get(env_id, args.episodes))
            for kind, values in time_env(env_id, episodes, 1).items():
                by_env[env_id][kind].extend(values)
        if gem_times is not None:
            more = time_gem(args.peers_python, args.episodes, 1)
            gem_times = None if more is None else gem_times + more
    every_step: dict[str, list[float]] = {}
    for env_id in env_ids:
        every_step[env_id] = [t for values in by_env[env_id].values() for t in values]
        for kind, values in sorted(by_env[env_id].items()):
            rows.append((env_id, kind, statistics.median(values), len(values)))
    if gem_times:
        every_step[GEM_LABEL] = gem_times
        rows.append((GEM_LABEL, "guess (\\boxed{n})", statistics.median(gem_times), len(gem_times)))
    lines = [
        "# env.step: median µs per step",
        "",
        f"Machine: {machine_description()}. llm_gym {llm_gym.__version__}, "
        f"gymnasium {gym.__version__}.",
        f"Command: `python -m benchmarks.env_step --episodes {args.episodes} "
        f"--repeats {args.repeats}`. Our steps go through `gym.make` (with its default "
        "wrappers); actions come from each environment's oracle.",
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
    lines.append("")
    for env_id, (peer, factor) in RELATIVE_TARGETS.items():
        if env_id not in every_step:
            continue
        ours = statistics.median(every_step[env_id])
        if peer not in every_step:
            lines.append(
                f"{env_id}: median {ours:.1f} µs over all steps; {peer} not measured (install "
                "gem-llm in .venv-peers, see the module docstring)."
            )
            continue
        theirs = statistics.median(every_step[peer])
        ratio = ours / theirs
        lines.append(
            f"{env_id} vs {peer}: median over all steps {ours:.1f} µs vs {theirs:.1f} µs, "
            f"ratio {ratio:.2f} (target ≤ {factor:g}x: {'met' if ratio <= factor else 'MISSED'})."
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if args.write:
        write_markdown("env_step", text, args.out_dir)
        record = {
            "machine": machine_description(),
            "command": f"python -m benchmarks.env_step --episodes {args.episodes} "
            f"--repeats {args.repeats}",
            "rows": [
                {"env": env, "action": kind, "median_us": median, "steps": count}
                for env, kind, median, count in rows
            ],
            "median_us_over_all_steps": {k: statistics.median(v) for k, v in every_step.items()},
        }
        (args.out_dir / "env_step.json").write_text(json.dumps(record, indent=2) + "\n")
        _plot(rows, args.out_dir / "env_step.png")
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
    parser.add_argument(
        "--peers-python",
        default=None,
        help=f"an interpreter with gem-llm (default: {DEFAULT_PEERS_PYTHON} if it exists)",
    )
    parser.add_argument("--no-peers", dest="peers", action="store_false", help="skip GEM")
    ns = parser.parse_args(argv)
    return Args(
        envs=ns.envs,
        episodes=ns.episodes,
        repeats=ns.repeats,
        out_dir=ns.out_dir,
        write=ns.write,
        peers=ns.peers,
        peers_python=ns.peers_python,
    )


if __name__ == "__main__":
    main(parse_args())
