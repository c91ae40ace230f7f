"""The cookbook's ``recipes/grpo/tool_use_game_async.py``: async GRPO on ToolUseGame, the seeds'
config with llm_gym's imports.

    python recipes/grpo/tool_use_game_async.py                # the tiny model, on CPU
    python recipes/grpo/tool_use_game_async.py --seeds-model  # Qwen/Qwen3.6-35B-A3B (GPU, hub)
    python recipes/grpo/tool_use_game_async.py --model smollm2-135m-instruct   # any model

Rollout workers collect ``groups_in_flight`` groups continuously on ``num_generator_replicas``
generator copies while the trainer steps; a group older than ``max_steps_off_policy`` steps is
dropped (watch ``async/train_wait_s`` and ``async/dropped_stale_groups``). ``--num-steps`` and
``--tasks`` shorten a run; W&B as in ``recipes/grpo/tool_use_game.py``.
"""

from __future__ import annotations

import argparse
import os

from llm_gym.command_errors import positive_int
from llm_gym.envs.tool_use_game import TOOL_USE_GAME_TASKS, ToolUseGameEnv
from llm_gym.models import build_tiny_model
from trainers.grpo.config import GRPOConfig
from trainers.grpo.train import train_multi_turn

SEEDS_MODEL = "Qwen/Qwen3.6-35B-A3B"


def main(argv: list[str] | None = None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds-model", action="store_true", help=f"train {SEEDS_MODEL}")
    parser.add_argument("--model", help="a model folder, .gguf file, packaged name or hub id")
    parser.add_argument("--num-steps", type=positive_int, default=100, help="optimizer steps (100)")
    parser.add_argument("--tasks", type=positive_int, default=None, help="the first N tasks (all)")
    args = parser.parse_args(argv)
    model = args.model or (SEEDS_MODEL if args.seeds_model else None)
    if model is None:
        model = str(build_tiny_model(envs=["ToolUseGame-v0"]))
        os.environ.setdefault("WANDB_MODE", "offline")
    tasks = list(TOOL_USE_GAME_TASKS)[: args.tasks]

    # --- the seeds' config ------------------------------------------------------------------
    config = GRPOConfig(
        model=model,
        max_turns=6,
        batch_size=4,
        episodes_per_task=8,
        max_steps_off_policy=1,
        groups_in_flight=8,
        num_generator_replicas=2,
        num_steps=args.num_steps,
        wandb_project="grpo-tool-use-game-async",
    )
    return train_multi_turn(config, tasks=tasks, env_factory=lambda task: ToolUseGameEnv())


if __name__ == "__main__":
    main()
