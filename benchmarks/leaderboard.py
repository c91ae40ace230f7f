"""The leaderboard: every policy on every environment, on a fixed split and seed.

One record per (environment, policy) goes into ``leaderboard.json``; ``leaderboard.md`` (envs as
rows, policies as columns) and ``leaderboard.png`` are drawn from those records.

    python -m benchmarks.leaderboard            # all envs x random,oracle,tiny-sft,tiny-grpo
    python -m benchmarks.leaderboard --policies hf:path/to/model --envs Math-v0,SQL-v0
    llm-gym leaderboard --policies openai:MODEL@http://localhost:8000/v1

Incremental: a record is keyed by (env, policy, split, k, episodes, seed, turn limit, sampling
settings); a rerun skips keys that have a record, so a new policy or env only adds its own runs,
and an interrupted run (Ctrl-C) resumes where it stopped (each record is written at once,
atomically). A record made under another env version, or with other model weights, is marked
stale in the table and rerun only with ``--refresh-stale`` (or ``--force``: rerun them all).
``tiny-sft`` and ``tiny-grpo`` are the main job's models in ``outputs/tool_use_game_tiny/``.
The table shows the records of this invocation's split, k, episodes, seed and turn limits.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import hashlib
import json
import os
import shlex
import sys
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS_DIR
from llm_gym.errors import InvalidArgumentError, UnknownNameError
from llm_gym.eval.metrics import is_success, mean_pass_at_k

ROOT = Path(__file__).resolve().parents[1]
MAIN_JOB_COMMAND = (
    "accelerate launch --config_file configs/accelerate/cpu.yaml train.py "
    "--config configs/tool_use_game_tiny.yaml"
)
TINY_MODELS = {
    "tiny-sft": "outputs/tool_use_game_tiny/sft",
    "tiny-grpo": "outputs/tool_use_game_tiny/final",
}
"""Aliases of the main job's two models (after SFT, after GRPO), relative to the repository."""
DEFAULT_POLICIES = ("random", "oracle", "tiny-sft", "tiny-grpo")
UNRANKED = ("oracle",)
"""Not ranked for best-per-row: the oracle reads the task's answer (it is the ceiling)."""
SPLITS = ("val", "test")
SCHEMA = 1

Key = tuple[str, str, str, int, int, int, int, str]
"""(env, policy, split, k, episodes, seed, max_turns, sampling settings as sorted JSON)."""


def _help(text: str, **argparse_kwargs: Any) -> dict[str, Any]:
    """The metadata of an :class:`Args` field: its help text and argparse settings."""
    return {"help": text, **argparse_kwargs}


@dataclass
class Args:
    """The leaderboard's options; ``--help`` is built from them."""

    envs: list[str] | None = field(default=None, metadata=_help("env ids, comma-separated"))
    policies: list[str] = field(
        default_factory=lambda: list(DEFAULT_POLICIES),
        metadata=_help("random[:SEED], oracle, tiny-sft, tiny-grpo, hf:PATH, openai:MODEL@URL"),
    )
    episodes: int = field(
        default=200, metadata=_help("episodes per env x policy (episodes // k tasks)", type=int)
    )
    k: int = field(default=1, metadata=_help("episodes per task; the k of pass@k", type=int))
    split: str = field(default="val", metadata=_help("the task split", choices=SPLITS))
    max_turns: int | None = field(
        default=None, metadata=_help("turn limit (default: each env's registered one)", type=int)
    )
    seed: int = field(
        default=0, metadata=_help("seed of the task choice, random policy, sampling", type=int)
    )
    temperature: float | None = field(
        default=None,
        metadata=_help("model policies; 0: greedy (default: 0 if k == 1, else 1)", type=float),
    )
    max_new_tokens: int = field(
        default=64, metadata=_help("model policies: tokens per assistant turn", type=int)
    )
    max_model_length: int = field(
        default=4096, metadata=_help("local models: context budget in tokens", type=int)
    )
    out_dir: Path = field(
        default=RESULTS_DIR, metadata=_help("where leaderboard.{json,md,png} go", type=Path)
    )
    force: bool = field(default=False, metadata=_help("rerun the selected records"))
    refresh_stale: bool = field(default=False, metadata=_help("rerun selected stale records"))
    render_only: bool = field(default=False, metadata=_help("only redraw md and PNG from JSON"))
    progress: bool = field(default=True, metadata=_help("no progress bars"))


@dataclass
class Job:
    """One (environment, policy) run: what identifies its record, and how it was made."""

    env_id: str
    """The environment id (a table row)."""
    policy: str
    """The policy's label (a table column): ``random``, ``oracle``, ``tiny-sft``, ``hf:PATH``..."""
    split: str
    """The task split."""
    k: int
    """Episodes per task, and the k of pass@k."""
    episodes: int
    """Episodes asked for (``episodes // k`` tasks, seeded)."""
    seed: int
    """Seed of the task choice and of the policy."""
    max_turns: int
    """The turn limit of the episodes."""
    sampling: dict[str, Any]
    """Generation settings of model policies (temperature, top_p, token budgets); {} otherwise."""
    spec: str
    """The policy spec (``policy_from_spec``; model paths as given)."""
    env_version: str | None
    """The environment's registered version at run time."""
    model_path: str | None
    """Local model folder (hf policies), as given."""
    model_hash: str | None
    """Short hash of the model's weight files at run time (hf policies)."""
    command: str
    """The command that made it."""

    @property
    def key(self) -> Key:
        sampling = json.dumps(self.sampling, sort_keys=True)
        return (
            self.env_id,
            self.policy,
            self.split,
            self.k,
            self.episodes,
            self.seed,
            self.max_turns,
            sampling,
        )


@dataclass
class Record(Job):
    """One finished run, as stored in ``leaderboard.json``."""

    policy_description: dict[str, Any]
    """The policy's own description, with its label and spec."""
    tasks: int
    """Distinct tasks played."""
    success_rate: float
    """Episodes that succeeded."""
    success_ci: list[float]
    """95% Wilson interval of the success rate, ``[low, high]``."""
    reward_mean: float
    """Mean final reward."""
    pass_at_k: float
    """Unbiased pass@k, averaged over tasks."""
    turns_mean: float
    """Assistant turns per episode."""
    tool_error_rate: float
    """Tool errors per tool call."""
    parse_failure_rate: float
    """Episodes ended by an unparseable action."""
    tokens_per_episode: float
    """Tokens the policy sampled per episode (0 for scripted policies)."""
    metrics: dict[str, float]
    """Every number of :func:`~llm_gym.eval.metrics.summarize_episodes`."""
    settings: dict[str, Any]
    """The rollout settings ``run_and_report`` used."""
    date: str
    """When it ran (UTC, ISO 8601)."""
    machine: str
    """Where it ran."""
    wall_time_s: float
    """Seconds the run took."""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Record:
        names = [f.name for f in dataclasses.fields(cls)]
        missing = [name for name in names if name not in data]
        if missing:
            raise InvalidArgumentError(f"A leaderboard record lacks the fields {missing}.")
        return cls(**{name: data[name] for name in names})


# --- pure logic: merge, staleness, ranking ----------------------------------------------------


def merge_records(existing: Iterable[Record], new: Iterable[Record]) -> list[Record]:
    """``existing`` with ``new`` merged in: a new record replaces the one with its key. Sorted."""
    merged = {r.key: r for r in existing}
    merged.update({r.key: r for r in new})
    return [merged[key] for key in sorted(merged)]


def stale_reasons(
    record: Job, env_versions: Mapping[str, str], model_hashes: Mapping[str, str | None]
) -> list[str]:
    """Why ``record`` no longer describes what is registered and on disk (empty: it is fresh).

    ``env_versions``: env id -> registered version; ``model_hashes``: model path -> the hash of
    its weights now. Unregistered envs and models that cannot be hashed are not judged.
    """
    reasons = []
    current = env_versions.get(record.env_id)
    if current is not None and current != record.env_version:
        reasons.append(f"env version {record.env_version} -> {current}")
    now = model_hashes.get(record.model_path) if record.model_path else None
    if now is not None and now != record.model_hash:
        reasons.append(f"model weights {record.model_hash} -> {now}")
    return reasons


def needs_run(existing: Record | None, stale: bool, *, force: bool, refresh_stale: bool) -> bool:
    """Run a job when it has no record, when forced, or when its record is stale and asked to."""
    return existing is None or force or (refresh_stale and stale)


def cell_value(record: Record) -> float:
    """The number a cell shows and ranks by: the success rate, or pass@k when k > 1."""
    return record.pass_at_k if record.k > 1 else record.success_rate


def best_per_row(
    values: Mapping[str, float], stale: Iterable[str] = (), unranked: Iterable[str] = UNRANKED
) -> set[str]:
    """The policies holding a row's best value (ties all win). Stale cells and ``unranked``
    policies are not ranked; a best of 0 marks nobody."""
    skip = set(stale) | set(unranked)
    ranked = {policy: v for policy, v in values.items() if policy not in skip}
    top = max(ranked.values(), default=0.0)
    return {policy for policy, v in ranked.items() if v >= top - 1e-12} if top > 0 else set()


def pass_at_k_from_episodes(episodes: Sequence[Any], k: int, threshold: float = 1.0) -> float:
    """Mean unbiased pass@k over the tasks of ``episodes`` (grouped by ``episode.group``)."""
    groups: dict[int, list[bool]] = {}
    for episode in episodes:
        groups.setdefault(episode.group, []).append(is_success(episode, threshold))
    return mean_pass_at_k([(len(g), sum(g)) for g in groups.values()], k)


def select_cell(records: Iterable[Record], key: Key, any_turns: bool = False) -> Record | None:
    """The record shown for ``key``: the exact one, else the newest that differs only in its
    sampling settings (a policy run earlier with settings of its own). ``any_turns``: ignore
    the turn limit too (an environment that is no longer registered)."""
    width = 6 if any_turns else 7
    candidates = [r for r in records if r.key[:width] == key[:width]]
    pool = [r for r in candidates if r.key[7] == key[7]] or candidates
    return max(pool, key=lambda r: r.date) if pool else None


# --- the table --------------------------------------------------------------------------------


@dataclass(frozen=True)
class View:
    """The settings a table shows: one cell per env x policy."""

    split: str
    k: int
    episodes: int
    seed: int
    max_turns: int | None
    """None: each environment's registered limit."""


@dataclass
class Registry:
    """What is registered and on disk now, against which records are judged."""

    env_versions: dict[str, str]
    env_turns: dict[str, int]
    model_hashes: dict[str, str | None] = field(default_factory=dict)


@dataclass
class Cell:
    """One table cell."""

    record: Record
    stale: list[str]
    best: bool = False


Table = dict[str, dict[str, Cell]]
"""``table[env][policy]``; a missing policy is a cell not run."""


def build_table(
    records: Sequence[Record],
    env_ids: Sequence[str],
    policies: Sequence[str],
    view: View,
    now: Registry,
    sampling: Mapping[str, Mapping[str, Any]] | None = None,
) -> Table:
    """The cells of ``view`` with their staleness and best-per-row marks. ``sampling``: the
    settings a policy runs with now (preferred when a policy has records under several)."""
    table: Table = {}
    for env_id in env_ids:
        turns = view.max_turns or now.env_turns.get(env_id)
        row: dict[str, Cell] = {}
        for policy in policies:
            settings = json.dumps((sampling or {}).get(policy, {}), sort_keys=True)
            key = (env_id, policy, view.split, view.k, view.episodes, view.seed, turns or 0)
            record = select_cell(records, (*key, settings), any_turns=turns is None)
            if record is not None:
                row[policy] = Cell(
                    record, stale_reasons(record, now.env_versions, now.model_hashes)
                )
        values = {p: cell_value(c.record) for p, c in row.items()}
        for policy in best_per_row(values, [p for p, c in row.items() if c.stale]):
            row[policy].best = True
        table[env_id] = row
    return table


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
        return f"random well-formed tool calls or short replies, seed {d.get('seed')} (the floor)"
    if record.policy == "oracle":
        return "each environment's scripted expert; it reads the task's answer (the ceiling)"
    decoding = "greedy" if s.get("temperature") == 0 else f"temperature {s.get('temperature')}"
    how = f"{decoding}, {s.get('max_new_tokens')} new tokens per turn"
    if record.model_path is not None:
        return f"local model `{record.model_path}` (weights sha256 {record.model_hash}), {how}"
    return f"`{d.get('model')}` at {d.get('base_url')}, {how}"


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
        "| environment | " + " | ".join(policies) + " |",
        "| --- |" + " --- |" * len(policies),
    ]
    for env_id, row in table.items():
        lines.append(
            f"| {env_id} | " + " | ".join(format_cell(row.get(p)) for p in policies) + " |"
        )
    lines += [
        "",
        "**bold ★**: best per row (ties all marked; none when the best is 0; the oracle and "
        "stale cells are not ranked; overlapping intervals mean the lead is not significant). "
        "†: stale, made under another env version or with other "
        "model weights; rerun with `--refresh-stale`. –: not run.",
        "",
        "Policies:",
        "",
    ]
    newest = {c.record.policy: c.record for c in sorted(cells, key=lambda c: c.record.date)}
    lines += [f"- `{p}`: {describe_policy(newest[p])}" for p in policies if p in newest]
    stale = [(env, p, c) for env, row in table.items() for p, c in row.items() if c.stale]
    if stale:
        lines += ["", "Stale cells:", ""]
        lines += [f"- {env} x {p}: {'; '.join(c.stale)}" for env, p, c in stale]
    lines += [
        "",
        "## Details",
        "",
        "| environment | policy | success | pass@k | mean reward | turns | tool-error rate "
        "| parse failures | tokens / episode | env version | date |",
        "| --- | --- |" + " ---: |" * 7 + " --- | --- |",
    ]
    for env_id, row in table.items():
        for p, cell in sorted(row.items(), key=lambda item: policies.index(item[0])):
            r = cell.record
            tokens = f"{r.tokens_per_episode:.1f}" if r.tokens_per_episode else "–"
            lines.append(
                f"| {env_id} | {p} | {r.success_rate:.3f} | {r.pass_at_k:.3f} | "
                f"{r.reward_mean:.3f} | {r.turns_mean:.2f} | {r.tool_error_rate:.3f} | "
                f"{r.parse_failure_rate:.3f} | {tokens} | {r.env_version} | {r.date[:10]} |"
            )
    commands = sorted({c.record.command for c in cells}, key=lambda cmd: (len(cmd), cmd))
    machines = ", ".join(sorted({c.record.machine for c in cells})) or "–"
    lines += ["", "Made by:", "", *(f"    {cmd}" for cmd in commands), ""]
    lines.append(f"Machine: {machines}. Every number is in `leaderboard.json`.")
    return "\n".join(lines) + "\n"


def plot(table: Table, policies: Sequence[str], view: View, path: Path) -> bool:
    """The table as a heat map: envs as rows, policies as columns, each cell's value and 95%
    interval written in it, ★ on the best per row, stale cells hatched. False without matplotlib."""
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
        legend += "\n† hatched: stale (another env version or other model weights)"
    fig.text(0.01, 0.01, legend, fontsize=8.5, va="bottom", color="#333333")
    fig.tight_layout(rect=(0, 0.45 / fig.get_figheight(), 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


# --- files, models, policies ------------------------------------------------------------------


def load_records(path: Path) -> list[Record]:
    """The records of ``leaderboard.json`` (none when it does not exist)."""
    if not path.exists():
        return []
    return [Record.from_dict(r) for r in json.loads(path.read_text()).get("records", [])]


def write_atomic(path: Path, text: str) -> None:
    """Write through a temporary file and a rename: readers see the old file or the new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o644)  # mkstemp makes it private; results are for everyone to read
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def save_records(path: Path, records: Sequence[Record]) -> None:
    records = merge_records(records, [])
    payload = {"schema": SCHEMA, "records": [dataclasses.asdict(r) for r in records]}
    write_atomic(path, json.dumps(payload, indent=1, ensure_ascii=False) + "\n")


def weights_hash(folder: Path) -> str | None:
    """A short sha256 of a model folder's weight files (None: no folder, or no weights)."""
    if not folder.is_dir():
        return None
    names = sorted(p.name for p in folder.iterdir())
    weights = [n for n in names if n.endswith(".safetensors") or n.startswith("pytorch_model")]
    if not weights:
        return None
    digest = hashlib.sha256()
    for name in weights:
        digest.update(name.encode())
        with (folder / name).open("rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
    return digest.hexdigest()[:12]


def model_folder(path: str) -> Path:
    """Where a model path lives (the tiny aliases' paths are relative to the repository)."""
    return ROOT / path if path in TINY_MODELS.values() else Path(path)


def parse_policy(label: str) -> tuple[str, str | None]:
    """``(spec, local model path or None)`` of a policy label; a clear error when the label is
    unknown or its model folder is missing."""
    kind, _, rest = label.partition(":")
    if label in TINY_MODELS:
        path = TINY_MODELS[label]
        if not (ROOT / path / "config.json").exists():
            raise InvalidArgumentError(
                f"Policy {label!r} is the main job's model in {path}/, which does not exist yet. "
                f"Make it with: {MAIN_JOB_COMMAND}"
            )
        return f"hf:{path}", path
    if label == "oracle" or (kind == "random" and (not rest or rest.isdigit())):
        return label, None
    if kind == "hf" and rest:
        if Path(rest).is_dir():
            return label, rest
        if rest.startswith((".", "/", "~")):
            raise InvalidArgumentError(f"Policy {label!r}: no model folder at {rest}.")
        return label, None  # a hub id
    if kind == "openai" and "@" in rest:
        return label, None
    close = difflib.get_close_matches(label, [*DEFAULT_POLICIES, "hf:PATH", "openai:MODEL@URL"], 1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise UnknownNameError(
        f"Unknown policy {label!r}.{hint} Expected one of: random[:SEED], oracle, tiny-sft, "
        "tiny-grpo, hf:PATH, openai:MODEL@URL."
    )


def is_model_policy(label: str) -> bool:
    return label in TINY_MODELS or label.startswith(("hf:", "openai:"))


def sampling_settings(label: str, args: Args) -> dict[str, Any]:
    """The generation settings that change a model policy's numbers ({} for scripted ones)."""
    if not is_model_policy(label):
        return {}
    temperature = args.temperature
    if temperature is None:
        temperature = 0.0 if args.k == 1 else 1.0
    settings = {"temperature": temperature, "top_p": 1.0, "max_new_tokens": args.max_new_tokens}
    if not label.startswith("openai:"):
        settings["max_model_length"] = args.max_model_length
    return settings


def format_command(args: Args) -> str:
    """The command line that makes ``args``' records."""
    parts = ["python", "-m", "benchmarks.leaderboard"]
    if args.envs:
        parts += ["--envs", ",".join(args.envs)]
    parts += ["--policies", ",".join(args.policies), "--episodes", str(args.episodes)]
    parts += ["--k", str(args.k), "--split", args.split, "--seed", str(args.seed)]
    if args.max_turns is not None:
        parts += ["--max-turns", str(args.max_turns)]
    if any(is_model_policy(p) for p in args.policies):
        if args.temperature is not None:
            parts += ["--temperature", str(args.temperature)]
        parts += ["--max-new-tokens", str(args.max_new_tokens)]
        parts += ["--max-model-length", str(args.max_model_length)]
    return shlex.join(parts)


# --- running ----------------------------------------------------------------------------------


Runner = Callable[[Job], Record]
"""Runs one job and returns its record (tests pass fakes)."""


def record_from_report(report: Any, job: Job) -> Record:
    """The record of ``job`` from its :class:`~llm_gym.eval.EvalReport`."""
    m = report.metrics
    pass_k = pass_at_k_from_episodes(report.episodes, job.k) if report.episodes else m["pass_at_k"]
    description = {**report.policy, "label": job.policy, "spec": job.spec}
    if job.model_path is not None:
        description["model"] = job.model_path  # as given, not this machine's absolute path
    return Record(
        **{f.name: getattr(job, f.name) for f in dataclasses.fields(Job)},
        policy_description=description,
        tasks=report.tasks,
        success_rate=m["success_rate"],
        success_ci=[m["success_ci_low"], m["success_ci_high"]],
        reward_mean=m["reward_mean"],
        pass_at_k=pass_k,
        turns_mean=m["turns_mean"],
        tool_error_rate=m["tool_error_rate"],
        parse_failure_rate=m["parse_failure_ratio"],
        tokens_per_episode=m["completion_tokens_mean"],
        metrics=dict(m),
        settings=dict(report.settings),
        date=report.date,
        machine=report.machine,
        wall_time_s=report.wall_time_s,
    )


class EvalRunner:
    """The real runner, ``run_and_report`` per job. A model policy is loaded once and kept for
    the jobs that follow (jobs come policy by policy); scripted ones are built fresh per job."""

    def __init__(self, progress: bool = True) -> None:
        self.progress = progress
        self._loaded: tuple[str, Any] | None = None

    def _policy(self, job: Job) -> Any:
        if not is_model_policy(job.policy):
            return job.spec  # run_and_report builds it, seeded with job.seed
        if self._loaded is None or self._loaded[0] != job.policy:
            from llm_gym.policies import policy_from_spec

            self._loaded = None  # free the previous model first
            kwargs = {k: v for k, v in job.sampling.items() if k != "max_model_length"}
            spec = f"hf:{model_folder(job.model_path)}" if job.model_path else job.spec
            policy = policy_from_spec(spec, seed=job.seed, **kwargs)
            policy.name = job.policy
            self._loaded = (job.policy, policy)
        return self._loaded[1]

    def __call__(self, job: Job) -> Record:
        from llm_gym.eval import run_and_report

        report = run_and_report(
            job.env_id,
            self._policy(job),
            split=job.split,
            episodes=job.episodes,
            k=job.k,
            seed=job.seed,
            max_turns=job.max_turns,
            max_new_tokens=job.sampling.get("max_new_tokens"),
            max_model_length=job.sampling.get("max_model_length"),
            progress=self.progress,
            print_report=False,
        )
        return record_from_report(report, job)


@dataclass
class Outcome:
    """What one invocation did."""

    records: list[Record]
    """Every record of leaderboard.json afterwards."""
    ran: list[Key] = field(default_factory=list)
    """Jobs run now."""
    kept: list[Key] = field(default_factory=list)
    """Jobs whose existing record was kept."""
    errors: list[str] = field(default_factory=list)
    """Policies and runs that failed (the others went on)."""


def plan_jobs(args: Args, now: Registry, outcome: Outcome) -> list[Job]:
    """Every selected (policy, env) job, policy by policy; unusable tiny models are reported in
    ``outcome.errors`` and left out. Fills ``now.model_hashes``."""
    from llm_gym.gym import env_entry

    env_ids = args.envs or list(now.env_versions)
    for env_id in env_ids:
        env_entry(env_id)  # an unknown id suggests the closest one
    specs: dict[str, tuple[str, str | None]] = {}
    for label in args.policies:
        try:
            specs[label] = parse_policy(label)
        except InvalidArgumentError as exc:  # a missing tiny model: say so, run the others
            if label not in TINY_MODELS:
                raise
            outcome.errors.append(str(exc))
    paths = {p for _, p in specs.values() if p} | {r.model_path for r in outcome.records}
    now.model_hashes = {p: weights_hash(model_folder(p)) for p in sorted(paths - {None})}
    command = format_command(args)
    return [
        Job(
            env_id=env_id,
            policy=label,
            split=args.split,
            k=args.k,
            episodes=args.episodes,
            seed=args.seed,
            max_turns=args.max_turns or now.env_turns[env_id],
            sampling=sampling_settings(label, args),
            spec=spec,
            env_version=now.env_versions[env_id],
            model_path=path,
            model_hash=now.model_hashes.get(path) if path else None,
            command=command,
        )
        for label, (spec, path) in specs.items()
        for env_id in env_ids
    ]


def render(args: Args, records: Sequence[Record], now: Registry) -> Table:
    """Redraw leaderboard.md and .png for ``args``' view, from every record that fits it."""
    view = View(args.split, args.k, args.episodes, args.seed, args.max_turns)
    fits = [r for r in records if r.key[2:6] == (view.split, view.k, view.episodes, view.seed)]
    envs = list(now.env_versions) + sorted({r.env_id for r in fits} - set(now.env_versions))
    envs = [
        e for e in envs if e in (args.envs or now.env_versions) or any(r.env_id == e for r in fits)
    ]
    seen = [*args.policies, *(r.policy for r in fits)]
    policies = [p for p in DEFAULT_POLICIES if p in seen]
    policies += [p for p in dict.fromkeys(seen) if p not in policies]
    sampling = {p: sampling_settings(p, args) for p in policies}
    table = build_table(records, envs, policies, view, now, sampling)
    if any(table.values()):
        policies = [p for p in policies if any(p in row for row in table.values())]
        write_atomic(args.out_dir / "leaderboard.md", render_markdown(table, policies, view))
        plot(table, policies, view, args.out_dir / "leaderboard.png")
    return table


def main(args: Args, runner: Runner | None = None) -> Outcome:
    """Run what is missing (or asked for), merge each record into leaderboard.json as it
    finishes, then redraw leaderboard.md and .png (also after an interruption)."""
    from llm_gym.gym import registered_envs

    if args.k < 1 or args.episodes < args.k:
        raise InvalidArgumentError(
            f"Expected 1 <= k <= episodes, actual values: k={args.k}, episodes={args.episodes}."
        )
    if args.split not in SPLITS:
        raise InvalidArgumentError(f"split must be one of {SPLITS}, actual value: {args.split!r}.")
    entries = registered_envs()
    now = Registry(
        {e.id: e.version for e in entries}, {e.id: e.max_turns for e in entries}
    )
    json_path = args.out_dir / "leaderboard.json"
    outcome = Outcome(load_records(json_path))
    jobs = plan_jobs(args, now, outcome)
    existing = {r.key: r for r in outcome.records}
    todo = []
    for job in jobs:
        old = existing.get(job.key)
        stale = old is not None and bool(stale_reasons(old, now.env_versions, now.model_hashes))
        if not args.render_only and needs_run(
            old, stale, force=args.force, refresh_stale=args.refresh_stale
        ):
            todo.append(job)
        else:
            outcome.kept.append(job.key)
    from tqdm.auto import tqdm

    runner = runner or EvalRunner(progress=args.progress)
    bar = tqdm(
        total=len(todo), desc="leaderboard", unit="run", disable=not args.progress or not todo
    )
    for error in outcome.errors:
        bar.write(f"leaderboard: skipped: {error}", file=sys.stderr)
    try:
        for job in todo:
            bar.set_postfix_str(f"{job.env_id} · {job.policy}")
            try:
                record = runner(job)
            except Exception as exc:  # a broken env or endpoint must not stop the others
                outcome.errors.append(f"{job.env_id} x {job.policy}: {type(exc).__name__}: {exc}")
                bar.write(f"leaderboard: error: {outcome.errors[-1]}", file=sys.stderr)
            else:
                outcome.records = merge_records(outcome.records, [record])
                save_records(json_path, outcome.records)
                outcome.ran.append(job.key)
                bar.write(f"{job.env_id} · {job.policy}: {format_cell(Cell(record, []))}")
            bar.update(1)
    finally:
        bar.close()
        render(args, outcome.records, now)
    return outcome


# --- command line -----------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of :class:`Args` (``python -m benchmarks.leaderboard``, ``llm-gym
    leaderboard``)."""
    for f in dataclasses.fields(Args):
        extra = {k: v for k, v in f.metadata.items() if k != "help"}
        flag, text = "--" + f.name.replace("_", "-"), f.metadata["help"]
        if f.default is True:
            parser.add_argument(f"--no-{f.name}", dest=f.name, action="store_false", help=text)
        elif f.default is False:
            parser.add_argument(flag, action="store_true", help=text)
        elif f.name in ("envs", "policies"):
            default = "all registered" if f.name == "envs" else ",".join(DEFAULT_POLICIES)
            parser.add_argument(flag, nargs="+", help=f"{text} (default: {default})")
        else:
            suffix = "" if f.default is None else " (default: %(default)s)"
            parser.add_argument(flag, default=f.default, help=text + suffix, **extra)


def args_from_namespace(ns: argparse.Namespace) -> Args:
    values = {f.name: getattr(ns, f.name) for f in dataclasses.fields(Args)}
    for name in ("envs", "policies"):
        items = [v.strip() for value in values[name] or [] for v in value.split(",") if v.strip()]
        values[name] = items or None
    values["policies"] = values["policies"] or list(DEFAULT_POLICIES)
    return Args(**values)


def run_cli(args: Args, out: Any = None) -> int:
    """Run and print a summary; 1 when some run failed, 130 on Ctrl-C (records kept)."""
    out = out or sys.stdout
    try:
        outcome = main(args)
    except KeyboardInterrupt:
        print(
            "interrupted: finished records are saved; rerun the same command to resume.", file=out
        )
        return 130
    done = f"ran {len(outcome.ran)} run(s), kept {len(outcome.kept)} existing record(s)"
    print(f"{done}; wrote {args.out_dir / 'leaderboard.md'}", file=out)
    for error in outcome.errors:
        print(f"error: {error}", file=out)
    return 1 if outcome.errors else 0


def cli(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_arguments(parser)
    return run_cli(args_from_namespace(parser.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(cli())
