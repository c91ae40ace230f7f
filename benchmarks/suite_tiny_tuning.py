"""Choosing the suite's GRPO settings on val: GRPO runs from one SFT model, compared on the
mean validation success over the environments, built run by run.

Each invocation runs ``configs/suite_tiny.yaml``'s GRPO phase alone (no SFT: the given start
model; no test evaluation) with the given overrides, validating every environment on its val
split (``val_tasks``, ``grpo.validation_interval``), and merges the run into
``results/suite_tiny_tuning.json``: the settings, the start model's file hash, the validation
curve (success per environment and their mean where every environment validated), the best
point, the wall time and the conditions. A run already recorded for the same settings and start
model is skipped. ``suite_tiny_tuning.md`` is rendered from the JSON alone.

    python -m benchmarks.suite_tiny_tuning --start outputs/suite_tiny/sft \\
        --set grpo.learning_rate=2e-5
    python -m benchmarks.suite_tiny_tuning --render      # the table again

The SFT model is the suite run's (``python -m benchmarks.suite_tiny`` writes
``outputs/suite_tiny/sft``; its SFT is deterministic at a fixed seed). Nothing here reads the
test split: the settings chosen here are then run by ``benchmarks.suite_tiny``, which reports
test.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS_DIR, ROOT, Conditions, pin_threads, write_markdown

NAME = "suite_tiny_tuning"
CONFIG = ROOT / "configs" / "suite_tiny.yaml"


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """``KEY=VALUE`` pairs as a mapping, each value parsed as ``train.py --set`` parses it
    (:func:`trainers.pipeline.config.yaml_load`: ``2e-5`` is a float).

    Example:
        >>> parse_overrides(["grpo.learning_rate=2e-5", "grpo.batch_size=16"])
        {'grpo.learning_rate': 2e-05, 'grpo.batch_size': 16}
    """
    from trainers.pipeline.config import yaml_load

    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"--set takes KEY=VALUE (grpo.learning_rate=2e-5), actual: {pair!r}")
        out[key] = yaml_load(value)
    return out


def run_key(overrides: dict[str, Any], start_hash: str) -> str:
    """The record's key: the start model's hash and the sorted overrides.

    Example:
        >>> run_key({"grpo.learning_rate": 2e-05, "grpo.batch_size": 16}, "abc")
        'abc grpo.batch_size=16 grpo.learning_rate=2e-05'
    """
    return " ".join([start_hash, *(f"{k}={overrides[k]}" for k in sorted(overrides))])


def curve(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The run's validation points: step, success by environment, and the mean (None where an
    environment did not validate at that step)."""
    from benchmarks.suite_tiny import validation_points

    envs = list(summary["envs"])
    points = validation_points(summary.get("validation_history", []), envs)
    return [{"step": s, "success": values, "mean": mean} for s, values, mean in points]


def run(start: Path, overrides: dict[str, Any], threads: dict[str, Any]) -> dict[str, Any]:
    """GRPO from ``start`` with ``overrides`` over the suite config, validated, not tested."""
    from trainers.pipeline.run import load_config, run_pipeline

    conditions = Conditions.start(NAME, threads=threads, settings=overrides)
    out = ROOT / "outputs" / f"{NAME}_{int(time.time())}"
    config = load_config(
        CONFIG,
        {**overrides, "model": str(start), "sft": None, "evaluation": None,
         "output_dir": str(out)},
    )  # fmt: skip
    summary = run_pipeline(config)
    conditions.finish()
    return {
        "overrides": overrides,
        "curve": curve(summary),
        "best_point": summary.get("best_point"),
        "grpo_seconds": summary["grpo_seconds"],
        "conditions": conditions.as_json(),
    }


def render(results: dict[str, Any]) -> str:
    """``suite_tiny_tuning.md`` from the JSON."""
    lines = [
        "# The suite's GRPO settings, chosen on val",
        "",
        "GRPO runs of `configs/suite_tiny.yaml` from the same SFT model (its file hash below), "
        "each with the overrides shown, validated on every environment's val split (greedy, "
        "`val_tasks` tasks each); the mean over the environments at each point where all "
        "validated. The config takes the settings whose best point is highest; the test split "
        "is read only by `benchmarks.suite_tiny`'s run of that config.",
        "",
    ]
    lines += ["| settings | best mean validation success (step) | at the last point |",
              "| --- | ---: | ---: |"]  # fmt: skip
    for record in results["runs"].values():
        means = [(p["mean"], p["step"]) for p in record["curve"] if p["mean"] is not None]
        best = max(means, key=lambda m: (m[0], -m[1]), default=None)  # ties: the earliest
        cells = [f"{m:.3f} ({step})" for m, step in (best, means[-1])] if means else ["", ""]
        lines.append(f"| {_settings(record)} | " + " | ".join(cells) + " |")
    lines.append("")
    for key, record in results["runs"].items():
        points = record["curve"]
        envs = list(points[0]["success"]) if points else []
        best = record.get("best_point") or {}
        lines += [
            f"## {_settings(record)}",
            "",
            f"Start model `{key.split()[0]}`; GRPO {record['grpo_seconds'] / 60:.1f} min"
            + (f"; {record['note']}" if record.get("note") else "")
            + (f"; best point: step {best['step']} ({best['value']:.3f})" if best else "")
            + ".",
            "",
            "| step | " + " | ".join(envs) + " | mean |",
            "| ---: | " + " | ".join("---:" for _ in envs) + " | ---: |",
        ]
        for point in points:
            cells = [f"{point['success'][e]:.3f}" if e in point["success"] else "" for e in envs]
            mean = "" if point["mean"] is None else f"{point['mean']:.3f}"
            lines.append(f"| {point['step']} | " + " | ".join(cells) + f" | {mean} |")
        if record.get("conditions"):
            lines += ["", Conditions(**record["conditions"]).describe()]
        lines.append("")
    return "\n".join(lines)


def _settings(record: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(record["overrides"].items())) or "the config"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--start", type=Path, help="the SFT model GRPO starts from")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--render", action="store_true", help="render the table only")
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    path = args.out_dir / f"{NAME}.json"
    results = json.loads(path.read_text()) if path.exists() else {"runs": {}}
    if not args.render:
        if args.start is None:
            raise SystemExit("--start names the SFT model (outputs/suite_tiny/sft)")
        from llm_gym.eval.model_hash import model_files_hash

        overrides = parse_overrides(args.set)
        key = run_key(overrides, model_files_hash(args.start)[:12])
        if key in results["runs"]:
            print(f"[{NAME}] already recorded: {key}")
        else:
            threads = pin_threads(args.threads)
            results["runs"][key] = run(args.start, overrides, threads)
            args.out_dir.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(results, indent=2, default=str) + "\n")
    text = render(results)
    print(text)
    write_markdown(NAME, text, args.out_dir)
    return results


if __name__ == "__main__":
    main()
