"""``run_and_report``: score any policy on any environment, print a table, write a JSON record.

The cookbook's baseline evaluator: run it before you spend GPU time, to know the floor (random),
the ceiling (oracle) and where a model starts.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import random
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from llm_gym.core.registry import EnvEntry, as_env_entry
from llm_gym.core.task import Task
from llm_gym.errors import InvalidArgumentError
from llm_gym.eval.episode_files import episode_record, write_episodes
from llm_gym.eval.files import write_atomic, write_target
from llm_gym.eval.metrics import (
    format_rate,
    is_success,
    mean_pass_at_k,
    success_by_type,
    summarize_episodes,
)
from llm_gym.policies.base import Policy
from llm_gym.policies.registry import policy_from_spec
from llm_gym.policies.template_format import episode_format
from llm_gym.rollout.driver import DEFAULT_FAILED_PARSE_REWARD
from llm_gym.rollout.episode import Episode
from llm_gym.rollout.loop import collect_groups

__all__ = [
    "MAX_EVAL_EPISODES",
    "EvalReport",
    "check_output_path",
    "run_and_report",
    "select_tasks",
    "machine_name",
]

MAX_EVAL_EPISODES = 1_000_000
"""The most episodes (tasks x k) one :func:`run_and_report` plays: every episode of a
collection is scheduled at once, so the count is refused before any is made."""


def machine_name() -> str:
    """A short description of this machine for records: CPU model and core count."""
    import os

    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next(
                (line.split(":", 1)[1].strip() for line in f if line.startswith("model name")),
                model,
            )
    except OSError:
        pass
    return f"{model} x{os.cpu_count()}"


@dataclass
class EvalReport:
    """One evaluation: what ran, how, and the numbers."""

    env_id: str
    """The environment's id (or the factory's name)."""
    env_version: str | None
    """The environment's version."""
    split: str
    """The task split."""
    seed: int
    """Seed of the task selection (and of seeded policies)."""
    k: int
    """Episodes per task, and the k of pass@k."""
    tasks: int
    """Distinct tasks evaluated."""
    policy: dict[str, Any]
    """The policy's own description (name, model, sampling settings); its token budget per
    turn is in ``settings``."""
    settings: dict[str, Any]
    """Rollout settings: max_turns, action format, token budgets. ``max_new_tokens`` is the
    per-turn budget the run used and ``max_new_tokens_source`` where it came from (``"user"``,
    or :meth:`~llm_gym.core.EnvEntry.token_budget`'s ``"registration"``, ``"env"`` or
    ``"default"``)."""
    metrics: dict[str, float]
    """See :func:`~llm_gym.eval.metrics.summarize_episodes`, plus ``pass_at_k``,
    ``episodes_per_second`` and ``tokens_per_second`` (sampled tokens over the wall time)."""
    by_type: dict[str, dict[str, float]] = field(default_factory=dict)
    """Success per kind of task (:func:`~llm_gym.eval.metrics.success_by_type`; empty when the
    tasks name no kind)."""
    date: str = ""
    """When it ran (UTC, ISO 8601)."""
    machine: str = ""
    """Where it ran."""
    wall_time_s: float = 0.0
    """Seconds for the whole collection."""
    episodes: list[Episode] = field(default_factory=list, repr=False)
    """The episodes themselves (not written to JSON)."""

    def to_dict(self) -> dict[str, Any]:
        """The JSON record (without the episodes)."""
        record = asdict(self)
        record.pop("episodes")
        return record

    def save(self, path: str | Path) -> Path:
        """Write the JSON record; returns the path."""
        path = Path(path)
        write_atomic(path, json.dumps(self.to_dict(), indent=2, default=str) + "\n")
        return path

    def budget_text(self) -> str:
        """The per-turn token budget the run used and where it came from, in words."""
        budget = self.settings.get("max_new_tokens")
        source = self.settings.get("max_new_tokens_source")
        if budget is None:
            return "the policy's own"
        whose = {
            "user": "set by the user",
            "registration": f"{self.env_id}'s registration",
            "env": f"{self.env_id}'s own",
            "default": "the default of envs that declare none",
        }.get(source, str(source))
        change = "" if source == "user" else "; --max-new-tokens sets another"
        return f"{budget} tokens ({whose}{change})"

    def format_table(self) -> str:
        """The report as a small two-column table a person reads."""
        m = self.metrics
        rows = [
            ("environment", f"{self.env_id} (version {self.env_version}), split {self.split}"),
            ("policy", self.policy.get("name", "?")),
            ("episodes", f"{int(m['episodes'])} ({self.tasks} tasks x {self.k})"),
            (
                "success rate",
                f"{m['success_rate']:.3f}  95% CI [{m['success_ci_low']:.3f}, "
                f"{m['success_ci_high']:.3f}]",
            ),
            (f"pass@{self.k}", f"{m['pass_at_k']:.3f}"),
            ("mean reward", f"{m['reward_mean']:.3f} (std {m['reward_std']:.3f})"),
            ("terminated / truncated", f"{m['terminated_ratio']:.3f} / {m['truncated_ratio']:.3f}"),
            ("  context overflow", f"{m['context_overflow_ratio']:.3f}"),
            ("  max turns", f"{m['max_turns_ratio']:.3f}"),
            ("  parse failure", f"{m['parse_failure_ratio']:.3f}"),
            ("  env", f"{m['env_ratio']:.3f}"),
            *(
                (f"  {cause} error", f"{m[f'{cause}_ratio']:.3f}")
                for cause in ("template", "tokenizer")
                if m.get(f"{cause}_ratio")
            ),
            ("turns per episode", f"{m['turns_mean']:.2f}"),
            ("tool calls per episode", f"{m['tool_calls_mean']:.2f}"),
            ("tool-error rate", f"{m['tool_error_rate']:.3f}"),
            (
                "tokens per episode",
                f"{m['completion_tokens_mean']:.1f} sampled, {m['prompt_tokens_mean']:.1f} prompt",
            ),
            ("per-turn token budget", self.budget_text()),
            ("episodes per second", format_rate(m["episodes_per_second"])),
            ("sampled tokens per second", format_rate(m.get("tokens_per_second", 0.0))),
        ]
        by_type = [
            (f"  on {kind}", f"{v['success_rate']:.3f} ({int(v['episodes'])} episodes)")
            for kind, v in self.by_type.items()
        ]
        rows[4:4] = by_type  # under the success rate
        if note := self.policy.get("batching_note"):
            rows.append(("batching", str(note)))
        width = max(len(name) for name, _ in rows)
        return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def check_output_path(path: str | Path, name: str = "output") -> Path:
    """``path`` as :meth:`EvalReport.save` will write it, checked before any episode runs (each
    of these failed only once the whole evaluation was done); errors call it ``name``.

    The report is a regular file, written as a new file in the folder of ``path`` (of its target,
    for a link of one's own) and renamed over it (:func:`llm_gym.eval.files.write_atomic`):
    ``path`` must be a new path or a regular file, and its folder must take a new file, which a
    probe file shows (``/dev/full`` passes every permission check and fails each write; a folder
    can refuse new files, a read-only mount for one). A disk that fills during the run can
    still fail the write at the end.

    Raises:
        InvalidArgumentError: ``path`` is a directory or another non-regular file (a device, a
            FIFO), another user's symbolic link, or its folder is a file, not writable or takes
            no new file.
    """
    path = Path(path)
    if path.is_dir():
        raise InvalidArgumentError(
            f"{name} must be a file path, got the directory {str(path)!r}; add a file name "
            f"(e.g. {str(path / 'report.json')!r})."
        )
    try:
        target = write_target(path)
    except OSError as e:
        raise InvalidArgumentError(f"{name} must be a regular file or a new path: {e}.") from None
    folder = target.parent
    while not folder.exists() and folder != folder.parent:  # save() makes the missing ones
        folder = folder.parent
    if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
        raise InvalidArgumentError(
            f"{name} {str(path)!r} cannot be written: {str(folder)!r} is "
            f"{'not a directory' if not folder.is_dir() else 'not writable'}."
        )
    if target.exists() and not os.access(target, os.W_OK):
        raise InvalidArgumentError(f"{name} {str(path)!r} exists and is not writable.")
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".llm_gym-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise InvalidArgumentError(
            f"{name} {str(path)!r} cannot be written: {str(folder)!r} takes no new file "
            f"({e.strerror or e})."
        ) from None
    return path


def select_tasks(tasks: Sequence[Task], count: int | None, seed: int) -> list[Task]:
    """``count`` tasks: all of them in order when ``count`` is None or covers the split, else a
    seeded sample (the same seed always picks the same tasks)."""
    task_list = list(tasks)
    if count is None or count >= len(task_list):
        return task_list
    if count < 1:
        raise InvalidArgumentError(f"Expected at least one task, actual value: {count}.")
    picked = sorted(random.Random(seed).sample(range(len(task_list)), count))
    return [task_list[i] for i in picked]


def run_and_report(
    env: str | EnvEntry | Callable[..., Any],
    policy: Policy | str,
    *,
    tasks: Sequence[Task] | None = None,
    split: str = "val",
    episodes: int | None = None,
    k: int = 1,
    seed: int = 0,
    max_turns: int | None = None,
    max_model_length: int | None = None,
    max_new_tokens: int | None = None,
    action_format: str | None = None,
    failed_parse_reward: float = DEFAULT_FAILED_PARSE_REWARD,
    success_threshold: float = 1.0,
    oracle: Callable[..., Any] | None = None,
    progress: bool = True,
    print_report: bool = True,
    output: str | Path | None = None,
    save_episodes: str | Path | None = None,
) -> EvalReport:
    """Run ``policy`` on an environment and report how it did.

    Args:
        env: A registered id (``"ToolUseGame-v0"``: its tasks, oracle, turn limit and action
            format come from the registry), its :class:`~llm_gym.core.EnvEntry`, or an env
            factory / ``Env`` class (then pass ``tasks``).
        policy: A :class:`Policy`, or a spec for
            :func:`~llm_gym.policies.policy_from_spec`: ``oracle``, ``random``, ``hf:PATH``,
            ``openai:MODEL@URL``.
        tasks: The tasks (default: the registered env's ``split``).
        split: ``"train"``, ``"val"`` or ``"test"``.
        episodes: Total episodes; ``episodes // k`` tasks are picked (seeded). Default: every
            task of the split, ``k`` times.
        k: Episodes per task, and the k of the unbiased pass@k (tasks x k at most
            :data:`MAX_EVAL_EPISODES`).
        seed: Seed of the task selection (and of a ``random`` policy built from a spec).
        max_turns: Assistant turns per episode (default: the registered value, else 8).
        max_model_length: Context budget in tokens (model policies).
        max_new_tokens: Tokens per assistant turn (model policies). Default: the env's own
            budget (:meth:`~llm_gym.core.EnvEntry.token_budget`: what its actions need), which
            every request carries, so a policy's own ``max_new_tokens`` is not used.
        action_format: A registered format name (pinned), or ``"auto"``: the one the policy's
            chat template teaches, else the environment's
            (:func:`~llm_gym.policies.template_format.episode_format`). Default: the
            environment's when it pins one, else ``"auto"``.
        failed_parse_reward: Reward of an episode that ends on an unparseable action.
        success_threshold: An episode succeeds when its reward reaches this (unless its
            metrics carry ``success``).
        oracle: The scripted expert for ``policy="oracle"`` (default: the registered one).
        progress: Show a progress bar.
        print_report: Print the table when done.
        output: Write the JSON record here (checked before the first episode).
        save_episodes: Write every episode here as JSONL, one object per line
            (:mod:`llm_gym.eval.episode_files`: messages, tool specs, reward, truncation cause,
            metrics, token ids and logprobs where a model sampled them, the policy's and the
            environment's versions); checked before the first episode.
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise InvalidArgumentError(f"k must be an int >= 1, actual value: {k!r}.")
    if episodes is not None and (
        isinstance(episodes, bool) or not isinstance(episodes, int) or episodes < 1
    ):
        raise InvalidArgumentError(
            f"episodes must be None (every task) or an int >= 1, actual value: {episodes!r}."
        )
    for path, name in ((output, "output"), (save_episodes, "save_episodes")):
        if path is not None:
            check_output_path(path, name)
    entry = as_env_entry(env)
    all_tasks = list(tasks) if tasks is not None else entry.tasks(split)
    count = None if episodes is None else max(1, episodes // k)
    chosen = select_tasks(all_tasks, count, seed)
    if len(chosen) * k > MAX_EVAL_EPISODES:
        raise InvalidArgumentError(
            f"{len(chosen):,} tasks x k={k:,} is {len(chosen) * k:,} episodes, more than "
            f"{MAX_EVAL_EPISODES:,} (llm_gym.eval.report.MAX_EVAL_EPISODES); lower k or episodes."
        )
    if isinstance(policy, str):
        policy = policy_from_spec(policy, seed=seed)
    budget, source = (
        (max_new_tokens, "user") if max_new_tokens is not None else entry.token_budget()
    )
    settings = {
        "max_turns": entry.max_turns if max_turns is None else max_turns,  # 0 is refused
        "action_format": episode_format(
            action_format or entry.requested_action_format,
            getattr(policy, "tokenizer", None),
            env_format=entry.action_format,
        ).name,
        "max_model_length": max_model_length,
        "max_new_tokens": budget,
        "max_new_tokens_source": source,
        "failed_parse_reward": failed_parse_reward,
        "success_threshold": success_threshold,
    }
    start = time.perf_counter()
    groups = collect_groups(
        entry.env_factory(),
        chosen,
        policy,
        episodes_per_task=k,
        max_turns=settings["max_turns"],
        max_model_length=max_model_length,
        max_new_tokens=budget,
        action_format=settings["action_format"],
        failed_parse_reward=failed_parse_reward,
        oracle=oracle or entry.oracle(),
        progress=f"{entry.id} · {policy.name}" if progress else False,
    )
    wall = time.perf_counter() - start
    flat = [episode for group in groups for episode in group]
    described = dict(policy.describe())
    described.pop("max_new_tokens", None)  # one budget in the record: the one used (settings)
    metrics = summarize_episodes(flat, success_threshold)
    metrics["pass_at_k"] = mean_pass_at_k(
        [(len(g), sum(is_success(e, success_threshold) for e in g)) for g in groups], k
    )
    metrics["episodes_per_second"] = len(flat) / wall if wall > 0 else float("inf")
    sampled = sum(episode.completion_tokens for episode in flat)
    metrics["tokens_per_second"] = (
        sampled / wall if wall > 0 else (float("inf") if sampled else 0.0)
    )
    report = EvalReport(
        env_id=entry.id,
        env_version=entry.version,
        split=split,
        seed=seed,
        k=k,
        tasks=len(chosen),
        policy=described,
        settings=settings,
        metrics=metrics,
        by_type=success_by_type(flat, success_threshold),
        date=_dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        machine=machine_name(),
        wall_time_s=wall,
        episodes=flat,
    )
    if print_report:
        print(report.format_table())
    if output is not None:
        report.save(output)
    if save_episodes is not None:
        provenance = {"env_id": entry.id, "env_version": entry.version, "policy": described}
        write_episodes(save_episodes, (episode_record(e, **provenance) for e in flat))
    return report
