"""What every benchmark shares: conditions, interleaved repeats, intervals and result files.

The harness, in the order a benchmark uses it:

1. :func:`pin_threads` sets torch's threads (and ``OMP_NUM_THREADS``/``MKL_NUM_THREADS`` for child
   processes) before anything is timed; :meth:`Conditions.start` records them with the machine,
   the load average, the git commit and the time, and :meth:`Conditions.finish` the load after.
2. :func:`interleave` runs the contenders A/B/A/B...: every repeat runs each contender once, in
   an order that rotates from repeat to repeat (or is shuffled with a seed), so a drift in the
   machine's load falls on every contender alike; it keeps every repeat's measurement.
3. :func:`median_interval` gives each contender's median with a distribution-free 95% interval
   (order statistics); :func:`ratio_interval` the ratio of two contenders' medians with a paired
   bootstrap interval.
4. :func:`write_markdown` and :func:`write_json` write ``name.md`` and ``name.json`` side by side;
   the JSON carries the conditions.

The ``--quick`` convention (:func:`add_harness_arguments`): tiny sizes, the same code paths, and
nothing written unless ``--out-dir`` is given, so a smoke run never overwrites ``results/``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# The statistics live in benchmarks.stats; re-exported so a benchmark imports one harness.
from benchmarks import procstat
from benchmarks.procstat import cpu_shares, cpu_times, machine_description
from benchmarks.stats import Estimate, mean_interval, median_interval, ratio_interval  # noqa: F401

RESULTS_DIR = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parents[1]
CONFIDENCE = 0.95
"""The coverage every interval the harness reports aims at."""
MIN_REPEATS = 5
"""Fewest interleaved repeats a full (not ``--quick``) measurement may use."""
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def write_markdown(name: str, text: str, out_dir: Path = RESULTS_DIR) -> Path:
    """Write ``text`` to ``out_dir/name.md`` and return the path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.md"
    path.write_text(text)
    return path


def write_json(name: str, payload: Mapping[str, Any], out_dir: Path = RESULTS_DIR) -> Path:
    """Write ``payload`` to ``out_dir/name.json`` (beside ``name.md``) and return the path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2, default=_jsonable) + "\n")
    return path


def _jsonable(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "as_json"):
        return value.as_json()
    if hasattr(value, "__dataclass_fields__"):
        return asdict(value)
    raise TypeError(f"Cannot write {type(value).__name__} to JSON: {value!r}")


def cache_dir() -> Path:
    """Where the main job and the benchmarks cache models (``LLM_GYM_CACHE``)."""
    return Path(os.environ.get("LLM_GYM_CACHE", Path.home() / ".cache/llm_gym"))


def main_job_model(stage: str = "sft") -> str | None:
    """A model the main job wrote (``stage``: ``sft``, or ``sft_short_context``, its first SFT
    phase), from ``outputs/`` or the cache; None when there is none."""
    places = (Path("outputs/tool_use_game_tiny") / stage, cache_dir() / "main-job" / stage)
    return next((str(p) for p in places if (p / "config.json").exists()), None)


def default_model(stage: str = "sft") -> str:
    """:func:`main_job_model`, or exit with a clear message when there is none."""
    found = main_job_model(stage)
    if found is None:
        raise SystemExit(
            f"No {stage} model: run the main job (README, set-up command 1) or pass its path "
            f"(e.g. outputs/tool_use_game_tiny/{stage})."
        )
    return found


def sampled_success(
    model: Any,
    tokenizer: Any,
    *,
    tasks: int,
    samples: int,
    max_turns: int,
    max_model_length: int,
    max_tokens_per_turn: int,
    split: str = "test",
    seed: int = 1234,
    temperature: float = 1.0,
) -> tuple[float, tuple[float, float]]:
    """Held-out success on ToolUseGame: ``samples`` episodes at ``temperature`` (1: sampled, 0:
    greedy) for each of the first ``tasks`` tasks of ``split``; the mean of the per-task rates
    and its 95% interval over tasks."""
    from llm_gym.envs.tool_use_game import ToolUseGameEnv, get_tasks
    from llm_gym.policies import HFPolicy
    from llm_gym.rollout import collect_groups

    policy = HFPolicy(
        model, tokenizer, temperature=temperature, max_new_tokens=max_tokens_per_turn, seed=seed
    )
    groups = collect_groups(
        ToolUseGameEnv,
        list(get_tasks(split))[:tasks],
        policy,
        episodes_per_task=samples,
        max_turns=max_turns,
        max_model_length=max_model_length,
        max_new_tokens=max_tokens_per_turn,
    )
    return mean_interval(
        [statistics.fmean(float(e.reward >= 1.0) for e in group) for group in groups]
    )


# --- conditions ----------------------------------------------------------------------------------


def pin_threads(threads: int | None) -> dict[str, Any]:
    """Pin torch's intra-op threads to ``threads`` (None: leave torch's default) and return the
    thread settings in effect (:func:`thread_settings`).

    ``OMP_NUM_THREADS`` and ``MKL_NUM_THREADS`` are set too: torch has read them already, so
    they matter for child processes (a benchmark that times another checkout); in this process
    ``torch.set_num_threads`` sets OpenMP's and MKL's pools itself. Inter-op threads are pinned
    to 1 when torch still allows it (it refuses once inter-op work has run); either way the value
    in effect is recorded.
    """
    if threads is not None:
        if threads < 1:
            raise ValueError(f"threads must be >= 1 (or None for torch's default), got {threads}.")
        for name in THREAD_VARIABLES:
            os.environ[name] = str(threads)
        try:
            import torch
        except ImportError:
            return thread_settings(pinned=True)
        torch.set_num_threads(threads)
        with contextlib.suppress(RuntimeError):  # already started: recorded as it is
            torch.set_num_interop_threads(1)
    return thread_settings(pinned=threads is not None)


def thread_settings(pinned: bool = False) -> dict[str, Any]:
    """torch's intra- and inter-op threads and the thread variables, as they are now."""
    settings: dict[str, Any] = {"pinned": pinned}
    try:
        import torch

        settings["torch_threads"] = torch.get_num_threads()
        settings["torch_interop_threads"] = torch.get_num_interop_threads()
    except ImportError:
        settings["torch_threads"] = settings["torch_interop_threads"] = None
    for name in THREAD_VARIABLES:
        settings[name] = os.environ.get(name)
    return settings


_GIT_STATUS = ("git", "status", "--porcelain", "--untracked-files=no")


def git_state(root: Path = ROOT) -> tuple[str | None, bool | None]:
    """The checkout's commit and whether tracked files differ from it (None when no git); the
    benchmarks' own results (``benchmarks/results``) do not count."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10
        )
        status = subprocess.run(
            [*_GIT_STATUS, "--", ".", ":(exclude)benchmarks/results"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None, None
    if commit.returncode != 0:
        return None, None
    return commit.stdout.strip(), bool(status.stdout.strip()) if status.returncode == 0 else None


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@dataclass
class Conditions:
    """What a measurement ran under, recorded beside its numbers (:meth:`start`, :meth:`finish`)."""

    benchmark: str
    """The benchmark's name (its results files are ``name.md`` and ``name.json``)."""
    command: str
    """The command line that reproduces the run."""
    machine: str
    """CPU model, cores and Python version (:func:`machine_description`)."""
    torch: str | None
    """torch's version (None without torch)."""
    threads: dict[str, Any]
    """:func:`thread_settings` when the measurement started."""
    load_before: list[float]
    """1-, 5- and 15-minute load averages at the start."""
    git_commit: str | None
    """The checkout's commit (None outside git)."""
    git_dirty: bool | None
    """Tracked files differed from that commit."""
    started: str
    """UTC start time (ISO 8601)."""
    quick: bool = False
    """A ``--quick`` smoke run (its numbers are not results)."""
    settings: dict[str, Any] = field(default_factory=dict)
    """The benchmark's own arguments."""
    load_after: list[float] | None = None
    """Load averages at the end (:meth:`finish`)."""
    threads_after: dict[str, Any] | None = None
    """:func:`thread_settings` at the end (a contender that changed them shows here)."""
    finished: str | None = None
    """UTC end time."""
    wall_s: float | None = None
    """Seconds from :meth:`start` to :meth:`finish`."""
    cpu_share: dict[str, float] | None = None
    """How the machine's CPU time from start to finish was spent (busy, idle, steal:
    :func:`benchmarks.procstat.cpu_shares`); None without ``/proc``."""
    cpu_flags: list[str] | None = None
    """The CPU's flags among :data:`benchmarks.procstat.CPU_FLAGS`; None when unknown."""
    _clock: float = field(default=0.0, repr=False)
    _cpu: list[int] | None = field(default=None, repr=False)

    @classmethod
    def start(
        cls,
        benchmark: str,
        *,
        threads: Mapping[str, Any] | None = None,
        settings: Mapping[str, Any] | None = None,
        quick: bool = False,
        command: str | None = None,
    ) -> Conditions:
        """Record the conditions now; ``threads`` is what :func:`pin_threads` returned (None:
        the settings as they are, not pinned)."""
        try:
            import torch

            torch_version: str | None = torch.__version__
        except ImportError:
            torch_version = None
        commit, dirty = git_state()
        if command is None:
            command = " ".join(["python -m", f"benchmarks.{benchmark}", *sys.argv[1:]])
        return cls(
            benchmark=benchmark,
            command=command,
            machine=machine_description(),
            cpu_flags=procstat.cpu_flags(),
            torch=torch_version,
            threads=dict(threads) if threads is not None else thread_settings(),
            load_before=list(os.getloadavg()),
            git_commit=commit,
            git_dirty=dirty,
            started=_now(),
            quick=quick,
            settings={k: v for k, v in (settings or {}).items() if not k.startswith("_")},
            _clock=time.perf_counter(),
            _cpu=cpu_times(),
        )

    def finish(self) -> Conditions:
        """Record the load average and the time at the end; returns ``self``."""
        self.load_after = list(os.getloadavg())
        self.threads_after = thread_settings(pinned=bool(self.threads.get("pinned")))
        self.finished = _now()
        self.wall_s = time.perf_counter() - self._clock
        self.cpu_share = cpu_shares(self._cpu, cpu_times())
        return self

    def describe(self) -> str:
        """One markdown paragraph: machine and CPU flags, threads, load, commit, time."""
        threads = self.threads
        n = threads.get("torch_threads")
        pin = "pinned" if threads.get("pinned") else "torch's default, not pinned"
        after = f"{self.load_after[0]:.1f}" if self.load_after else "?"
        if self.threads_after and self.threads_after.get("torch_threads") != n:
            pin += f"; {self.threads_after.get('torch_threads')} at the end"
        commit = (self.git_commit or "unknown")[:12]
        commit += " (uncommitted changes)" if self.git_dirty else ""
        share, cpu = self.cpu_share, ""
        if share:
            cpu = (f" The machine's CPU time over the run: {share['busy']:.0%} busy, "
                   f"{share['steal']:.1%} stolen by the hypervisor.")  # fmt: skip
        flags = "" if self.cpu_flags is None else f" ({procstat.describe_flags(self.cpu_flags)})"
        return (
            f"Machine: {self.machine}{flags}, torch {self.torch} ({n} intra-op thread"
            f"{'s' if n != 1 else ''}, {pin}; inter-op {threads.get('torch_interop_threads')}). "
            f"1-minute load average {self.load_before[0]:.1f} at the start, {after} at the end."
            f"{cpu} "
            f"Commit {commit}, started {self.started}"
            + (f", {self.wall_s / 60:.1f} min in all" if self.wall_s is not None else "")
            + (". A `--quick` smoke run: not a result." if self.quick else ".")
            + f" Reproduce: `{self.command}`."
        )

    def as_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if not k.startswith("_")}


def add_harness_arguments(
    parser: argparse.ArgumentParser, *, repeats: int = 7, threads: int | None = 1
) -> None:
    """The options every benchmark shares: ``--quick``, ``--repeats``, ``--order``, ``--seed``,
    ``--threads``, ``--out-dir`` and ``--no-write``."""
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: tiny sizes, few repeats, nothing written unless --out-dir is given",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=None,
        help=f"interleaved repeats of every contender (default {repeats}; at least "
        f"{MIN_REPEATS} unless --quick)",
    )
    parser.add_argument("--order", choices=ORDERS, default="rotate", help="contender order")
    parser.add_argument("--seed", type=int, default=0, help="seed of --order shuffle and samples")
    parser.add_argument(
        "--threads",
        type=int,
        default=threads,
        help=f"torch intra-op threads, pinned and recorded (default {threads})",
    )
    parser.add_argument("--out-dir", type=Path, default=None, help="where the results go")
    parser.add_argument("--no-write", dest="write", action="store_false", help="write nothing")


def output_dir(quick: bool, out_dir: Path | None, write: bool) -> Path | None:
    """Where results are written (None: nowhere): ``out_dir``, else ``results/`` for a full
    run; a ``--quick`` run writes only where ``--out-dir`` says."""
    if not write or (quick and out_dir is None):
        return None
    return out_dir or RESULTS_DIR


def check_repeats(repeats: int, quick: bool) -> None:
    """A full measurement runs at least :data:`MIN_REPEATS` repeats; a quick one at least 1."""
    least = 1 if quick else MIN_REPEATS
    if repeats < least:
        raise ValueError(
            f"Expected at least {least} repeats{'' if quick else ' (or --quick)'}, got {repeats}."
        )


# --- interleaved repeats -------------------------------------------------------------------------

ORDERS = ("rotate", "shuffle")
"""``rotate``: repeat r runs the contenders rotated by r (A B, B A, A B, ...: each contender
takes each place equally often); ``shuffle``: a seeded random order per repeat."""

Measurement = Mapping[str, Any]
"""One contender's numbers from one repeat (``wall_s`` and the counts its rates divide)."""


@dataclass
class Interleaved:
    """Every repeat's measurement of every contender, and the order they ran in."""

    runs: dict[str, list[dict[str, Any]]]
    """``runs[name][r]``: contender ``name``'s measurement in repeat ``r``."""
    order: list[list[str]]
    """``order[r]``: the contenders in the order repeat ``r`` ran them."""

    def rates(self, name: str, count: str, time: str = "wall_s") -> list[float]:
        """``count / time`` of contender ``name``, one value per repeat."""
        return [run[count] / run[time] for run in self.runs[name]]


def run_order(names: Sequence[str], repeats: int, order: str = "rotate", seed: int = 0):
    """The order of the contenders in each repeat.

    Example:
        >>> run_order(["A", "B"], 4)
        [['A', 'B'], ['B', 'A'], ['A', 'B'], ['B', 'A']]
        >>> run_order(["A", "B", "C"], 3)
        [['A', 'B', 'C'], ['B', 'C', 'A'], ['C', 'A', 'B']]
    """
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}, got {order!r}.")
    names = list(names)
    if order == "rotate":
        return [names[r % len(names) :] + names[: r % len(names)] for r in range(repeats)]
    rng = random.Random(seed)
    return [rng.sample(names, len(names)) for _ in range(repeats)]


def interleave(
    contenders: Mapping[str, Callable[[int], Measurement]],
    repeats: int,
    *,
    order: str = "rotate",
    seed: int = 0,
    warmup: Sequence[str] = (),
    log: Callable[[str], None] | None = None,
) -> Interleaved:
    """Run every contender once per repeat, interleaved (see :func:`run_order`).

    Args:
        contenders: ``name -> run(repeat)``; a run returns its measurement (a mapping).
        repeats: Repeats (each runs every contender once).
        order: ``"rotate"`` or ``"shuffle"``.
        seed: Seeds the shuffle.
        warmup: Contenders run once (``repeat=-1``) before the repeats, unrecorded.
        log: Called with a line after each run (progress).
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}.")
    unknown = set(warmup) - set(contenders)
    if unknown:
        raise ValueError(f"warmup names unknown contenders {sorted(unknown)}: {list(contenders)}")
    for name in warmup:
        contenders[name](-1)
    plan = run_order(list(contenders), repeats, order, seed)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in contenders}
    for repeat, names in enumerate(plan):
        for name in names:
            measurement = dict(contenders[name](repeat))
            runs[name].append(measurement)
            if log is not None:
                wall = measurement.get("wall_s")
                log(f"repeat {repeat + 1}/{repeats} {name}: " + (f"{wall:.3f} s" if wall else ""))
    return Interleaved(runs=runs, order=plan)
