"""The async benchmark's results: ``async.md`` (:func:`render`, with :func:`targets`) and
``async.png`` (:func:`plot`); the JSON is the summary itself."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.common import Conditions


def render(summary: dict[str, Any], args: Any, model: str, seconds: float) -> str:
    lines = [
        "# Async training against lockstep (ToolUseGame-v0, CPU)",
        "",
        Conditions(**summary["conditions"]).describe(),
        "",
        f"Each run: {args.steps} optimizer steps (the first two untimed) of {args.batch_size} "
        f"tasks x {args.episodes_per_task} episodes, max {args.max_turns} turns, "
        f"{args.max_tokens_per_turn} tokens a turn, dapo loss, lr {args.learning_rate}, "
        "from the same SFT weights. "
        f"{args.rounds} interleaved rounds (the order reversed every other round); steps per hour: "
        "median over rounds [order-statistic interval: min-max at 5 rounds, coverage 94%]. Async: "
        f"max_steps_off_policy=2 and {3 * args.batch_size} groups in flight (`-off1`: 1 and "
        f"{2 * args.batch_size}); generator and trainer each get one of the two cores' torch "
        "threads (the default split). Held-out success: test split, "
        f"{args.eval_tasks} tasks x {args.eval_samples} sampled episodes at temperature 1 after "
        "training (first round), 95% interval over tasks.",
        "",
        "| latency per tool call | contender | steps / hour | trainer busy | generator busy "
        "| staleness mean (max) | dropped stale | held-out success [95% CI] |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for e in summary["entries"]:
        low, high = e["steps_per_hour_ci"]
        s_low, s_high = e["success_interval"]
        lines.append(
            f"| {e['latency_s']:g} s | {e['contender']} | {e['steps_per_hour']:.0f} "
            f"[{low:.0f}, {high:.0f}] | {e['trainer_utilisation']:.0%} | "
            f"{e['generator_utilisation']:.0%} | {e['staleness_mean']:.2f} "
            f"({e['staleness_max']:.0f}) | {e['dropped_stale_ratio']:.1%} | "
            f"{e['success']:.3f} [{s_low:.3f}, {s_high:.3f}] |"
        )
    lines += [
        "",
        "Best async contender over the faster lockstep, steps per hour (ratio of medians, paired "
        "bootstrap 95% interval over rounds):",
        "",
    ]
    for latency, ratio in summary["speedup_by_latency"].items():
        lines.append(
            f"- {float(latency):g} s per tool call: **{ratio['median']:.2f}x** "
            f"[{ratio['ci'][0]:.2f}, {ratio['ci'][1]:.2f}] ({ratio['async']} over "
            f"{ratio['lockstep']})"
        )
    lines += ["", "Targets:", ""] + [f"- {line}" for line in targets(summary)]
    return "\n".join(lines) + "\n"


def targets(summary: dict[str, Any]) -> list[str]:
    """The issue's targets, each with the numbers that decide it."""
    entries = summary["entries"]
    top = summary["latency_with_s"]

    def at(latency: float, prefix: str) -> list[dict[str, Any]]:
        return [
            e for e in entries if e["latency_s"] == latency and e["contender"].startswith(prefix)
        ]

    best_async = max(at(top, "async"), key=lambda e: e["steps_per_hour"])
    best_lock = max(at(top, "lockstep"), key=lambda e: e["steps_per_hour"])
    low, high = best_lock["success_interval"]
    held = best_async["success"] >= low  # against the lockstep its speed-up is measured over
    others = [
        f"{e['contender']}'s [{e['success_interval'][0]:.3f}, {e['success_interval'][1]:.3f}]"
        for e in at(top, "lockstep")
        if e is not best_lock
    ]
    with_latency = summary["speedup_with_latency"]["median"]
    with_ci = summary["speedup_with_latency"]["ci"]
    without = summary["speedup_without_latency"]["median"]
    without_ci = summary["speedup_without_latency"]["ci"]
    drops = [e["dropped_stale_ratio"] for e in entries if e["contender"].endswith("-off1")]
    verdict = {True: "met", False: "NOT met"}
    return [
        f"speedup at {top:g} s per tool call >= 1.5: {with_latency:.2f}x "
        f"[{with_ci[0]:.2f}, {with_ci[1]:.2f}] "
        f"({best_async['contender']} over {best_lock['contender']}), "
        f"{verdict[with_latency >= 1.5]}; "
        f"its held-out success {best_async['success']:.3f} not below the interval of "
        f"{best_lock['contender']} [{low:.3f}, {high:.3f}]: {verdict[held]}"
        + (f" (for reference, {', '.join(others)})" if others else ""),
        f"without latency >= 1.2x: {without:.2f}x [{without_ci[0]:.2f}, {without_ci[1]:.2f}], "
        f"{verdict[without >= 1.2]}",
        f"dropped stale groups at max_steps_off_policy=1 < 10%: at most {max(drops):.1%}, "
        f"{verdict[max(drops) < 0.10]}",
    ]


def plot(summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    entries = summary["entries"]
    latencies = sorted({e["latency_s"] for e in entries})
    contenders = list(dict.fromkeys(e["contender"] for e in entries))
    fig, ax = plt.subplots(figsize=(10, 4))
    width = 0.8 / len(contenders)
    for i, name in enumerate(contenders):
        values = [
            next(
                e["steps_per_hour"]
                for e in entries
                if e["contender"] == name and e["latency_s"] == latency
            )
            for latency in latencies
        ]
        ax.bar([x + i * width for x in range(len(latencies))], values, width, label=name)
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(latencies))])
    ax.set_xticklabels([f"{latency:g} s / tool call" for latency in latencies])
    ax.set_ylabel("optimizer steps per hour")
    ax.set_title("Async vs lockstep, ToolUseGame-v0, tiny SFT model, 2 CPU cores")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
