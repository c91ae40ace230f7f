"""The cookbook's ``recipes/grpo/tool_use_game.py``: the seeds' code, with llm_gym's imports.

    python recipes/grpo/tool_use_game.py                # the embedded tiny model, on CPU
    python recipes/grpo/tool_use_game.py --seeds-model  # the seeds' Qwen/Qwen3.8-27B (GPU, hub)
    python recipes/grpo/tool_use_game.py --model smollm2-135m-instruct   # any model

``--num-steps N`` and ``--tasks N`` (the first N tasks, validation on the same) shorten a run.
The tiny model starts from random weights, so on it this recipe shows the loop, not learning:
the main job (``train.py --config configs/tool_use_game_tiny.yaml``) warm-starts it first. W&B
is on, as in the cookbook; with the tiny model it logs offline unless ``WANDB_MODE`` says else.
"""

from __future__ import annotations

import argparse
import os

from llm_gym.command_errors import positive_int
from llm_gym.envs.tool_use_game import TOOL_USE_GAME_TASKS, ToolUseGameEnv
from llm_gym.models import build_tiny_model
from trainers.grpo.config import GRPOConfig
from trainers.grpo.train import train_multi_turn

SEEDS_MODEL = "Qwen/Qwen3.8-27B"


def main(argv: list[str] | None = None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds-model", action="store_true", help=f"train {SEEDS_MODEL}")
    parser.add_argument("--model", help="a model folder, .gguf file, packaged name or hub id")
    parser.add_argument("--num-steps", type=positive_int, default=200, help="optimizer steps (200)")
    parser.add_argument("--tasks", type=positive_int, default=None, help="the first N tasks (all)")
    args = parser.parse_args(argv)
    model = args.model or (SEEDS_MODEL if args.seeds_model else None)
    if model is None:
        model = str(build_tiny_model(envs=["ToolUseGame-v0"]))  # the main job's, cached
        os.environ.setdefault("WANDB_MODE", "offline")

    # --- the seeds' code -------------------------------------------------------------------
    tasks = list(TOOL_USE_GAME_TASKS)[: args.tasks]

    config = GRPOConfig(
        model=model,
        batch_size=4,
        episodes_per_task=8,
        num_steps=args.num_steps,
        validation_interval=10,
        max_turns=6,
        max_model_length=2048,
        learning_rate=2e-5,
        wandb_project="grpo-tool-use-game",
        sequential_validation=True,
        max_sampling_attempts=2,
    )

    return train_multi_turn(
        config,
        tasks=tasks,
        env_factory=lambda task: ToolUseGameEnv(),
        val_tasks=tasks,
    )


if __name__ == "__main__":
    main()
