"""TRL's own tool loop as a contender, at its best settings:
``GRPOTrainer(environment_factory=...)`` generating one batch
(``_generate_and_score_completions``) on the ToolUseGame tasks.

What "its best settings" means here, each the same as ours:

* the per-turn budget: ``generation_kwargs={"max_new_tokens": max_tokens_per_turn}`` (TRL's
  default gives every turn the whole ``max_completion_length``), the turn limit
  (``max_tool_calling_iterations = max_turns - 1``) and a completion budget
  (``max_completion_length``) that never binds before ours does;
* identical prompt token ids: TRL renders its tools from the environment's method docstrings
  (a ``Returns`` entry, other parameter text, no empty ``required``); :func:`our_rendering` makes
  its tokenizer render our tool specs instead, and :func:`check_identical_prompts` asserts, on
  every task, that both sides feed the model the same ids;
* a warm-up: one untimed batch per trainer (first kernels, allocator, the environment pool);
* both generation back-ends: plain ``generate`` and ``use_transformers_continuous_batching``;
  the benchmark times both and reports ours against the faster.
"""

from __future__ import annotations

import time
from typing import Any

TRL_BACKENDS = ("generate", "continuous_batching")
"""TRL's two local generation paths (vLLM cannot run here)."""


def trl_environment():
    from llm_gym.envs.tool_use_game.env import list_fact_keys, lookup
    from llm_gym.tools.arithmetic import format_number, safe_eval

    class ToolUseGameTRL:
        """ToolUseGame's three tools as TRL environment methods (the same results as ours)."""

        def reset(self, **row):
            return None

        def list_fact_keys(self, prefix: str = "") -> str:
            """List the keys of the fact table, one per line.

            Args:
                prefix: Only list keys that start with this text, for example 'Velmora.'.
            """
            return list_fact_keys(prefix)

        def lookup(self, key: str) -> str:
            """Look up one fact by its key.

            Args:
                key: A fact key of the form 'Town.attribute', for example 'Velmora.population'.
            """
            return lookup(key)

        def calculator(self, expression: str) -> str:
            """Evaluate an arithmetic expression with + - * / // % ** and parentheses.

            Args:
                expression: The expression.
            """
            return format_number(safe_eval(expression))

    return ToolUseGameTRL


def our_tool_specs() -> list[dict[str, Any]]:
    from llm_gym.envs.tool_use_game import ToolUseGameEnv

    return ToolUseGameEnv().tool_specs


def our_rendering(tokenizer: Any) -> Any:
    """``tokenizer`` rendering our tool specs, in our order, where TRL passes its tool callables
    (:func:`llm_gym.integrations.trl.our_rendering`)."""
    from llm_gym.integrations.trl import our_rendering as render_ours

    return render_ours(tokenizer, our_tool_specs())


def prompt_rows(tasks: Any) -> list[dict[str, Any]]:
    from llm_gym.envs.tool_use_game import SYSTEM_PROMPT

    return [
        {
            "prompt": [
                {"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": t.prompt},
            ],
            "target": str(t.target),
        }
        for t in tasks
    ]


def our_prompt_ids(tokenizer: Any, task: Any) -> list[int]:
    """The ids our rollout engine feeds the model for ``task``'s first turn."""
    import asyncio

    from llm_gym.envs.tool_use_game import ToolUseGameEnv
    from llm_gym.policies.chat import render_chat

    env = ToolUseGameEnv()
    messages = asyncio.run(env.reset(task))
    text = render_chat(tokenizer, messages, env.tool_specs, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def check_identical_prompts(trainer: Any, tokenizer: Any, tasks: Any) -> int:
    """Assert that TRL's prompt ids equal ours on every task; return how many were compared."""
    rows = prompt_rows(tasks)
    for task, row in zip(tasks, rows, strict=True):
        theirs = trainer.processing_class.apply_chat_template(
            row["prompt"], tools=trainer.tools, add_generation_prompt=True, tokenize=True
        )
        theirs = theirs["input_ids"] if hasattr(theirs, "keys") else theirs
        ours = our_prompt_ids(tokenizer, task)
        if list(theirs) != list(ours):
            raise AssertionError(
                f"TRL's prompt ids differ from ours on {task.id}: {len(theirs)} vs {len(ours)} "
                "tokens. Both sides must feed the model identical prompts."
            )
    return len(rows)


def build_trl(
    model_path: str,
    tasks: Any,
    args: Any,
    *,
    backend: str = "generate",
    reward_funcs: Any = None,
    **overrides: Any,
) -> Any:
    """A ``GRPOTrainer(environment_factory=...)`` at its best settings for the benchmark's
    budgets (see the module docstring); ``overrides`` are more ``GRPOConfig`` fields."""
    import warnings

    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    if backend not in TRL_BACKENDS:
        raise ValueError(f"backend must be one of {TRL_BACKENDS}, actual value: {backend!r}.")
    warnings.filterwarnings("ignore")
    rows = prompt_rows(tasks)
    fields: dict[str, Any] = dict(
        output_dir="/tmp/llm_gym_bench_trl",
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        num_generations=args.episodes_per_task,
        per_device_train_batch_size=len(rows) * args.episodes_per_task,
        # the turns' sampled tokens plus their tool results: never tighter than ours
        max_completion_length=args.max_turns * args.max_tokens_per_turn + 512,
        generation_kwargs={"max_new_tokens": args.max_tokens_per_turn},
        max_tool_calling_iterations=args.max_turns - 1,
        use_transformers_continuous_batching=backend == "continuous_batching",
        temperature=1.0,
        report_to="none",
        save_strategy="no",
        beta=0.0,
        seed=0,
    )
    fields.update(overrides)
    tokenizer = our_rendering(AutoTokenizer.from_pretrained(model_path))
    return GRPOTrainer(
        model=model_path,
        reward_funcs=reward_funcs or [lambda completions, **kw: [0.0] * len(completions)],
        args=GRPOConfig(**fields),
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        environment_factory=trl_environment(),
    )


def generate_batch(trainer: Any, tasks: Any, args: Any) -> dict[str, float]:
    """Time one ``_generate_and_score_completions`` over every task x episodes_per_task."""
    rows = prompt_rows(tasks)
    inputs = [row for row in rows for _ in range(args.episodes_per_task)]
    start = time.perf_counter()
    output = trainer._generate_and_score_completions(inputs)
    wall = time.perf_counter() - start
    tool_mask = output.get("tool_mask")
    completion_mask = output["completion_mask"]
    sampled = completion_mask * tool_mask if tool_mask is not None else completion_mask
    # Tool results are the masked-out runs inside a completion: count them per episode.
    calls = 0.0
    if tool_mask is not None:
        env_runs = ((completion_mask == 1) & (tool_mask == 0)).int()
        starts = env_runs[:, 1:] & (1 - env_runs[:, :-1])
        calls = (starts.sum() + env_runs[:, 0].sum()).item() / len(inputs)
    return {
        "wall_s": wall,
        "episodes": len(inputs),
        "tokens": int(sampled.sum().item()),
        "tool_calls_mean": calls,
    }


class TRLContender:
    """One TRL back-end, built once, checked for identical prompts and warmed up untimed."""

    def __init__(self, model_path: str, tokenizer: Any, tasks: Any, args: Any, backend: str):
        self.trainer = build_trl(model_path, tasks, args, backend=backend)
        self.prompts_checked = check_identical_prompts(self.trainer, tokenizer, tasks)
        self.tasks, self.args, self.backend = tasks, args, backend
        generate_batch(self.trainer, tasks, args)  # the warm-up, untimed

    def __call__(self, repeat: int) -> dict[str, float]:
        return {
            **generate_batch(self.trainer, self.tasks, self.args),
            "backend": self.backend,
            "dtype": str(next(self.trainer.model.parameters()).dtype).removeprefix("torch."),
            "identical_prompt_ids": self.prompts_checked,
        }
