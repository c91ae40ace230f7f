"""Your own agent trained on the CPU: does the train reward of an agent's episodes rise?

An agent with its own tool loop on the official ``openai`` client (the env's tools called by the
agent itself, its final answer graded by the environment) plays ToolUseGame-v0 against the
trainer's training endpoint (``train_multi_turn(agent=...)``), with the main job's GRPO
settings (``configs/tool_use_game_tiny.yaml``) at a smaller batch, for a few steps. The start
is the main job's SFT model when one is there (``benchmarks.common.main_job_model``), else a
shorter SFT warm start of the same recipe (``--sft-steps`` steps of each phase's count,
cached under the benchmark cache). Logs the reward and the agent's calls per step and writes
``agent_training.md`` and ``agent_training.json``.

    python -m benchmarks.agent_training                          # about 5 to 9 min on 2 cores
    python -m benchmarks.agent_training --quick --model PATH     # smoke run, writes nothing
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.common import (
    Conditions,
    cache_dir,
    main_job_model,
    output_dir,
    thread_settings,
    write_json,
    write_markdown,
)
from llm_gym.core.task import Task

NAME = "agent_training"
CONFIG = Path(__file__).resolve().parents[1] / "configs" / "tool_use_game_tiny.yaml"
NO_GRPO = {
    "grpo.num_steps": 1,
    "grpo.batch_size": 2,
    "grpo.episodes_per_task": 2,
    "grpo.max_turns": 2,
    "grpo.max_tokens_per_turn": 8,
    "grpo.validation_interval": None,
    "grpo.keep_best": None,
    "val_tasks": 0,
    "evaluation": None,
}
"""The pipeline's GRPO and evaluations shrunk to nothing: only its SFT warm start is kept."""


async def tool_loop_agent(base_url: str, task: Task) -> str:
    """The official client and a hand-written tool loop: the env's tools, called here, until
    the model answers without a tool call (its answer) or the endpoint ends the episode."""
    import openai

    from llm_gym.envs.tool_use_game import ToolUseGameEnv

    env = ToolUseGameEnv()
    messages: list[dict[str, Any]] = await env.reset(task)
    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
    try:
        while True:  # the endpoint refuses the call past max_turns: the episode ends there
            reply = await client.chat.completions.create(
                model="policy", messages=messages, tools=env.tool_specs
            )
            message = reply.choices[0].message
            if not message.tool_calls:
                return message.content or ""
            messages.append(message.model_dump(exclude_none=True))
            for call in message.tool_calls:
                content, _ = await env.call_tool(call.function.name, call.function.arguments)
                messages.append({"role": "tool", "tool_call_id": call.id, "content": content})
    finally:
        await env.close()
        await client.close()


def warm_start(args: argparse.Namespace) -> str:
    """The model GRPO starts from: ``--model``, the main job's SFT model, or a shorter SFT
    warm start of the main job's recipe (built once, then read from the cache)."""
    if args.model:
        return str(args.model)
    found = main_job_model()
    if found is not None:
        return found
    from trainers.pipeline.run import load_config, run_pipeline

    folder = cache_dir() / f"agent-training-sft-{args.sft_steps}"
    if (folder / "sft" / "config.json").exists():
        return str(folder / "sft")
    steps = args.sft_steps
    overrides = {
        **NO_GRPO,
        "output_dir": str(folder),
        "sft.episodes": 16 * steps,
        "sft.short_context_steps": steps,
        "sft.max_steps": max(1, steps // 4),
    }
    print(f"== a shorter SFT warm start ({steps} + {max(1, steps // 4)} steps)", flush=True)
    return str(run_pipeline(load_config(CONFIG, overrides))["start_model"])


def run(args: argparse.Namespace) -> dict[str, Any]:
    from trainers import train_multi_turn
    from trainers.pipeline.run import build_grpo_config, check_pipeline, load_config

    conditions = Conditions.start(
        NAME, threads=thread_settings(), settings={k: str(v) for k, v in vars(args).items()},
        quick=args.quick,
    )  # fmt: skip
    model = warm_start(args)
    with tempfile.TemporaryDirectory(prefix="llm_gym_agent_training_") as tmp:
        overrides = {
            "output_dir": tmp,
            "grpo.num_steps": args.steps,
            "grpo.batch_size": args.batch_size,
            "grpo.episodes_per_task": args.episodes_per_task,
            "grpo.validation_interval": None,
            "grpo.keep_best": None,
            "grpo.warmup_steps": min(5, args.steps // 4),
            "grpo.max_steps_off_policy": args.max_steps_off_policy,
            "val_tasks": 0,
        }
        if args.quick:
            overrides.update({"grpo.max_turns": 2, "grpo.max_tokens_per_turn": 16})
        config = load_config(CONFIG, overrides)
        config.sft = None
        entry, tasks, max_turns = check_pipeline(config)
        grpo = build_grpo_config(config, model, max_turns=max_turns, use_cpu=True)
        grpo.agent_timeout_s = 120.0
        trainer = train_multi_turn(
            grpo, tasks=tasks, env_factory=entry.env_factory(), agent=tool_loop_agent
        )
    conditions.finish()
    log = [r for r in trainer.state.log_history if "reward" in r]
    keys = ("reward", "episodes/success_rate", "episodes/turns_mean", "truncated_ratio",
            "episodes/tool_calls_mean", "zero_variance_skip_ratio", "step_time")  # fmt: skip
    steps = [{"step": r["step"], **{k: r[k] for k in keys if k in r}} for r in log]
    return {
        "benchmark": NAME,
        "conditions": conditions.as_json(),
        "start_model": model,
        "settings": {
            "steps": args.steps,
            "batch_size": args.batch_size,
            "episodes_per_task": args.episodes_per_task,
            "max_turns": grpo.max_turns,
            "max_tokens_per_turn": grpo.max_tokens_per_turn,
            "learning_rate": grpo.learning_rate,
            "max_steps_off_policy": args.max_steps_off_policy,
        },
        "steps": steps,
        "trend": trend([s["reward"] for s in steps]),
    }


def trend(rewards: list[float]) -> dict[str, float]:
    """The least-squares slope of reward over steps, and the means of the first and last
    thirds (at least one step each).

    Example:
        >>> trend([0.0, 0.1, 0.2])
        {'slope_per_step': 0.1, 'first_third': 0.0, 'last_third': 0.2}
    """
    n = len(rewards)
    if n < 2:
        value = rewards[0] if rewards else 0.0
        return {"slope_per_step": 0.0, "first_third": value, "last_third": value}
    xs = range(n)
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(rewards)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, rewards, strict=True)) / sum(
        (x - mean_x) ** 2 for x in xs
    )
    third = max(1, n // 3)
    return {
        "slope_per_step": round(slope, 6),
        "first_third": round(statistics.fmean(rewards[:third]), 6),
        "last_third": round(statistics.fmean(rewards[-third:]), 6),
    }


def report(result: dict[str, Any]) -> str:
    s, t = result["settings"], result["trend"]
    lines = [
        "# Your own agent, trained on the CPU (tiny model, ToolUseGame-v0)",
        "",
        Conditions(**result["conditions"]).describe(),
        "",
        f"An `openai`-client agent with its own tool loop, trained with "
        f"`train_multi_turn(agent=...)` from `{result['start_model']}`: {s['steps']} steps of "
        f"{s['batch_size']} tasks x {s['episodes_per_task']} episodes, at most "
        f"{s['max_turns']} calls of {s['max_tokens_per_turn']} tokens an episode, learning rate "
        f"{s['learning_rate']:g}, max_steps_off_policy {s['max_steps_off_policy']}.",
        "",
        "| step | reward | success | calls an episode | tool calls | truncated | groups without "
        "variance | step s |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    nan = float("nan")
    for r in result["steps"]:
        lines.append(
            f"| {r['step']} | {r['reward']:.3f} | {r.get('episodes/success_rate', nan):.3f} | "
            f"{r.get('episodes/turns_mean', nan):.2f} | "
            f"{r.get('episodes/tool_calls_mean', nan):.2f} | "
            f"{r.get('truncated_ratio', nan):.2f} | "
            f"{r.get('zero_variance_skip_ratio', nan):.2f} | {r.get('step_time', nan):.1f} |"
        )
    lines += [
        "",
        f"Reward: first third {t['first_third']:.3f}, last third {t['last_third']:.3f}, "
        f"least-squares slope {t['slope_per_step']:+.4f} a step. A group whose episodes all "
        "got the same reward has zero advantages: it teaches nothing (`groups without variance`).",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="start here (default: see the docstring)")
    parser.add_argument("--sft-steps", type=int, default=300, help="the shorter warm start's")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--episodes-per-task", type=int, default=4)
    parser.add_argument("--max-steps-off-policy", type=int, default=None)
    parser.add_argument("--quick", action="store_true", help="tiny sizes; writes nothing")
    parser.add_argument("--out-dir", type=Path, default=None)
    parser.add_argument("--no-write", dest="write", action="store_false")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.batch_size, args.episodes_per_task = 1, 2, 2
    result = run(args)
    print(report(result), flush=True)
    out = output_dir(args.quick, args.out_dir, args.write)
    if out is not None:
        write_json(NAME, result, out)
        write_markdown(NAME, report(result), out)
    print(json.dumps(result["trend"]))
    return result


if __name__ == "__main__":
    main()
