"""The leaderboard: every policy on every environment, on a fixed split and seed.

One record per (environment, policy) goes into ``leaderboard.json``; ``leaderboard.md`` (envs as
rows, policies as columns) and ``leaderboard.png`` are drawn from those records. They go to
``./leaderboard/`` unless ``--out-dir`` names another folder.

    llm-gym leaderboard                      # all envs x random,oracle,tiny-sft,tiny-grpo
    llm-gym leaderboard --policies hf:path/to/model --envs Math-v0,SQL-v0
    llm-gym leaderboard --policies openai:MODEL@http://localhost:8000/v1 --out-dir results

Incremental: a record is keyed by (env, policy, split, k, episodes, seed, turn limit, sampling
settings); a rerun skips keys that have a record, so a new policy or env only adds its own runs,
and an interrupted run (Ctrl-C) resumes where it stopped (each record is written at once,
atomically). A record made under another env version, or with other model files (weights,
config, tokenizer, chat template), is marked stale in the table and rerun only with
``--refresh-stale`` (or ``--force``: rerun them all).
A policy is any spec of ``policy_from_spec``; ``tiny-sft`` and ``tiny-grpo`` are the main job's
models in ``outputs/tool_use_game_tiny/`` (relative to the current folder: run from the
repository). The table shows the records of this invocation's split, k, episodes, seed and turn
limits. ``python -m benchmarks.leaderboard`` is the same, writing to ``benchmarks/results/``.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from llm_gym.eval.leaderboard_run import DEFAULT_OUT_DIR, DEFAULT_POLICIES, Args, main

__all__ = ["add_arguments", "args_from_namespace", "cli", "run_cli"]


def add_arguments(parser: argparse.ArgumentParser, *, out_dir: Path = DEFAULT_OUT_DIR) -> None:
    """The options of :class:`~llm_gym.eval.leaderboard_run.Args` (``llm-gym leaderboard``,
    ``python -m benchmarks.leaderboard``); ``out_dir`` is the default of ``--out-dir``."""
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
    parser.set_defaults(out_dir=out_dir)


def args_from_namespace(ns: argparse.Namespace) -> Args:
    """The :class:`~llm_gym.eval.leaderboard_run.Args` of parsed options (comma-separated lists
    split)."""
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


def cli(argv: Sequence[str] | None = None, *, out_dir: Path = DEFAULT_OUT_DIR) -> int:
    """Parse ``argv`` (default: the command line), run, print a summary; the exit code."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_arguments(parser, out_dir=out_dir)
    return run_cli(args_from_namespace(parser.parse_args(argv)))
