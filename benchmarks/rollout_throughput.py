"""Rollout throughput: llm_gym's ``collect_groups`` as a percentage of its replay limit, beside HF
``generate`` over a prefilled shared-prefix cache, TRL's own tool loop and our previous engine.

Contenders, run interleaved (A/B/A/B..., the order rotating each repeat) for ``--repeats`` repeats
by the common harness (:mod:`benchmarks.common`), each reported as a median with its 95% interval:

* ``ours``: ``collect_groups`` with ``HFPolicy``'s continuous batching, on ToolUseGame val tasks.
* ``replay`` (the limit): the token streams ``ours`` produced, replayed through the same model as
  pure model work, every sampled token decoded at the largest batch possible
  (:mod:`benchmarks.rollout_replay`). Ours is at most 100% of it by construction; the script
  asserts it.
* ``generate`` (a second reference): one HF ``generate`` of the same mean number of sampled tokens
  per episode, the shared prefix prefilled once into a cache every row reads (no environment).
* ``trl_generate`` and ``trl_continuous_batching``: ``GRPOTrainer(environment_factory=...)``
  generating one batch at its best settings (:mod:`benchmarks.rollout_trl`: the same per-turn
  budget, identical prompt token ids asserted on every task, a warm-up), with each of its two
  local generation back-ends; ``ratio_to_trl_best`` is ours against the faster.
* ``waves``: ``collect_groups`` with ``batching="waves"`` (one ``generate`` per wave).

Against the hardware (:mod:`benchmarks.roofline`, measured in the same run): each contender's
floor is the floor of ours' token streams (the replay's work: the shared prefix prefilled once,
then the fewest passes the streams allow, each reading the weights and its rows' keys and
values) at the dtype it ran, prorated to the tokens it sampled; its share of the floor is floor
/ measured time.

The model must call the tools, so that every loop runs real multi-turn episodes (a model that
does not is refused): pass a warmed model, or let the script take the main job's SFT model
(``outputs/tool_use_game_tiny/sft``), or build the tiny model and warm it on oracle transcripts.

    python -m benchmarks.rollout_throughput --model outputs/tool_use_game_tiny/sft
    python -m benchmarks.rollout_throughput --quick --model PATH   # smoke run, writes nothing
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from benchmarks.common import (
    Conditions,
    Estimate,
    Interleaved,
    add_harness_arguments,
    cache_dir,
    check_repeats,
    interleave,
    main_job_model,
    median_interval,
    output_dir,
    pin_threads,
    ratio_interval,
)
from benchmarks.rollout_report import report
from benchmarks.rollout_trl import TRL_BACKENDS, TRLContender
from benchmarks.roofline import Roofline, contender_roofline, measure_model, prorated
from benchmarks.step_work import ModelShape, dtype_of, element_bytes, stream_work

NAME = "rollout_throughput"


@dataclass
class Args:
    model: str | None = None
    """A tools-calling model directory (None: the main job's SFT model, else the tiny model
    warmed here by SFT)."""
    tasks: int = 16
    """ToolUseGame val tasks."""
    episodes_per_task: int = 4
    """Episodes per task (the group)."""
    max_turns: int = 6
    """Assistant turns per episode."""
    max_tokens_per_turn: int = 64
    """Generation budget per assistant turn."""
    repeats: int = 7
    """Interleaved repeats of every contender (at least 5 unless ``quick``)."""
    sft_seconds: float | None = None
    """SFT time budget when no model is given (None: the warm start's whole recipe, which
    makes the tiny model call the tools; a cut one may not, and is refused)."""
    out_dir: Path | None = None
    """Where rollout_throughput.md and .json go (None: ``results/``; nowhere when ``quick``)."""
    write: bool = True
    """Write the results files."""
    waves: bool = True
    """Also time ``collect_groups`` with ``batching="waves"`` (the previous engine)."""
    trl: bool = True
    """Also time TRL's tool loop."""
    threads: int | None = 1
    """torch intra-op threads for every contender, pinned and recorded (None: torch's default)."""
    seed: int = 0
    """Sampling seed of ours (the same every repeat: the replay replays identical streams)."""
    order: str = "rotate"
    """Contender order per repeat: ``rotate`` or ``shuffle`` (seeded)."""
    quick: bool = False
    """A smoke run: tiny sizes (unless given), nothing written unless ``out_dir`` is set."""

    @classmethod
    def quick_sizes(cls) -> dict[str, Any]:
        """The sizes ``--quick`` uses where none is given."""
        return {
            "tasks": 2,
            "episodes_per_task": 2,
            "max_turns": 2,
            "max_tokens_per_turn": 8,
            "repeats": 3,
        }


def warm_model(args: Args) -> str:
    """``--model``, else the main job's SFT model where it ran, else the tiny model warmed here
    on oracle transcripts (which :func:`check_multi_turn` refuses if it calls no tools)."""
    if args.model:
        return args.model
    found = main_job_model("sft")
    if found is not None:
        return found
    from llm_gym.models import build_tiny_model
    from trainers.sft.data import oracle_sft_dataset
    from trainers.sft.settings import SFTSettings
    from trainers.sft.train import sft_warm_start

    out = cache_dir() / "bench-sft"
    if (out / "config.json").exists():
        return str(out)
    dataset = oracle_sft_dataset("ToolUseGame-v0")
    settings = SFTSettings(time_budget_s=args.sft_seconds, epochs=3, progress=False)
    return str(sft_warm_start(build_tiny_model(), out, dataset, settings))


MIN_TOOL_CALLS = 0.5
"""Tool calls per episode below which the workload is refused: single-turn episodes are not
what this benchmark measures."""


def check_multi_turn(model, tokenizer, model_path: str, tasks, args: Args) -> None:
    """Refuse a model that does not call the tools (a full run; ``--quick`` only warns): its
    episodes would end on the first turn, and the numbers would not be a multi-turn
    benchmark's."""
    sample: list = []
    probe = Args(**{**asdict(args), "episodes_per_task": 2})
    run_ours(model, tokenizer, tasks[:8], probe, record=sample)
    calls = statistics.mean(e.tool_calls for e in sample)
    if calls >= MIN_TOOL_CALLS:
        return
    message = (
        f"The model at {model_path} makes {calls:.2f} tool calls an episode on ToolUseGame val "
        f"(at least {MIN_TOOL_CALLS} wanted): its episodes are single-turn. Pass a tools-calling "
        "model (--model outputs/tool_use_game_tiny/sft, the main job's SFT stage), or delete "
        "that folder and let the script run its SFT warm start whole (no --sft-seconds)."
    )
    if not args.quick:
        raise SystemExit(message)
    print(f"[{NAME}] warning: {message}", flush=True)


def run_ours(
    model,
    tokenizer,
    tasks,
    args: Args,
    batching: str = "continuous",
    seed: int = 0,
    record: list | None = None,
) -> dict[str, float]:
    """Time one ``collect_groups``; with ``record``, its episodes are appended to it."""
    from llm_gym.envs.tool_use_game import ToolUseGameEnv
    from llm_gym.policies import HFPolicy
    from llm_gym.rollout import collect_groups

    policy = HFPolicy(
        model,
        tokenizer,
        temperature=1.0,
        max_new_tokens=args.max_tokens_per_turn,
        seed=seed,
        batching=batching,
    )
    start = time.perf_counter()
    groups = collect_groups(
        ToolUseGameEnv,
        tasks,
        policy,
        episodes_per_task=args.episodes_per_task,
        max_turns=args.max_turns,
    )
    wall = time.perf_counter() - start
    episodes = [e for g in groups for e in g]
    if record is not None:
        record.extend(episodes)
    return {
        "wall_s": wall,
        "episodes": len(episodes),
        "tokens": sum(e.completion_tokens for e in episodes),
        "turns_mean": statistics.mean(e.num_turns for e in episodes),
        "tool_calls_mean": statistics.mean(e.tool_calls for e in episodes),
        "longest_episode_tokens": max(e.completion_tokens for e in episodes),
        "generate_calls": policy.generate_calls,
        "forward_passes": policy.forward_passes,
        "prefilled_tokens": policy.prefilled_tokens,
        "shared_prefix_tokens": policy.shared_prefix_tokens,
    }


class LimitViolated(AssertionError):
    """Ours measured above 100% of the replay limit, which its construction rules out."""


def contenders(
    model, tokenizer, model_path: str, tasks, args: Args, roof: Roofline
) -> dict[str, Any]:
    """``name -> run(repeat)`` for :func:`~benchmarks.common.interleave`. The replay and the
    generate reference read the episodes of ours' latest run (a recording run comes first);
    the replay records its streams' floor in every dtype ``roof`` measured."""
    from benchmarks.rollout_replay import Replay, episode_streams, time_generate

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    shape, dtype = ModelShape.of(model), dtype_of(model)
    latest: list = []
    source = run_ours(model, tokenizer, tasks, args, seed=args.seed, record=latest)  # warms up
    built: dict[str, Any] = {}

    def replay_for(episodes: list) -> Any:
        if built.get("episodes") is not episodes:
            prefix, streams = episode_streams(episodes)
            replay = Replay(model, prefix, streams, pad)
            replay.run()  # untimed: first touch of the cache and the kernels' shapes
            built.update(episodes=episodes, replay=replay, prefix=prefix, streams=streams)
        return built["replay"]

    def ours(repeat: int) -> dict[str, Any]:
        nonlocal latest, source
        episodes: list = []
        measured = run_ours(model, tokenizer, tasks, args, seed=args.seed, record=episodes)
        identical = [s.completion_ids for e in episodes for s in e.samples] == [
            s.completion_ids for e in latest for s in e.samples
        ]
        latest, source = episodes, measured
        return {**measured, "dtype": dtype, "same_streams_as_before": identical}

    def replay(repeat: int) -> dict[str, Any]:
        limit = replay_for(latest)
        floors = {
            d: roof.floor_s(
                stream_work(shape, len(limit.prefix), limit.streams, element_bytes(d)), d
            )
            for d in roof.dtypes
        }
        return {
            "wall_s": limit.run(),
            "dtype": dtype,
            "floor_s": floors,
            "episodes": len(limit.streams),
            "tokens": limit.tokens,
            "forward_passes": limit.passes,
            "prefilled_tokens": limit.prefill_tokens,
            "source_tokens": source["tokens"],
            "source_forward_passes": source["forward_passes"],
        }

    def generate(repeat: int) -> dict[str, Any]:
        limit = replay_for(latest)
        prompts = [e.samples[0].prompt_ids for e in latest if e.samples]
        per_episode = max(1, round(limit.tokens / len(limit.streams)))
        wall = time_generate(model, built["prefix"], prompts, per_episode, pad, seed=args.seed)
        return {
            "wall_s": wall,
            "episodes": len(prompts),
            "tokens": per_episode * len(prompts),
            "new_tokens_per_episode": per_episode,
            "dtype": dtype,
            "prefilled_tokens": len(built["prefix"])
            + sum(len(p) - len(built["prefix"]) for p in prompts),
        }

    runs = {"ours": ours, "replay": replay, "generate": generate}
    if args.trl:
        for backend in TRL_BACKENDS:
            runs[f"trl_{backend}"] = TRLContender(model_path, tokenizer, tasks, args, backend)
    if args.waves:
        runs["waves"] = lambda repeat: {
            **run_ours(model, tokenizer, tasks, args, batching="waves", seed=args.seed),
            "dtype": dtype,
        }
    return runs


def floors(result: Interleaved, name: str) -> list[float]:
    """Contender ``name``'s floor in each repeat: the replay's floor per sampled token (median
    over its repeats) in the contender's dtype, times the tokens it sampled."""
    runs, replayed = result.runs[name], result.runs["replay"]
    dtype = runs[0]["dtype"]
    per_token = statistics.median(r["floor_s"][dtype] / r["tokens"] for r in replayed)
    return [prorated(per_token, 1, run["tokens"]) for run in runs]


def summarize(result: Interleaved) -> dict[str, Any]:
    """Each contender's medians with intervals, its floor and share of it, and ours' ratios to
    each (paired bootstrap)."""
    summary: dict[str, Any] = {"contenders": {}, "ratios": {}}
    for name, runs in result.runs.items():
        summary["contenders"][name] = {
            "tokens_per_s": median_interval(result.rates(name, "tokens")),
            "episodes_per_s": median_interval(result.rates(name, "episodes")),
            "wall_s": median_interval([run["wall_s"] for run in runs]),
            "roofline": contender_roofline(runs, floors(result, name), runs[0]["dtype"]),
            "runs": runs,
        }
    ours_tokens = result.rates("ours", "tokens")
    ours_episodes = result.rates("ours", "episodes")
    for name in result.runs:
        if name != "ours":
            unit = "tokens" if name in ("replay", "generate") else "episodes"
            mine = ours_tokens if unit == "tokens" else ours_episodes
            summary["ratios"][name] = (unit, ratio_interval(mine, result.rates(name, unit)))
    trl = [n for n in result.runs if n.startswith("trl_")]
    if trl:  # TRL at its best: the back-end with the higher median episodes/s
        best = max(trl, key=lambda n: summary["contenders"][n]["episodes_per_s"].median)
        summary["trl_best"] = best
        summary["ratios"]["trl_best"] = summary["ratios"][best]
    return summary


def check_limit(summary: dict[str, Any], quick: bool = False) -> None:
    """Ours cannot beat the replay of its own streams: raise :class:`LimitViolated` if it did.
    The replay's work is checked in every run; the timing bound in full runs only (a ``quick``
    run's few tiny repeats on a shared machine are too noisy to judge it, so it only warns)."""
    for r in summary["contenders"]["replay"]["runs"]:
        if r["forward_passes"] > r["source_forward_passes"] or r["tokens"] != r["source_tokens"]:
            raise LimitViolated(
                f"The replay ran {r['forward_passes']} passes over {r['tokens']} sampled tokens "
                f"where the run of ours it replays ran {r['source_forward_passes']} over "
                f"{r['source_tokens']}: it must replay ours' tokens in at most as many passes. "
                "The replay is broken, not ours fast."
            )
    ratio: Estimate = summary["ratios"]["replay"][1]
    if ratio.median > 1.0:
        error = LimitViolated(
            f"Ours ran at {ratio.format('.0%', suffix='')} of the replay limit (median, 95% "
            "interval): above 100%, which the construction rules out (the replay does a subset "
            "of ours' work: the same forward passes over the same tokens, nothing else). Either "
            "the machine's load changed between the two (compare the per-repeat walls and the "
            "load averages in the JSON, and rerun on a quiet machine with more --repeats), or "
            "the replay does work ours skips, and then it is no limit: compare its passes and "
            "prefilled tokens with ours'."
        )
        if not quick:
            raise error
        print(f"WARNING (--quick, not raised): {error}", file=sys.stderr)


def main(args: Args) -> dict[str, Any]:
    check_repeats(args.repeats, args.quick)
    threads = pin_threads(args.threads)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from llm_gym.envs.tool_use_game import get_tasks

    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    model_path = warm_model(args)
    settings = {**asdict(args), "model": model_path}
    conditions = Conditions.start(NAME, threads=threads, settings=settings, quick=args.quick)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path).eval()
    tasks = list(get_tasks("val"))[: args.tasks]
    roof = measure_model(
        ModelShape.of(model), args.tasks * args.episodes_per_task, quick=args.quick,
        repeats=args.repeats, log=lambda line: print(f"[{NAME}] {line}", flush=True),
    )  # fmt: skip
    check_multi_turn(model, tokenizer, model_path, tasks, args)
    runs = contenders(model, tokenizer, model_path, tasks, args, roof)
    if args.waves:  # its first generate calls, outside the timing
        warm = Args(**{**asdict(args), "episodes_per_task": 1, "max_turns": 2})
        run_ours(model, tokenizer, tasks[:2], warm, batching="waves")
    result = interleave(
        runs, args.repeats, order=args.order, seed=args.seed, warmup=("replay", "generate")
    )
    conditions.finish()
    summary = summarize(result)
    summary["order"] = result.order
    summary["roofline"] = roof
    check_limit(summary, args.quick)
    out = output_dir(args.quick, args.out_dir, args.write)
    text = report(NAME, summary, conditions, args, model_path, out)
    print(text)
    return summary


def parse_args(argv: list[str] | None = None) -> Args:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    for name in ("tasks", "episodes_per_task", "max_turns", "max_tokens_per_turn"):
        parser.add_argument("--" + name.replace("_", "-"), type=int, default=None)
    parser.add_argument("--sft-seconds", type=float, default=Args.sft_seconds)
    parser.add_argument("--no-waves", dest="waves", action="store_false")
    parser.add_argument("--no-trl", dest="trl", action="store_false")
    add_harness_arguments(parser, repeats=Args.repeats, threads=Args.threads)
    ns = vars(parser.parse_args(argv))
    sizes = Args.quick_sizes() if ns["quick"] else {}
    given = {f.name: ns[f.name] for f in fields(Args) if ns.get(f.name) is not None}
    return Args(**{**sizes, **given})


if __name__ == "__main__":
    main(parse_args())
