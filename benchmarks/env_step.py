"""Median microseconds per ``step`` of every registered environment, through ``gym.make``.

Each step is timed alone (``perf_counter_ns`` around ``env.step``): parsing the action text,
running the tools, bookkeeping and the ``info`` dict. Actions come from the environment's oracle,
so steps are the ones a competent agent takes; they are grouped by what the action did (the tool
it called, or ``final_answer``).

    python -m benchmarks.env_step              # all environments, writes results/env_step.md
    python -m benchmarks.env_step --episodes 50 --no-write

Side by side in the same run, GEM's ``game:GuessTheNumber-v0-easy`` (PyPI ``gem-llm``) is timed
the same way (``perf_counter_ns`` around ``env.step``) in a separate virtual environment, because
gem-llm pins packages of its own. Both sides then do the same work per step: the same bisection
agent reads each side's feedback and sends the same action strings (``\\boxed{n}``) to
GuessNumber-v0 and to GEM (our oracle's bare digits would hit a faster parse), and the passes
interleave (ours, GEM, ours, ...) for ``--repeats`` repeats; the ratio is of the per-repeat
medians, with a paired bootstrap interval. Ours keeps the structured message history in
``info`` on every step, which GEM's text observation does not::

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
from benchmarks.common import (
    Conditions,
    check_repeats,
    median_interval,
    output_dir,
    pin_threads,
    ratio_interval,
    write_json,
    write_markdown,
)
from llm_gym.envs.builtin import BUILTIN_ENVS

TARGETS_US = {("ToolUseGame-v0", "lookup"): 50.0}
"""Targets from the issues: median µs per step."""

GEM_ENV = "game:GuessTheNumber-v0-easy"
"""GEM's environment timed beside ours."""
GEM_LABEL = f"GEM {GEM_ENV}"
SAME_ACTIONS = "GuessNumber-v0 (\\boxed{n}, bisection)"
"""Our GuessNumber driven exactly as GEM is: the same agent and action strings."""
RELATIVE_TARGETS = {SAME_ACTIONS: (GEM_LABEL, 2.0)}
"""Targets relative to a peer: our median step <= factor x the peer's (per-repeat medians)."""
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
    repeats: int = 5
    """Interleaved passes over the episodes (at least 5 for a result)."""
    out_dir: Path | None = None
    """Where env_step.md, .json and .png go (None: ``results/``; nowhere when ``quick``)."""
    write: bool = True
    """Write the results files (off for smoke tests)."""
    peers: bool = True
    """Time GEM's GuessTheNumber beside ours (skipped, with a note, when gem-llm is missing)."""
    peers_python: str | None = None
    """An interpreter with gem-llm installed (default: ``.venv-peers/bin/python``)."""
    quick: bool = False
    """A smoke run: at least 1 repeat, nothing written."""


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


_BOUNDS = __import__("re").compile(r"between (\d+) and (\d+)")


def time_boxed(episodes: int) -> list[float]:
    """Our GuessNumber-v0 driven as GEM is driven: a bisection agent reading the feedback and
    sending ``\\boxed{n}`` (µs per step)."""
    env = gym.make("GuessNumber-v0")
    n_tasks = len(env.unwrapped.tasks("val"))
    times: list[float] = []
    for episode in range(episodes):
        observation, _ = env.reset(
            seed=episode, options={"split": "val", "index": episode % n_tasks}
        )
        low, high = map(int, _BOUNDS.search(observation).groups())
        while True:
            guess = (low + high) // 2
            start = time.perf_counter_ns()
            observation, _, terminated, truncated, _ = env.step(f"\\boxed{{{guess}}}")
            times.append((time.perf_counter_ns() - start) / 1000)
            if terminated or truncated:
                break
            if "higher" in observation.lower():
                low = guess + 1
            else:
                high = guess - 1
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
    check_repeats(args.repeats, args.quick)
    threads = pin_threads(1)
    # The built-in table's ids (not ids a script or test registered on the side).
    env_ids = args.envs or [row.id for row in BUILTIN_ENVS]
    conditions = Conditions.start(
        "env_step",
        threads=threads,
        settings={k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        quick=args.quick,
    )
    by_env: dict[str, dict[str, list[float]]] = {env_id: defaultdict(list) for env_id in env_ids}
    per_repeat: dict[str, list[float]] = defaultdict(list)  # contender -> median step per repeat
    pooled: dict[str, list[float]] = defaultdict(list)
    gem = args.peers
    # Each repeat runs every contender once, in a rotating order (ours first, then GEM first...).
    for repeat in range(args.repeats):
        contenders = ["ours", "gem"] if gem else ["ours"]
        for name in contenders[repeat % len(contenders) :] + contenders[: repeat % len(contenders)]:
            if name == "gem":
                times = time_gem(args.peers_python, args.episodes, 1)
                if times is None:
                    gem = False
                    continue
                per_repeat[GEM_LABEL].append(statistics.median(times))
                pooled[GEM_LABEL].extend(times)
                continue
            for env_id in env_ids:
                episodes = min(args.episodes, EPISODE_CAPS.get(env_id, args.episodes))
                for kind, values in time_env(env_id, episodes, 1).items():
                    by_env[env_id][kind].extend(values)
            if "GuessNumber-v0" in env_ids:
                times = time_boxed(args.episodes)
                per_repeat[SAME_ACTIONS].append(statistics.median(times))
                pooled[SAME_ACTIONS].extend(times)
    conditions.finish()
    rows: list[tuple[str, str, float, int]] = []
    for env_id in env_ids:
        for kind, values in sorted(by_env[env_id].items()):
            rows.append((env_id, kind, statistics.median(values), len(values)))
    for label, action in ((SAME_ACTIONS, "guess (\\boxed{n})"), (GEM_LABEL, "guess (\\boxed{n})")):
        if pooled.get(label):
            rows.append((label, action, statistics.median(pooled[label]), len(pooled[label])))
    lines = [
        "# env.step: median µs per step",
        "",
        conditions.describe(),
        "",
        f"llm_gym {llm_gym.__version__}, gymnasium {gym.__version__}. Our steps go through "
        "`gym.make` (with its default wrappers); actions come from each environment's oracle, "
        "except the row driven exactly as GEM is (the same bisection agent and `\\boxed{n}` "
        f"strings). {args.episodes} episodes per environment and pass, {args.repeats} passes, "
        "ours and GEM interleaved; medians over every timed step.",
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
    ratios = {}
    for ours_label, (peer, factor) in RELATIVE_TARGETS.items():
        if not per_repeat.get(ours_label):
            continue
        if len(per_repeat.get(peer, [])) != len(per_repeat[ours_label]):
            lines.append(
                f"{ours_label}: {peer} not measured (install gem-llm in .venv-peers, see the "
                "module docstring)."
            )
            continue
        ratio = ratio_interval(per_repeat[ours_label], per_repeat[peer])
        ratios[ours_label] = {"peer": peer, "target": factor, **ratio.as_json()}
        ours_median = median_interval(per_repeat[ours_label])
        theirs = median_interval(per_repeat[peer])
        met = "met" if ratio.median <= factor else "MISSED"
        lines.append(
            f"{ours_label} vs {peer}, the same action strings: median step "
            f"{ours_median.format('.1f')} µs vs {theirs.format('.1f')} µs (per-repeat medians), "
            f"ratio {ratio.format('.2f')} (target ≤ {factor:g}x: {met})."
        )
    text = "\n".join(lines) + "\n"
    print(text)
    out = output_dir(args.quick, args.out_dir, args.write)
    if out is not None:
        write_markdown("env_step", text, out)
        record = {
            "benchmark": "env_step",
            "conditions": conditions.as_json(),
            "rows": [
                {"env": env, "action": kind, "median_us": median, "steps": count}
                for env, kind, median, count in rows
            ],
            "median_us_per_repeat": dict(per_repeat),
            "ratios": ratios,
        }
        write_json("env_step", record, out)
        _plot(rows, out / "env_step.png")
        print(f"wrote {out / 'env_step.md'}")
    return rows


def parse_args(argv: list[str] | None = None) -> Args:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--envs", nargs="*", default=None)
    parser.add_argument("--episodes", type=int, default=Args.episodes)
    parser.add_argument("--repeats", type=int, default=Args.repeats)
    parser.add_argument("--out-dir", type=Path, default=None)
    parser.add_argument("--no-write", dest="write", action="store_false")
    parser.add_argument(
        "--peers-python",
        default=None,
        help=f"an interpreter with gem-llm (default: {DEFAULT_PEERS_PYTHON} if it exists)",
    )
    parser.add_argument("--no-peers", dest="peers", action="store_false", help="skip GEM")
    parser.add_argument("--quick", action="store_true", help="a smoke run: writes nothing")
    ns = parser.parse_args(argv)
    return Args(
        envs=ns.envs,
        episodes=ns.episodes,
        repeats=ns.repeats,
        out_dir=ns.out_dir,
        write=ns.write,
        peers=ns.peers,
        peers_python=ns.peers_python,
        quick=ns.quick,
    )


if __name__ == "__main__":
    main(parse_args())
