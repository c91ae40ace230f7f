"""The report of :mod:`benchmarks.real_model`, from its JSON alone: the probe of the instruct
model's start, each recipe's GRPO and RFT runs paired by test task, the other settings tried
and the validation-only runs that chose the recipes' settings; the reward curves' PNG.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from benchmarks.common import ROOT, Conditions
from benchmarks.real_model import ARMS, RECIPES, run_settings, settings_key
from llm_gym.errors import InvalidArgumentError


def paired(before: dict[str, float], after: dict[str, float]) -> dict[str, Any] | None:
    """``after - before`` over the tasks both evaluated (task success rates), with its 95%
    interval (:func:`llm_gym.eval.paired_difference_interval`); None without shared tasks.

    Example:
        >>> r = paired({"a": 0.0, "b": 1.0, "c": 0.5}, {"a": 1.0, "b": 1.0, "c": 0.5})
        >>> r["tasks"], r["before"], round(r["after"], 3), round(r["difference"], 3)
        (3, 0.5, 0.833, 0.333)
    """
    from llm_gym.eval import paired_difference_interval

    keys = sorted(set(before) & set(after))
    if not keys:
        return None
    diff, low, high = paired_difference_interval(
        [before[k] for k in keys], [after[k] for k in keys]
    )
    return {
        "tasks": len(keys),
        "before": sum(before[k] for k in keys) / len(keys),
        "after": sum(after[k] for k in keys) / len(keys),
        "difference": diff,
        "ci": [low, high],
    }


def recipe_runs(
    results: dict[str, Any], recipe: str, quick: bool = False
) -> dict[str, dict[str, Any]]:
    """The recorded test run of each arm of ``recipe`` under its current config file and no
    overrides (the committed recipe; ``quick``: its smoke run)."""
    found: dict[str, dict[str, Any]] = {}
    for arm in ARMS:
        current = run_settings(recipe, arm, {}, tune=False, quick=quick)
        key = settings_key(f"{recipe}.{arm}", current)
        if key in results.get("runs", {}):
            found[arm] = results["runs"][key]
    return found


def render(results: dict[str, Any], quick: bool = False) -> str:
    """``real_model.md`` from the JSON alone (``quick``: the smoke runs' report)."""
    lines = [
        "# RL on a real pretrained model: SmolLM2-135M-Instruct",
        "",
        "Built run by run (`python -m benchmarks.real_model --run NAME`, each run merged into "
        "`real_model.json`). Each recipe is a `train.py` config; its RFT twin is the same run "
        "with `credit_assignment: rejection_sampling` (the SFT loss on the model's own "
        "successful episodes): the same start, tasks, group size, steps, sampling budget and "
        "optimizer. Success on the test split; gains and differences paired by task with 95% "
        "intervals (a task's success is the mean over its episodes).",
        "",
    ]
    lines += _render_probe(results.get("probe"))
    for recipe in RECIPES:
        lines += _render_recipe(recipe, recipe_runs(results, recipe, quick))
    lines += _render_earlier(results.get("runs", {}), quick)
    lines += _render_tuning(results.get("runs", {}))
    return "\n".join(lines)


def _render_probe(record: dict[str, Any] | None) -> list[str]:
    if not record:
        return ["## Where the instruct model starts", "", "Not run yet (`--run probe`).", ""]
    s = record["settings"]
    lines = [
        "## Where the instruct model starts (val split)",
        "",
        f"`{s['model']}` as it comes, {s['tasks']} val tasks of each candidate, "
        f"{s['max_new_tokens']} tokens a reply: greedy, and {s['samples']} samples a task at "
        f"temperature {s['temperature']:g} (what GRPO's groups see); the mean reward is "
        "reasoning-gym's score with its partial credit. A recipe starts where the model "
        "already succeeds sometimes (0.1 to 0.7) where a candidate allows.",
        "",
        "| candidate | environment | greedy success [95% CI] | sampled success [95% CI] | "
        "mean reward, greedy / sampled | sampled tokens / episode | seconds |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for label, c in record["candidates"].items():
        cells = [_rate(c[m]) for m in ("greedy", "sampled")]
        reward = " / ".join(f"{c[m]['mean_reward']:.3f}" for m in ("greedy", "sampled"))
        tokens = c["sampled"]["sampled_tokens_per_episode"]
        lines.append(f"| {label} | {c['env']} | {cells[0]} | {cells[1]} | {reward} | "
                     f"{tokens:.0f} | {c['seconds']:.0f} |")  # fmt: skip
    conditions = record.get("conditions")
    lines += ["", Conditions(**conditions).describe() if conditions else "", ""]
    return lines


def _rate(cell: dict[str, Any]) -> str:
    ci = cell.get("ci") or []
    return f"{cell['success']:.3f}" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if len(ci) == 2 else "")


def _render_recipe(recipe: str, runs: dict[str, dict[str, Any]]) -> list[str]:
    lines = [f"## {recipe} (`{RECIPES[recipe]}`)", ""]
    if not runs:
        return [*lines, f"Not run yet (`--run {recipe}.grpo`, `--run {recipe}.rft`).", ""]
    for arm, run in runs.items():
        c = run.get("conditions", {})
        sft = f", SFT {run['sft_seconds']:.0f} s" if run.get("sft_seconds") else ""
        lines.append(
            f"- {arm.upper()}: {run['total_seconds'] / 60:.1f} min in all (training "
            f"{run['grpo_seconds'] / 60:.1f} min{sft}), peak RSS {run['peak_rss_mb']:.0f} MiB, "
            f"start `{run['start_model']}` (weights {run.get('start_hash')}), "
            + _precision(run.get("precision"))
            + "commit "
            f"{(c.get('git_commit') or 'unknown')[:12]}."
        )
    hashes = {run.get("start_hash") for run in runs.values()}
    if len(runs) == 2:
        lines.append(
            "- Both arms started from the same weights."
            if len(hashes) == 1
            else "- **The arms started from different weights**: not a paired comparison."
        )
    lines += ["", "| test split | start | after GRPO | GRPO gain [95% CI] | after RFT | "
              "RFT gain [95% CI] | GRPO - RFT [95% CI] |",
              "| --- | ---: | ---: | --- | ---: | --- | --- |"]  # fmt: skip
    fields = [("success", "task_success"), ("mean reward", "task_reward")]
    if all(run.get("task_reward") == run.get("task_success") for run in runs.values()):
        fields = fields[:1]  # a reward of success alone: the same numbers twice
    for measure, field in fields:
        for mode in ("greedy", "sampled"):
            row = _table_row(runs, field, "_sampled" if mode == "sampled" else "")
            if row is not None:
                lines.append(f"| {mode} {measure} | " + " | ".join(row) + " |")
    for arm, run in runs.items():
        if run.get("conditions"):
            lines += ["", f"{arm.upper()} run: " + Conditions(**run["conditions"]).describe()]
    return [*lines, ""]


def _table_row(runs: dict[str, dict[str, Any]], field: str, suffix: str) -> list[str] | None:
    """The cells after the row's name: start, each arm's after and gain, GRPO - RFT; all paired
    by task on ``field`` (``task_success`` or ``task_reward``); None when no run has it."""
    gains = {}
    for arm in ARMS:
        values = runs.get(arm, {}).get(field, {})
        gains[arm] = paired(values.get(f"before_grpo{suffix}", {}),
                            values.get(f"after_grpo{suffix}", {}))  # fmt: skip
    if not any(gains.values()):
        return None
    start = next(g["before"] for g in gains.values() if g)
    cells = [f"{start:.3f}"]
    for arm in ARMS:
        g = gains[arm]
        cells += ["", ""] if g is None else [f"{g['after']:.3f}", _ci(g)]
    grpo, rft = (runs.get(arm, {}).get(field, {}) for arm in ("grpo", "rft"))
    d = paired(rft.get(f"after_grpo{suffix}", {}), grpo.get(f"after_grpo{suffix}", {}))
    return [*cells, "n/a" if d is None else _ci(d)]


def _precision(record: dict[str, Any] | None) -> str:
    """``dtype`` as the run settled it: sampling / training, and why."""
    if not record:
        return ""
    return (
        f"sampled in {record['sampling']}, trained in {record['training']} ({record['reason']}), "
    )


def _ci(cell: dict[str, Any]) -> str:
    low, high = cell["ci"]
    return f"{cell['difference']:+.3f} [{low:+.3f}, {high:+.3f}]"


def flat(mapping: Any, prefix: str = "") -> dict[str, Any]:
    """A nested mapping's leaves by dotted key.

    Example:
        >>> flat({"grpo": {"num_steps": 16, "lr": 1e-05}, "env": "X"})
        {'grpo.num_steps': 16, 'grpo.lr': 1e-05, 'env': 'X'}
    """
    if not isinstance(mapping, dict):
        return {prefix[:-1]: mapping}
    out: dict[str, Any] = {}
    for key, value in mapping.items():
        out.update(flat(value, f"{prefix}{key}."))
    return out


def config_changes(earlier_text: str | None, current_text: str, overrides: dict[str, Any]) -> str:
    r"""What an earlier run's config set that the current one does not, as ``key=value`` pairs
    (the current value after an arrow); ``overrides`` go over the earlier text.

    Example:
        >>> config_changes("grpo: {num_steps: 16}\nenv: X", "grpo: {num_steps: 48}\nenv: X", {})
        'grpo.num_steps=16 (now 48)'
    """
    from trainers.pipeline.config import yaml_load

    if earlier_text is None:
        return "an earlier config (its text not recorded)"
    before = {**flat(yaml_load(earlier_text)), **overrides}
    now = flat(yaml_load(current_text))
    changed = [
        f"{k}={before.get(k, 'unset')} (now {now.get(k, 'unset')})"
        for k in sorted(set(before) | set(now))
        if before.get(k) != now.get(k)
    ]
    return ", ".join(changed) or "the current config"


def _render_earlier(runs: dict[str, Any], quick: bool) -> list[str]:
    """Test runs of a recipe under other settings than its current config's (what was tried)."""
    rows = []
    for key, r in runs.items():
        settings = r["settings"]
        if settings.get("tune") or settings.get("quick") != quick:
            continue
        recipe = key.split()[0].split(".")[0]
        current = run_settings(recipe, settings["arm"], {}, tune=False, quick=quick)
        if key == settings_key(key.split()[0], current):
            continue
        text = (ROOT / RECIPES[recipe]).read_text()
        changes = config_changes(r.get("config_text"), text, settings["overrides"])
        cells = []
        for field, suffix in (("task_success", ""), ("task_success", "_sampled"),
                              ("task_reward", "")):  # fmt: skip
            values = r.get(field, {})
            g = paired(
                values.get(f"before_grpo{suffix}", {}), values.get(f"after_grpo{suffix}", {})
            )
            cells.append("" if g is None else f"{g['before']:.3f} -> {g['after']:.3f}")
        cells.append(_val_curve(r))
        rows.append(f"| {recipe} | {settings['arm'].upper()} | {changes} | " + " | ".join(cells)
                    + f" | {r['total_seconds'] / 60:.1f} |")  # fmt: skip
    if not rows:
        return []
    return [
        "## Other settings tried (test split)",
        "",
        "Runs of a recipe under settings its config no longer has, start -> after.",
        "",
        "| recipe | arm | settings | greedy success | sampled success | greedy mean reward | "
        "val success by step | minutes |",
        "| --- | --- | --- | ---: | ---: | ---: | --- | ---: |",
        *rows,
        "",
    ]


def _render_tuning(runs: dict[str, Any]) -> list[str]:
    tuned = [(k, r) for k, r in runs.items() if r["settings"].get("tune")]
    if not tuned:
        return []
    lines = [
        "## Settings chosen on val",
        "",
        "Runs validated on val only (`--tune`; no test evaluation): greedy val success at each "
        "validation point; each run's settings as they differ from the recipe's config now.",
        "",
        "| run | settings | val success by step | minutes |",
        "| --- | --- | --- | ---: |",
    ]
    for key, r in tuned:
        recipe = key.split()[0].split(".")[0]
        text = (ROOT / RECIPES[recipe]).read_text()
        changes = config_changes(r.get("config_text"), text, r["settings"]["overrides"])
        lines.append(f"| {key.split()[0]} | {changes} | {_val_curve(r)} | "
                     f"{r['total_seconds'] / 60:.1f} |")  # fmt: skip
    return [*lines, ""]


def _val_curve(record: dict[str, Any]) -> str:
    """``step: success`` at each of a run's validation points."""
    return ", ".join(
        f"{p['step']}: {p['success_rate']:.3f}"
        for p in record.get("validation_history", [])
        if "success_rate" in p
    )


def plot(results: dict[str, Any], path: Path, quick: bool = False) -> None:
    """Each recipe's train reward per step, GRPO and RFT, from the JSON."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    recipes = {r: recipe_runs(results, r, quick) for r in RECIPES}
    recipes = {r: runs for r, runs in recipes.items() if runs}
    if not recipes:
        return
    fig, axes = plt.subplots(1, len(recipes), figsize=(6 * len(recipes), 4), squeeze=False)
    for axis, (recipe, runs) in zip(axes[0], recipes.items(), strict=True):
        for arm, style in (("grpo", "-"), ("rft", "--")):
            log = runs.get(arm, {}).get("train_log", [])
            axis.plot([r["step"] for r in log], [r["reward"] for r in log], style,
                      label=arm.upper())  # fmt: skip
        axis.set_title(f"SmolLM2-135M-Instruct, {recipe}: train reward")
        axis.set_xlabel("optimizer step")
        axis.set_ylabel("mean episode reward")
        axis.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


RECIPE_LABELS = {
    "chain_sum": "one-digit sums, GRPO straight from the instruct model",
    "tool_use_game": "ToolUseGame-v0 after an SFT warm start",
}
"""How the headline names each recipe."""


def headline(results: Mapping[str, Any], recipe: str = "chain_sum") -> str:
    """A recipe's greedy test success: start, after GRPO and after RFT, and the paired
    differences with their intervals (``real_model.json``'s runs of the current config), as the
    README's sentence says them (:mod:`benchmarks.readme_numbers`)."""
    runs = recipe_runs(results["real_model"], recipe)
    if set(runs) != {"grpo", "rft"}:
        raise InvalidArgumentError(
            f"real_model.json has no GRPO and RFT runs of {RECIPES[recipe]} as it is: run "
            f"python -m benchmarks.real_model --run {recipe}.grpo (and .rft)."
        )
    success = {arm: run["task_success"] for arm, run in runs.items()}
    g = paired(success["grpo"]["before_grpo"], success["grpo"]["after_grpo"])
    r = paired(success["rft"]["before_grpo"], success["rft"]["after_grpo"])
    d = paired(success["rft"]["after_grpo"], success["grpo"]["after_grpo"])
    assert g is not None and r is not None and d is not None

    def shown(cell: Mapping[str, Any]) -> str:
        return f"{cell['difference']:+.3f} [{cell['ci'][0]:+.3f}, {cell['ci'][1]:+.3f}]"

    minutes = [runs[arm]["total_seconds"] / 60 for arm in ("grpo", "rft")]
    return (
        f"greedy test success {g['before']:.3f} at the start, {g['after']:.3f} after GRPO "
        f"({shown(g)}) and {r['after']:.3f} after RFT at the same sampling budget; GRPO - RFT "
        f"{shown(d)}; {minutes[0]:.1f} and {minutes[1]:.1f} min a run on 2 cores"
    )


def headline_row(results: Mapping[str, Any]) -> str:
    """:func:`headline` of every recipe with both arms recorded, as the benchmarks guide's
    headline table shows it."""
    recorded = [r for r in RECIPES if set(recipe_runs(results["real_model"], r)) == set(ARMS)]
    return "; ".join(f"SmolLM2-135M-Instruct, {RECIPE_LABELS[r]}: {headline(results, r)}"
                     for r in recorded)  # fmt: skip


def regions() -> dict[str, Any]:
    """The README's and the pretrained guide's regions (:mod:`benchmarks.readme_numbers`): each
    recipe's :func:`headline`."""
    return {
        "real_model_result": lambda results, _: headline(results, "chain_sum"),
        "real_model_guide": lambda results, _: headline(results, "chain_sum"),
        "real_model_tool_result": lambda results, _: headline(results, "tool_use_game"),
        "real_model_tool_guide": lambda results, _: headline(results, "tool_use_game"),
    }
