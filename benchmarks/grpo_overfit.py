"""Does GRPO raise success on the very tasks it trains on? A direction check for the trainer.

Trains ``MultiTurnGRPOTrainer`` on a few ToolUseGame train tasks and scores the same tasks
before and after, sampled (temperature 1.0, ``--samples`` per task) and greedy:

    python -m benchmarks.grpo_overfit --model outputs/tool_use_game_tiny/sft

A working trainer lifts both; held-out success is the main job's business (main_job.md).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path


def _score(path: str, tasks: list, samples: int) -> tuple[float, float]:
    from llm_gym.envs.tool_use_game import ToolUseGameEnv
    from llm_gym.eval import run_and_report
    from llm_gym.policies.hf import HFPolicy

    out = []
    for temperature, k in ((1.0, samples), (0.0, 1)):
        policy = HFPolicy.from_pretrained(path, temperature=temperature, max_new_tokens=64, seed=0)
        report = run_and_report(
            ToolUseGameEnv,
            policy,
            tasks=tasks,
            episodes=len(tasks) * k,
            k=k,
            max_turns=6,
            print_report=False,
            progress=False,
        )
        out.append(report.metrics["success_rate"])
    return out[0], out[1]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="outputs/tool_use_game_tiny/sft")
    parser.add_argument("--tasks", type=int, default=16, help="train tasks (lookup_arith, compare)")
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--learning-rate", type=float, default=1e-4)
    parser.add_argument("--samples", type=int, default=16, help="sampled episodes per task")
    args = parser.parse_args(argv)

    from llm_gym.envs.tool_use_game import ToolUseGameEnv, get_tasks
    from trainers import GRPOConfig, train_multi_turn

    kinds = ("lookup_arith", "compare")
    tasks = [t for t in get_tasks("train") if t.metadata["type"] in kinds][: args.tasks]
    before = _score(args.model, tasks, args.samples)
    print(f"before: sampled {before[0]:.3f}, greedy {before[1]:.3f}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        config = GRPOConfig(
            output_dir=tmp,
            model=args.model,
            batch_size=4,
            episodes_per_task=8,
            num_steps=args.steps,
            max_turns=6,
            max_model_length=1024,
            max_tokens_per_turn=64,
            learning_rate=args.learning_rate,
            loss_type="dapo",
            beta=0.0,
            report_to="none",
            save_strategy="no",
            use_cpu=True,
            logging_steps=1,
        )
        trainer = train_multi_turn(config, tasks=tasks, env_factory=ToolUseGameEnv)
        final = str(Path(tmp) / "final")
        trainer.save_model(final)
        trainer.processing_class.save_pretrained(final)
        after = _score(final, tasks, args.samples)
    print(f"after:  sampled {after[0]:.3f}, greedy {after[1]:.3f}", flush=True)


if __name__ == "__main__":
    main()
