"""Score a GRPO batch's completions once per shared prefix instead of once per row.

Every episode of a tool-use environment opens with the same system prompt and tool specs (most
of a ToolUseGame episode's tokens), and TRL's loss forward runs all of them for every row.
:func:`plan_shared_prefix` finds the longest token prefix that every row of a
``[left-padded prompt | right-padded completion]`` batch starts with; the trainer runs that
prefix once (one row, with gradients), repeats its keys and values over the rows, and runs only
the rest. The log-probabilities are the same as a full forward's (up to float rounding) and so
are the gradients: the prefix's keys and values reach the loss through the repeat.

The plan is pure index arithmetic on the batch (tested on hand-made batches);
:func:`score_shared_prefix` makes the model calls, and
:meth:`trainers.grpo.trainer.MultiTurnGRPOTrainer._get_per_token_logps_and_entropies` decides when
they apply.
:func:`shared_prefix_inputs` does the same for an SFT batch (``labels``, right-padded) inside
the SFT trainer's loss.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from trainers.grpo.length_chunks import common_prefix_length, length_chunks

__all__ = [
    "shared_prefix_applies",
    "SharedPrefixPlan",
    "cache_keyword",
    "output_cache",
    "plan_shared_prefix",
    "score_shared_prefix",
    "shared_prefix_inputs",
]


@dataclass(frozen=True)
class SharedPrefixPlan:
    """How to score a batch as one shared prefix plus per-row suffixes.

    Shapes: ``B`` rows, ``L`` prefix tokens, ``S`` suffix tokens, ``C`` completion columns.
    """

    prefix_ids: Any
    """(1, L): the tokens every row starts with."""
    suffix_ids: Any
    """(B, S): each row's tokens after the prefix, right-padded."""
    attention_mask: Any
    """(B, L + S): 1 on the prefix and on each row's real suffix tokens."""
    shift_labels: Any
    """(B, S): at suffix position ``q``, the completion token predicted there, else -100."""
    gather_index: Any
    """(B, C): the suffix position whose prediction is completion column ``j`` (clamped where the
    column is padding)."""
    completion_mask: Any
    """(B, C): True on real completion tokens (bool)."""


def shared_prefix_applies(
    *,
    enabled: bool,
    wrapped: bool,
    sharded: bool,
    gradient_checkpointing: bool,
    extra_inputs: bool,
) -> bool:
    """Whether GRPO may score the rows' shared prefix once (else TRL's full forward runs).

    Not for a model under a wrapper (DDP, DeepSpeed) or sharded (FSDP, ZeRO-3): those may gather
    parameters per forward, so every process must run the same passes. Not under gradient
    checkpointing, which turns the prefix's KV cache off. Not with multimodal inputs or MoE's
    auxiliary loss, which the prefix pass does not carry.

    Example:
        >>> shared_prefix_applies(enabled=True, wrapped=False, sharded=False,
        ...                       gradient_checkpointing=False, extra_inputs=False)
        True
    """
    return enabled and not (wrapped or sharded or gradient_checkpointing or extra_inputs)


def plan_shared_prefix(
    input_ids: Any, attention_mask: Any, logits_to_keep: int, min_length: int = 32
) -> SharedPrefixPlan | None:
    """The shared-prefix plan of a batch, or None when the shared prefix is too short to pay.

    Args:
        input_ids: (B, P + C) prompt ids left-padded to ``P`` then completion ids right-padded to
            ``C`` (TRL's layout).
        attention_mask: (B, P + C), 1 on real tokens.
        logits_to_keep: ``C``, the completion width.
        min_length: The shortest prefix worth a separate pass.

    The prefix stops one token before the shortest prompt ends, so the prediction of every
    completion token (made at the position before it) lies in the suffix.

    Example:
        >>> import torch
        >>> ids = torch.tensor([[0, 5, 6, 7, 1, 2], [5, 6, 8, 9, 3, 0]])
        >>> mask = torch.tensor([[0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0]])
        >>> plan = plan_shared_prefix(ids, mask, logits_to_keep=2, min_length=1)
        >>> plan.prefix_ids.tolist(), plan.suffix_ids.tolist()
        ([[5, 6]], [[7, 1, 2], [8, 9, 3]])
        >>> plan.shift_labels.tolist(), plan.gather_index.tolist()
        ([[1, 2, -100], [-100, 3, -100]], [[0, 1], [1, 0]])
    """
    import torch

    rows, width = input_ids.shape
    if rows < 2 or logits_to_keep < 1 or logits_to_keep >= width:
        return None
    mask = attention_mask.bool()
    prompt_width = width - logits_to_keep
    prompt_lengths = mask[:, :prompt_width].sum(dim=1)  # real prompt tokens per row
    lengths = mask.sum(dim=1)
    if int(prompt_lengths.min()) < 1:
        return None
    # Each row's real tokens shifted to start at column 0 (left padding removed).
    shift = prompt_width - prompt_lengths
    columns = torch.arange(width, device=input_ids.device).unsqueeze(0) + shift.unsqueeze(1)
    aligned_mask = torch.arange(width, device=input_ids.device).unsqueeze(0) < lengths.unsqueeze(1)
    aligned = torch.where(aligned_mask, input_ids.gather(1, columns.clamp(max=width - 1)), 0)
    common = common_prefix_length(aligned, aligned_mask)
    prefix = min(common, int(prompt_lengths.min()) - 1)
    if prefix < max(1, min_length):
        return None
    total = int(lengths.max())
    suffix_ids = aligned[:, prefix:total]
    suffix_mask = aligned_mask[:, prefix:total]
    span = total - prefix
    # Completion column j of row i sits at aligned position prompt_length_i + j and is predicted
    # at the position before it: suffix position prompt_length_i + j - 1 - prefix.
    j = torch.arange(logits_to_keep, device=input_ids.device).unsqueeze(0)
    target = prompt_lengths.unsqueeze(1) + j - 1 - prefix
    completion_real = mask[:, prompt_width:]
    gather_index = torch.where(completion_real, target, 0).clamp(0, span - 1)
    shift_labels = torch.full((rows, span), -100, dtype=input_ids.dtype, device=input_ids.device)
    completion_ids = input_ids[:, prompt_width:]
    row_index = torch.arange(rows, device=input_ids.device).unsqueeze(1).expand_as(target)
    real = completion_real & (target >= 0) & (target < span)
    shift_labels[row_index[real], target[real]] = completion_ids[real]
    full_mask = torch.cat(
        [
            torch.ones((rows, prefix), dtype=attention_mask.dtype, device=input_ids.device),
            suffix_mask.to(attention_mask.dtype),
        ],
        dim=1,
    )
    return SharedPrefixPlan(
        prefix_ids=aligned[:1, :prefix],
        suffix_ids=suffix_ids,
        attention_mask=full_mask,
        shift_labels=shift_labels,
        gather_index=gather_index,
        completion_mask=completion_real,
    )


def score_shared_prefix(
    model: Any,
    plan: SharedPrefixPlan,
    *,
    keyword: str,
    batch_size: int,
    compute_entropy: bool,
    autocast: Callable[[], AbstractContextManager[Any]],
) -> tuple[Any, Any] | None:
    """The per-token logprobs (and entropies) of a planned batch's completion tokens, as TRL's
    scoring gives them: (B, C) each, 0.0 on completion padding.

    Rows are scored in chunks of up to ``batch_size`` rows of similar length
    (:func:`length_chunks`); per chunk the prefix runs once (with gradients) and its keys and
    values are repeated over the chunk's rows.

    Args:
        model: The (unwrapped) causal LM; its forward takes ``shift_labels`` and
            ``fused_lm_head`` and returns ``log_probs`` and ``entropy``.
        plan: :func:`plan_shared_prefix` of the batch.
        keyword: The keyword the model's forward takes its cache under (:func:`cache_keyword`).
        batch_size: Rows per forward.
        compute_entropy: Also return the entropies (else None).
        autocast: The mixed-precision context of the forwards (``accelerator.autocast``).

    Returns:
        ``(logps, entropies)``, or None when the model returns no cache (score it TRL's way).
    """
    import torch

    prefix_length = plan.prefix_ids.size(1)
    lengths = plan.attention_mask[:, prefix_length:].sum(dim=1).tolist()
    # Rows of similar length together: a chunk runs padded to its longest row only.
    chunks = length_chunks(lengths, batch_size, overhead=prefix_length + 64)
    all_logps, all_entropies = [], []
    for chunk in chunks:
        rows = torch.tensor(chunk, device=plan.suffix_ids.device)
        width = max(1, int(lengths[chunk[0]]))
        with autocast():
            prefix = model(input_ids=plan.prefix_ids, use_cache=True, logits_to_keep=1)
            cache = output_cache(prefix)
            if cache is None:
                return None
            cache.batch_repeat_interleave(len(chunk))
            outputs = model(
                input_ids=plan.suffix_ids[rows, :width],
                attention_mask=plan.attention_mask[rows, : prefix_length + width],
                **{keyword: cache},
                shift_labels=plan.shift_labels[rows, :width],
                fused_lm_head=True,
            )
        # A real completion token is predicted within its row's length; padding columns point
        # anywhere in range and come out as 0.0, as TRL's path gives them.
        index = plan.gather_index[rows].clamp(max=width - 1)
        padding = ~plan.completion_mask[rows]
        all_logps.append(outputs.log_probs.gather(1, index).masked_fill(padding, 0.0))
        if compute_entropy:
            all_entropies.append(outputs.entropy.gather(1, index).masked_fill(padding, 0.0))
    # Back to the batch's row order.
    inverse = torch.empty(len(lengths), dtype=torch.long, device=plan.suffix_ids.device)
    order = torch.tensor([i for chunk in chunks for i in chunk], device=inverse.device)
    inverse[order] = torch.arange(len(lengths), device=inverse.device)
    logps = torch.cat(all_logps, dim=0)[inverse]
    entropies = torch.cat(all_entropies, dim=0)[inverse] if compute_entropy else None
    return logps, entropies


def cache_keyword(forward: Any) -> str:
    """The keyword a model's ``forward`` takes its KV cache under: ``cache`` (transformers 5.2x)
    or the older ``past_key_values``."""
    import inspect

    try:
        parameters = inspect.signature(forward).parameters
    except (TypeError, ValueError):
        return "past_key_values"
    return "cache" if "cache" in parameters else "past_key_values"


def output_cache(outputs: Any) -> Any:
    """The KV cache of a forward's outputs (``cache``, or the older ``past_key_values``)."""
    cache = getattr(outputs, "cache", None)
    return cache if cache is not None else getattr(outputs, "past_key_values", None)


def shared_prefix_inputs(model: Any, inputs: dict[str, Any], min_length: int) -> dict[str, Any]:
    """An SFT batch with its shared prefix precomputed (``shared_prefix`` of
    :func:`trainers.sft.train.sft_warm_start`): the suffix ids, the full attention mask, the
    prefix's keys and values repeated over the batch, and the labels pre-shifted for the suffix
    positions.

    ``inputs`` is a causal-LM batch (``input_ids``, ``attention_mask``, ``labels``, right-padded);
    it comes back unchanged when it has other keys, fewer than two rows, or a shared untrained
    prefix shorter than ``min_length``, and when the model returns no cache.
    """
    import torch

    ids, labels = inputs.get("input_ids"), inputs.get("labels")
    mask = inputs.get("attention_mask")
    if ids is None or labels is None or mask is None or ids.dim() != 2 or ids.shape[0] < 2:
        return inputs
    if set(inputs) - {"input_ids", "labels", "attention_mask"}:
        return inputs  # position ids, padding-free or multimodal batches run as they are
    rows = ids.shape[0]
    common = common_prefix_length(ids, mask)
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
