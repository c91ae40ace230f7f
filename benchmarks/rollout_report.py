"""The rollout throughput results: ``rollout_throughput.md`` and ``rollout_throughput.json``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.common import Conditions, Estimate, write_json, write_markdown
from benchmarks.roofline import percent, share_cell
from benchmarks.stats import order_statistic_rank

LABELS = {
    "ours": "llm_gym `collect_groups` (HFPolicy, continuous batching)",
    "replay": "replay limit: ours' token streams as pure model work",
    "generate": "HF `generate`, shared prefix prefilled once",
    "trl_generate": "TRL `GRPOTrainer` tool loop, best settings, `generate`",
    "trl_continuous_batching": "TRL `GRPOTrainer` tool loop, best settings, continuous batching",
    "waves": 'llm_gym `collect_groups`, `batching="waves"` (the engine before)',
}
JSON_KEYS = {
    "replay": "ratio_to_replay_limit",
    "generate": "ratio_to_generate_reference",
    "trl_generate": "ratio_to_trl_generate",
    "trl_continuous_batching": "ratio_to_trl_continuous_batching",
    "trl_best": "ratio_to_trl_best",
    "waves": "ratio_to_waves",
}
"""The JSON key of ours' ratio to each contender (``trl_best``: the faster TRL back-end)."""


def _typical(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median wall time (its counts describe the contender)."""
    return sorted(runs, key=lambda r: r["wall_s"])[len(runs) // 2]


def _notes(name: str, run: dict[str, Any]) -> str:
    if name == "ours":
        return (
            f"{run['turns_mean']:.2f} turns, {run['tool_calls_mean']:.2f} tool calls, "
            f"{run['tokens'] / run['episodes']:.0f} sampled tokens per episode (longest "
            f"{run['longest_episode_tokens']}); {run['forward_passes']} forward passes, "
            f"{run['prefilled_tokens']} tokens prefilled ({run['shared_prefix_tokens']} of them "
            "the shared prefix, once)"
            + (
                ""
                if run["same_streams_as_before"]
                else "; its streams differed from the run before"
            )
        )
    if name == "replay":
        return (
            f"the same {run['tokens']} sampled tokens; {run['forward_passes']} forward passes, "
            f"{run['prefilled_tokens']} tokens prefilled; only the passes timed"
        )
    if name == "generate":
        return (
            f"{run['new_tokens_per_episode']} new tokens per episode (ours' mean), no environment "
            f"replies; {run['prefilled_tokens']} tokens prefilled"
        )
    if name.startswith("trl_"):
        return (
            "`_generate_and_score_completions` (beta=0), after an untimed warm-up batch; "
            f"prompt ids identical to ours on all {run['identical_prompt_ids']} tasks; "
            f"{run['tool_calls_mean']:.2f} tool-result blocks per episode"
        )
    calls = run["generate_calls"]
    return f"{run['turns_mean']:.2f} turns per episode; {calls} `generate` call{'s' * (calls != 1)}"


def _ratio_cell(name: str, unit: str, ratio: Estimate) -> str:
    if name == "replay":
        return ratio.format(".0%") + " (tokens/s)"
    return ratio.format(".2f", suffix="x") + f" ({unit}/s)"


def report(
    name: str,
    summary: dict[str, Any],
    conditions: Conditions,
    args: Any,
    model_path: str,
    out: Path | None,
) -> str:
    """The markdown text; with ``out``, write it and the JSON there."""
    contenders, ratios = summary["contenders"], summary["ratios"]
    repeats = len(contenders["ours"]["runs"])
    _, coverage = order_statistic_rank(repeats)
    to_limit = ratios["replay"][1]
    lines = [
        "# Rollout throughput: collect_groups against its replay limit, HF generate and TRL",
        "",
        conditions.describe(),
        "",
        f"Workload: model `{model_path}`, {args.tasks} ToolUseGame val tasks x "
        f"{args.episodes_per_task} episodes, up to {args.max_turns} turns of "
        f"{args.max_tokens_per_turn} tokens, temperature 1.0, seed {args.seed} every repeat. "
        f"{repeats} repeats, the contenders interleaved ({args.order} order: "
        f"{' / '.join(summary['order'][0])} first). Rates are medians over repeats with the "
        f"order-statistic interval of the median (coverage {coverage:.1%} at {repeats} "
        "repeats); ratios are ours' median over its median, with a paired percentile bootstrap "
        "95% interval over repeats (benchmarks/stats.py).",
        "",
        summary["roofline"].describe(),
        "",
        "| contender | dtype | generated tokens/s | episodes/s | ours / it | floor (s) | "
        "share of floor | notes |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for contender, entry in contenders.items():
        cell = "1.00"
        if contender == summary.get("trl_best"):
            cell = "(the faster TRL) "
        if contender in ratios:
            cell = (cell if cell != "1.00" else "") + _ratio_cell(contender, *ratios[contender])
        roof = entry["roofline"]
        share = share_cell(roof["share_of_floor"])
        lines.append(
            f"| {LABELS[contender]} | {roof['dtype']} | {entry['tokens_per_s'].format('.0f')} | "
            f"{entry['episodes_per_s'].format('.2f')} | {cell} | {roof['floor_s']:.4f} | "
            f"{share} | {_notes(contender, _typical(entry['runs']))} |"
        )
    met = "met" if to_limit.median >= 0.8 else "NOT met"
    lines += [
        "",
        f"Target: ours >= 80% of the replay limit in tokens/s ({to_limit.format('.0%')}: {met}).",
    ]
    if "trl_best" in ratios:
        trl = ratios["trl_best"][1]
        best = LABELS[summary["trl_best"]].rsplit(", ", 1)[-1]
        met = "met" if trl.median >= 1.5 else "NOT met"
        lines[-1] += (
            f" Ours >= 1.5x TRL at its best settings in episodes/s (its faster back-end, "
            f"{best}): {trl.format('.2f', suffix='x')}: {met}."
        )
    lines += [
        "",
        "How to read it. The replay runs ours' own token streams through the same model with "
        "nothing else: the shared prefix prefilled once, each question and environment reply "
        "prefilled once into its episode's KV-cache row, every sampled token decoded in the "
        "widest batch its episode's order allows (pass k holds every episode's k-th piece of "
        "work), every step's layout built before the clock starts "
        "(benchmarks/rollout_replay.py). It uses the engine's attention, and it reproduces the "
        "sampled tokens' logprobs exactly (tests/test_benchmarks.py), so ours cannot exceed it: "
        "the gap is what ours spends outside the model (scheduling each step, sampling, the "
        "environments, the chat template and tokenizer, the event loop and its thread). HF "
        "`generate` with a prefilled prefix is the check against transformers' own decoding: "
        "it decodes the same mean number of tokens per episode but prefills no environment "
        "replies, pads every row to the longest and decodes finished rows too.",
        "",
        "Floor: the least time this CPU allows for ours' streams (the replay's work: the "
        "shared prefix prefilled once, then the fewest passes the streams allow, each reading "
        "the weights once and its rows' keys and values), the larger of its FLOPs at the "
        "contender's dtype's matmul peak and its bytes at the copy bandwidth, both measured "
        "above; each contender's floor is that per sampled token times the tokens it sampled, "
        "and its share of the floor is floor / measured time (1.0 is the hardware's limit; "
        "the gap is overhead: Python, scheduling, small kernels, the environments).",
    ]
    text = "\n".join(lines) + "\n"
    if out is not None:
        write_markdown(name, text, out)
        payload = _payload(name, summary, conditions, coverage)
        write_json(name, payload, out)
        plot(payload, out / f"{name}.png")
    return text


def plot(payload: dict[str, Any], path: Path) -> None:
    """Each contender's episodes/s (median and 95% interval), from the JSON payload."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(payload["contenders"])
    medians = [payload["contenders"][n]["episodes_per_s"]["median"] for n in names]
    lows = [
        m - payload["contenders"][n]["episodes_per_s"]["ci"][0]
        for n, m in zip(names, medians, strict=True)
    ]
    highs = [
        payload["contenders"][n]["episodes_per_s"]["ci"][1] - m
        for n, m in zip(names, medians, strict=True)
    ]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    colors = ["#4C72B0" if n == "ours" else "#999999" for n in names]
    ax.bar(range(len(names)), medians, yerr=[lows, highs], color=colors, capsize=4)
    for i, name in enumerate(names):  # each bar's share of its roofline floor
        share = payload["contenders"][name]["share_of_floor"]["median"]
        ax.annotate(f"{percent(share)} of floor",
                    (i, medians[i] + highs[i]), ha="center", va="bottom", fontsize=7)  # fmt: skip
    short = {
        "ours": "llm_gym",
        "replay": "replay limit",
        "generate": "HF generate,\nprefix prefilled",
        "trl_generate": "TRL best,\ngenerate",
        "trl_continuous_batching": "TRL best,\ncontinuous batching",
        "waves": "llm_gym,\nwaves engine",
    }
    ax.set_xticks(range(len(names)), [short.get(n, n) for n in names], fontsize=8)
    ax.set_ylabel("episodes / s (median, 95% interval)")
    ax.set_title("Rollout throughput, ToolUseGame-v0, 1 thread")
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _payload(
    name: str, summary: dict[str, Any], conditions: Conditions, coverage: float
) -> dict[str, Any]:
    contenders = summary["contenders"]
    payload: dict[str, Any] = {
        "benchmark": name,
        "conditions": conditions.as_json(),
        "statistics": {
            "repeats": len(contenders["ours"]["runs"]),
            "order": summary["order"],
            "median_interval": "order statistics x(k)..x(n+1-k), the largest k with coverage "
            ">= 95% (k = 1 below 6 repeats)",
            "median_interval_coverage": coverage,
            "ratio": "median(ours) / median(it), paired percentile bootstrap 95% interval "
            "(exact enumeration up to 8 repeats, seeded resampling above)",
        },
    }
    payload["roofline"] = summary["roofline"].as_json()
    if "trl_best" in summary:
        payload["trl_best"] = summary["trl_best"]
    for contender, (unit, ratio) in summary["ratios"].items():
        payload[JSON_KEYS[contender]] = ratio.as_json()
        payload["statistics"].setdefault("ratio_units", {})[JSON_KEYS[contender]] = f"{unit}/s"
    payload["contenders"] = {
        contender: {
            "label": LABELS[contender],
            "tokens_per_s": entry["tokens_per_s"].as_json(),
            "episodes_per_s": entry["episodes_per_s"].as_json(),
            "wall_s": entry["wall_s"].as_json(),
            **entry["roofline"],
            "runs": entry["runs"],
        }
        for contender, entry in contenders.items()
    }
    return payload


def verdict(results: Any) -> str:
    """The two targets against the medians of ``results["rollout_throughput"]`` (ours >= 80%
    of the replay limit, >= 1.5x TRL's faster back-end), naming the CPU where one is not met."""
    data = results["rollout_throughput"]
    met = (
        data["ratio_to_replay_limit"]["median"] >= 0.8,
        data["ratio_to_trl_best"]["median"] >= 1.5,
    )
    if all(met):
        return "met"
    shown = "; ".join("met" if ok else "not met" for ok in met)
    return f"{shown} ({data['conditions']['machine'].split(', ')[0]})"
