"""What a grammar costs per token: the two constrained-decoding libraries vLLM uses, measured on
the CPU, and llm-gym's constrained decoding beside unconstrained decoding.

1. **Libraries** (per tokenizer: the tiny model's 512 tokens and SmolLM2's 49,152): the one-off
   set-up per tokenizer, the compile of a typical tool schema, and the per-token mask over the
   tokens of a call that follows it (median), for ``llguidance`` (the one
   :mod:`llm_gym.policies.constraint` uses) and ``xgrammar`` (when installed).
2. **Decoding** (the tiny model and SmolLM2-135M-Instruct, fp32): seconds per sampled token of
   the server's sampler (:func:`llm_gym.serving.generation.sample_tokens`) at temperature 1,
   free against under a JSON-schema grammar, interleaved for ``--repeats`` repeats.

    flock /tmp/heavy.lock python -m benchmarks.constrained_decoding    # writes results/
    python -m benchmarks.constrained_decoding --quick                  # tiny model only
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks.common import (
    Conditions,
    add_harness_arguments,
    output_dir,
    pin_threads,
    write_json,
    write_markdown,
)

NAME = "constrained_decoding"
SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "days": {"type": "integer", "minimum": 1},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "hourly": {"type": "boolean"},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
SAMPLE = '{"city": "San Francisco", "days": 3, "unit": "celsius", "hourly": false}'
ANSWER = {  # long enough output for the decode timing: a list of short strings
    "type": "object",
    "properties": {"notes": {"type": "array", "items": {"type": "string", "maxLength": 24}}},
    "required": ["notes"],
}


def _median_us(samples: list[float]) -> float:
    return 1e6 * statistics.median(samples)


def time_llguidance(tokenizer: Any) -> dict[str, float]:
    import llguidance.hf
    import llguidance.torch as lt
    from llguidance import LLMatcher

    start = time.perf_counter()
    ll_tokenizer = llguidance.hf.from_tokenizer(tokenizer)
    setup = time.perf_counter() - start
    grammar = LLMatcher.grammar_from_json_schema(json.dumps(SCHEMA))
    compiles, masks = [], []
    for _ in range(5):
        start = time.perf_counter()
        matcher = LLMatcher(ll_tokenizer, grammar, log_level=0)
        compiles.append(time.perf_counter() - start)
        bitmask = lt.allocate_token_bitmask(1, ll_tokenizer.vocab_size)
        for token in tokenizer.encode(SAMPLE, add_special_tokens=False):
            start = time.perf_counter()
            lt.fill_next_token_bitmask(matcher, bitmask, 0)
            masks.append(time.perf_counter() - start)
            assert matcher.consume_token(token)
    return {
        "setup_s": setup,
        "compile_ms": 1e3 * statistics.median(compiles),
        "mask_us": _median_us(masks),
    }


def time_xgrammar(tokenizer: Any) -> dict[str, float] | None:
    try:
        import xgrammar
    except ImportError:
        return None
    start = time.perf_counter()
    info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=len(tokenizer))
    setup = time.perf_counter() - start
    compiler = xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    compiles, masks = [], []
    for _ in range(5):
        start = time.perf_counter()
        compiled = compiler.compile_json_schema(json.dumps(SCHEMA))
        compiles.append(time.perf_counter() - start)
        matcher = xgrammar.GrammarMatcher(compiled)
        bitmask = xgrammar.allocate_token_bitmask(1, info.vocab_size)
        for token in tokenizer.encode(SAMPLE, add_special_tokens=False):
            start = time.perf_counter()
            matcher.fill_next_token_bitmask(bitmask, 0)
            masks.append(time.perf_counter() - start)
            assert matcher.accept_token(token)
    return {
        "setup_s": setup,
        "compile_ms": 1e3 * statistics.median(compiles),
        "mask_us": _median_us(masks),
    }


def _counter(count: list[int]) -> Any:
    def on_token(token: Any) -> bool:
        count.append(token.token_id)
        return False

    return on_token


def time_decoding(model: Any, tokenizer: Any, tokens: int, repeats: int) -> dict[str, Any]:
    """Seconds per sampled token, free and under :data:`ANSWER`'s grammar (interleaved)."""
    from llm_gym.actions import get_action_format
    from llm_gym.actions.grammar import ToolChoice
    from llm_gym.policies.constraint import compiler_for, reply_constraint
    from llm_gym.serving.generation import Sampling, sample_tokens

    eos = [tokenizer.eos_token_id]
    width = model.get_output_embeddings().weight.shape[0]
    compiler = compiler_for(tokenizer, width, eos)
    grammar = reply_constraint(
        compiler, get_action_format("hermes"), [], ToolChoice(), answer=ANSWER
    )
    prompt = tokenizer.encode("Write notes about the weather as JSON.", add_special_tokens=False)
    runs: dict[str, list[float]] = {"free": [], "grammar": []}
    for repeat in range(repeats):
        for kind in ("free", "grammar") if repeat % 2 == 0 else ("grammar", "free"):
            count: list[int] = []
            constraint = compiler.constraint(grammar) if kind == "grammar" else None
            sampling = Sampling(tokens, 1.0, 1.0, seed=repeat, constraint=constraint)
            start = time.perf_counter()
            sample_tokens(
                model, prompt, sampling, eos_ids=[], pad_id=eos[0], on_token=_counter(count)
            )
            runs[kind].append((time.perf_counter() - start) / max(1, len(count)))
    free, constrained = statistics.median(runs["free"]), statistics.median(runs["grammar"])
    return {
        "free_ms_per_token": 1e3 * free,
        "grammar_ms_per_token": 1e3 * constrained,
        "overhead_ms_per_token": 1e3 * (constrained - free),
        "ratio": constrained / free,
        "runs": runs,
    }


def load(path: str) -> tuple[Any, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(path)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=48, help="sampled tokens per run")
    add_harness_arguments(parser, repeats=5)
    args = parser.parse_args(argv)
    threads = pin_threads(args.threads)
    conditions = Conditions.start(NAME, threads=threads, settings=vars(args), quick=args.quick)
    from llm_gym.models import build_tiny_model

    models = {"tiny": str(build_tiny_model())}
    if not args.quick:
        from llm_gym.policies.pretrained import fetch_model

        models["SmolLM2-135M"] = str(fetch_model("smollm2-135m-instruct"))
    repeats = 1 if args.quick else args.repeats
    summary: dict[str, Any] = {"libraries": {}, "decoding": {}}
    for name, path in models.items():
        model, tokenizer = load(path)
        summary["libraries"][name] = {
            "vocab": len(tokenizer),
            "llguidance": time_llguidance(tokenizer),
            "xgrammar": time_xgrammar(tokenizer),
        }
        summary["decoding"][name] = time_decoding(model, tokenizer, args.tokens, repeats)
        del model
    summary["conditions"] = conditions.finish().as_json()
    out = output_dir(args.quick, args.out_dir, not args.no_write)
    if out is not None:
        write_results(summary, out)
    for name, row in summary["decoding"].items():
        print(
            f"{name}: free {row['free_ms_per_token']:.2f} ms/token, grammar "
            f"{row['grammar_ms_per_token']:.2f} ms/token (x{row['ratio']:.2f})"
        )
    return summary


def write_results(summary: dict[str, Any], out: Path) -> None:
    lines = [
        "# Constrained decoding: the grammar's cost per token",
        "",
        Conditions(**summary["conditions"]).describe(),
        "",
        "## Libraries (CPU, one thread)",
        "",
        "| tokenizer | vocab | library | set-up per tokenizer | compile (tool schema) | "
        "mask per token (median) |",
        "| --- | ---: | --- | ---: | ---: | ---: |",
    ]
    for name, row in summary["libraries"].items():
        for library in ("llguidance", "xgrammar"):
            cell = row[library]
            if cell is None:
                lines.append(f"| {name} | {row['vocab']} | {library} | not installed | | |")
                continue
            lines.append(
                f"| {name} | {row['vocab']:,} | {library} | {cell['setup_s']:.3f} s | "
                f"{cell['compile_ms']:.2f} ms | {cell['mask_us']:.1f} us |"
            )
    lines += [
        "",
        "## Decoding (the server's sampler, temperature 1, fp32)",
        "",
        "| model | free, ms/token | JSON-schema grammar, ms/token | overhead, ms/token | ratio |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for name, row in summary["decoding"].items():
        lines.append(
            f"| {name} | {row['free_ms_per_token']:.2f} | {row['grammar_ms_per_token']:.2f} | "
            f"{row['overhead_ms_per_token']:+.2f} | {row['ratio']:.2f} |"
        )
    lines += [
        "",
        "## Reading",
        "",
        "llguidance is the library llm-gym uses (why: `llm_gym/policies/constraint.py`). The "
        "grammar's cost per token is the mask (tens of microseconds) plus applying it to the "
        "logits; on the tiny model (a forward pass of well under a millisecond) it is visible, "
        "on SmolLM2 it is within the noise of one decode step.",
        "",
    ]
    write_markdown(NAME, "\n".join(lines), out)
    write_json(NAME, summary, out)
    plot(summary, out / f"{NAME}.png")


def plot(summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(summary["decoding"])
    fig, ax = plt.subplots(figsize=(6, 3.5))
    xs = range(len(names))
    free = [summary["decoding"][n]["free_ms_per_token"] for n in names]
    grammar = [summary["decoding"][n]["grammar_ms_per_token"] for n in names]
    ax.bar([x - 0.2 for x in xs], free, width=0.4, label="free")
    ax.bar([x + 0.2 for x in xs], grammar, width=0.4, label="JSON-schema grammar")
    ax.set_xticks(list(xs), names)
    ax.set_ylabel("ms per sampled token")
    ax.set_title("Constrained decoding on the CPU (llguidance)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    main()
