"""Training step, side by side in one run: our ``MultiTurnGRPOTrainer`` against TRL's
``GRPOTrainer`` with ``environment_factory`` (TRL's own multi-turn tool loop).

Both start from the same tools-calling model (the SFT-warmed tiny model), train on the same
ToolUseGame train tasks with the same seed, group size, tasks per step, turn limit, learning rate,
loss (``dapo``, ``beta=0``) and number of optimizer steps, on the CPU, one after the other. We
report seconds per optimizer step (median over the steps; rollout and update together) and the
held-out success of each final model and of the starting model, measured by the same evaluator
on the same val tasks: sampled (``val_samples`` episodes a task at the training temperature, the
policy both trainers optimise; the gain over the start is paired by task) and greedy.

    python -m benchmarks.train_step --model outputs/tool_use_game_tiny/sft

Targets (issue 4): our step <= 0.67x TRL's, our val success >= TRL's (sampled).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS_DIR, machine_description, write_markdown


@dataclass
class Args:
    model: str | None = None
    """A tools-calling model directory (None: the rollout benchmark's SFT-warmed tiny model)."""
    steps: int = 20
    """Optimizer steps per trainer."""
    batch_size: int = 16
    """Tasks per optimizer step."""
    episodes_per_task: int = 8
    """Episodes per task (the group)."""
    max_turns: int = 6
    """Assistant turns per episode (TRL: ``max_tool_calling_iterations = max_turns - 1``)."""
    max_tokens_per_turn: int = 64
    """Generation budget per assistant turn (TRL has one budget for the whole completion:
    ``max_turns * max_tokens_per_turn``)."""
    learning_rate: float = 2e-4
    """Both trainers' peak learning rate (linear warmup, then linear decay, as the main job)."""
    warmup_steps: int = 5
    """Both trainers' warmup steps."""
    scale_rewards: str = "none"
    """Both trainers' advantage scaling (``none``: Dr. GRPO, the main job's choice)."""
    val_tasks: int = 200
    """Held-out ToolUseGame val tasks of the final evaluation."""
    val_samples: int = 8
    """Sampled episodes per val task (temperature 1.0), besides one greedy episode."""
    seed: int = 0
    """Seed of both trainers and of the evaluation."""
    sft_seconds: float = 120.0
    """SFT budget when no model is given."""
    out_dir: Path = RESULTS_DIR
    """Where train_step.md goes."""
    write: bool = True
    """Write the results file."""


def _step_clock(times: list[float]) -> Any:
    from transformers import TrainerCallback

    class StepClock(TrainerCallback):
        """Wall time of each optimizer step (generation, scoring and update)."""

        def on_step_begin(self, args, state, control, **kwargs):
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            times.append(time.perf_counter() - self.start)

    return StepClock()


def run_ours(model_path: str, tasks, args: Args, out: Path) -> dict[str, Any]:
    from llm_gym.envs.tool_use_game import ToolUseGameEnv
    from trainers import GRPOConfig, train_multi_turn

    times: list[float] = []
    config = GRPOConfig(
        model=model_path,
        batch_size=args.batch_size,
        episodes_per_task=args.episodes_per_task,
        num_steps=args.steps,
        max_turns=args.max_turns,
        max_tokens_per_turn=args.max_tokens_per_turn,
        max_model_length=1024,
        learning_rate=args.learning_rate,
        lr_scheduler_type="linear",
        warmup_steps=args.warmup_steps,
        scale_rewards=args.scale_rewards,
        max_sampling_attempts=1,  # no refills: the same episodes per step as TRL
        loss_type="dapo",
        beta=0.0,
        temperature=1.0,
        wandb_project=None,
        validation_interval=None,
        use_cpu=True,
        output_dir=str(out / "ours"),
        save_strategy="no",
        logging_steps=1,
        report_to="none",
        seed=args.seed,
    )
    trainer = train_multi_turn(
        config, tasks=tasks, env_factory=ToolUseGameEnv, callbacks=[_step_clock(times)]
    )
    trainer.save_model(str(out / "ours" / "final"))
    return {"step_times": times, "model": str(out / "ours" / "final"), "log": _rewards(trainer)}


def run_trl(model_path: str, tasks, args: Args, out: Path) -> dict[str, Any]:
    import warnings

    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from benchmarks.rollout_throughput import trl_environment
    from llm_gym.core.tool_env import answers_match, extract_answer
    from llm_gym.envs.tool_use_game import SYSTEM_PROMPT

    warnings.filterwarnings("ignore")
    rows = [
        {
            "prompt": [
                {"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": t.prompt},
            ],
            "target": str(t.target),
        }
        for t in tasks
    ]

    def answer_reward(completions, target, **kwargs):
        """ToolUseGame's reward: 1.0 when the final reply matches the target."""
        rewards = []
        for completion, expected in zip(completions, target, strict=True):
            last = completion[-1] if completion else {}
            text = last.get("content") or "" if isinstance(last, dict) else str(last)
            final = not (isinstance(last, dict) and last.get("tool_calls"))
            rewards.append(float(final and answers_match(extract_answer(text), expected)))
        return rewards

    times: list[float] = []
    config = GRPOConfig(
        output_dir=str(out / "trl"),
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        num_generations=args.episodes_per_task,
        per_device_train_batch_size=args.batch_size * args.episodes_per_task,
        gradient_accumulation_steps=1,
        max_completion_length=args.max_turns * args.max_tokens_per_turn,
        max_tool_calling_iterations=args.max_turns - 1,
        temperature=1.0,
        learning_rate=args.learning_rate,
        lr_scheduler_type="linear",
        warmup_steps=args.warmup_steps,
        scale_rewards=args.scale_rewards,
        loss_type="dapo",
        beta=0.0,
        max_steps=args.steps,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        seed=args.seed,
    )
    trainer = GRPOTrainer(
        model=model_path,
        reward_funcs=[answer_reward],
        args=config,
        train_dataset=Dataset.from_list(rows),
        environment_factory=trl_environment(),
        callbacks=[_step_clock(times)],
    )
    trainer.train()
    trainer.save_model(str(out / "trl" / "final"))
    return {"step_times": times, "model": str(out / "trl" / "final"), "log": _rewards(trainer)}


def _rewards(trainer: Any) -> list[float]:
    return [h["reward"] for h in trainer.state.log_history if "reward" in h]


def evaluate(model_path: str, args: Args, label: str) -> dict[str, Any]:
    """Greedy and sampled ``run_and_report`` reports of one model on the val tasks."""
    from llm_gym.eval import run_and_report
    from llm_gym.policies.hf import HFPolicy

    reports = {}
    for mode, temperature, k in (("greedy", 0.0, 1), ("sampled", 1.0, args.val_samples)):
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
            split="val",
            episodes=args.val_tasks * k,
            k=k,
            seed=args.seed,
            max_turns=args.max_turns,
            progress=False,
            print_report=False,
        )
    return reports


def main(args: Args) -> dict[str, Any]:
    import torch

    from benchmarks.rollout_throughput import Args as RolloutArgs
    from benchmarks.rollout_throughput import warm_model
    from llm_gym.envs.tool_use_game import TOOL_USE_GAME_TASKS
    from trainers.pipeline_eval import paired_gain

    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    model_path = warm_model(RolloutArgs(model=args.model, sft_seconds=args.sft_seconds))
    tasks = list(TOOL_USE_GAME_TASKS)
    with tempfile.TemporaryDirectory(prefix="llm_gym_train_step_") as tmp:
        out = Path(tmp)
        start = evaluate(model_path, args, "start")
        ours = run_ours(model_path, tasks, args, out)
        ours["val"] = evaluate(ours["model"], args, "ours")
        trl = run_trl(model_path, tasks, args, out)
        trl["val"] = evaluate(trl["model"], args, "trl")
    for result in (ours, trl):
        result["step_s"] = statistics.median(result["step_times"])
        result["gain"] = {mode: paired_gain(start[mode], result["val"][mode]) for mode in start}
    ratio = ours["step_s"] / trl["step_s"]
    trl_budget = args.max_turns * args.max_tokens_per_turn

    def success(r: dict[str, Any], mode: str) -> float:
        return r["gain"][mode]["success_after"]

    def row(name: str, r: dict[str, Any]) -> str:
        cells = []
        for mode in ("sampled", "greedy"):
            g = r["gain"][mode]
            low, high = g["gain_ci"]
            cells.append(f"{g['success_after']:.3f} ({g['gain']:+.3f} [{low:+.3f}, {high:+.3f}])")
        times = " ".join(f"{t:.1f}" for t in r["step_times"])
        return (
            f"| {name} | {r['step_s']:.2f} | {times} | {cells[0]} | {cells[1]} | "
            f"{statistics.fmean(r['log']):.3f} |"
        )

    start_sampled = ours["gain"]["sampled"]["success_before"]
    start_greedy = ours["gain"]["greedy"]["success_before"]

    lines = [
        "# Training step: MultiTurnGRPOTrainer vs TRL GRPOTrainer(environment_factory=...)",
        "",
        f"Machine: {machine_description()}, torch {torch.__version__}. Model: `{model_path}` "
        f"(the SFT-warmed tiny model). ToolUseGame-v0 train tasks, {args.batch_size} tasks x "
        f"{args.episodes_per_task} episodes per step, up to {args.max_turns} turns "
        f"({args.max_tokens_per_turn} tokens per turn; TRL: {trl_budget} tokens per completion), "
        f"{args.steps} steps, lr {args.learning_rate} (warmup {args.warmup_steps}, linear decay), "
        f"dapo, beta 0, scale_rewards {args.scale_rewards}, temperature 1.0, seed {args.seed}; "
        "ours without dynamic-sampling refills, so both collect the same episodes per step. "
        f"Val: the same evaluator for every model on {args.val_tasks} val tasks, "
        f"{args.val_samples} sampled episodes a task at temperature 1.0 (the trained policy) "
        "and one greedy; in brackets the gain over the starting model, paired by task, with its "
        "95% interval.",
        "",
        "| trainer | s / step (median) | every step (s) | val success, sampled (gain) | "
        "val success, greedy (gain) | mean train reward |",
        "| --- | ---: | --- | --- | --- | ---: |",
        row("llm_gym MultiTurnGRPOTrainer", ours),
        row("TRL GRPOTrainer + environment_factory", trl),
        "",
        f"Starting model: val success {start_sampled:.3f} sampled, {start_greedy:.3f} greedy.",
        "",
        f"Step time ratio (ours / TRL): **{ratio:.2f}** (target <= 0.67). Val success, sampled: "
        f"ours {success(ours, 'sampled'):.3f} vs TRL {success(trl, 'sampled'):.3f} (target: ours "
        f">= TRL); greedy: ours {success(ours, 'greedy'):.3f} vs TRL "
        f"{success(trl, 'greedy'):.3f}.",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.write:
        write_markdown("train_step", text, args.out_dir)
    return {"ours": ours, "trl": trl, "start": start, "ratio": ratio}


def parse_args(argv: list[str] | None = None) -> Args:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--steps", type=int, default=Args.steps)
    parser.add_argument("--batch-size", type=int, default=Args.batch_size)
    parser.add_argument("--episodes-per-task", type=int, default=Args.episodes_per_task)
    parser.add_argument("--max-turns", type=int, default=Args.max_turns)
    parser.add_argument("--max-tokens-per-turn", type=int, default=Args.max_tokens_per_turn)
    parser.add_argument("--learning-rate", type=float, default=Args.learning_rate)
    parser.add_argument("--warmup-steps", type=int, default=Args.warmup_steps)
    parser.add_argument("--scale-rewards", default=Args.scale_rewards)
    parser.add_argument("--val-tasks", type=int, default=Args.val_tasks)
    parser.add_argument("--val-samples", type=int, default=Args.val_samples)
    parser.add_argument("--seed", type=int, default=Args.seed)
    parser.add_argument("--sft-seconds", type=float, default=Args.sft_seconds)
    parser.add_argument("--no-write", dest="write", action="store_false")
    ns = parser.parse_args(argv)
    if ns.val_samples < 1:
        parser.error(f"--val-samples must be >= 1, actual value: {ns.val_samples}.")
    return Args(**{k: v for k, v in vars(ns).items()})


if __name__ == "__main__":
    main(parse_args())
