"""The leaderboard drawn for people: a markdown table with details, and a PNG heat map.

Both draw a :data:`~llm_gym.eval.leaderboard.Table` of one view: envs as rows, policies as
columns; each cell shows the success rate with its 95% Wilson interval (pass@k when k > 1), ★ on
the best per row, † on stale cells. matplotlib is imported only to draw the PNG.

Every text that comes from a record (env ids, policy labels, versions, commands, machine names)
goes through :func:`md_text` or :func:`md_code`: a ``|``, a line break, a backtick or HTML in a
record stays text in its cell, and never adds a row, a heading or markup to the page. The PNG is
drawn for tables of at most :data:`MAX_PLOT_CELLS` cells (a larger one stays in the markdown).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from llm_gym.eval.leaderboard import Cell, Record, Table, View, cell_value

__all__ = [
    "MAX_PLOT_CELLS",
    "describe_policy",
    "format_cell",
    "md_code",
    "md_text",
    "plot",
    "render_markdown",
]

MAX_PLOT_CELLS = 400
"""The largest table (envs x policies) drawn as a PNG: past it the picture is unreadable and
matplotlib's time and memory grow with every cell."""

_UNPRINTABLE = re.compile(r"[^\S ]|[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_HTML = {"&": "&amp;", "<": "&lt;"}  # no tag or entity can start; ">" stays readable


def _one_line(value: Any) -> str:
    """``value`` as text on one line: every line break, tab or control character shown
    escaped (``\\n``)."""
    return _UNPRINTABLE.sub(lambda m: repr(m.group())[1:-1], str(value))


def md_text(value: Any) -> str:
    r"""``value`` as plain text inside a markdown table cell or line: markdown's characters
    escaped, ``<`` and ``&`` as entities (no HTML tag), line breaks and control characters
    shown escaped.

    Example:
        >>> print(md_text("a|b\n# <i>"))
        a\|b\\n# &lt;i>
    """
    text = _one_line(value).replace("\\", "\\\\")
    text = re.sub(r"[&<]", lambda m: _HTML[m.group()], text)
    return re.sub(r"([|`*_\[\]])", r"\\\1", text)


def md_code(value: Any) -> str:
    """``value`` as one inline code span, on one line (:func:`md_text`'s line breaks), fenced
    by more backticks than any run of them in it (for list items: a table cell takes
    :func:`md_text`).

    Example:
        >>> md_code("a`b")
        '`` a`b ``'
    """
    text = _one_line(value)
    fence = "`" * (max((len(run) for run in re.findall("`+", text)), default=0) + 1)
    return f"{fence} {text} {fence}" if fence != "`" else f"`{text}`"


def format_cell(cell: Cell | None) -> str:
    """``0.850 [0.793, 0.894]``: ``**...** ★`` when best, ``†`` when stale, ``–`` when not run."""
    if cell is None:
        return "–"
    r = cell.record
    low, high = r.success_ci
    text = f"{r.pass_at_k:.3f}" if r.k > 1 else f"{r.success_rate:.3f} [{low:.3f}, {high:.3f}]"
    text = f"**{text}** ★" if cell.best else text
    return f"{text} †" if cell.stale else text


def describe_policy(record: Record) -> str:
    """One line about a record's policy."""
    d, s = record.policy_description, record.sampling
    if record.policy.startswith("random"):
        seed = md_text(d.get("seed"))
        return f"random well-formed tool calls or short replies, seed {seed} (the floor)"
    if record.policy == "oracle":
        return "each environment's scripted expert; it reads the task's answer (the ceiling)"
    if not s:  # another scripted backend: no model, no sampling settings
        return f"the scripted policy {md_code(record.policy)}"
    temperature = md_text(s.get("temperature"))
    decoding = "greedy" if s.get("temperature") == 0 else f"temperature {temperature}"
    budget = s.get("max_new_tokens")
    per_turn = (
        "each environment's own token budget per turn"
        if budget is None
        else f"{md_text(budget)} new tokens per turn"
    )
    how = f"{decoding}, {per_turn}"
    if record.model_path is not None:
        weights = md_text(record.model_hash)
        return f"local model {md_code(record.model_path)} (model files sha256 {weights}), {how}"
    return f"{md_code(d.get('model'))} at {md_text(d.get('base_url'))}, {how}"


def render_markdown(table: Table, policies: Sequence[str], view: View) -> str:
    """The leaderboard a person reads: the table, a legend, the policies, details, commands."""
    cells = [c for row in table.values() for c in row.values()]
    number = f"pass@{view.k}" if view.k > 1 else "Success rate [95% Wilson interval]"
    turns = f"{view.max_turns} turns" if view.max_turns else "each environment's turn limit"
    lines = [
        "# Leaderboard: every policy on every environment",
        "",
        f"{number} on the **{view.split}** split: {view.episodes} episodes per cell "
        f"({view.episodes // view.k} tasks x k = {view.k}), seed {view.seed}, {turns}.",
        "",
        "| environment | " + " | ".join(md_text(p) for p in policies) + " |",
        "| --- |" + " --- |" * len(policies),
    ]
    for env_id, row in table.items():
        lines.append(
            f"| {md_text(env_id)} | " + " | ".join(format_cell(row.get(p)) for p in policies) + " |"
        )
    lines += [
        "",
        "**bold ★**: best per row (ties all marked; none when the best is 0; the oracle and "
        "stale cells are not ranked; overlapping intervals mean the lead is not significant). "
        "†: stale, made under another env version or with other "
        "model files (weights, config, tokenizer, chat template); rerun with "
        "`--refresh-stale`. –: not run.",
        "",
        "Policies:",
        "",
    ]
    newest = {c.record.policy: c.record for c in sorted(cells, key=lambda c: c.record.date)}
    lines += [f"- {md_code(p)}: {describe_policy(newest[p])}" for p in policies if p in newest]
    stale = [(env, p, c) for env, row in table.items() for p, c in row.items() if c.stale]
    if stale:
        lines += ["", "Stale cells:", ""]
        lines += [
            f"- {md_text(env)} x {md_text(p)}: {md_text('; '.join(c.stale))}" for env, p, c in stale
        ]
    lines += [
        "",
        "## Details",
        "",
        "| environment | policy | success | pass@k | mean reward | turns | tool-error rate "
        "| parse failures | tokens / episode | env version | date |",
        "| --- | --- |" + " ---: |" * 7 + " --- | --- |",
    ]
    order = {p: i for i, p in enumerate(policies)}
    for env_id, row in table.items():
        for p, cell in sorted(row.items(), key=lambda item: order[item[0]]):
            r = cell.record
            tokens = f"{r.tokens_per_episode:.1f}" if r.tokens_per_episode else "–"
            lines.append(
                f"| {md_text(env_id)} | {md_text(p)} | {r.success_rate:.3f} | {r.pass_at_k:.3f} | "
                f"{r.reward_mean:.3f} | {r.turns_mean:.2f} | {r.tool_error_rate:.3f} | "
                f"{r.parse_failure_rate:.3f} | {tokens} | {md_text(r.env_version)} | "
                f"{md_text(r.date[:10])} |"
            )
    commands = sorted({_one_line(c.record.command) for c in cells}, key=lambda c: (len(c), c))
    machines = ", ".join(sorted({md_text(c.record.machine) for c in cells})) or "–"
    lines += ["", "Made by:", "", *(f"    {cmd}" for cmd in commands), ""]
    lines.append(f"Machine: {machines}. Every number is in `leaderboard.json`.")
    return "\n".join(lines) + "\n"


def plot(table: Table, policies: Sequence[str], view: View, path: Path) -> bool:
    """The table as a heat map: envs as rows, policies as columns, each cell's value and 95%
    interval written in it, ★ on the best per row, stale cells hatched. False without matplotlib,
    or for a table of more than :data:`MAX_PLOT_CELLS` cells (then nothing is drawn)."""
    if len(table) * len(policies) > MAX_PLOT_CELLS:
        return False
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    envs = list(table)
    values = [
        [cell_value(row[p].record) if p in row else float("nan") for p in policies]
        for row in table.values()
    ]
    fig, ax = plt.subplots(figsize=(2.0 + 1.9 * len(policies), 1.7 + 0.62 * len(envs)))
    image = ax.imshow(values, cmap="YlGn", vmin=0.0, vmax=1.0, aspect="auto")
    for i, env_id in enumerate(envs):
        for j, policy in enumerate(policies):
            cell = table[env_id].get(policy)
            if cell is None:
                ax.text(j, i, "not run", ha="center", va="center", color="#888888", fontsize=9)
                continue
            r, value = cell.record, values[i][j]
            head = f"{value:.3f}" + (" ★" if cell.best else "") + (" †" if cell.stale else "")
            low, high = r.success_ci
            text = head if r.k > 1 else f"{head}\n[{low:.3f}, {high:.3f}]"
            color = "white" if value > 0.6 else "black"
            box = None
            if cell.stale:  # hatched, the text on a plain patch of the cell's colour
                ax.add_patch(
                    matplotlib.patches.Rectangle(
                        (j - 0.5, i - 0.5), 1, 1, fill=False, hatch="//", edgecolor="#999999"
                    )
                )
                box = {"facecolor": image.cmap(image.norm(value)), "edgecolor": "none"}
            ax.text(j, i, text, ha="center", va="center", color=color, fontsize=9, bbox=box)
    ax.set_xticks(range(len(policies)), policies)
    ax.set_yticks(range(len(envs)), envs)
    ax.tick_params(top=True, labeltop=True, bottom=False, labelbottom=False, length=0)
    ax.set_xticks([x - 0.5 for x in range(1, len(policies))], minor=True)
    ax.set_yticks([y - 0.5 for y in range(1, len(envs))], minor=True)
    ax.grid(which="minor", color="white", linewidth=2)
    ax.tick_params(which="minor", length=0)
    number = f"pass@{view.k}" if view.k > 1 else "success rate"
    fig.colorbar(image, ax=ax, fraction=0.04, pad=0.02).set_label(number)
    ax.set_title(
        f"llm_gym leaderboard: {number}, {view.split} split, {view.episodes} episodes "
        f"per cell, seed {view.seed}",
        fontsize=11,
        pad=10,
    )
    legend = "[low, high]: 95% Wilson interval" if view.k == 1 else f"pass@{view.k}: unbiased"
    legend += "   ★ best per row (the oracle and stale cells are not ranked)"
    if any(c.stale for row in table.values() for c in row.values()):
        legend += "\n† hatched: stale (another env version or other model files)"
    fig.text(0.01, 0.01, legend, fontsize=8.5, va="bottom", color="#333333")
    fig.tight_layout(rect=(0, 0.45 / fig.get_figheight(), 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
