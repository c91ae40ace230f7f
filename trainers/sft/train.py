"""Multi-turn SFT warm start: TRL's ``SFTTrainer`` on oracle transcripts, loss on assistant turns.

The data are conversations in TRL's conversational format (:mod:`trainers.sft.data`), built so
that the SFT token sequence is exactly the one the RL side trains on. With ``loss_mask="rl"``
(the default) :func:`build_sft_trainer` gives the tokenizer
:data:`~trainers.chat_template.RL_ALIGNED_QWEN2_5_TEMPLATE`: the loss covers exactly the tokens
whose ``env_mask`` is 1 at RL time (see :mod:`trainers.chat_template`). The saved model keeps
the tokenizer's own template.

Speed. Every conversation of an environment starts with the same system prompt and tool specs;
with ``shared_prefix=True`` (the default) that prefix runs once per batch, not once per row (the
same loss and gradients; see :func:`trainers.grpo.shared_prefix.shared_prefix_inputs`).

Usage::

    from llm_gym.models import build_tiny_model
    from trainers.sft.train import sft_warm_start
    from trainers.sft.data import oracle_sft_dataset

    dataset = oracle_sft_dataset("ToolUseGame-v0")             # 1,000 train transcripts
    path = sft_warm_start(build_tiny_model(), "runs/sft", dataset, num_train_epochs=100,
                          per_device_train_batch_size=8, time_budget_s=300)
"""

from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from llm_gym.errors import InvalidArgumentError
from llm_gym.policies.chat_templates import (
    apply_chat_template,
    require_chat_template,
    resolve_chat_template,
)
from llm_gym.policies.pretrained import resolve_model_path
from llm_gym.policies.template_format import episode_format
from trainers.chat_template import RL_ALIGNED_QWEN2_5_TEMPLATE, rl_aligned_chat_template
from trainers.grpo.health import HealthCallback
from trainers.grpo.length_chunks import LengthChunkedLM
from trainers.grpo.shared_prefix import shared_prefix_inputs
from trainers.sft.data import (
    disjoint_tasks,
    episode_to_messages,
    oracle_sft_dataset,
    rl_token_dataset,
    sft_dataset_from_multi_turn,
    short_context_dataset,
    text_layout_dataset,
)
from trainers.sft.labelled_head import labelled_head_forward, unsupported_reason
from trainers.sft.schedule import TimeBudgetCallback, lr_schedule

if TYPE_CHECKING:
    from datasets import Dataset
    from trl import SFTTrainer

__all__ = [
    # the warm start
    "LossMask",
    "TimeBudgetCallback",
    "build_sft_trainer",
    "sft_warm_start",
    # re-exported: the data (trainers.sft.data) and the template (trainers.chat_template)
    "RL_ALIGNED_QWEN2_5_TEMPLATE",
    "disjoint_tasks",
    "episode_to_messages",
    "oracle_sft_dataset",
    "rl_aligned_chat_template",
    "sft_dataset_from_multi_turn",
    "short_context_dataset",
]

LossMask = Literal["rl", "trl"]
"""``"rl"``: train exactly the tokens RL trains; ``"trl"``: TRL's training template."""


def build_sft_trainer(
    model_path: str | os.PathLike[str],
    output_dir: str | os.PathLike[str],
    dataset: Dataset,
    *,
    learning_rate: float = 5e-4,
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
    length_chunked: bool = True,
    progress: bool = True,
    action_format: str = "auto",
    lora: dict[str, Any] | None = None,
    chat_template: str | None = None,
    health_action: str = "warn",
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
    if chat_template is not None:
        resolve_chat_template(chat_template)  # a misspelt name: before the model loads
    model_path = resolve_model_path(model_path)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    if chat_template is None:
        require_chat_template(tokenizer, what=f"model {model_path!r}")
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    apply_chat_template(tokenizer, chat_template, model)  # tokens added as TRL's clone does
    action_format = episode_format(action_format, tokenizer).name
    original_template = tokenizer.chat_template
    tokenized = False
    if loss_mask == "rl":
        probe = [dataset[i] for i in range(min(4, len(dataset)))]
        aligned = rl_aligned_chat_template(tokenizer, probe)
        if aligned is None:  # any other template: the rows as the rollout tokenizes them
            dataset = rl_token_dataset(tokenizer, dataset, action_format=action_format)
            tokenized = True
        else:
            tokenizer.chat_template = aligned
    if not tokenized:  # TRL tokenizes the rows: each one through template_input, as at RL time
        dataset = text_layout_dataset(tokenizer, dataset, action_format=action_format)
    if use_cpu is None:
        use_cpu = not torch.cuda.is_available()
    config = SFTConfig(
        output_dir=str(output_dir),
        assistant_only_loss=not tokenized,  # tokenized rows carry their assistant_masks
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
        activation_checkpointing=False,
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
                factor = lr_schedule(
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
            prefix = min_shared_prefix if shared_prefix else None
            # Only TRL's fused-head path (no label smoothing, loss function or returned logits)
            # on an unwrapped model (DDP sees one forward per backward).
            chunk = length_chunked and model.training and not return_outputs
            chunk = chunk and self.label_smoother is None and self.compute_loss_func is None
            chunk = (
                chunk
                and not self.aux_loss_enabled
                and self.accelerator.unwrap_model(model) is model
            )
            if chunk and LengthChunkedLM.applies(inputs):  # rows of similar length together
                prepare = None
                if prefix is not None:
                    prepare = functools.partial(shared_prefix_inputs, model, min_length=prefix)
                head = labelled_head_forward if unsupported_reason(model) is None else None
                model = LengthChunkedLM(model, prepare=prepare, head=head)
            elif prefix is not None and model.training:
                inputs = shared_prefix_inputs(model, inputs, prefix)
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    columns = ("input_ids", "assistant_masks") if tokenized else ("messages", "tools")
    keep = [c for c in columns if c in dataset.column_names]
    peft_config = None
    if lora is not None:
        from peft import LoraConfig

        peft_config = LoraConfig(**{"target_modules": "all-linear", **lora}, task_type="CAUSAL_LM")
    trainer = _Trainer(
        model=model,
        args=config,
        train_dataset=dataset.select_columns(keep),
        processing_class=tokenizer,
        callbacks=[HealthCallback(health_action, "sft"), *([] if budget is None else [budget])],
        peft_config=peft_config,
    )
    trainer.original_chat_template = original_template  # type: ignore[attr-defined]
    trainer.time_budget = budget  # type: ignore[attr-defined]
    return trainer


def sft_warm_start(
    model_path: str | os.PathLike[str],
    output_dir: str | os.PathLike[str],
    dataset: Dataset,
    *,
    learning_rate: float = 5e-4,
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
    length_chunked: bool = True,
    progress: bool = True,
    action_format: str = "auto",
    lora: dict[str, Any] | None = None,
    chat_template: str | None = None,
    health_action: str = "warn",
    **config_kwargs: Any,
) -> Path:
    """Supervised warm start of a causal LM on a conversational dataset, assistant turns only.

    TRL's ``SFTTrainer`` with ``SFTConfig(assistant_only_loss=True, bf16=False,
    activation_checkpointing=False, report_to="none", save_strategy="no")``, plain AdamW, fp32.

    Args:
        model_path: A directory ``from_pretrained`` loads (model and tokenizer).
        output_dir: Where the final model and tokenizer are saved (``save_pretrained``), with
            ``sft_info.json`` (steps, seconds, tokens, last loss, settings).
        dataset: Conversational rows (``messages``, ``tools``) of :mod:`trainers.sft.data`
            (:func:`oracle_sft_dataset`, :func:`sft_dataset_from_multi_turn`). Other columns are
            ignored.
        learning_rate: Peak learning rate. The default suits the embedded tiny model: at 2e-3 it
            learns tool names and keys but never learns to copy a number from a tool result
            (the loss stalls near 0.2); at 5e-4 copying appears within a few hundred steps.
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
            end-of-turn token): for TRL's Qwen2.5 template through
            :mod:`trainers.chat_template`, for any other the rows as the rollout tokenizes them
            (:func:`trainers.sft.data.rl_token_rows`); ``"trl"``: TRL's training template (also
            the newline before and after each assistant turn).
        use_cpu: Train on the CPU (default: when CUDA is not available).
        bf16: bf16 autocast (the weights stay fp32 and are saved fp32). Off by default; on a
            CPU with AMX it speeds up steps without ``shared_prefix``, not those with it.
        shared_prefix: Run the token prefix that every conversation of a batch shares (the system
            prompt with the tool specs: most of a ToolUseGame transcript) once per batch and
            reuse its keys and values for every row: the same loss and gradients (to float
            rounding), several times faster at large batches. Applies when that prefix holds no
            trained token and is at least ``min_shared_prefix`` tokens long; otherwise the
            batch runs as usual.
        length_chunked: Run a batch as chunks of rows of similar length, each only as wide as its
            longest row and with its own shared prefix
            (:class:`trainers.grpo.length_chunks.LengthChunkedLM`): the same loss and gradients (to
            float rounding), without the padding's FLOPs; the LM head then scores only the
            labelled positions (:mod:`trainers.sft.labelled_head`, where the model allows it).
        progress: Show transformers' progress bar.
        action_format: The action format of the conversations' tool calls: it writes the tools
            as text for a chat template that cannot render them
            (:mod:`llm_gym.policies.template_tools`). ``"auto"``: the one the model's chat
            template teaches, else hermes
            (:func:`~llm_gym.policies.template_format.episode_format`).
        lora: Train a LoRA adapter instead of every weight: ``peft.LoraConfig`` arguments
            (``{"r": 16, "lora_alpha": 32}``; ``target_modules`` defaults to ``"all-linear"``).
            The saved model has the adapter merged in.
        chat_template: The chat template for a model without one (a base model): a named
            template (``"chatml"``, ``"gemma"``: its turn tokens added where missing, the
            embeddings resized, as TRL's ``clone_chat_template``) or a ``.jinja`` file; the
            saved model keeps it. None: the model's own (a model with none is refused).
        health_action: What a health check that fires does (:mod:`trainers.grpo.health`; SFT runs
            ``nonfinite_loss``): ``"warn"``, ``"stop"`` (the loop ends; the model is saved) or
            ``"off"``.
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
        length_chunked=length_chunked,
        progress=progress,
        action_format=action_format,
        lora=lora,
        chat_template=chat_template,
        health_action=health_action,
        **config_kwargs,
    )
    result = trainer.train()
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = trainer.processing_class
    tokenizer.chat_template = trainer.original_chat_template  # type: ignore[attr-defined]
    model = trainer.accelerator.unwrap_model(trainer.model)
    if lora is not None:  # the adapter merged in: the output is an ordinary model folder
        model = model.merge_and_unload()
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    tokens = [e["num_tokens"] for e in trainer.state.log_history if "num_tokens" in e]
    budget = trainer.time_budget  # type: ignore[attr-defined]
    if budget is not None and budget.stopped:
        planned = trainer.state.max_steps
        print(
            f"[sft] stopped by time_budget_s={budget.budget_s:g} after "
            f"{trainer.state.global_step} of {planned} steps: this machine trains slower than "
            "the budget allows for, so this run is not the recipe as configured (raise "
            "time_budget_s to run it whole)",
            file=sys.stderr,
            flush=True,
        )
    info = {
        "model_path": str(model_path),
        "examples": len(dataset),
        "action_format": action_format,
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
            "length_chunked": length_chunked,
            "lora": lora,
            "seed": seed,
        },
    }
    (out / "sft_info.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    return out
