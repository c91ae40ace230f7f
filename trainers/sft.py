"""Multi-turn SFT warm start: TRL's ``SFTTrainer`` on oracle transcripts, loss on assistant turns.

The data are conversations in TRL's conversational format (``{"messages": [...], "tools": ...}``)
built so that the SFT token sequence is exactly the one the RL side trains on:

* assistant messages are the raw text the rollout produced (``Turn.text``: for hermes, the
  ``<tool_call>...</tool_call>`` text the oracle's action was rendered to) as plain ``content``,
  without structured ``tool_calls``, exactly as :func:`llm_gym.rollout.tokens.render_chat`
  renders them at RL time; the model learns to *write* its tool calls;
* environment replies keep their roles (``tool`` messages with their ``name``);
* ``tools`` holds the environment's tool specs (as a JSON string), so the template renders them
  into the system prompt as at RL time.

Loss mask. TRL's own training copy of the Qwen2.5 template (swapped in for
``assistant_only_loss=True``) puts ``{% generation %}`` around ``"\\n" + content +
"<|im_end|>\\n"``: per assistant turn it trains two tokens more than RL does (the ``"\\n"`` after
``<|im_start|>assistant``, which at RL time is part of the generation prompt, and the ``"\\n"``
after ``<|im_end|>``, which RL never samples: it is the start of the environment's reply). With
``loss_mask="rl"`` (the default) :func:`build_sft_trainer` gives the tokenizer
:data:`RL_ALIGNED_QWEN2_5_TEMPLATE` instead: the same text, byte for byte, with the markers
around ``content + "<|im_end|>"`` only, i.e. exactly the tokens whose ``env_mask`` is 1 in
:func:`llm_gym.rollout.episode_to_samples`. The saved model keeps the tokenizer's own template.

Speed. Every ToolUseGame conversation starts with the same 413 tokens (system prompt and tool
specs) out of ~520; with ``shared_prefix=True`` (the default) they run once per batch, not once
per row (the same loss and gradients, ~3.5x faster at batch 32). On 2 CPU cores the default tiny
model (1.8M parameters) then trains at ~1.2 steps/s at batch 32 and ~3.5 steps/s at batch 8.

Usage::

    from trainers.sft import oracle_sft_dataset, sft_warm_start
    from llm_gym.models import build_tiny_model

    dataset = oracle_sft_dataset("ToolUseGame-v0")             # 1,000 train transcripts
    path = sft_warm_start(build_tiny_model(), "runs/sft", dataset, num_train_epochs=100,
                          per_device_train_batch_size=8, time_budget_s=300)
"""

from __future__ import annotations

import json
import math
import os
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from llm_gym.core.task import Task
from llm_gym.errors import InvalidArgumentError

if TYPE_CHECKING:
    from datasets import Dataset
    from trl import SFTTrainer

    from llm_gym.environments import EnvironmentMultiTurn
    from llm_gym.rollout import Episode

__all__ = [
    "RL_ALIGNED_QWEN2_5_TEMPLATE",
    "TimeBudgetCallback",
    "build_sft_trainer",
    "disjoint_tasks",
    "episode_to_messages",
    "oracle_sft_dataset",
    "rl_aligned_chat_template",
    "sft_dataset_from_multi_turn",
    "short_context_dataset",
    "sft_warm_start",
]

LossMask = Literal["rl", "trl"]

# --- the data ----------------------------------------------------------------------------------


def _plain_message(message: dict[str, Any]) -> dict[str, Any]:
    """A message as the RL side renders it: role and content (+ name for tool results)."""
    role = str(message.get("role", "user"))
    out: dict[str, Any] = {"role": role, "content": str(message.get("content") or "")}
    if role == "tool" and message.get("name") is not None:
        out["name"] = str(message["name"])
    return out


def episode_to_messages(episode: Episode) -> list[dict[str, Any]]:
    """The conversation of a finished episode as the RL side renders it.

    The opening messages, then for each turn the assistant's raw text (``Turn.text``, plain
    ``content``, no structured ``tool_calls``) and the environment's reply (``Turn.env_messages``,
    ``tool`` messages keep their ``name``). The same messages :func:`~llm_gym.rollout.
    episode_to_samples` renders, so the chat template gives the same token sequence.
    """
    messages = [_plain_message(m) for m in episode.messages[: episode.num_opening_messages]]
    for turn in episode.turns:
        messages.append({"role": "assistant", "content": turn.text})
        messages.extend(_plain_message(m) for m in turn.env_messages)
    return messages


def _rows_to_dataset(rows: list[dict[str, Any]]) -> Dataset:
    from datasets import Dataset

    if not rows:
        raise InvalidArgumentError("No SFT rows: every transcript was filtered out.")
    return Dataset.from_list(rows)


def oracle_sft_dataset(
    env_id_or_factory: str | Callable[..., Any],
    tasks: Sequence[Task] | None = None,
    *,
    oracle: Callable[..., Any] | None = None,
    episodes: int | None = None,
    action_format: str | None = None,
    split: str = "train",
    max_turns: int | None = None,
    only_successful: bool = True,
    success_threshold: float = 1.0,
) -> Dataset:
    """The oracle's transcripts as a conversational SFT dataset.

    Runs the oracle through :func:`llm_gym.rollout.collect_groups` (an
    :class:`~llm_gym.rollout.OraclePolicy`; the action format renders its messages to text) and
    converts each episode with :func:`episode_to_messages`.

    Args:
        env_id_or_factory: A registered id (``"ToolUseGame-v0"``: its tasks, oracle, turn limit
            and action format come from the registry), its ``EnvEntry``, or an env factory /
            ``Env`` class.
        tasks: The tasks (default: the registered environment's ``split``).
        oracle: The scripted expert (default: the registered one).
        episodes: Transcripts to make (default: one per task). Tasks are taken in order and
            cycled when ``episodes`` exceeds their number (the oracles are deterministic, so a
            repeat is a duplicate row: it weighs the task more, it adds no information).
        action_format: ``"hermes"`` or ``"json"`` (default: the registered one, else hermes).
        split: The split of a registered environment, when ``tasks`` is None.
        max_turns: Assistant turns per episode (default: the registered value, else 8).
        only_successful: Drop episodes whose reward is below ``success_threshold`` (and those
            that raised), so the model never imitates a failed transcript.
        success_threshold: See ``only_successful``.

    Returns:
        A ``datasets.Dataset`` with ``messages`` (list of ``{"role", "content"[, "name"]}``),
        ``tools`` (the tool specs as a JSON string: TRL ``json.loads`` it; as a list, Arrow would
        merge the specs' schemas and fill missing keys with nulls that ``tojson`` would render
        into the system prompt), ``task_id``, ``reward``.
    """
    from llm_gym.core.registry import as_env_entry
    from llm_gym.policies import OraclePolicy
    from llm_gym.rollout import collect_groups

    entry = as_env_entry(env_id_or_factory)
    task_list = list(tasks) if tasks is not None else entry.tasks(split)
    expert = oracle or entry.oracle()
    if expert is None:
        raise InvalidArgumentError(
            "oracle_sft_dataset needs an oracle: pass oracle=..., or use an environment "
            "registered with one."
        )
    if not task_list:
        raise InvalidArgumentError("oracle_sft_dataset needs at least one task.")
    if episodes is not None:
        if episodes < 1:
            raise InvalidArgumentError(f"episodes must be >= 1, actual value: {episodes}.")
        task_list = [task_list[i % len(task_list)] for i in range(episodes)]
    groups = collect_groups(
        entry.env_factory(),
        task_list,
        OraclePolicy(expert),
        max_turns=max_turns or entry.max_turns,
        action_format=action_format or entry.action_format,
        oracle=expert,
    )
    rows = []
    for group in groups:
        for episode in group:
            if only_successful and (episode.error or episode.reward < success_threshold):
                continue
            rows.append(
                {
                    "messages": episode_to_messages(episode),
                    "tools": json.dumps(episode.tool_specs, ensure_ascii=False),
                    "task_id": str(episode.task.id or ""),
                    "reward": float(episode.reward),
                }
            )
    return _rows_to_dataset(rows)


def sft_dataset_from_multi_turn(
    env: EnvironmentMultiTurn, examples: Iterable[Any], prompt_text: str = ""
) -> Dataset:
    """Document 002's SFT rows: ``env.start_episode(example, prompt_text) +
    env.sft_completion(example)`` per example (see :func:`llm_gym.environments.sft_messages`).

    SFT never runs ``step_episode``: the target transcript comes from ``example.output`` (or an
    ``sft_completion`` override). Non-assistant target messages (tool results, user turns) stay
    in the conversation and are masked; assistant messages are trained.

    Args:
        env: The environment.
        examples: ``TaskExample``\\ s, ``Task``\\ s or dicts with ``input``/``output``.
        prompt_text: The system prompt text passed to ``start_episode``.

    Returns:
        A dataset with ``messages`` and ``tools`` (the environment's ``tool_specs`` as a JSON
        string: ``"[]"`` for document 002's plain-text protocol).
    """
    from llm_gym.environments import sft_messages

    specs = getattr(env, "tool_specs", None)
    if callable(specs):
        specs = specs()
    tools = json.dumps(list(specs or []), ensure_ascii=False)
    rows = []
    for index, example in enumerate(examples):
        prompt, target = sft_messages(env, example, prompt_text)
        if not any(m.get("role") == "assistant" for m in target):
            raise InvalidArgumentError(
                f"Example {index}: the SFT target has no assistant message to train on."
            )
        rows.append({"messages": [_plain_message(m) for m in prompt + target], "tools": tools})
    return _rows_to_dataset(rows)


def disjoint_tasks(
    generate: Callable[[int, int], Sequence[Task]],
    n: int,
    seed: int,
    exclude: Iterable[Task | str],
) -> list[Task]:
    """Up to ``n`` extra tasks from ``generate(seed, m)`` whose prompts are not in ``exclude``.

    For more distinct training tasks than a split holds (``exclude`` = the val and test tasks,
    and the train tasks to avoid duplicates); draws ``2 n`` and keeps the first ``n`` disjoint
    ones (fewer when the task space runs out).
    """
    banned = {t.prompt if isinstance(t, Task) else str(t) for t in exclude}
    out = []
    for task in generate(seed, 2 * n):
        if task.prompt not in banned:
            banned.add(task.prompt)
            out.append(task)
            if len(out) == n:
                break
    return out


def short_context_dataset(dataset: Dataset) -> Dataset:
    """The rows without their system message and tool specs: the conversation from the user's
    question on (the chat template then renders its short default system line).

    A curriculum for small models trained from scratch: the system prompt and tool specs are
    the same ~400 tokens in every ToolUseGame transcript, and behind them a 1.8M-parameter model
    learns to copy a name or a number from the question or a tool result into its tool call very
    slowly (attention at initialisation spreads over every earlier token). Trained first on these
    ~100-token conversations it learns the copying in a few hundred steps; a shorter phase on the
    full transcripts then carries it over to the long context the model sees at RL time.
    """
    from datasets import Dataset

    rows = []
    for row in dataset:
        messages = [m for m in row["messages"] if m.get("role") != "system"]
        rows.append({**row, "messages": messages, "tools": "[]"})
    return Dataset.from_list(rows)


# --- the template ------------------------------------------------------------------------------

RL_ALIGNED_QWEN2_5_TEMPLATE = """\
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n\
You are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and \
arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \
\\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful \
assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>assistant\\n' }}
        {%- generation %}
        {%- if not message.tool_calls %}
            {{- message.content + '<|im_end|>' }}
        {%- else %}
            {%- if message.content %}
                {{- message.content }}
            {%- endif %}
            {%- for tool_call in message.tool_calls %}
                {%- if tool_call.function is defined %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {%- if message.content or not loop.first %}
                    {{- '\\n' }}
                {%- endif %}
                {{- '<tool_call>\\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {{- tool_call.arguments | tojson }}
                {{- '}\\n</tool_call>' }}
            {%- endfor %}
            {{- '<|im_end|>' }}
        {%- endif %}
        {%- endgeneration %}
        {{- '\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""
"""TRL's Qwen2.5 template (``qwen2_5.jinja``) with ``{% generation %}`` markers around each
assistant turn's ``content + "<|im_end|>"`` only: it renders the same text as the original, and
its assistant mask is exactly the RL side's ``env_mask`` (TRL's ``qwen2_5_training.jinja`` also
marks the ``"\\n"`` before the content and the one after ``<|im_end|>``)."""

_PROBE_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look up a fact.",
            "parameters": {
                "type": "object",
                "properties": {"key": {"type": "string", "description": "The key."}},
                "required": ["key"],
            },
        },
    }
]
_PROBE_MESSAGES: list[dict[str, Any]] = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is x?"},
    {"role": "assistant", "content": '<tool_call>\n{"name": "lookup"}\n</tool_call>'},
    {"role": "tool", "name": "lookup", "content": "7"},
    {"role": "tool", "name": "lookup", "content": "8"},
    {
        "role": "assistant",
        "content": "thinking",
        "tool_calls": [
            {"type": "function", "function": {"name": "lookup", "arguments": {"key": "a"}}},
            {"type": "function", "function": {"name": "lookup", "arguments": {"key": "b"}}},
        ],
    },
    {"role": "tool", "name": "lookup", "content": "9"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"type": "function", "function": {"name": "lookup", "arguments": {"key": "c"}}},
        ],
    },
    {"role": "user", "content": "And?"},
    {"role": "assistant", "content": "15"},
]


def _render(tokenizer: Any, messages: Any, tools: Any, template: str | None, gen: bool) -> str:
    return tokenizer.apply_chat_template(
        messages, tools=tools, chat_template=template, tokenize=False, add_generation_prompt=gen
    )


def rl_aligned_chat_template(tokenizer: Any, examples: Iterable[dict[str, Any]] = ()) -> str | None:
    """:data:`RL_ALIGNED_QWEN2_5_TEMPLATE` when it renders exactly what the tokenizer's own
    template renders (on probe conversations and on ``examples``, rows with ``messages`` and
    ``tools``), else ``None``."""
    original = getattr(tokenizer, "chat_template", None)
    if not isinstance(original, str):
        return None
    cases: list[tuple[Any, Any]] = [
        (_PROBE_MESSAGES, _PROBE_TOOLS),
        (_PROBE_MESSAGES, None),
        (_PROBE_MESSAGES[1:], None),
        (_PROBE_MESSAGES[1:], _PROBE_TOOLS),
    ]
    for row in examples:
        tools = row.get("tools")
        cases.append((row["messages"], json.loads(tools) if isinstance(tools, str) else tools))
    try:
        for messages, tools in cases:
            for gen in (False, True):
                mine = _render(tokenizer, messages, tools, RL_ALIGNED_QWEN2_5_TEMPLATE, gen)
                if mine != _render(tokenizer, messages, tools, original, gen):
                    return None
    except Exception:
        return None
    return RL_ALIGNED_QWEN2_5_TEMPLATE


# --- training ----------------------------------------------------------------------------------


def _transformers_callback_base() -> type:
    from transformers import TrainerCallback

    return TrainerCallback


class TimeBudgetCallback(_transformers_callback_base()):  # type: ignore[misc]
    """Stops training after ``budget_s`` seconds of the training loop (checked after each
    optimizer step, so the last step may run past it)."""

    def __init__(self, budget_s: float) -> None:
        if budget_s <= 0:
            raise InvalidArgumentError(f"time_budget_s must be > 0, actual value: {budget_s}.")
        self.budget_s = float(budget_s)
        self.start: float | None = None
        self.stopped = False

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self.start = time.perf_counter()
        return control

    def elapsed(self) -> float:
        return 0.0 if self.start is None else time.perf_counter() - self.start

    def fraction(self) -> float:
        """The spent share of the budget (0 before training starts)."""
        return self.elapsed() / self.budget_s

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if self.elapsed() >= self.budget_s:
            self.stopped = True
            control.should_training_stop = True
        return control


def _schedule(
    kind: str,
    warmup_steps: int,
    min_lr_ratio: float,
    total_steps: int,
    budget: TimeBudgetCallback | None,
) -> Callable[[int], float]:
    """The LR multiplier: linear warmup, then ``kind`` over the progress, which is the larger of
    the step fraction and (with a time budget) the spent share of the budget."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / (warmup_steps + 1)
        if kind == "constant":
            return 1.0
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        if budget is not None:
            progress = max(progress, budget.fraction())
        progress = min(1.0, max(0.0, progress))
        shape = 0.5 * (1 + math.cos(math.pi * progress)) if kind == "cosine" else 1 - progress
        return min_lr_ratio + (1 - min_lr_ratio) * shape

    return factor


def _shared_prefix_inputs(model: Any, inputs: dict[str, Any], min_length: int) -> dict[str, Any]:
    """The batch with its shared prefix precomputed (see ``shared_prefix`` in
    :func:`sft_warm_start`): the suffix ids, the full attention mask, the prefix's keys and
    values repeated over the batch, and the labels pre-shifted for the suffix positions."""
    import torch

    from trainers.shared_prefix import cache_keyword, output_cache

    ids, labels = inputs.get("input_ids"), inputs.get("labels")
    mask = inputs.get("attention_mask")
    if ids is None or labels is None or mask is None or ids.dim() != 2 or ids.shape[0] < 2:
        return inputs
    if set(inputs) - {"input_ids", "labels", "attention_mask"}:
        return inputs  # position ids, padding-free or multimodal batches run as they are
    rows = ids.shape[0]
    same = ((ids == ids[:1]) & (mask == 1)).all(dim=0)
    common = int(same.long().cumprod(dim=0).sum())
    trained = (labels != -100).any(dim=0)
    first_trained = int(trained.long().argmax()) if bool(trained.any()) else ids.shape[1]
    # labels[:, : split + 1] are all -100: no prefix position predicts a trained token
    split = min(common, first_trained - 1)
    if split < min_length:
        return inputs
    backbone = model.base_model
    cache_arg = cache_keyword(backbone.forward)
    cache = output_cache(backbone(input_ids=ids[:1, :split], use_cache=True))
    if cache is None:
        return inputs
    cache.batch_repeat_interleave(rows)
    shifted = torch.cat([labels[:, split + 1 :], labels.new_full((rows, 1), -100)], dim=1)
    return {
        "input_ids": ids[:, split:],
        "attention_mask": mask,
        cache_arg: cache,
        "shift_labels": shifted,
    }


def build_sft_trainer(
    model_path: str | os.PathLike[str],
    output_dir: str | os.PathLike[str],
    dataset: Dataset,
    *,
    learning_rate: float = 2e-3,
    num_train_epochs: float = 1.0,
    max_steps: int | None = None,
    per_device_train_batch_size: int = 32,
    gradient_accumulation_steps: int = 1,
    lr_scheduler_type: Literal["cosine", "linear", "constant"] = "cosine",
    warmup_steps: int = 10,
    min_lr_ratio: float = 0.0,
    weight_decay: float = 0.0,
    max_grad_norm: float = 1.0,
    max_length: int | None = 2048,
    logging_steps: int = 10,
    seed: int = 0,
    time_budget_s: float | None = None,
    loss_mask: LossMask = "rl",
    use_cpu: bool | None = None,
    bf16: bool = False,
    shared_prefix: bool = True,
    progress: bool = True,
    **config_kwargs: Any,
) -> SFTTrainer:
    """The ``SFTTrainer`` :func:`sft_warm_start` runs (arguments as there); its
    ``train_dataset`` holds the prepared ``input_ids`` and ``labels``."""
    import torch
    from torch.optim.lr_scheduler import LambdaLR
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    if lr_scheduler_type not in ("cosine", "linear", "constant"):
        raise InvalidArgumentError(
            "lr_scheduler_type must be 'cosine', 'linear' or 'constant', actual value: "
            f"{lr_scheduler_type!r}."
        )
    if loss_mask not in ("rl", "trl"):
        raise InvalidArgumentError(f"loss_mask must be 'rl' or 'trl', actual value: {loss_mask!r}.")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    original_template = tokenizer.chat_template
    if loss_mask == "rl":
        probe = [dataset[i] for i in range(min(4, len(dataset)))]
        aligned = rl_aligned_chat_template(tokenizer, probe)
        if aligned is None:
            warnings.warn(
                "loss_mask='rl': the tokenizer's chat template is not TRL's Qwen2.5 template, so "
                "TRL's training template is used; its assistant mask may differ from the RL "
                "env_mask (e.g. also train the newlines around each turn).",
                RuntimeWarning,
                stacklevel=2,
            )
        else:
            tokenizer.chat_template = aligned
    if use_cpu is None:
        use_cpu = not torch.cuda.is_available()
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    config = SFTConfig(
        output_dir=str(output_dir),
        assistant_only_loss=True,
        learning_rate=learning_rate,
        num_train_epochs=num_train_epochs,
        max_steps=-1 if max_steps is None else max_steps,
        per_device_train_batch_size=per_device_train_batch_size,
        gradient_accumulation_steps=gradient_accumulation_steps,
        lr_scheduler_type="constant" if lr_scheduler_type == "constant" else lr_scheduler_type,
        warmup_steps=warmup_steps,
        weight_decay=weight_decay,
        max_grad_norm=max_grad_norm,
        max_length=max_length,
        logging_steps=logging_steps,
        seed=seed,
        data_seed=seed,
        bf16=bf16,
        fp16=False,
        use_cpu=use_cpu,
        gradient_checkpointing=False,
        report_to="none",
        save_strategy="no",
        eval_strategy="no",
        disable_tqdm=not progress,
        dataloader_num_workers=0,
        **config_kwargs,
    )
    budget = TimeBudgetCallback(time_budget_s) if time_budget_s is not None else None
    min_shared_prefix = 32

    class _Trainer(SFTTrainer):
        def create_scheduler(self, num_training_steps: int, optimizer: Any = None) -> Any:
            if self.lr_scheduler is None:
                factor = _schedule(
                    lr_scheduler_type, warmup_steps, min_lr_ratio, num_training_steps, budget
                )
                self.lr_scheduler = LambdaLR(optimizer or self.optimizer, factor)
                self._created_lr_scheduler = True
            return self.lr_scheduler

        def compute_loss(
            self,
            model: Any,
            inputs: dict[str, Any],
            return_outputs: bool = False,
            num_items_in_batch: Any = None,
        ) -> Any:
            if shared_prefix and model.training:
                inputs = _shared_prefix_inputs(model, inputs, min_shared_prefix)
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    keep = [c for c in ("messages", "tools") if c in dataset.column_names]
    trainer = _Trainer(
        model=model,
        args=config,
        train_dataset=dataset.select_columns(keep),
        processing_class=tokenizer,
        callbacks=[budget] if budget is not None else None,
    )
    trainer.original_chat_template = original_template  # type: ignore[attr-defined]
    trainer.time_budget = budget  # type: ignore[attr-defined]
    return trainer


def sft_warm_start(
    model_path: str | os.PathLike[str],
    output_dir: str | os.PathLike[str],
    dataset: Dataset,
    *,
    learning_rate: float = 2e-3,
    num_train_epochs: float = 1.0,
    max_steps: int | None = None,
    per_device_train_batch_size: int = 32,
    gradient_accumulation_steps: int = 1,
    lr_scheduler_type: Literal["cosine", "linear", "constant"] = "cosine",
    warmup_steps: int = 10,
    min_lr_ratio: float = 0.0,
    weight_decay: float = 0.0,
    max_grad_norm: float = 1.0,
    max_length: int | None = 2048,
    logging_steps: int = 10,
    seed: int = 0,
    time_budget_s: float | None = None,
    loss_mask: LossMask = "rl",
    use_cpu: bool | None = None,
    bf16: bool = False,
    shared_prefix: bool = True,
    progress: bool = True,
    **config_kwargs: Any,
) -> Path:
    """Supervised warm start of a causal LM on a conversational dataset, assistant turns only.

    TRL's ``SFTTrainer`` with ``SFTConfig(assistant_only_loss=True, bf16=False,
    gradient_checkpointing=False, report_to="none", save_strategy="no")``, plain AdamW, fp32.

    Args:
        model_path: A directory ``from_pretrained`` loads (model and tokenizer).
        output_dir: Where the final model and tokenizer are saved (``save_pretrained``), with
            ``sft_info.json`` (steps, seconds, tokens, last loss, settings).
        dataset: Conversational rows (``messages``, ``tools``): :func:`oracle_sft_dataset` or
            :func:`sft_dataset_from_multi_turn`. Other columns are ignored.
        learning_rate: Peak learning rate.
        num_train_epochs: Epochs over ``dataset`` (when ``max_steps`` is None).
        max_steps: Optimizer steps (overrides ``num_train_epochs``).
        per_device_train_batch_size: Conversations per step (times ``gradient_accumulation_steps``).
        gradient_accumulation_steps: Micro-batches per optimizer step.
        lr_scheduler_type: ``"cosine"``, ``"linear"`` (decay to ``min_lr_ratio`` times the peak)
            or ``"constant"``, after ``warmup_steps`` of linear warmup. With a time budget the
            decay follows the larger of the step fraction and the spent share of the budget, so
            a run stopped by the budget ends at the bottom of its schedule.
        warmup_steps: Linear warmup steps.
        min_lr_ratio: The floor of the decay, as a share of ``learning_rate``.
        weight_decay: AdamW weight decay.
        max_grad_norm: Gradient clipping.
        max_length: Conversations are truncated to this many tokens (keep it above the longest).
        logging_steps: Log (loss, lr, tokens) every this many steps.
        seed: Seed of the initialisation of everything random (data order included).
        time_budget_s: Stop after this many seconds of the training loop (dataset preparation
            not counted); ``None``: no limit.
        loss_mask: ``"rl"``: train exactly the tokens RL trains (assistant content and its
            ``<|im_end|>``; see the module docstring); ``"trl"``: TRL's training template (also
            the newline before and after each assistant turn).
        use_cpu: Train on the CPU (default: when CUDA is not available).
        bf16: bf16 autocast (the weights stay fp32 and are saved fp32). Off by default; on a
            CPU with AMX it is about 1.5x faster per step without ``shared_prefix``, no faster
            with it.
        shared_prefix: Run the token prefix that every conversation of a batch shares (the system
            prompt with the tool specs: 413 of ~520 tokens on ToolUseGame) once per batch and
            reuse its keys and values for every row: the same loss and gradients (to float
            rounding), ~3.5x faster at batch 32. Applies when that prefix holds no trained
            token and is at least ``min_shared_prefix`` tokens long; otherwise the batch runs
            as usual.
        progress: Show transformers' progress bar.
        **config_kwargs: More ``SFTConfig`` fields.

    Returns:
        ``output_dir``.
    """
    trainer = build_sft_trainer(
        model_path,
        output_dir,
        dataset,
        learning_rate=learning_rate,
        num_train_epochs=num_train_epochs,
        max_steps=max_steps,
        per_device_train_batch_size=per_device_train_batch_size,
        gradient_accumulation_steps=gradient_accumulation_steps,
        lr_scheduler_type=lr_scheduler_type,
        warmup_steps=warmup_steps,
        min_lr_ratio=min_lr_ratio,
        weight_decay=weight_decay,
        max_grad_norm=max_grad_norm,
        max_length=max_length,
        logging_steps=logging_steps,
        seed=seed,
        time_budget_s=time_budget_s,
        loss_mask=loss_mask,
        use_cpu=use_cpu,
        bf16=bf16,
        shared_prefix=shared_prefix,
        progress=progress,
        **config_kwargs,
    )
    result = trainer.train()
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = trainer.processing_class
    tokenizer.chat_template = trainer.original_chat_template  # type: ignore[attr-defined]
    trainer.model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    tokens = [e["num_tokens"] for e in trainer.state.log_history if "num_tokens" in e]
    budget = trainer.time_budget  # type: ignore[attr-defined]
    info = {
        "model_path": str(model_path),
        "examples": len(dataset),
        "steps": trainer.state.global_step,
        "epochs": trainer.state.epoch,
        "train_seconds": result.metrics.get("train_runtime"),
        "steps_per_second": result.metrics.get("train_steps_per_second"),
        "num_tokens": tokens[-1] if tokens else None,
        "first_loss": losses[0] if losses else None,
        "last_loss": losses[-1] if losses else None,
        "train_loss": result.metrics.get("train_loss"),
        "stopped_by_time_budget": bool(budget is not None and budget.stopped),
        "settings": {
            "learning_rate": learning_rate,
            "per_device_train_batch_size": per_device_train_batch_size,
            "gradient_accumulation_steps": gradient_accumulation_steps,
            "num_train_epochs": num_train_epochs,
            "max_steps": max_steps,
            "lr_scheduler_type": lr_scheduler_type,
            "warmup_steps": warmup_steps,
            "min_lr_ratio": min_lr_ratio,
            "weight_decay": weight_decay,
            "time_budget_s": time_budget_s,
            "loss_mask": loss_mask,
            "bf16": bf16,
            "shared_prefix": shared_prefix,
            "seed": seed,
        },
    }
    (out / "sft_info.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    return out
