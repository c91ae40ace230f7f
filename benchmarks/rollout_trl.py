"""TRL's own tool loop as a rollout contender: ``GRPOTrainer(environment_factory=...)`` generating
one batch (``_generate_and_score_completions``) on the ToolUseGame tasks, as
:mod:`benchmarks.rollout_throughput` times it.

Its settings are TRL's defaults around ours (issue 16 item 2 tunes them: the per-turn budget,
continuous batching, a warm-up and identical prompt ids)."""

from __future__ import annotations

import time
from typing import Any


def trl_environment():
    from llm_gym.envs.tool_use_game.env import list_fact_keys, lookup
    from llm_gym.tools.arithmetic import format_number, safe_eval

    class ToolUseGameTRL:
        """ToolUseGame's three tools as TRL environment methods."""

        def reset(self, **row):
            return None

        def list_fact_keys(self, prefix: str = "") -> str:
            """List the keys of the fact table, one per line.

            Args:
                prefix: Only list keys that start with this text, for example 'Velmora.'.

            Returns:
                The keys.
            """
            return list_fact_keys(prefix)

        def lookup(self, key: str) -> str:
            """Look up one fact by its key.

            Args:
                key: A fact key of the form 'Town.attribute', for example 'Velmora.population'.

            Returns:
                The value.
            """
            return lookup(key)

        def calculator(self, expression: str) -> str:
            """Evaluate an arithmetic expression with + - * / // % ** and parentheses.

            Args:
                expression: The expression.

            Returns:
                The value.
            """
            return format_number(safe_eval(expression))

    return ToolUseGameTRL


def run_trl(model_path: str, tasks, args: Any) -> dict[str, float]:
    """TRL's tool loop: GRPOTrainer(environment_factory=...) generating one batch."""
    import warnings

    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from llm_gym.envs.tool_use_game import SYSTEM_PROMPT

    warnings.filterwarnings("ignore")
    rows = [
        {
            "prompt": [
                {"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": t.prompt},
            ]
        }
        for t in tasks
    ]
    n = len(rows) * args.episodes_per_task
    config = GRPOConfig(
        output_dir="/tmp/llm_gym_bench_trl",
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        num_generations=args.episodes_per_task,
        per_device_train_batch_size=n,
        max_completion_length=args.max_turns * args.max_tokens_per_turn + 512,
        max_tool_calling_iterations=args.max_turns - 1,
        temperature=1.0,
        report_to="none",
        save_strategy="no",
        beta=0.0,
        seed=0,
    )
    trainer = GRPOTrainer(
        model=model_path,
        reward_funcs=[lambda completions, **kw: [0.0] * len(completions)],
        args=config,
        train_dataset=Dataset.from_list(rows),
        environment_factory=trl_environment(),
    )
    inputs = [row for row in rows for _ in range(args.episodes_per_task)]
    start = time.perf_counter()
    output = trainer._generate_and_score_completions(inputs)
    wall = time.perf_counter() - start
    tool_mask = output.get("tool_mask")
    completion_mask = output["completion_mask"]
    sampled = completion_mask * tool_mask if tool_mask is not None else completion_mask
    # Tool results are the masked-out runs inside a completion: count them per episode.
    env_runs = ((completion_mask == 1) & (tool_mask == 0)).int() if tool_mask is not None else None
    calls = 0.0
    if env_runs is not None:
        starts = env_runs[:, 1:] & (1 - env_runs[:, :-1])
        calls = (starts.sum() + env_runs[:, 0].sum()).item() / n
    return {
        "wall_s": wall,
        "episodes": n,
        "tokens": int(sampled.sum().item()),
        "tool_calls_mean": calls,
    }
