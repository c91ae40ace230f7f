"""Sampling speed on a real pretrained model: our engine against HF ``generate``, and the CPU's
measured matmul peak.

SmolLM2-135M-Instruct (``llm-gym fetch-model smollm2-135m-instruct``; ``--model`` for another),
fp32, 32 chat prompts, ``--new-tokens`` sampled tokens each at temperature 1, as a new user tries
it. Two prompt sets: ToolUseGame-v0's openings with its tools rendered (521 tokens each, 480 of
them shared: system prompt and tool block) and the same questions without tools (118 tokens).
Contenders, interleaved (A/B/C, rotating) for ``--repeats`` repeats:

* ``ours``: ``HFPolicy``'s continuous-batching engine, one request per prompt (the ids of
  :func:`llm_gym.policies.render_chat`), a row stopping at its end-of-turn token;
* ``generate``: one batched HF ``generate`` over the left-padded prompts, every row forced to
  ``--new-tokens`` (its most efficient case: a full batch at every step);
* ``generate_prefix``: the same with the shared prefix prefilled once into a cache that every
  row reads (:func:`benchmarks.rollout_replay.time_generate`): ``generate`` at its best.

Each is reported in sampled tokens per second (median, 95% interval) and as model-FLOP
utilisation: ``2 x parameters`` FLOPs for each token a contender feeds the model (prefill and
decode; attention's own FLOPs left out, so this is a lower bound) over the seconds, against the
CPU's fp32 matmul peak measured in the same run (``torch.mm`` at 2048^3 and at the model's own
decode shapes).

    python -m benchmarks.real_model_speed                 # writes results/real_model_speed.*
    python -m benchmarks.real_model_speed --quick         # smoke run, writes nothing
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import warnings
from typing import Any

from benchmarks.common import (
    Conditions,
    add_harness_arguments,
    check_repeats,
    interleave,
    median_interval,
    output_dir,
    pin_threads,
    ratio_interval,
    write_json,
    write_markdown,
)

NAME = "real_model_speed"
PACKAGED = "smollm2-135m-instruct"


def matmul_peak(shapes: list[tuple[int, int, int]], repeats: int = 5) -> dict[str, float]:
    """GFLOP/s of fp32 ``torch.mm`` at each ``(m, k, n)``: the best of ``repeats`` timings (a
    bound: the most this CPU gave)."""
    import torch

    out = {}
    for m, k, n in shapes:
        a, b = torch.randn(m, k), torch.randn(k, n)
        torch.mm(a, b)
        reps = max(1, int(2e9 / (2 * m * k * n)))  # ~2 GFLOP a timing
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            for _ in range(reps):
                torch.mm(a, b)
            best = min(best, (time.perf_counter() - start) / reps)
        out[f"{m}x{k}x{n}"] = 2 * m * k * n / best / 1e9
    return out


def prompt_sets(tokenizer: Any, count: int) -> dict[str, list[list[int]]]:
    """``{"tools": ..., "plain": ...}``: ``count`` ToolUseGame openings as prompt ids, with its
    tools rendered and without."""
    import gymnasium as gym

    from llm_gym.policies.chat import render_chat

    env = gym.make("ToolUseGame-v0")
    openings, specs = [], []
    for seed in range(count):
        _, info = env.reset(seed=seed)
        openings.append(info["messages"])
        specs = info["tool_specs"]
    env.close()
    sets = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the text layout's one-time warning
        for name, tools in (("tools", specs), ("plain", [])):
            texts = [render_chat(tokenizer, m, tools, add_generation_prompt=True) for m in openings]
            sets[name] = [tokenizer.encode(t, add_special_tokens=False) for t in texts]
    return sets


def shared_prefix(prompts: list[list[int]]) -> list[int]:
    """The longest prefix every prompt starts with.

    Example:
        >>> shared_prefix([[1, 2, 3], [1, 2, 4], [1, 2]])
        [1, 2]
    """
    first = prompts[0]
    n = min(len(p) for p in prompts)
    for i in range(n):
        if any(p[i] != first[i] for p in prompts):
            return first[:i]
    return first[:n]


def contenders(model: Any, tokenizer: Any, prompts: list[list[int]], new_tokens: int) -> dict:
    from benchmarks.rollout_replay import time_generate
    from llm_gym.actions import get_action_format
    from llm_gym.aio import run_sync
    from llm_gym.core.task import Task
    from llm_gym.policies import HFPolicy
    from llm_gym.policies.base import PolicyRequest

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    prefix = shared_prefix(prompts)
    hermes = get_action_format("hermes")
    rows = len(prompts)

    def ours(repeat: int) -> dict[str, Any]:
        policy = HFPolicy(model, tokenizer, max_new_tokens=new_tokens, seed=max(repeat, 0))
        requests = [
            PolicyRequest(messages=[], tool_specs=[], task=Task("x"), action_format=hermes,
                          max_new_tokens=new_tokens, prompt_ids=ids)
            for ids in prompts
        ]  # fmt: skip
        stream = policy.open_stream()
        assert stream is not None, "the engine does not cover this model"

        async def run() -> list[Any]:
            try:
                return await asyncio.gather(*(stream.act(i, r) for i, r in enumerate(requests)))
            finally:
                await stream.aclose()

        start = time.perf_counter()
        outs = run_sync(run())
        wall = time.perf_counter() - start
        sampled = sum(len(o.token_ids) for o in outs)
        fed = policy.prefilled_tokens + sampled
        return {"wall_s": wall, "tokens": sampled, "fed_tokens": fed}

    def generate(repeat: int, cached: list[int]) -> dict[str, Any]:
        wall = time_generate(model, cached, prompts, new_tokens, pad, seed=max(repeat, 0))
        width = max(len(p) - len(cached) for p in prompts)
        fed = len(cached) + rows * (width + new_tokens)
        return {"wall_s": wall, "tokens": rows * new_tokens, "fed_tokens": fed}

    return {
        "ours": ours,
        "generate": lambda r: generate(r, []),
        "generate_prefix": lambda r: generate(r, prefix),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=PACKAGED, help="a model folder or packaged name")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=48)
    add_harness_arguments(parser, repeats=5, threads=2)
    args = parser.parse_args(argv)
    repeats = args.repeats or (1 if args.quick else 5)
    check_repeats(repeats, args.quick)
    if args.quick:
        args.prompts, args.new_tokens = 4, 8
    threads = pin_threads(args.threads)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from llm_gym.policies.pretrained import resolve_model_path

    path = resolve_model_path(args.model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    params = sum(p.numel() for p in model.parameters())
    conditions = Conditions.start(NAME, threads=threads, settings=vars(args), quick=args.quick)
    config = model.config
    shapes = [(2048, 2048, 2048), (32, config.hidden_size, config.intermediate_size)]
    peak = matmul_peak(shapes if not args.quick else [(256, 256, 256)])
    best = max(peak.values())
    results: dict[str, Any] = {"model": path, "parameters": params, "matmul_gflops": peak}
    for name, prompts in prompt_sets(tokenizer, args.prompts).items():
        runs = interleave(
            contenders(model, tokenizer, prompts, args.new_tokens), repeats, order=args.order,
            seed=args.seed, warmup=["ours", "generate"],
            log=lambda line, n=name: print(f"[{NAME}] {n} {line}", flush=True),
        )  # fmt: skip
        rates = {c: runs.rates(c, "tokens") for c in runs.runs}
        entry: dict[str, Any] = {
            "prompt_tokens_mean": statistics.mean(map(len, prompts)),
            "shared_prefix_tokens": len(shared_prefix(prompts)),
        }
        for contender, values in rates.items():
            flops = [2 * params * r["fed_tokens"] / r["wall_s"] / 1e9 for r in runs.runs[contender]]
            entry[contender] = {
                "tokens_per_s": median_interval(values).as_json(),
                "model_gflops": statistics.median(flops),
                "mfu": statistics.median(flops) / best,
                "runs": runs.runs[contender],
            }
        for other in ("generate", "generate_prefix"):
            entry[f"ours_over_{other}"] = ratio_interval(rates["ours"], rates[other]).as_json()
        results[name] = entry
    conditions.finish()
    report = render(results, conditions, args)
    print(report)
    out = output_dir(args.quick, args.out_dir, args.write)
    if out is not None:
        write_markdown(NAME, report, out)
        write_json(NAME, {"conditions": conditions.as_json(), **results}, out)
    return results


def _interval(estimate: dict[str, Any], spec: str, suffix: str = "") -> str:
    low, high = estimate["ci"]
    return f"{estimate['median']:{spec}}{suffix} [{low:{spec}}, {high:{spec}}]"


def render(results: dict[str, Any], conditions: Conditions, args: Any) -> str:
    peak = results["matmul_gflops"]
    lines = [
        "# Sampling speed on a real model",
        "",
        f"{results['model']} ({results['parameters'] / 1e6:.1f}M parameters, fp32), "
        f"{args.prompts} prompts, {args.new_tokens} sampled tokens each at temperature 1; "
        f"every contender interleaved, median [95% interval] of the repeats.",
        "",
        "This CPU's fp32 matmul, measured in this run: "
        + ", ".join(f"{shape}: {gflops:.0f} GFLOP/s" for shape, gflops in peak.items())
        + " (the best is the peak the utilisation is taken against).",
        "",
        "| prompts | contender | tokens/s | ours / it | model GFLOP/s | MFU |",
        "| --- | --- | --- | --- | ---: | ---: |",
    ]
    for name in ("tools", "plain"):
        entry = results[name]
        label = f"{name} ({entry['prompt_tokens_mean']:.0f} tokens, "
        label += f"{entry['shared_prefix_tokens']} shared)"
        for contender in ("ours", "generate", "generate_prefix"):
            rate = entry[contender]["tokens_per_s"]
            ratio = entry.get(f"ours_over_{contender}")
            shown = _interval(ratio, ".2f", "x") if ratio else ""
            lines.append(
                f"| {label} | {contender} | {_interval(rate, '.1f')} | {shown} | "
                f"{entry[contender]['model_gflops']:.0f} | {entry[contender]['mfu']:.0%} |"
            )
    lines += [
        "",
        "Model GFLOP/s counts 2 x parameters per token fed to the model (prefill and decode; "
        "attention's own FLOPs left out): a lower bound of the work. `generate` feeds padding "
        "too (left-padded prompts, rows forced to the full length), which it counts as work.",
        "",
        conditions.describe(),
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
