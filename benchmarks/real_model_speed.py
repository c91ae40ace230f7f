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

Each is reported in sampled tokens per second (median, 95% interval), model GFLOP/s (``2 x
parameters`` FLOPs for each token a contender feeds the model, prefill and decode, padding
included) and against the roofline measured in the same run (:mod:`benchmarks.roofline`: fp32
and bf16 ``torch.mm`` at 2048^3 and at the model's shapes, and memory bandwidth): the floor of
the workload (the shared prefix prefilled once, each row's own prompt, then a decode step of
every row per token, :func:`benchmarks.roofline.generation`) at the dtype the contender ran,
prorated to the tokens it sampled, and its share of that floor (floor / measured time).

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
from benchmarks.roofline import contender_roofline, measure_model, prorated, share_cell
from benchmarks.step_work import ModelShape, decode_step, dtype_of, element_bytes, generation

NAME = "real_model_speed"
PACKAGED = "smollm2-135m-instruct"


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


def workload_floors(
    roof: Any, shape: ModelShape, lengths: list[int], shared: int, new_tokens: int
) -> dict[str, Any]:
    """The workload's floor in seconds in each dtype the roofline measured (weights and cache
    in that dtype), and one decode step's work and floor with every row at its prompt."""
    rows, context = len(lengths), shared + sum(lengths) - len(lengths) * shared
    floors, step = {}, {}
    for dtype in roof.dtypes:
        element = element_bytes(dtype)
        floors[dtype] = roof.floor_s(generation(shape, lengths, shared, new_tokens, element), dtype)
        work = decode_step(shape, rows, context, element)
        step[dtype] = {"gflop": work.flops / 1e9, "mbytes": work.bytes / 1e6,
                       "floor_ms": roof.floor_s(work, dtype) * 1e3}  # fmt: skip
    return {"floor_s": floors, "decode_step": {"rows": rows, **step}}


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
        args.prompts, args.new_tokens = 2, 6
    threads = pin_threads(args.threads)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from llm_gym.policies.pretrained import resolve_model_path

    path = resolve_model_path(args.model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    shape = ModelShape.of(model)
    dtype = dtype_of(model)
    conditions = Conditions.start(NAME, threads=threads, settings=vars(args), quick=args.quick)
    roof = measure_model(
        shape, args.prompts, quick=args.quick, repeats=repeats,
        log=lambda line: print(f"[{NAME}] {line}", flush=True),
    )  # fmt: skip
    results: dict[str, Any] = {
        "model": path,
        "parameters": shape.parameters,
        "dtype": dtype,
        "roofline": roof.as_json(),
    }
    for name, prompts in prompt_sets(tokenizer, args.prompts).items():
        runs = interleave(
            contenders(model, tokenizer, prompts, args.new_tokens), repeats, order=args.order,
            seed=args.seed, warmup=["ours", "generate"],
            log=lambda line, n=name: print(f"[{NAME}] {n} {line}", flush=True),
        )  # fmt: skip
        lengths, shared = [len(p) for p in prompts], len(shared_prefix(prompts))
        entry: dict[str, Any] = {
            "prompt_tokens_mean": statistics.mean(lengths),
            "shared_prefix_tokens": shared,
            **workload_floors(roof, shape, lengths, shared, args.new_tokens),
        }
        workload = len(prompts) * args.new_tokens
        for contender, values in ((c, runs.rates(c, "tokens")) for c in runs.runs):
            measured = runs.runs[contender]
            flops = [2 * shape.parameters * r["fed_tokens"] / r["wall_s"] / 1e9 for r in measured]
            floor = entry["floor_s"][dtype]
            entry[contender] = {
                "tokens_per_s": median_interval(values).as_json(),
                "model_gflops": statistics.median(flops),
                **contender_roofline(
                    measured, [prorated(floor, workload, r["tokens"]) for r in measured], dtype
                ),
                "runs": measured,
            }
        for other in ("generate", "generate_prefix"):
            entry[f"ours_over_{other}"] = ratio_interval(
                runs.rates("ours", "tokens"), runs.rates(other, "tokens")
            ).as_json()
        results[name] = entry
    conditions.finish()
    report = render(results, conditions, args, roof.describe())
    print(report)
    out = output_dir(args.quick, args.out_dir, args.write)
    if out is not None:
        write_markdown(NAME, report, out)
        write_json(NAME, {"conditions": conditions.as_json(), **results}, out)
    return results


def _interval(estimate: dict[str, Any], spec: str, suffix: str = "") -> str:
    low, high = estimate["ci"]
    return f"{estimate['median']:{spec}}{suffix} [{low:{spec}}, {high:{spec}}]"


def render(results: dict[str, Any], conditions: Conditions, args: Any, roofline: str) -> str:
    """The markdown report; ``roofline``: :meth:`benchmarks.roofline.Roofline.describe`."""
    dtype = results["dtype"]
    lines = [
        "# Sampling speed on a real model",
        "",
        f"{results['model']} ({results['parameters'] / 1e6:.1f}M parameters, {dtype}), "
        f"{args.prompts} prompts, {args.new_tokens} sampled tokens each at temperature 1; "
        f"every contender interleaved, median [95% interval] of the repeats.",
        "",
        roofline,
        "",
    ]
    step = results["tools"]["decode_step"]
    lines.append(
        f"A decode step of {step['rows']} rows at the tool prompts' length: "
        + "; ".join(
            f"{d} {v['gflop']:.1f} GFLOP, {v['mbytes']:.0f} MB (weights and cache), "
            f"floor {v['floor_ms']:.1f} ms"
            for d, v in step.items()
            if d != "rows"
        )
        + "."
    )
    lines += [
        "",
        "| prompts | contender | dtype | tokens/s | ours / it | model GFLOP/s | floor (s) "
        "| share of floor |",
        "| --- | --- | --- | --- | --- | ---: | ---: | --- |",
    ]
    for name in ("tools", "plain"):
        entry = results[name]
        label = f"{name} ({entry['prompt_tokens_mean']:.0f} tokens, "
        label += f"{entry['shared_prefix_tokens']} shared)"
        for contender in ("ours", "generate", "generate_prefix"):
            c = entry[contender]
            ratio = entry.get(f"ours_over_{contender}")
            shown = _interval(ratio, ".2f", "x") if ratio else ""
            lines.append(
                f"| {label} | {contender} | {c['dtype']} | {_interval(c['tokens_per_s'], '.1f')} "
                f"| {shown} | {c['model_gflops']:.0f} | {c['floor_s']:.3f} | "
                f"{share_cell(c['share_of_floor'])} |"
            )
    floors = {n: results[n]["floor_s"] for n in ("tools", "plain")}
    lines += [
        "",
        "Model GFLOP/s counts 2 x parameters per token fed to the model (prefill and decode; "
        "attention's own FLOPs left out): a lower bound of the work. `generate` feeds padding "
        "too (left-padded prompts, rows forced to the full length), which it counts as work.",
        "",
        "Floor: the least time this CPU allows for the workload (the shared prefix prefilled "
        "once, each row's own prompt, then one decode step of every row per token, reading the "
        "weights once a step and each row's cached keys and values), the larger of its FLOPs at "
        "the dtype's matmul peak and its bytes at the copy bandwidth, prorated to the tokens the "
        "contender sampled; share of floor = floor / measured time (1.0 is the hardware's "
        "limit). The whole workload's floor by dtype: "
        + "; ".join(
            f"{n}: " + ", ".join(f"{d} {v:.3f} s" for d, v in f.items()) for n, f in floors.items()
        )
        + ".",
        "",
        conditions.describe(),
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
