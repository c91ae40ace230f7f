"""The trainer's scoring: the batch, reference, behaviour and teacher logprobs, and scoring with
a shared prefix.

Functions of :class:`~trainers.grpo.trainer.MultiTurnGRPOTrainer`'s state, called from its TRL
seams: :func:`training_batch` turns episode groups into the tensors TRL's loss reads (with
on-policy distillation's teacher advantages, :mod:`trainers.distillation.config`);
:func:`reference_logps` adds what TRL's loss reads besides the batch (``old_per_token_logps``,
``ref_per_token_logps``, vLLM's importance-sampling ratio) and marks async training's stale
tokens; :func:`shared_prefix_scores` runs the rows' shared prefix once
(:mod:`trainers.grpo.shared_prefix`); :func:`weigh_stale_advantages` is the off-policy correction
the loss applies to those stale tokens.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from trainers.distillation.config import build_teacher, distill_batch
from trainers.grpo.batch import (
    episode_batch,
    importance_sampling_ratio,
    logprob_gap,
    off_policy_weights,
    pad_rows,
    silent_rows_skippable,
    stale_token_mask,
    without_silent_rows,
)
from trainers.grpo.shared_prefix import (
    cache_keyword,
    plan_shared_prefix,
    score_shared_prefix,
    shared_prefix_applies,
)
from trainers.grpo.token_tree import (
    plan_token_tree,
    score_token_tree,
    tree_costs,
    tree_unsupported_reason,
)

if TYPE_CHECKING:
    from trainers.grpo.trainer import MultiTurnGRPOTrainer

__all__ = [
    "StaleTokens",
    "reference_logps",
    "shared_prefix_scores",
    "token_tree_scores",
    "training_batch",
    "weigh_stale_advantages",
]


def training_batch(
    trainer: MultiTurnGRPOTrainer, groups: Sequence[Sequence[Any]], advantages: Any
) -> tuple[dict[str, Any], int, dict[str, float]]:
    """The step's batch from its episode groups and their advantages, the samples dropped
    over ``max_samples_per_episode``, and metrics (distillation's, async's)."""
    args = trainer.grpo_args
    pad_id = trainer.pad_token_id
    batch, dropped = episode_batch(
        groups,
        advantages.episode,
        advantages.turns,
        overlong_masking=args.overlong_masking,
        max_rows=args.max_samples_per_episode,
        pad_id=pad_id,
    )
    accelerator = trainer.accelerator
    skip_silent = args.skip_silent_rows and silent_rows_skippable(
        loss_type=trainer.loss_type,
        beta=trainer.beta,
        top_entropy_quantile=trainer.top_entropy_quantile,
        entropy_bonus=bool(getattr(trainer, "_entropy_bonus_enabled", False)),
        aux_loss=bool(getattr(trainer, "aux_loss_enabled", False)),
        per_token_advantages_added=args.distillation_settings is not None,
    )
    if skip_silent:  # the same loss and gradients, without their passes
        batch, loss_tokens = without_silent_rows(batch)
    else:
        loss_tokens = int(batch["tool_mask"].sum())
    # As many rows on every rank (a row per sample varies; void episodes leave gaps), in
    # whole micro-batches; at least the batch TRL expects unless silent rows were left out.
    most = accelerator.gather(torch.tensor([len(batch["advantages"])], device=accelerator.device))
    expected = args.per_device_train_batch_size * args.steps_per_generation
    batch = pad_rows(
        batch,
        multiple=args.steps_per_generation,
        at_least=int(most.max()) if skip_silent else max(int(most.max()), expected),
        pad_id=pad_id,
    )
    batch = {key: tensor.to(accelerator.device) for key, tensor in batch.items()}
    metrics: dict[str, float] = {}
    settings = args.distillation_settings
    if settings is not None:
        start = time.perf_counter()
        if trainer.teacher is None:
            trainer.teacher = build_teacher(settings, accelerator.device)
        kl_sum, tokens = distill_batch(batch, trainer.teacher, settings)
        totals = (
            accelerator.gather(
                torch.tensor([kl_sum, tokens], dtype=torch.float64, device=accelerator.device)
            )
            .view(-1, 2)
            .sum(0)
        )
        metrics["distill/reverse_kl"] = float(totals[0] / totals[1].clamp(min=1))
        metrics["distill/teacher_s"] = time.perf_counter() - start
    # The loss tokens of every row, silent ones left out of the passes included.
    count = torch.tensor(loss_tokens, dtype=torch.long, device=accelerator.device)
    batch["num_items_in_batch"] = accelerator.gather(count).sum()
    metrics.update(reference_logps(trainer, batch))
    batch.pop("sampling_per_token_logps")
    return batch, dropped, metrics


def reference_logps(trainer: MultiTurnGRPOTrainer, batch: dict[str, Any]) -> dict[str, float]:
    """Add ``old_per_token_logps`` when off-policy or when the sampler is another kernel (vLLM,
    an in-process sampler in bf16: their logprob gap is logged), ``ref_per_token_logps`` when
    beta != 0, vLLM's importance-sampling ratio, and, when older weights or a bf16 sampler
    sampled tokens in-process, what the loss needs to correct them (``behaviour_logps``,
    ``stale_mask``; see :func:`weigh_stale_advantages`). Returns the async and sampling
    metrics."""
    args = trainer.grpo_args
    input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    attention = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    keep = batch["completion_ids"].size(1)
    micro = args.per_device_train_batch_size
    generate_every = args.steps_per_generation * trainer.num_iterations
    correct = trainer.use_vllm and trainer.vllm_importance_sampling_correction
    # An in-process sampler in bf16 is another kernel than the trainer's, as vLLM is.
    other_kernel = not trainer.use_vllm and trainer.precision.sampling_bf16
    loss_mask = batch["completion_mask"] * batch["tool_mask"]
    versions = batch.pop("policy_versions", None)
    stale = None
    if args.is_async and versions is not None:
        stale = stale_token_mask(versions, trainer.state.global_step, loss_mask)
    metrics: dict[str, float] = {}
    if stale is not None:
        metrics["async/stale_token_ratio"] = float(stale.sum() / loss_mask.sum().clamp(min=1))
    # In-process generators: correct only the tokens older weights sampled (the current
    # weights' tokens are the current policy's, bit for bit), and every token of a bf16
    # sampler. vLLM: TRL's correction below covers every token (kernel mismatch and staleness
    # alike).
    behaviour = loss_mask.clone() if other_kernel else stale
    fold = (
        behaviour is not None
        and not trainer.use_vllm
        and trainer.vllm_importance_sampling_correction
        and bool(behaviour.any())
    )
    if fold:  # weighed in the loss, from the logprobs its own forward pass computes
        batch["behaviour_logps"] = batch["sampling_per_token_logps"]
        batch["stale_mask"] = behaviour

    def logps(model: Any) -> Any:
        return trainer.token_logps(model, input_ids, attention, keep, batch_size=micro)

    with torch.no_grad():
        if args.gradient_accumulation_steps % generate_every != 0 or correct or other_kernel:
            batch["old_per_token_logps"] = logps(trainer.model)
        if "old_per_token_logps" in batch:  # the sampler's logprobs against the trainer's
            gap = logprob_gap(
                batch["old_per_token_logps"], batch["sampling_per_token_logps"], loss_mask
            )  # gathered: every process reads the same step log (health checks stop all)
            gaps = trainer.accelerator.gather(torch.tensor([gap], device=loss_mask.device))
            metrics["sampling/sampling_logp_difference/mean"] = float(gaps[:, 0].mean())
            metrics["sampling/sampling_logp_difference/max"] = float(gaps[:, 1].max())
        if correct:  # vLLM's sampler vs the trainer's logprobs, as TRL corrects it
            batch["importance_sampling_ratio"] = importance_sampling_ratio(
                batch["old_per_token_logps"],
                batch["sampling_per_token_logps"],
                loss_mask,
                trainer.vllm_importance_sampling_mode,
                trainer.vllm_importance_sampling_clip_min,
                trainer.vllm_importance_sampling_clip_max,
            )
        if trainer.beta != 0.0:
            if trainer.ref_model is not None:
                batch["ref_per_token_logps"] = logps(trainer.ref_model)
            else:
                from trl.trainer.utils import use_adapter

                unwrapped = trainer.accelerator.unwrap_model(trainer.model)
                name = "ref" if "ref" in getattr(unwrapped, "peft_config", {}) else None
                with use_adapter(unwrapped, adapter_name=name):
                    batch["ref_per_token_logps"] = logps(trainer.model)
    return metrics


def shared_prefix_scores(
    trainer: MultiTurnGRPOTrainer,
    model: Any,
    input_ids: Any,
    attention_mask: Any,
    logits_to_keep: int,
    *,
    batch_size: int | None,
    compute_entropy: bool,
    extra_inputs: bool,
) -> tuple[Any, Any, None] | None:
    """TRL's scoring with the rows' token tree (``args.token_tree``, for a model
    :func:`~trainers.grpo.token_tree.tree_unsupported_reason` accepts) or else their shared
    prefix run once (``args.shared_prefix``), or None where TRL's own forward must run.

    Same values and gradients as TRL's full forward (see :mod:`trainers.grpo.token_tree` and
    :mod:`trainers.grpo.shared_prefix`);
    None for multimodal or MoE-aux batches (``extra_inputs``), for models wrapped or sharded for
    distributed training (DDP, FSDP, DeepSpeed), under gradient checkpointing (in the config or
    on the model), when the shared prefix is short, and for a model that returns no cache.
    """
    args = trainer.grpo_args
    unwrapped = trainer.accelerator.unwrap_model(model)
    if not shared_prefix_applies(
        enabled=args.shared_prefix,
        wrapped=unwrapped is not model,
        sharded=trainer.is_fsdp_enabled or trainer.is_deepspeed_enabled,
        gradient_checkpointing=args.gradient_checkpointing
        or getattr(unwrapped, "is_activation_checkpointing", False),
        extra_inputs=extra_inputs,
    ):
        return None
    base = unwrapped.get_base_model() if hasattr(unwrapped, "get_base_model") else unwrapped
    if args.token_tree and tree_unsupported_reason(base) is None:
        scored = token_tree_scores(
            trainer, base, input_ids, attention_mask, logits_to_keep,
            batch_size=batch_size, compute_entropy=compute_entropy,
        )  # fmt: skip
        if scored is not None:
            return scored
    plan = plan_shared_prefix(
        input_ids, attention_mask, logits_to_keep, args.shared_prefix_min_length
    )
    if plan is None:
        return None
    scored = score_shared_prefix(
        model,
        plan,
        keyword=cache_keyword(base.forward),  # PEFT's forward takes it through **kwargs
        batch_size=batch_size or input_ids.size(0),
        compute_entropy=compute_entropy,
        autocast=trainer.accelerator.autocast,
    )
    if scored is None:
        return None
    logps, entropies = scored
    return logps, entropies, None


def token_tree_scores(
    trainer: MultiTurnGRPOTrainer,
    model: Any,
    input_ids: Any,
    attention_mask: Any,
    logits_to_keep: int,
    *,
    batch_size: int | None,
    compute_entropy: bool,
) -> tuple[Any, Any, None] | None:
    """TRL's scoring with each chunk of ``batch_size`` rows run as its token tree
    (:mod:`trainers.grpo.token_tree`), or None when a chunk cannot be (nothing scored, a
    non-contiguous row, no cache)."""
    import torch

    args = trainer.grpo_args
    step = batch_size or input_ids.size(0)
    logps, entropies = [], []
    for start in range(0, input_ids.size(0), step):
        rows = slice(start, start + step)
        plan = plan_token_tree(
            input_ids[rows],
            attention_mask[rows],
            logits_to_keep,
            min_prefix=args.shared_prefix_min_length,
            row_tokens=args.token_tree_row_tokens,
            costs=tree_costs(model),
        )
        if plan is None:
            return None
        scored = score_token_tree(
            model,
            plan,
            temperature=trainer.temperature,
            compute_entropy=compute_entropy,
            autocast=trainer.accelerator.autocast,
            head_in_fp32=bool(getattr(trainer.args, "cast_lm_head_to_fp32", False)),
        )
        if scored is None:
            return None
        logps.append(scored[0])
        entropies.append(scored[1])
    return torch.cat(logps), (torch.cat(entropies) if compute_entropy else None), None


def weigh_stale_advantages(
    trainer: MultiTurnGRPOTrainer, inputs: dict[str, Any], stale: StaleTokens, logps: Any
) -> float | None:
    """Multiply the advantages in ``inputs`` (what TRL's loss reads) by
    :func:`~trainers.grpo.batch.off_policy_weights` of the policy's logprobs over the sampler's
    on the ``stale`` tokens; the mean weight over them (None when there are none).

    The policy's logprobs are ``old_per_token_logps`` when TRL computed them, else the detached
    ``logps`` of the loss's own forward pass (the same values at the first iteration), so no
    extra pass runs. Every GRPO loss TRL offers is positively homogeneous in the advantage, so
    this is ``per_token_loss * weight``, as TRL applies vLLM's importance-sampling ratio.
    """
    target = inputs.get("old_per_token_logps")
    weights = off_policy_weights(
        logps.detach() if target is None else target,
        stale.behaviour_logps,
        inputs["completion_mask"] * inputs["tool_mask"],
        stale.mask,
        trainer.vllm_importance_sampling_mode,
        trainer.vllm_importance_sampling_clip_min,
        trainer.vllm_importance_sampling_clip_max,
    )
    inputs["advantages"] = inputs["advantages"] * weights
    if not stale.mask.any():
        return None
    return float(weights.expand_as(stale.mask)[stale.mask > 0].float().mean())


@dataclass(frozen=True)
class StaleTokens:
    """A micro-batch's tokens that another policy sampled in-process (``mask``: older weights
    in async training, every token of a bf16 sampler), and the sampler's logprobs of every
    token (``behaviour_logps``), taken out of the batch for the loss."""

    mask: Any
    behaviour_logps: Any

    @classmethod
    def take(cls, inputs: dict[str, Any]) -> tuple[dict[str, Any], StaleTokens | None]:
        """``inputs`` without the two columns, and the record (None when the batch has none)."""
        if "behaviour_logps" not in inputs:
            return inputs, None
        rest = dict(inputs)
        return rest, cls(mask=rest.pop("stale_mask"), behaviour_logps=rest.pop("behaviour_logps"))
