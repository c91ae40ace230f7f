"""Multi-turn SFT warm start: TRL's ``SFTTrainer`` on oracle transcripts, loss on assistant turns.

The data are conversations in TRL's conversational format (:mod:`trainers.sft.data`), built so
that the SFT token sequence is exactly the one the RL side trains on. With ``loss_mask="rl"``
(the default) :func:`build_sft_run` gives the tokenizer
:data:`~trainers.chat_template.RL_ALIGNED_QWEN2_5_TEMPLATE`: the loss covers exactly the tokens
whose ``env_mask`` is 1 at RL time (see :mod:`trainers.chat_template`). The saved model keeps
the tokenizer's own template.

Speed. Every conversation of an environment starts with the same system prompt and tool specs;
with ``shared_prefix=True`` (the default) that prefix runs once per batch, not once per row (the
same loss and gradients; see :func:`trainers.grpo.shared_prefix.shared_prefix_inputs`).

Usage (one :class:`~trainers.sft.settings.SFTSettings` record carries every setting)::

    from llm_gym.models import build_tiny_model
    from trainers.sft.data import oracle_sft_dataset
    from trainers.sft.settings import SFTSettings
    from trainers.sft.train import sft_warm_start

    dataset = oracle_sft_dataset("ToolUseGame-v0")             # 1,000 train transcripts
    settings = SFTSettings(epochs=100, batch_size=8, time_budget_s=300)
    path = sft_warm_start(build_tiny_model(), "runs/sft", dataset, settings)
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

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
from trainers.sft.settings import (
    LossMask,
    SFTSettings,
    check_trl_options,
    full_phase,
    sft_config_fields,
    short_context_phase,
)

if TYPE_CHECKING:
    from datasets import Dataset
    from transformers import PreTrainedTokenizerBase
    from trl import SFTTrainer

__all__ = [
    # the warm start
    "SFTRun",
    "build_sft_run",
    "sft_warm_start",
    # re-exported: the settings (trainers.sft.settings) and the clock (trainers.sft.schedule)
    "LossMask",
    "SFTSettings",
    "TimeBudgetCallback",
    # re-exported: the data (trainers.sft.data) and the template (trainers.chat_template)
    "RL_ALIGNED_QWEN2_5_TEMPLATE",
    "disjoint_tasks",
    "episode_to_messages",
    "oracle_sft_dataset",
    "rl_aligned_chat_template",
    "sft_dataset_from_multi_turn",
    "short_context_dataset",
]

MIN_SHARED_PREFIX = 32
"""The shortest token prefix that ``shared_prefix`` runs once per batch."""


@dataclass(frozen=True)
class SFTRun:
    """One phase of the warm start, ready to train (:func:`build_sft_run`)."""

    trainer: SFTTrainer
    """TRL's trainer; its ``train_dataset`` holds the prepared ``input_ids`` and ``labels``."""
    tokenizer: PreTrainedTokenizerBase
    """The trainer's tokenizer (it may render with the RL-aligned template while training)."""
    chat_template: str | None
    """The tokenizer's own chat template: the saved tokenizer keeps it."""
    time_budget: TimeBudgetCallback | None
    """The clock that stops training at ``time_budget_s``; None without a budget."""
    action_format: str
    """The action format the transcripts' tools are written in (``"auto"`` resolved)."""


def build_sft_run(
    model_path: str | os.PathLike[str],
    output_dir: str | os.PathLike[str],
    dataset: Dataset,
    settings: SFTSettings,
    *,
    seed: int = 0,
    action_format: str = "auto",
    chat_template: str | None = None,
    health_action: str = "warn",
) -> SFTRun:
    """One phase of :func:`sft_warm_start` (arguments as there), ready to train: the model and
    tokenizer loaded, the rows prepared, TRL's ``SFTTrainer`` built from ``settings``.

    Raises:
        InvalidArgumentError: ``settings`` asks for a short-context phase (one phase is built
            here; :func:`~trainers.sft.settings.short_context_phase` gives its settings), or
            ``settings.trl_options`` names a field the warm start sets or ``SFTConfig`` lacks.
    """
    import torch
    from torch.optim.lr_scheduler import LambdaLR
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    if settings.short_context_steps:
        raise InvalidArgumentError(
            "build_sft_run builds one phase, and settings.short_context_steps is "
            f"{settings.short_context_steps}; run sft_warm_start for both phases, or build each "
            "with short_context_phase(settings) and full_phase(settings, seconds)."
        )
    ours = sft_config_fields(settings, output_dir, seed, tokenized=False, use_cpu=True)
    options = check_trl_options(settings.trl_options, ours, SFTConfig)  # before the model loads
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
    if settings.loss_mask == "rl":
        probe = [dataset[i] for i in range(min(4, len(dataset)))]
        aligned = rl_aligned_chat_template(tokenizer, probe)
        if aligned is None:  # any other template: the rows as the rollout tokenizes them
            dataset = rl_token_dataset(tokenizer, dataset, action_format=action_format)
            tokenized = True
        else:
            tokenizer.chat_template = aligned
    if not tokenized:  # TRL tokenizes the rows: each one through template_input, as at RL time
        dataset = text_layout_dataset(tokenizer, dataset, action_format=action_format)
    use_cpu = settings.use_cpu if settings.use_cpu is not None else not torch.cuda.is_available()
    fields = sft_config_fields(settings, output_dir, seed, tokenized=tokenized, use_cpu=use_cpu)
    config = SFTConfig(**fields, **options)
    budget = (
        TimeBudgetCallback(settings.time_budget_s) if settings.time_budget_s is not None else None
    )
    schedule = functools.partial(
        lr_schedule,
        settings.lr_scheduler_type,
        settings.warmup_steps,
        settings.min_lr_ratio,
        budget=budget,
    )
    prefix = MIN_SHARED_PREFIX if settings.shared_prefix else None
    length_chunked = settings.length_chunked

    class _Trainer(SFTTrainer):
        def create_scheduler(self, num_training_steps: int, optimizer: Any = None) -> Any:
            if self.lr_scheduler is None:
                factor = schedule(total_steps=num_training_steps)
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
    if settings.lora is not None:
        from peft import LoraConfig

        lora = {"target_modules": "all-linear", **settings.lora}
        peft_config = LoraConfig(**lora, task_type="CAUSAL_LM")
    trainer = _Trainer(
        model=model,
        args=config,
        train_dataset=dataset.select_columns(keep),
        processing_class=tokenizer,
        callbacks=[HealthCallback(health_action, "sft"), *([] if budget is None else [budget])],
        peft_config=peft_config,
    )
    return SFTRun(trainer, tokenizer, original_template, budget, action_format)


def sft_warm_start(
    model_path: str | os.PathLike[str],
    output_dir: str | os.PathLike[str],
    dataset: Dataset,
    settings: SFTSettings,
    *,
    short_dataset: Dataset | None = None,
    seed: int = 0,
    action_format: str = "auto",
    chat_template: str | None = None,
    health_action: str = "warn",
) -> Path:
    """Supervised warm start of a causal LM on a conversational dataset, assistant turns only.

    TRL's ``SFTTrainer`` with ``SFTConfig(assistant_only_loss=True, bf16=False,
    activation_checkpointing=False, report_to="none", save_strategy="no")``, plain AdamW, fp32.
    With ``settings.short_context_steps`` a first phase trains on the transcripts without
    system prompt and tool specs (:func:`trainers.sft.data.short_context_dataset`), saved in
    ``<output_dir>_short_context``; the full transcripts then train from it
    (:func:`~trainers.sft.settings.short_context_phase`,
    :func:`~trainers.sft.settings.full_phase`: one warmup, one time budget for both).

    Args:
        model_path: A directory ``from_pretrained`` loads (model and tokenizer).
        output_dir: Where the final model and tokenizer are saved (``save_pretrained``), with
            ``sft_info.json`` (steps, seconds, tokens, first and last loss, the phase's
            settings).
        dataset: Conversational rows (``messages``, ``tools``) of :mod:`trainers.sft.data`
            (:func:`oracle_sft_dataset`, :func:`sft_dataset_from_multi_turn`). Other columns are
            ignored.
        settings: How to train (:class:`~trainers.sft.settings.SFTSettings`; the fields that
            say where transcripts come from are not read here).
        short_dataset: The transcripts of the short-context phase (None: ``dataset``'s).
        seed: Seed of the initialisation of everything random (data order included).
        action_format: The action format of the conversations' tool calls: it writes the tools
            as text for a chat template that cannot render them
            (:mod:`llm_gym.policies.template_tools`). ``"auto"``: the one the model's chat
            template teaches, else hermes
            (:func:`~llm_gym.policies.template_format.episode_format`).
        chat_template: The chat template for a model without one (a base model): a named
            template (``"chatml"``, ``"gemma"``: its turn tokens added where missing, the
            embeddings resized, as TRL's ``clone_chat_template``) or a ``.jinja`` file; the
            saved model keeps it. None: the model's own (a model with none is refused).
        health_action: What a health check that fires does (:mod:`trainers.grpo.health`; SFT runs
            ``nonfinite_loss``): ``"warn"``, ``"stop"`` (the loop ends; the model is saved) or
            ``"off"``.

    Returns:
        ``output_dir``.
    """
    phase = functools.partial(
        _train_phase,
        seed=seed,
        action_format=action_format,
        chat_template=chat_template,
        health_action=health_action,
    )
    out = Path(output_dir)
    short_seconds = None
    if settings.short_context_steps > 0:
        start = time.perf_counter()
        steps = settings.short_context_steps
        print(f"   phase 1: {steps} steps without the system prompt", flush=True)
        short = short_context_dataset(dataset if short_dataset is None else short_dataset)
        short_out = out.with_name(f"{out.name}_short_context")
        model_path = phase(model_path, short_out, short, short_context_phase(settings))
        short_seconds = time.perf_counter() - start
        print("   phase 2: the full transcripts", flush=True)
    return phase(model_path, out, dataset, full_phase(settings, short_seconds))


def _train_phase(
    model_path: str | os.PathLike[str],
    output_dir: Path,
    dataset: Dataset,
    settings: SFTSettings,
    **context: Any,
) -> Path:
    """One phase of :func:`sft_warm_start`: trains, saves the model and ``sft_info.json``."""
    run = build_sft_run(model_path, output_dir, dataset, settings, **context)
    trainer = run.trainer
    result = trainer.train()
    output_dir.mkdir(parents=True, exist_ok=True)
    run.tokenizer.chat_template = run.chat_template
    model = trainer.accelerator.unwrap_model(trainer.model)
    if settings.lora is not None:  # the adapter merged in: the output is an ordinary model folder
        model = model.merge_and_unload()
    model.save_pretrained(output_dir, safe_serialization=True)
    run.tokenizer.save_pretrained(output_dir)
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    tokens = [e["num_tokens"] for e in trainer.state.log_history if "num_tokens" in e]
    stopped = run.time_budget is not None and run.time_budget.stopped
    if stopped:
        print(
            f"[sft] stopped by time_budget_s={settings.time_budget_s:g} after "
            f"{trainer.state.global_step} of {trainer.state.max_steps} steps: this machine "
            "trains slower than the budget allows for, so this run is not the recipe as "
            "configured (raise time_budget_s to run it whole)",
            file=sys.stderr,
            flush=True,
        )
    info = {
        "model_path": str(model_path),
        "examples": len(dataset),
        "action_format": run.action_format,
        "steps": trainer.state.global_step,
        "epochs": trainer.state.epoch,
        "train_seconds": result.metrics.get("train_runtime"),
        "steps_per_second": result.metrics.get("train_steps_per_second"),
        "num_tokens": tokens[-1] if tokens else None,
        "first_loss": losses[0] if losses else None,
        "last_loss": losses[-1] if losses else None,
        "train_loss": result.metrics.get("train_loss"),
        "stopped_by_time_budget": stopped,
        "settings": dataclasses.asdict(settings),
    }
    (output_dir / "sft_info.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    return output_dir
