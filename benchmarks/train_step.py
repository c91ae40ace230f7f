"""Training step, side by side: our ``MultiTurnGRPOTrainer`` (and three ablations of it) against
TRL's ``GRPOTrainer(environment_factory=...)`` at its best settings.

Contenders, each a fresh trainer from the same tools-calling model, interleaved for ``--repeats``
repeats by the common harness (:mod:`benchmarks.common`), each repeat ``--steps`` optimizer steps:

* ``ours``: the default trainer (continuous-batching rollouts, token-tree scoring);
* ``ours_no_token_tree``: ``token_tree=False`` (the rows' shared prefix once, every row's rest);
* ``ours_no_shared_prefix``: ``shared_prefix=False`` (TRL's per-sample scoring path);
* ``ours_waves``: the previous rollout engine (``HFPolicy(batching="waves")``, registered here
  as the policy kind ``hf-waves`` for ``generation_backend``);
* ``trl``: TRL's tool loop with the same per-turn budget (``generation_kwargs``), turn limit,
  identical prompt token ids (asserted; :mod:`benchmarks.rollout_trl`), the same reward and the
  same parse-failure reward (-0.1), loss (dapo, beta 0), lr schedule and seed.

Every step is split into generation (``_generate_and_score_completions``: rollouts, environment,
rewards), scoring (``_compute_loss``: the forward pass over the batch and the loss) and the rest
(backward and optimizer step), by the same wrappers on both trainers. A repeat's value is the median
of its steps after the first (the first warms kernels up); ratios are ours' median over the other's
with a paired bootstrap interval over repeats. Against the hardware (:mod:`benchmarks.roofline`,
measured in the same run): a step's floor is that of the forward and backward over its batch
(:func:`benchmarks.step_work.train_step`: the distinct positions of the rows' token tree, a
group's shared prompt once, and the head only where the loss reads logits) at the dtype it
trains in, and its share of the floor is floor / measured time, over the whole step and over
its forward and backward (scoring and the rest); the generation's floor is
``rollout_throughput``'s.

Held-out quality: one longer run each of ``ours`` and ``trl`` (``--quality-steps``), evaluated by
the same evaluator on ToolUseGame test tasks (sampled at temperature 1.0, the trained policy, and
greedy), each gain paired by task against the starting model.

    python -m benchmarks.train_step --model MAINJOB/sft
    python -m benchmarks.train_step --quick --model PATH      # smoke run, writes nothing
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from benchmarks import step_work
from benchmarks.common import (
    Conditions,
    add_harness_arguments,
    check_repeats,
    default_model,
    interleave,
    output_dir,
    pin_threads,
    write_json,
    write_markdown,
)
from benchmarks.roofline import measure_model
from benchmarks.step_work import ModelShape, dtype_of
from benchmarks.train_step_report import COUNTS, PARSE_FAILURE_REWARD, report, summarize

NAME = "train_step"
OURS = {
    "ours": {},
    "ours_no_token_tree": {"token_tree": False},
    "ours_no_shared_prefix": {"shared_prefix": False},
    "ours_waves": {"generation_backend": "hf-waves"},
}


@dataclass
class Args:
    model: str | None = None
    """A tools-calling model directory (None: the main job's cached SFT model)."""
    steps: int = 3
    """Optimizer steps per timed repeat (the first is the warm-up)."""
    quality_steps: int = 20
    """Steps of the held-out quality run of ours and TRL (0: skip it)."""
    batch_size: int = 16
    """Tasks per optimizer step."""
    episodes_per_task: int = 8
    """Episodes per task (the group)."""
    max_turns: int = 6
    """Assistant turns per episode (TRL: ``max_tool_calling_iterations = max_turns - 1``)."""
    max_tokens_per_turn: int = 64
    """Generation budget per assistant turn, on both sides."""
    learning_rate: float = 2e-4
    warmup_steps: int = 5
    eval_tasks: int = 200
    """Held-out ToolUseGame test tasks of the quality evaluation."""
    eval_samples: int = 8
    """Sampled episodes per task (temperature 1.0), besides one greedy episode."""
    repeats: int = 5
    threads: int | None = 2
    """torch intra-op threads, pinned and recorded (training uses both cores)."""
    seed: int = 0
    order: str = "rotate"
    out_dir: Path | None = None
    write: bool = True
    quick: bool = False
    contenders: tuple[str, ...] = (
        "ours", "ours_no_token_tree", "ours_no_shared_prefix", "ours_waves", "trl"
    )  # fmt: skip
    """The contenders to time (``ours`` always among them); the ratios and the held-out
    comparison are those whose contenders ran."""

    @classmethod
    def quick_sizes(cls) -> dict[str, Any]:
        return {
            "steps": 2,
            "quality_steps": 1,
            "batch_size": 2,
            "episodes_per_task": 2,
            "max_turns": 2,
            "max_tokens_per_turn": 8,
            "eval_tasks": 2,
            "eval_samples": 2,
            "repeats": 2,
        }


def waves_policy_class() -> type:
    from llm_gym.policies.hf import HFPolicy

    class WavesHFPolicy(HFPolicy):
        """``HFPolicy`` with ``batching="waves"``: one ``generate`` per wave of turns."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **{**kwargs, "batching": "waves"})

    return WavesHFPolicy


def __getattr__(name: str) -> Any:  # the registry resolves "benchmarks.train_step:WavesHFPolicy"
    if name == "WavesHFPolicy":
        return waves_policy_class()
    raise AttributeError(name)


def register_waves_policy() -> None:
    from llm_gym.policies.registry import register_policy

    register_policy(
        "hf-waves",
        "benchmarks.train_step:WavesHFPolicy",
        description="HFPolicy with batching='waves' (the train_step ablation)",
    )


# --- timing both trainers the same way -----------------------------------------------------------


class StepTimer:
    """Per-step wall time split into generation, scoring and the rest, by wrapping the two
    methods every GRPO trainer here runs (TRL's and ours alike) and a step callback; and the
    work of each step's batch, counted once its time is taken: its real tokens (``tokens``), the
    distinct positions of its rows' token tree and the positions whose logits its loss reads
    (``positions``, ``trained``: :func:`benchmarks.step_work.prefix_tree_work`)."""

    def __init__(self, trainer: Any) -> None:
        from transformers import TrainerCallback

        self.steps: list[dict[str, float]] = []
        self._batches: list[dict[str, Any]] = []
        self._current = {"generation_s": 0.0, "scoring_s": 0.0}
        for method, key in (
            ("_generate_and_score_completions", "generation_s"),
            ("_compute_loss", "scoring_s"),
        ):
            setattr(trainer, method, self._timed(getattr(trainer, method), key))
        timer = self

        class Clock(TrainerCallback):
            def on_step_begin(self, args, state, control, **kwargs):
                timer._current = {"generation_s": 0.0, "scoring_s": 0.0}
                timer._batches = []
                timer._start = time.perf_counter()

            def on_step_end(self, args, state, control, **kwargs):
                total = time.perf_counter() - timer._start
                rest = total - timer._current["generation_s"] - timer._current["scoring_s"]
                work = step_work.batch_work(timer._batches)
                timer.steps.append({"step_s": total, **timer._current, "backward_s": rest,
                                    **work})  # fmt: skip

        trainer.add_callback(Clock())

    def _timed(self, method: Any, key: str) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                result = method(*args, **kwargs)
            finally:
                self._current[key] += time.perf_counter() - start
            if key == "generation_s":  # the batch the step trains on, counted after the step
                self._batches.append(result)
            return result

        return wrapper

    def summary(self) -> dict[str, Any]:
        """The median of each part, of the forward and backward (``train_s``: scoring and the
        rest) and of the tokens trained, over the steps after the first (all, with one step)."""
        timed = self.steps[1:] or self.steps
        parts = ("step_s", "generation_s", "scoring_s", "backward_s", *COUNTS)
        medians = {p: statistics.median(s[p] for s in timed) for p in parts}
        train_s = statistics.median(s["scoring_s"] + s["backward_s"] for s in timed)
        return {**medians, "train_s": train_s, "steps": self.steps}


def training_dtype(trainer: Any) -> str:
    """The dtype a trainer's matmuls run in: ``bfloat16`` under bf16 autocast, else its
    weights'."""
    return "bfloat16" if getattr(trainer.args, "bf16", False) else dtype_of(trainer.model)


# --- the trainers --------------------------------------------------------------------------------


def build_ours(model_path: str, tasks, args: Args, out: Path, steps: int, **ablation: Any):
    from llm_gym.envs.tool_use_game import ToolUseGameEnv
    from trainers import GRPOConfig
    from trainers.grpo.train import load_tasks
    from trainers.grpo.trainer import MultiTurnGRPOTrainer

    config = GRPOConfig(
        model=model_path,
        batch_size=args.batch_size,
        episodes_per_task=args.episodes_per_task,
        num_steps=steps,
        max_turns=args.max_turns,
        max_tokens_per_turn=args.max_tokens_per_turn,
        max_model_length=1024,
        learning_rate=args.learning_rate,
        lr_scheduler_type="linear",
        warmup_steps=args.warmup_steps,
        scale_rewards="none",
        max_sampling_attempts=1,  # no refills: the same episodes per step as TRL
        loss_type="dapo",
        beta=0.0,
        temperature=1.0,
        validation_interval=None,
        use_cpu=True,
        output_dir=str(out),
        save_strategy="no",
        logging_steps=1,
        report_to="none",
        seed=args.seed,
        **ablation,
    )
    return MultiTurnGRPOTrainer(
        args=config, env_factory=ToolUseGameEnv, tasks=load_tasks(tasks), model=None
    )


def answer_reward(completions, target, **kwargs) -> list[float]:
    """ToolUseGame's reward on TRL's completions: 1.0 for a final reply matching the target, the
    parse-failure reward for a reply holding a tool call TRL could not parse, else 0.0."""
    from llm_gym.core.tool_env import answers_match, extract_answer

    rewards = []
    for completion, expected in zip(completions, target, strict=True):
        last = completion[-1] if completion else {}
        text = (last.get("content") or "") if isinstance(last, dict) else str(last)
        if isinstance(last, dict) and last.get("tool_calls"):
            rewards.append(0.0)  # still calling tools at the turn limit, as ours' max_turns
        elif "<tool_call>" in text:
            rewards.append(PARSE_FAILURE_REWARD)
        else:
            rewards.append(float(answers_match(extract_answer(text), expected)))
    return rewards


def build_trl(model_path: str, tasks, args: Args, out: Path, steps: int, tokenizer: Any):
    from benchmarks.rollout_trl import build_trl as build
    from benchmarks.rollout_trl import check_identical_prompts

    trainer = build(
        model_path,
        tasks,
        args,
        reward_funcs=[answer_reward],
        output_dir=str(out),
        per_device_train_batch_size=args.batch_size * args.episodes_per_task,
        gradient_accumulation_steps=1,
        learning_rate=args.learning_rate,
        lr_scheduler_type="linear",
        warmup_steps=args.warmup_steps,
        scale_rewards="none",
        loss_type="dapo",
        max_steps=steps,
        logging_steps=1,
        seed=args.seed,
    )
    check_identical_prompts(trainer, tokenizer, tasks[:32])
    return trainer


def train(name: str, model_path: str, tasks, args: Args, out: Path, steps: int, tokenizer: Any):
    """One fresh trainer of contender ``name`` run for ``steps`` steps: (trainer, timer)."""
    if name == "trl":
        trainer = build_trl(model_path, tasks, args, out, steps, tokenizer)
    else:
        trainer = build_ours(model_path, tasks, args, out, steps, **OURS[name])
    timer = StepTimer(trainer)
    trainer.train()
    return trainer, timer


# --- the benchmark -------------------------------------------------------------------------------


def evaluate(model_path: str, args: Args, label: str) -> dict[str, Any]:
    """Greedy and sampled ``run_and_report`` reports of one model on the test tasks."""
    from llm_gym.eval import run_and_report
    from llm_gym.policies.hf import HFPolicy

    reports = {}
    for mode, temperature, k in (("greedy", 0.0, 1), ("sampled", 1.0, args.eval_samples)):
        policy = HFPolicy.from_pretrained(
            model_path,
            device="cpu",
            temperature=temperature,
            max_new_tokens=args.max_tokens_per_turn,
            seed=args.seed,
        )
        policy.name = f"{label}_{mode}"
        reports[mode] = run_and_report(
            "ToolUseGame-v0",
            policy,
            split="test",
            episodes=args.eval_tasks * k,
            k=k,
            seed=args.seed,
            max_turns=args.max_turns,
            progress=False,
            print_report=False,
        )
    return reports


def quality(model_path: str, tasks, args: Args, tmp: Path, tokenizer: Any) -> dict[str, Any]:
    """Ours and TRL trained ``quality_steps`` steps each, and the start, on held-out tasks."""
    from trainers.pipeline.eval import paired_gain

    start = evaluate(model_path, args, "start")
    result: dict[str, Any] = {}
    for name in ("ours", "trl"):
        trainer, _ = train(name, model_path, tasks, args, tmp / f"q_{name}", args.quality_steps,
                           tokenizer)  # fmt: skip
        trainer.save_model(str(tmp / f"q_{name}" / "final"))
        tokenizer.save_pretrained(str(tmp / f"q_{name}" / "final"))
        after = evaluate(str(tmp / f"q_{name}" / "final"), args, name)
        result[name] = {
            mode: {k: v for k, v in paired_gain(start[mode], after[mode]).items()} for mode in start
        }
        result[name]["train_reward"] = [
            h["reward"] for h in trainer.state.log_history if "reward" in h
        ]
    return result


def main(args: Args) -> dict[str, Any]:
    check_repeats(args.repeats, args.quick)
    threads = pin_threads(args.threads)
    register_waves_policy()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from llm_gym.envs.tool_use_game import get_tasks

    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    model_path = args.model or default_model("sft")
    settings = {**asdict(args), "model": model_path}
    conditions = Conditions.start(NAME, threads=threads, settings=settings, quick=args.quick)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    shape = ModelShape.of(AutoModelForCausalLM.from_pretrained(model_path))
    roof = measure_model(shape, args.batch_size * args.episodes_per_task, quick=args.quick,
                         repeats=args.repeats, log=print)  # fmt: skip
    tasks = list(get_tasks("train"))
    with tempfile.TemporaryDirectory(prefix="llm_gym_train_step_") as tmp:

        def contender(name: str):
            def run(repeat: int) -> dict[str, Any]:
                out = Path(tmp) / f"{name}_{repeat}"
                trainer, timer = train(name, model_path, tasks, args, out, args.steps, tokenizer)
                dtypes = {
                    "dtype": training_dtype(trainer),
                    "weights_dtype": dtype_of(trainer.model),
                }
                return {**timer.summary(), "wall_s": timer.summary()["step_s"], **dtypes}

            return run

        result = interleave({n: contender(n) for n in args.contenders}, args.repeats,
                            order=args.order, seed=args.seed, log=print)  # fmt: skip
        held_out = {}
        if args.quality_steps and "trl" in args.contenders:
            held_out = quality(model_path, tasks, args, Path(tmp), tokenizer)
    conditions.finish()
    summary = summarize(result, held_out, shape, roof)
    out = output_dir(args.quick, args.out_dir, args.write)
    text = report(summary, conditions, args, model_path, roof.describe())
    print(text)
    if out is not None:
        write_markdown(NAME, text, out)
        write_json(NAME, {"benchmark": NAME, "conditions": conditions.as_json(), **summary}, out)
    return summary


def parse_args(argv: list[str] | None = None) -> Args:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    for name in ("steps", "quality_steps", "batch_size", "episodes_per_task", "max_turns",
                 "max_tokens_per_turn", "eval_tasks", "eval_samples"):  # fmt: skip
        parser.add_argument("--" + name.replace("_", "-"), type=int, default=None)
    parser.add_argument("--learning-rate", type=float, default=None)
    parser.add_argument("--contenders", nargs="+", choices=Args.contenders, default=None,
                        help="the contenders to time (default: all; ours among them)")  # fmt: skip
    add_harness_arguments(parser, repeats=Args.repeats, threads=Args.threads)
    ns = vars(parser.parse_args(argv))
    sizes = Args.quick_sizes() if ns["quick"] else {}
    given = {f.name: ns[f.name] for f in fields(Args) if ns.get(f.name) is not None}
    if "contenders" in given:
        if "ours" not in given["contenders"]:
            parser.error(f"--contenders must include ours, got {given['contenders']}")
        given["contenders"] = tuple(dict.fromkeys(given["contenders"]))
    return Args(**{**sizes, **given})


if __name__ == "__main__":
    main(parse_args())
