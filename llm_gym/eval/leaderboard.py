"""The leaderboard's records: one per (environment, policy) run, their staleness and the table.

A :class:`Record` is keyed by (env, policy, split, k, episodes, seed, turn limit, sampling
settings); ``leaderboard.json`` holds one per key (:func:`add_records` merges each finished record
into it under a lock and writes it atomically, so an interrupted run keeps every finished record
and two runs on one folder keep each other's). A record made under another env version, or with
other model files (weights, config, tokenizer, chat template), is *stale*: :func:`stale_reasons`
says why. :func:`build_table` picks the record of each cell of a :class:`View` (envs as rows,
policies as columns) and marks the best per row; :mod:`llm_gym.eval.leaderboard_render` draws it,
:mod:`llm_gym.eval.leaderboard_run` runs it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import stat
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llm_gym.core.input_files import InputLimit, loads_json, read_input_text
from llm_gym.errors import InvalidArgumentError
from llm_gym.eval.files import write_atomic
from llm_gym.eval.leaderboard_checks import check_record_fields
from llm_gym.eval.metrics import is_success, mean_pass_at_k
from llm_gym.eval.model_hash import model_files_hash

__all__ = [
    # records
    "Job",
    "Key",
    "Record",
    "SCHEMA",
    # rules
    "best_per_row",
    "cell_value",
    "add_records",
    "merge_records",
    "needs_run",
    "pass_at_k_from_episodes",
    "select_cell",
    "stale_reasons",
    "UNRANKED",
    # the table
    "Cell",
    "Registry",
    "Table",
    "View",
    "build_table",
    # files
    "MAX_LEADERBOARD_BYTES",
    "load_records",
    "model_files_hash",
    "save_records",
]

UNRANKED = ("oracle",)
"""Not ranked for best-per-row: the oracle reads the task's answer (it is the ceiling)."""
SCHEMA = 1
"""The version of ``leaderboard.json``'s layout."""

Key = tuple[str, str, str, int, int, int, int, str]
"""(env, policy, split, k, episodes, seed, max_turns, sampling settings as sorted JSON)."""


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
    """Short hash of the model's weights, config, tokenizer and chat template files at run time
    (hf policies; :func:`~llm_gym.eval.model_hash.model_files_hash`)."""
    command: str
    """The command that made it."""

    @property
    def key(self) -> Key:
        """What identifies the record: a rerun with the same key replaces it."""
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
        """A record from its JSON form (every field required, of its declared type; extra keys
        are ignored).

        Numbers are finite; rates, pass@k and the interval are in [0, 1] (``low <= high``); ``k``
        and ``episodes`` are at least 1 and the other counts and means at least 0.

        Raises:
            InvalidArgumentError: ``data`` is not a mapping, lacks a field, holds a field of
                another type (``success_ci`` is ``[low, high]``), or a number out of its range.
        """
        if not isinstance(data, Mapping):
            raise InvalidArgumentError(
                f"A leaderboard record is a JSON object, actual value: {data!r:.80}."
            )
        check_record_fields(cls, data)
        names = [f.name for f in dataclasses.fields(cls)]
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
    its weights, config, tokenizer and chat template now (:func:`model_files_hash`).
    Unregistered envs and models that cannot be hashed are not judged.
    """
    reasons = []
    current = env_versions.get(record.env_id)
    if current is not None and current != record.env_version:
        reasons.append(f"env version {record.env_version} -> {current}")
    now = model_hashes.get(record.model_path) if record.model_path else None
    if now is not None and now != record.model_hash:
        reasons.append(f"model files {record.model_hash} -> {now}")
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
    """The task split."""
    k: int
    """Episodes per task."""
    episodes: int
    """Episodes per cell."""
    seed: int
    """Seed of the task choice and of the policy."""
    max_turns: int | None
    """The turn limit; None: each environment's registered limit."""


@dataclass
class Registry:
    """What is registered and on disk now, against which records are judged."""

    env_versions: dict[str, str]
    """Registered env id -> its version."""
    env_turns: dict[str, int]
    """Registered env id -> its turn limit."""
    model_hashes: dict[str, str | None] = field(default_factory=dict)
    """Local model path -> :func:`model_files_hash` of its folder now (None: no weights)."""


@dataclass
class Cell:
    """One table cell."""

    record: Record
    """The record shown."""
    stale: list[str]
    """Why it is stale (:func:`stale_reasons`; empty: fresh)."""
    best: bool = False
    """Whether it holds the row's best value."""


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
    by_cell: dict[tuple[Any, ...], list[Record]] = {}  # each cell's candidates, found at once
    for r in records:
        by_cell.setdefault(r.key[:6], []).append(r)
    table: Table = {}
    for env_id in env_ids:
        turns = view.max_turns or now.env_turns.get(env_id)
        row: dict[str, Cell] = {}
        for policy in policies:
            settings = json.dumps((sampling or {}).get(policy, {}), sort_keys=True)
            key = (env_id, policy, view.split, view.k, view.episodes, view.seed, turns or 0)
            candidates = by_cell.get(key[:6], [])
            record = select_cell(candidates, (*key, settings), any_turns=turns is None)
            if record is not None:
                row[policy] = Cell(
                    record, stale_reasons(record, now.env_versions, now.model_hashes)
                )
        values = {p: cell_value(c.record) for p, c in row.items()}
        for policy in best_per_row(values, [p for p, c in row.items() if c.stale]):
            row[policy].best = True
        table[env_id] = row
    return table


# --- files ---------------------------------------------------------------------------------------


MAX_LEADERBOARD_BYTES = 256 << 20
"""The largest ``leaderboard.json`` read (a record is about 2 KB)."""


def load_records(path: Path) -> list[Record]:
    """The records of ``leaderboard.json`` (none when it does not exist).

    Raises:
        InvalidArgumentError: The file is not a regular file, is over
            :data:`MAX_LEADERBOARD_BYTES`, is not JSON (or nests past
            :data:`~llm_gym.core.input_files.MAX_JSON_DEPTH`), or is not
            ``{"records": [record, ...]}`` of valid records; the message names the file.
    """
    if not os.path.lexists(path):
        return []
    name = "llm_gym.eval.leaderboard.MAX_LEADERBOARD_BYTES"
    limit = InputLimit("leaderboard", MAX_LEADERBOARD_BYTES, name, "a leaderboard.json file")
    try:
        data = loads_json(read_input_text(path, limit))
        if not isinstance(data, dict) or not isinstance(data.get("records", []), list):
            raise InvalidArgumentError(
                f'a leaderboard is {{"schema": 1, "records": [...]}}, actual value: {data!r:.80}.'
            )
        records = []
        for number, item in enumerate(data.get("records", [])):
            try:
                records.append(Record.from_dict(item))
            except InvalidArgumentError as exc:
                raise InvalidArgumentError(f"record {number}: {exc}") from None
    except InvalidArgumentError as exc:
        text = str(exc).rstrip(".")
        text = text if str(path) in text else f"{path}: {text}"
        raise InvalidArgumentError(
            f"{text}; move the file away (the rerun writes a new one) or fix it."
        ) from None
    return records


def save_records(path: Path, records: Sequence[Record]) -> None:
    """Write ``records`` (sorted, one per key) as ``leaderboard.json``, atomically."""
    records = merge_records(records, [])
    payload = {"schema": SCHEMA, "records": [dataclasses.asdict(r) for r in records]}
    write_atomic(path, json.dumps(payload, indent=1, ensure_ascii=False) + "\n")


def add_records(path: Path, new: Iterable[Record]) -> list[Record]:
    """Merge ``new`` into ``leaderboard.json`` as it is on disk now, and return what it holds.

    The read, merge and write run under an exclusive lock on ``.<name>.lock`` beside the file
    (``fcntl.flock``), so two processes adding to one leaderboard both keep their records: each
    merges into what the other wrote, never into its own older copy.
    """
    import fcntl

    new = list(new)
    lock = path.with_name(f".{path.name}.lock")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise InvalidArgumentError(f"{lock}: the leaderboard's lock must be a regular file.")
        fcntl.flock(fd, fcntl.LOCK_EX)
        records = merge_records(load_records(path), new)
        save_records(path, records)
        return records
    finally:
        os.close(fd)  # releases the lock
