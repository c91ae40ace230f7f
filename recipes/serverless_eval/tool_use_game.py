"""The cookbook's ``recipes/serverless_eval/tool_use_game.py``: a baseline score for ToolUseGame
before any training, with ``run_and_report`` (llm_gym's imports).

    python recipes/serverless_eval/tool_use_game.py                 # the tiny model, on CPU
    python recipes/serverless_eval/tool_use_game.py --seeds-model   # a hosted chat model
    python recipes/serverless_eval/tool_use_game.py --policy openai:MODEL@http://host:8000/v1

``--seeds-model`` asks an OpenAI-compatible endpoint (``OPENAI_BASE_URL``, ``OPENAI_API_KEY``)
for Qwen/Qwen3.8-27B, the model the GRPO recipe trains. ``--policy`` takes any policy spec
(``hf:PATH``, ``openai:MODEL@URL``, ``oracle``, ``random``); ``--episodes N`` and ``--split``
pick the tasks. The report: success with its 95% interval, pass@k, how episodes ended.
"""

from __future__ import annotations

import argparse
import os

from llm_gym.command_errors import positive_int
from llm_gym.eval import run_and_report
from llm_gym.models import build_tiny_model

SEEDS_MODEL = "Qwen/Qwen3.8-27B"


def main(argv: list[str] | None = None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds-model", action="store_true", help=f"score {SEEDS_MODEL}")
    parser.add_argument("--policy", help="a policy spec (default: the tiny model)")
    parser.add_argument("--episodes", type=positive_int, default=64, help="episodes (64)")
    parser.add_argument("--split", default="val", choices=["train", "val", "test"])
    args = parser.parse_args(argv)
    policy = args.policy
    if policy is None and args.seeds_model:
        base_url = os.environ.get("OPENAI_BASE_URL", "https://api.together.xyz/v1")
        policy = f"openai:{SEEDS_MODEL}@{base_url}"
    if policy is None:
        policy = "hf:" + str(build_tiny_model(envs=["ToolUseGame-v0"]))

    return run_and_report(
        "ToolUseGame-v0",
        policy,
        split=args.split,
        episodes=args.episodes,
        max_model_length=2048,
        max_new_tokens=256,
    )


if __name__ == "__main__":
    main()
