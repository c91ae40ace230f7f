"""``llm-gym eval``: score a policy on an environment (:func:`llm_gym.eval.run_and_report`),
print the table, and write the JSON record and the episodes where asked."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TextIO

__all__ = ["HELP", "add_arguments", "run"]

HELP = "score a policy on an environment (run_and_report)"


def add_arguments(
    p: argparse.ArgumentParser, add_task_option: Callable[[argparse.ArgumentParser], None]
) -> None:
    """The command's arguments (``add_task_option``: the shared ``--task-option``)."""
    p.add_argument("env_id")
    p.add_argument(
        "--policy", default="oracle", help="oracle | random[:SEED] | hf:PATH | openai:MODEL@URL"
    )
    p.add_argument("--split", default="val", choices=["train", "val", "test"])
    p.add_argument("--episodes", type=int, default=None, help="total episodes (default: split)")
    p.add_argument("--k", type=int, default=1, help="episodes per task; pass@k")
    p.add_argument(
        "--temperature", type=float, default=None, help="model policies: 0 is greedy (default 1)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-turns", type=int, default=None)
    p.add_argument("--max-new-tokens", type=int, default=None)
    p.add_argument("--max-model-length", type=int, default=None)
    p.add_argument(
        "--chat-template", default=None, metavar="NAME|PATH.jinja",
        help="hf: policies: the chat template for a model without one (a base model): "
        "chatml, gemma, or a .jinja file",
    )  # fmt: skip
    p.add_argument(
        "--action-format",
        default=None,
        help="how tool calls are written and parsed: auto (the format the model's chat template "
        "teaches, else the env's) or a registered format, pinned (default: the env's when it "
        "pins one, else auto)",
    )
    p.add_argument("--output", default=None, help="write the JSON record here")
    p.add_argument(
        "--save-episodes", default=None, metavar="PATH",
        help="write every episode here as JSONL (messages, tools, reward, tokens, versions)",
    )  # fmt: skip
    p.add_argument("--no-progress", action="store_true")
    add_task_option(p)


def run(
    args: argparse.Namespace,
    out: TextIO,
    assignments: Callable[[list[str]], dict[str, object]],
) -> int:
    """Run ``llm-gym eval`` with parsed ``args``; ``assignments`` reads ``--task-option``."""
    from llm_gym.eval import run_and_report
    from llm_gym.policies import policy_backend, policy_from_spec

    options: dict[str, object] = {"seed": args.seed}
    if args.temperature is not None and not policy_backend(args.policy.partition(":")[0]).scripted:
        options["temperature"] = args.temperature  # sampling settings are a model's
    if args.chat_template is not None:  # refused by name for a policy that renders no template
        options["chat_template"] = args.chat_template
    policy = policy_from_spec(args.policy, **options)
    tasks = None
    if args.task_option:
        from llm_gym.core.registry import env_entry

        tasks = env_entry(args.env_id).tasks(args.split, **assignments(args.task_option))
    report = run_and_report(
        args.env_id,
        policy,
        split=args.split,
        tasks=tasks,
        episodes=args.episodes,
        k=args.k,
        seed=args.seed,
        max_turns=args.max_turns,
        max_new_tokens=args.max_new_tokens,
        max_model_length=args.max_model_length,
        action_format=args.action_format,
        progress=not args.no_progress,
        print_report=False,
        output=args.output,
        save_episodes=args.save_episodes,
    )
    print(report.format_table(), file=out)
    for path in filter(None, (args.output, args.save_episodes)):
        print(f"wrote {path}", file=out)
    return 0
