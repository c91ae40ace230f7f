"""The training-step results: the summary of the repeats (written as ``train_step.json``) and
``train_step.md``."""

from __future__ import annotations

import statistics
from typing import Any

from benchmarks import step_work
from benchmarks.common import Conditions, median_interval, ratio_interval
from benchmarks.roofline import Roofline, contender_roofline, share_cell
from benchmarks.step_work import ModelShape, element_bytes

PARSE_FAILURE_REWARD = -0.1
"""Ours' ``failed_parse_reward``; TRL's reward function gives the same to an unparsed call."""

LABELS = {
    "ours": "llm_gym `MultiTurnGRPOTrainer`",
    "ours_no_token_tree": "llm_gym, `token_tree=False`",
    "ours_no_shared_prefix": "llm_gym, `shared_prefix=False`",
    "ours_waves": 'llm_gym, `HFPolicy(batching="waves")` (the engine before)',
    "trl": "TRL `GRPOTrainer` + `environment_factory`, best settings",
}


COUNTS = ("tokens", "positions", "trained")
"""A step's batch: real tokens, distinct positions, positions whose logits the loss reads."""


def step_floors(runs: list[dict[str, Any]], shape: ModelShape, roof: Roofline) -> list[float]:
    """Each repeat's step floor: forward and backward over its median positions and trained
    positions a step, the weights read in their dtype, the matmuls at the peak of the dtype it
    trains in."""
    return [
        roof.floor_s(
            step_work.train_step(
                shape, round(r["positions"]), round(r["trained"]), element_bytes(r["weights_dtype"])
            ),
            r["dtype"],
        )
        for r in runs
    ]


def summarize(
    result: Any, held_out: dict[str, Any], shape: ModelShape, roof: Roofline
) -> dict[str, Any]:
    """Each contender's parts (medians, 95% intervals), its floor and shares of it (the whole
    step, and its forward and backward: ``share_of_floor_train``), and ours' ratios."""
    parts = ("step_s", "generation_s", "scoring_s", "backward_s")
    contenders = {}
    for name, runs in result.runs.items():
        floors, dtype = step_floors(runs, shape, roof), runs[0]["dtype"]
        train = contender_roofline(runs, floors, dtype, key="train_s")
        contenders[name] = {
            **{p: median_interval([run[p] for run in runs]).as_json() for p in parts},
            **{k: statistics.median(run[k] for run in runs) for k in COUNTS},
            **contender_roofline(runs, floors, dtype, key="step_s"),
            "share_of_floor_train": train["share_of_floor"],
            "runs": runs,
        }
    ours = [run["step_s"] for run in result.runs["ours"]]

    def ratio(name: str) -> dict[str, Any] | None:
        if name not in result.runs:
            return None
        return ratio_interval(ours, [run["step_s"] for run in result.runs[name]]).as_json()

    return {
        "step_time_ratio_to_trl": ratio("trl"),
        "step_time_ratio_to_no_token_tree": ratio("ours_no_token_tree"),
        "step_time_ratio_to_no_shared_prefix": ratio("ours_no_shared_prefix"),
        "step_time_ratio_to_waves": ratio("ours_waves"),
        "contenders": contenders,
        "order": result.order,
        "held_out": held_out,
        "roofline": roof.as_json(),
    }


def _cell(estimate: dict[str, Any]) -> str:
    low, high = estimate["ci"]
    return f"{estimate['median']:.2f} [{low:.2f}, {high:.2f}]"


def ratio_lines(summary: dict[str, Any]) -> list[str]:
    """Ours' step time against each other contender that ran (TRL's with its target)."""
    lines = []
    ratio = summary["step_time_ratio_to_trl"]
    if ratio is not None:
        met = "met" if ratio["median"] <= 0.67 else "NOT met"
        lines.append(f"Step time, ours / TRL: **{_cell(ratio)}** (target <= 0.67: {met}).")
    for key, label in (("no_token_tree", "ours without token-tree scoring"),
                       ("no_shared_prefix", "ours without shared-prefix scoring"),
                       ("waves", "ours with the waves engine")):  # fmt: skip
        if summary.get(f"step_time_ratio_to_{key}") is not None:
            lines.append(f"Ours / {label}: {_cell(summary[f'step_time_ratio_to_{key}'])}.")
    return [" ".join(lines)] if lines else []


def report(
    summary: dict[str, Any], conditions: Conditions, args: Any, model_path: str, roofline: str
) -> str:
    """The markdown text; ``roofline``: :meth:`benchmarks.roofline.Roofline.describe`."""
    lines = [
        "# Training step: MultiTurnGRPOTrainer, its ablations and TRL's tool loop",
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
        roofline,
        "",
        "| trainer | dtype | s / step | generation | scoring (forward + loss) | backward + "
        "optimizer | tokens / step | positions / step | logits / step | tokens trained / s | "
        "floor (s) | share of floor: step | share: forward + backward |",
        "| --- | --- |" + " ---: |" * 11,
    ]
    for name, entry in summary["contenders"].items():
        rate = entry["tokens"] / entry["step_s"]["median"]
        lines.append(
            f"| {LABELS[name]} | {entry['dtype']} | {_cell(entry['step_s'])} | "
            f"{_cell(entry['generation_s'])} | {_cell(entry['scoring_s'])} | "
            f"{_cell(entry['backward_s'])} | {entry['tokens']:.0f} | {entry['positions']:.0f} | "
            f"{entry['trained']:.0f} | {rate:.0f} | {entry['floor_s']:.4f} | "
            f"{share_cell(entry['share_of_floor'])} | "
            f"{share_cell(entry['share_of_floor_train'])} |"
        )
    lines += [
        "",
        *ratio_lines(summary),
        "",
        "Floor: the least time this CPU allows for the forward and backward over a step's "
        "batch, the larger of its FLOPs at the matmul peak of the dtype the trainer computes in "
        "and its bytes at the copy bandwidth (medians over the steps). The least work: the "
        "distinct positions of the rows' token tree (positions / step: a group's shared "
        "prompt once, where tokens / step counts every row's prompt and completion), 6 x the "
        "body's parameters FLOPs each, and 6 x the head's (vocabulary x hidden) at each "
        "position whose logits the loss reads (logits / step: the model's own completion "
        "tokens, a logit shared by rows counted once); the weights read twice and their "
        "gradients written once. The generation's floor is not in it (see "
        "`rollout_throughput`). Share of floor = floor / measured time, of the whole step and "
        "of its forward and backward (scoring and backward + optimizer); tokens trained / s "
        "are tokens / step over the whole step.",
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
