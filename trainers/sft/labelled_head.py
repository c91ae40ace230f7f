"""The SFT loss's LM head over the labelled positions only: TRL's fused head, cheaper off Triton.

TRL's ``SFTTrainer`` calls the model with ``fused_lm_head=True`` (``trl.trainer.utils.
add_fused_lm_head``): the backbone, then the LM head in tiles that are recomputed in the backward,
so the ``(rows, length, vocab)`` logits never exist. On Triton devices it projects only the
positions whose next token is trained; elsewhere every position (fixed tile shapes for compilers
such as Neuron's). Off Triton, projecting only the labelled positions saves the head's work on
every unlabelled one (most of an SFT row's prompt); the measured step times are in
``benchmarks/results/README.md``.

:func:`labelled_head_forward` computes the same :class:`~trl.trainer.utils.FusedCausalLMOutput`
(``loss``, ``log_probs``, ``entropy``, ``is_top1``, ``label_mask``: the fields ``SFTTrainer``
reads) from the labelled positions' logits in one product, when they are small
(:data:`MAX_LOGITS`); otherwise, and for a model it cannot read the same way
(:func:`unsupported_reason`), the caller runs TRL's own head.
"""

from __future__ import annotations

from typing import Any

__all__ = ["MAX_LOGITS", "labelled_head_forward", "unsupported_reason"]

MAX_LOGITS = 1 << 24
"""Most logits (labelled positions x vocabulary) one call materialises: 64 MB in float32 (the
log-softmax and its gradient hold two more such tensors). Past it TRL's tiled head runs."""

_SCALING = ("final_logit_softcapping", "logit_scale", "output_multiplier", "lm_head_multiplier",
            "logits_scaling")  # fmt: skip


def unsupported_reason(model: Any, *, backbone_only: bool = False) -> str | None:
    """Why :func:`labelled_head_forward` cannot stand in for the model's fused head, or None.

    It needs a plain ``nn.Linear`` LM head on an unsharded weight, a ``base_model`` backbone, and
    logits that are that product alone (no soft-capping or scaling, as TRL applies for Gemma,
    Granite, Falcon-H1...); a PEFT wrapper, an MoE model's router loss and a forward wrapped for
    mixed precision (``bf16=True``: TRL's head runs under its autocast) are left to TRL.
    ``backbone_only``: the caller runs the backbone and the head itself, under the trainer's
    autocast, so a wrapped forward and PEFT's adapters in the backbone (``model`` being PEFT's
    base model) are fine; the head must still be plain.
    """
    import torch

    if hasattr(model, "peft_config") and not backbone_only:
        return "a PEFT model"
    if getattr(model, "_original_forward", None) is not None and not backbone_only:
        # accelerate's mixed precision wraps ``forward`` in autocast; this head calls the
        # backbone itself and would run it unwrapped, in float32
        return "its forward is wrapped (accelerate's mixed precision)"
    head = getattr(model, "get_output_embeddings", lambda: None)()
    if not isinstance(head, torch.nn.Linear) or type(head.weight.data) is not torch.Tensor:
        return "its LM head is not a plain nn.Linear"
    if getattr(model, "base_model", None) is None or model.base_model is model:
        return "it has no separate backbone (base_model)"
    config = model.config.get_text_config()
    for name in _SCALING:
        if getattr(config, name, None) is not None:
            return f"its logits are scaled ({name})"
    if getattr(config, "output_router_logits", False):
        return "it adds a router loss"
    return None


def labelled_head_forward(
    model: Any,
    *,
    labels: Any = None,
    shift_labels: Any = None,
    num_items_in_batch: Any = None,
    fused_lm_head: bool = True,
    **kwargs: Any,
) -> Any:
    """``model(**kwargs, labels=..., fused_lm_head=True)`` with the head over labelled positions.

    Takes what TRL's fused forward takes (``labels`` shifted here, or pre-shifted
    ``shift_labels``) and returns its output at temperature 1: per-token fields of the labels'
    shape, zero where the label is -100. Returns None, having run nothing, when the labelled
    positions' logits would exceed :data:`MAX_LOGITS` elements; the caller then runs the model's
    own fused head. Only for a model :func:`unsupported_reason` accepts.
    """
    import torch
    from trl.trainer.utils import FusedCausalLMOutput

    if not fused_lm_head:
        raise ValueError("labelled_head_forward stands in for the fused head (fused_lm_head=True).")
    targets = labels[:, 1:] if shift_labels is None else shift_labels
    mask = targets != -100
    head = model.get_output_embeddings()
    if int(mask.sum()) * head.weight.size(0) > MAX_LOGITS:
        return None
    kwargs["use_cache"] = False
    hidden = model.base_model(**kwargs).last_hidden_state
    if shift_labels is None:
        hidden = hidden[:, :-1]
    target = targets[mask]
    logits = torch.nn.functional.linear(hidden[mask], head.weight, head.bias)
    log_softmax = logits.float().log_softmax(dim=-1)
    picked = log_softmax.gather(1, target.unsqueeze(1)).squeeze(1)
    with torch.no_grad():
        entropy = -(log_softmax.exp() * log_softmax).sum(dim=-1)
        is_top1 = logits.argmax(dim=-1) == target

    def per_token(values: Any) -> Any:  # connected to the graph even with no label at all
        return values.new_zeros(mask.shape).masked_scatter(mask, values)

    log_probs = per_token(picked)
    count = mask.sum().clamp(min=1) if num_items_in_batch is None else num_items_in_batch
    return FusedCausalLMOutput(
        loss=-log_probs.sum() / count,
        log_probs=log_probs,
        entropy=per_token(entropy),
        is_top1=per_token(is_top1),
        label_mask=mask,
    )
