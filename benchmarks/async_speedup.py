"""Async training against lockstep, side by side in one run: optimizer steps per hour.

ToolUseGame-v0 with the main job's SFT model (tool-calling: ``outputs/tool_use_game_tiny/sft``, or
the cache the benchmark builds it into). Contenders, interleaved round by round:

- ``lockstep`` with generation on every torch thread, and ``lockstep-1t`` with generation on one
  (small decode steps often run faster on one core); the faster of the two is the baseline;
- ``async`` in each weight-sync mode (``SYNCHRONOUS``, ``BACKGROUND_PUBLISH``, ``PIPELINE``) with
  ``max_steps_off_policy=2`` and ``groups_in_flight`` = 3 x ``batch_size`` (the fastest setting
  of a tuning run before this one), and ``PIPELINE`` with the seeds' ``max_steps_off_policy=1``,
  2 x ``batch_size`` in flight (where the dropped-groups target is measured).

Each at 0 s, 0.1 s and 1 s of simulated latency per tool call (``ToolUseGameEnv(tool_latency_s=)``,
awaited: episodes wait concurrently). Every run trains the same model from the same weights for
the same number of steps (same tasks, budgets, rewards, threads); the first two steps are a
warm-up (async workers fill their pipeline meanwhile) and are not timed. Reported per contender
and latency, medians over rounds with their order-statistic interval (min-max at 5 rounds, coverage
94%), the speed-up as the best async contender's median over the faster lockstep's with a paired
bootstrap 95% interval over rounds:
optimizer steps per hour; trainer utilisation (1 - the share of a step spent waiting for
rollouts); generator utilisation (async: 1 - engine idle time / wall time; lockstep: collection
time / step time); staleness; dropped groups; and held-out sampled success after training (test
split, 8 episodes per task at temperature 1, 95% interval over tasks).

    python -m benchmarks.async_speedup --model outputs/tool_use_game_tiny/sft
    python -m benchmarks.async_speedup --quick        # a smoke run (seconds; writes nothing)
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.async_report import plot, render
from benchmarks.common import (
    RESULTS_DIR,
    Conditions,
    check_repeats,
    default_model,
    machine_description,
    sampled_success,
    thread_settings,
    write_markdown,
)
from benchmarks.stats import median_interval, ratio_interval

MODES = ("SYNCHRONOUS", "BACKGROUND_PUBLISH", "PIPELINE")


@dataclass
class Args:
    model: str | None = None
    """The SFT model (None: the main job's, from outputs/ or the benchmark cache)."""
    latencies: tuple[float, ...] = (0.0, 0.1, 1.0)
    """Simulated seconds per tool call."""
    rounds: int = 5
    """Interleaved rounds (at least 5 unless --quick)."""
    """Interleaved rounds (each runs every contender at every latency)."""
    steps: int = 8
    """Optimizer steps per run (the first two are a warm-up)."""
    batch_size: int = 8
    episodes_per_task: int = 8
    max_turns: int = 6
    max_tokens_per_turn: int = 64
    max_model_length: int = 1024
    learning_rate: float = 2e-4
    eval_tasks: int = 50
    """Test tasks of the held-out evaluation (8 sampled episodes each)."""
    eval_samples: int = 8
    out_dir: Path = RESULTS_DIR
    write: bool = True


@dataclass
class Run:
    contender: str
    latency: float
    round: int
    step_seconds: list[float] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    success: float = float("nan")
    success_interval: tuple[float, float] = (float("nan"), float("nan"))


def contender_config(name: str, args: Args) -> dict[str, Any]:
    """``lockstep``, ``lockstep-1t``, ``async-MODE`` (max_steps_off_policy=2, 3 x batch_size
    groups in flight: the setting that ran fastest in a tuning run before this benchmark) and
    ``async-MODE-off1`` (max_steps_off_policy=1, 2 x batch_size: the seeds' setting, where the
    dropped-groups target is measured)."""
    if name == "lockstep":
        return {}
    if name == "lockstep-1t":
        return {"generator_threads": 1}
    mode = name.removeprefix("async-")
    off = 2
    if mode.endswith("-off1"):
        mode, off = mode.removesuffix("-off1"), 1
    return {
        "max_steps_off_policy": off,
        "groups_in_flight": (off + 1) * args.batch_size,
        "weight_sync_type": f"WEIGHT_SYNC_TYPE_{mode}",
    }


def train_one(model: str, name: str, latency: float, args: Args, out: Path) -> tuple[Any, Run]:
    import torch
    from transformers import TrainerCallback

    from llm_gym.envs.tool_use_game import ToolUseGameEnv, get_tasks
    from trainers import GRPOConfig
    from trainers.grpo.trainer import MultiTurnGRPOTrainer

    run = Run(contender=name, latency=latency, round=0)
    stamps: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, a: Any, state: Any, control: Any, **kwargs: Any) -> None:
            stamps.append(time.perf_counter())

    torch.manual_seed(0)
    config = GRPOConfig(
        output_dir=str(out),
        model=model,
        batch_size=args.batch_size,
        episodes_per_task=args.episodes_per_task,
        num_steps=args.steps,
        max_turns=args.max_turns,
        max_model_length=args.max_model_length,
        max_tokens_per_turn=args.max_tokens_per_turn,
        learning_rate=args.learning_rate,
        loss_type="dapo",
        beta=0.0,
        scale_rewards="none",
        use_cpu=True,
        save_strategy="no",
        report_to="none",
        logging_steps=1,
        disable_tqdm=True,
        seed=0,
        **contender_config(name, args),
    )
    trainer = MultiTurnGRPOTrainer(
        args=config,
        env_factory=lambda task: ToolUseGameEnv(tool_latency_s=latency),
        tasks=list(get_tasks("train")),
        callbacks=[Clock()],
    )
    trainer.train()
    run.step_seconds = [b - a for a, b in itertools.pairwise(stamps)][1:]  # 2 warm-up steps
    logs = [r for r in trainer.state.log_history if "loss" in r][2:]  # the warm-up steps out
    for key in (
        "timing/rollout_seconds",
        "timing/train_seconds",
        "async/train_wait_s",
        "async/generator_idle_s",
        "async/staleness_mean",
        "async/staleness_max",
        "async/dropped_stale_groups",
        "async/weight_sync_s",
        "episodes/success_rate",
    ):
        values = [r[key] for r in logs if key in r]
        if values:
            run.metrics[key] = statistics.fmean(values)
    dropped = sum(r.get("async/dropped_stale_groups", 0.0) for r in logs)
    run.metrics["dropped_ratio"] = dropped / max(1.0, dropped + len(logs) * args.batch_size)
    return trainer, run


def evaluate(trainer: Any, args: Args) -> tuple[float, tuple[float, float]]:
    """Sampled success on test tasks: per-task rates, their mean and a 95% interval over tasks."""
    model = trainer.accelerator.unwrap_model(trainer.model).eval()
    return sampled_success(
        model, trainer.processing_class, tasks=args.eval_tasks, samples=args.eval_samples,
        max_turns=args.max_turns, max_model_length=args.max_model_length,
        max_tokens_per_turn=args.max_tokens_per_turn,
    )  # fmt: skip


def utilisation(run: Run) -> tuple[float, float]:
    """(trainer, generator) busy shares of a step."""
    step = statistics.median(run.step_seconds) if run.step_seconds else float("nan")
    if run.contender.startswith("async"):
        wait = run.metrics.get("async/train_wait_s", 0.0)
        idle = run.metrics.get("async/generator_idle_s", 0.0)
        return 1 - wait / step, max(0.0, 1 - idle / step)
    rollout = run.metrics.get("timing/rollout_seconds", 0.0)
    return 1 - rollout / step, rollout / step


def steps_per_hour(runs: list[Run]) -> list[float]:
    """Optimizer steps per hour of each run (from its median step), in round order; the rounds
    pair one contender's runs with another's."""
    ordered = sorted((r for r in runs if r.step_seconds), key=lambda r: r.round)
    return [3600 / statistics.median(r.step_seconds) for r in ordered]


def summarise(runs: list[Run], args: Args) -> dict[str, Any]:
    entries = []
    keys = sorted({(r.contender, r.latency) for r in runs}, key=lambda k: (k[1], k[0]))
    for contender, latency in keys:
        mine = [r for r in runs if r.contender == contender and r.latency == latency]
        per_round = steps_per_hour(mine)
        rate = median_interval(per_round)
        trainer_u, generator_u = zip(*(utilisation(r) for r in mine), strict=True)
        entries.append(
            {
                "contender": contender,
                "latency_s": latency,
                "steps_per_hour": rate.median,
                "steps_per_hour_ci": [rate.low, rate.high],
                "steps_per_hour_per_round": per_round,
                "trainer_utilisation": statistics.median(trainer_u),
                "generator_utilisation": statistics.median(generator_u),
                "staleness_mean": statistics.median(
                    r.metrics.get("async/staleness_mean", 0.0) for r in mine
                ),
                "staleness_max": max(r.metrics.get("async/staleness_max", 0.0) for r in mine),
                "dropped_stale_ratio": statistics.median(r.metrics["dropped_ratio"] for r in mine),
                "success": mine[0].success,  # evaluated in the first round
                "success_interval": list(mine[0].success_interval),
                "rounds": len(mine),
            }
        )

    def best(prefix: str, latency: float) -> dict[str, Any]:
        pool = [
            e for e in entries if e["contender"].startswith(prefix) and e["latency_s"] == latency
        ]
        return max(pool, key=lambda e: e["steps_per_hour"])

    speedups = {}
    for latency in args.latencies:
        fast, lock = best("async", latency), best("lockstep", latency)
        speedups[str(latency)] = {
            **ratio_interval(
                fast["steps_per_hour_per_round"], lock["steps_per_hour_per_round"]
            ).as_json(),
            "async": fast["contender"],
            "lockstep": lock["contender"],
        }
    top = max(args.latencies)
    return {
        "speedup_with_latency": speedups[str(top)],
        "speedup_without_latency": speedups[str(min(args.latencies))],
        "speedup_by_latency": speedups,
        "latency_with_s": top,
        "entries": entries,
    }


def main(args: Args) -> dict[str, Any]:
    import tempfile

    model = args.model or default_model()
    contenders = [
        "lockstep",
        "lockstep-1t",
        *(f"async-{m}" for m in MODES),
        "async-PIPELINE-off1",
    ]
    runs: list[Run] = []
    start = time.perf_counter()
    conditions = Conditions.start(
        "async_speedup",
        threads=thread_settings(),
        settings={k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(args).items()},
        quick=args.rounds == 1,
    )
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):
            for latency in args.latencies:
                order = contenders if round_ % 2 == 0 else contenders[::-1]
                for name in order:
                    trainer, run = train_one(model, name, latency, args, Path(tmp) / name)
                    run.round = round_
                    if round_ == 0:
                        run.success, run.success_interval = evaluate(trainer, args)
                    del trainer
                    step = statistics.median(run.step_seconds)
                    print(
                        f"round {round_} latency {latency:g}s {name:26s} {step:6.2f} s/step "
                        f"success {run.success:.3f}",
                        flush=True,
                    )
                    runs.append(run)
    seconds = time.perf_counter() - start
    conditions.finish()
    summary = summarise(runs, args)
    summary.update(
        conditions=conditions.as_json(),
        machine=machine_description(),
        model=model,
        settings={k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(args).items()},
        runs=[asdict(r) for r in runs],
        seconds=seconds,
        threads=__import__("torch").get_num_threads(),
    )
    if args.write:
        args.out_dir.mkdir(parents=True, exist_ok=True)
        write_markdown("async", render(summary, args, model, seconds), args.out_dir)
        (args.out_dir / "async.json").write_text(json.dumps(summary, indent=2) + "\n")
        plot(summary, args.out_dir / "async.png")
    for latency, ratio in summary["speedup_by_latency"].items():
        low, high = ratio["ci"]
        print(
            f"speedup at {latency} s per tool call: {ratio['median']:.2f}x [{low:.2f}, {high:.2f}]"
        )
    return summary


def parse(argv: list[str] | None = None) -> Args:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default=None)
    parser.add_argument(
        "--rounds", type=int, default=Args.rounds,
        help=f"interleaved rounds (default {Args.rounds}; at least 5 unless --quick)",
    )  # fmt: skip
    parser.add_argument("--steps", type=int, default=Args.steps)
    parser.add_argument("--latencies", type=float, nargs="+", default=list(Args.latencies))
    parser.add_argument("--eval-tasks", type=int, default=Args.eval_tasks)
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run: tiny sizes, one round, no files"
    )
    ns = parser.parse_args(argv)
    args = Args(
        model=ns.model,
        rounds=ns.rounds,
        steps=ns.steps,
        latencies=tuple(ns.latencies),
        eval_tasks=ns.eval_tasks,
        out_dir=ns.out_dir,
        write=not ns.no_write,
    )
    if not ns.quick:
        check_repeats(args.rounds, quick=False)
    if ns.quick:
        args.rounds, args.steps, args.batch_size, args.episodes_per_task = 1, 3, 2, 2
        args.latencies, args.eval_tasks, args.eval_samples, args.write = (0.0, 0.05), 4, 2, False
        args.max_tokens_per_turn = 16
    return args


if __name__ == "__main__":
    main(parse())
