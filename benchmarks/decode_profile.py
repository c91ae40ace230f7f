"""Where a decode step of our engine spends its time: per op (``torch.profiler``) and per Python
frame (``cProfile``).

``--rows`` episodes (default 32) open with ToolUseGame-v0's prompts, tools rendered (the ``tools``
shape of :mod:`benchmarks.real_model_speed`), on one :class:`~llm_gym.policies.hf_engine.
DecodeEngine` with no end-of-turn id, so every row decodes in every step. After the prefill and
``--warmup`` decode steps, ``--steps`` decode steps are timed plainly, then run under each
profiler. Reported: the plain step time, the top ops by self CPU time and the top Python frames by
own time, each with its share of the profiled steps' time.

    python -m benchmarks.decode_profile                          # SmolLM2, 32 rows, 2 threads
    python -m benchmarks.decode_profile --model PATH --threads 1
    python -m benchmarks.decode_profile --quick                  # smoke run
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time
from typing import Any

from benchmarks.common import pin_threads

NAME = "decode_profile"


def open_engine(model: Any, tokenizer: Any, rows: int, budget: int) -> Any:
    """An engine with ``rows`` tool-prompt rows admitted and prefilled (one step run)."""
    from benchmarks.real_model_speed import prompt_sets
    from llm_gym.policies.hf_engine import DecodeEngine

    prompts = prompt_sets(tokenizer, rows)["tools"]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    engine = DecodeEngine(model, eos_ids=[], pad_id=pad, temperature=1.0, top_p=1.0, seed=0)
    engine.step([(i, ids, budget) for i, ids in enumerate(prompts)])
    return engine


def op_table(steps: list, total_us: float, top: int) -> list[tuple[str, float, int]]:
    """``(op, share of the steps' time, calls)`` of the ``top`` ops by self CPU time."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for run in steps:
            run()
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    wall = sum(e.self_cpu_time_total for e in events) if total_us <= 0 else total_us
    return [(e.key, e.self_cpu_time_total / wall, e.count) for e in events[:top]]


def frame_table(steps: list, top: int) -> tuple[float, list[tuple[str, float, int]]]:
    """The steps' time under ``cProfile`` and ``(frame, share of it, calls)`` of the ``top``
    frames by own time."""
    profiler = cProfile.Profile()
    start = time.perf_counter()
    profiler.enable()
    for run in steps:
        run()
    profiler.disable()
    wall = time.perf_counter() - start
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    rows = []
    for (path, line, name), (_, calls, own, _, _) in stats.items():
        where = f"{path.rsplit('/', 2)[-2:][-1]}:{line}({name})" if line else name
        rows.append((where, own / wall, calls))
    rows.sort(key=lambda r: r[1], reverse=True)
    return wall, rows[:top]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model", default="smollm2-135m-instruct", help="a model folder, packaged name or tiny"
    )
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="a smoke run: 2 rows, 2 steps")
    args = parser.parse_args(argv)
    if args.quick:
        args.rows, args.steps, args.warmup = 2, 2, 1
    pin_threads(args.threads)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from llm_gym.policies.pretrained import resolve_model_path

    if args.model == "tiny":
        from llm_gym.models import build_tiny_model

        path = str(build_tiny_model())
    else:
        path = resolve_model_path(args.model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    budget = 4 * (args.warmup + args.steps) + 4
    engine = open_engine(model, tokenizer, args.rows, budget)
    step = lambda: engine.step([])  # noqa: E731
    for _ in range(args.warmup):
        step()
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    step_ms = (time.perf_counter() - start) / args.steps * 1e3
    ops = op_table([step] * args.steps, step_ms * 1e3 * args.steps, args.top)
    frames_wall, frames = frame_table([step] * args.steps, args.top)
    result = {
        "model": path,
        "rows": args.rows,
        "threads": torch.get_num_threads(),
        "step_ms": step_ms,
        "tokens_per_s": args.rows / step_ms * 1e3,
        "cprofile_step_ms": frames_wall / args.steps * 1e3,
        "ops": ops,
        "frames": frames,
    }
    print(render(result))
    return result


def render(result: dict[str, Any]) -> str:
    lines = [
        f"# Decode step profile: {result['model']}, {result['rows']} rows, "
        f"{result['threads']} threads",
        "",
        f"Plain step {result['step_ms']:.1f} ms ({result['tokens_per_s']:.0f} tokens/s); "
        f"under cProfile {result['cprofile_step_ms']:.1f} ms.",
        "",
        "| op (self CPU) | share of step | calls |",
        "| --- | ---: | ---: |",
    ]
    lines += [f"| {k} | {s:.1%} | {c} |" for k, s, c in result["ops"]]
    lines += ["", "| Python frame (own time) | share of step | calls |", "| --- | ---: | ---: |"]
    lines += [f"| {k} | {s:.1%} | {c} |" for k, s, c in result["frames"]]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
