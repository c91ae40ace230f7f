"""The training-step results: ``train_step.md`` (the JSON is the summary itself)."""

from __future__ import annotations

from typing import Any

from benchmarks.common import Conditions

PARSE_FAILURE_REWARD = -0.1
"""Ours' ``failed_parse_reward``; TRL's reward function gives the same to an unparsed call."""

LABELS = {
    "ours": "llm_gym `MultiTurnGRPOTrainer`",
    "ours_no_shared_prefix": "llm_gym, `shared_prefix=False`",
    "ours_waves": 'llm_gym, `HFPolicy(batching="waves")` (the engine before)',
    "trl": "TRL `GRPOTrainer` + `environment_factory`, best settings",
}


def _cell(estimate: dict[str, Any]) -> str:
    low, high = estimate["ci"]
    return f"{estimate['median']:.2f} [{low:.2f}, {high:.2f}]"


def report(summary: dict[str, Any], conditions: Conditions, args: Any, model_path: str) -> str:
    ratio = summary["step_time_ratio_to_trl"]
    met = "met" if ratio["median"] <= 0.67 else "NOT met"
    lines = [
        "# Training step: MultiTurnGRPOTrainer (and two ablations) vs TRL's tool loop",
        "",
        conditions.describe(),
        "",
        f"Workload: model `{model_path}`; ToolUseGame train tasks, {args.batch_size} tasks x "
        f"{args.episodes_per_task} episodes a step, up to {args.max_turns} turns of "
        f"{args.max_tokens_per_turn} tokens on both sides, dapo, beta 0, Dr. GRPO advantages, "
        f"lr {args.learning_rate} (warmup {args.warmup_steps}, linear), temperature 1.0, seed "
        f"{args.seed}, the same reward and parse-failure reward ({PARSE_FAILURE_REWARD}); TRL's "
        "prompt ids asserted identical to ours. Each repeat trains a fresh trainer for "
        f"{args.steps} steps; its value is the median of the steps after the first. "
        f"{len(summary['order'])} repeats, interleaved; medians over repeats with 95% intervals.",
        "",
        "| trainer | s / step | generation | scoring (forward + loss) | backward + optimizer |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for name, entry in summary["contenders"].items():
        lines.append(
            f"| {LABELS[name]} | {_cell(entry['step_s'])} | {_cell(entry['generation_s'])} | "
            f"{_cell(entry['scoring_s'])} | {_cell(entry['backward_s'])} |"
        )
    lines += [
        "",
        f"Step time, ours / TRL: **{_cell(ratio)}** (target <= 0.67: {met}). Attribution: "
        "ours / ours without shared-prefix scoring "
        f"{_cell(summary['step_time_ratio_to_no_shared_prefix'])}; ours / ours with the waves "
        f"engine {_cell(summary['step_time_ratio_to_waves'])}.",
    ]
    held = summary["held_out"]
    if held:
        lines += [
            "",
            f"## Held-out quality after {args.quality_steps} steps",
            "",
            f"{args.eval_tasks} ToolUseGame test tasks, the same evaluator for every model: "
            f"{args.eval_samples} sampled episodes a task at temperature 1.0 and one greedy; the "
            "gain over the starting model is paired by task, with its 95% interval.",
            "",
            "| trainer | sampled success (gain) | greedy success (gain) |",
            "| --- | --- | --- |",
        ]
        for name in ("ours", "trl"):
            cells = []
            for mode in ("sampled", "greedy"):
                g = held[name][mode]
                low, high = g["gain_ci"]
                gain = f"{g['gain']:+.3f} [{low:+.3f}, {high:+.3f}]"
                cells.append(f"{g['success_after']:.3f} ({gain})")
            lines.append(f"| {LABELS[name]} | {cells[0]} | {cells[1]} |")
        start = held["ours"]["sampled"]["success_before"]
        lines.append(f"\nStarting model: sampled success {start:.3f}.")
        ours, trl = held["ours"]["sampled"], held["trl"]["sampled"]
        kept = "met" if ours["gain"] >= trl["gain_ci"][0] else "NOT met"
        lines.append(
            f"\nTarget: ours' held-out sampled success not below TRL's interval. From the same "
            f"start, ours' gain {ours['gain']:+.3f} against the lower end of TRL's gain "
            f"interval {trl['gain_ci'][0]:+.3f} (success {ours['success_after']:.3f} against "
            f"{start + trl['gain_ci'][0]:.3f}): {kept}."
        )
    return "\n".join(lines) + "\n"
