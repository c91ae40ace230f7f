"""Run a padded batch as chunks of rows of similar length, each cut to its longest row.

A batch padded to its longest row spends the padding's FLOPs for nothing: a quarter of an SFT
step on ToolUseGame's short transcripts, more than half of a GRPO step's scoring. Each row's
result does not depend on the other rows, so rows of similar length can run together, each chunk
only as wide as its longest row. :func:`length_chunks` picks the chunks (pure index arithmetic,
tested by hand and by property); :mod:`trainers.grpo.shared_prefix` scores GRPO rows with them and
:class:`LengthChunkedLM` runs an SFT batch through TRL's fused LM head with them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["LengthChunkedLM", "common_prefix_length", "length_chunks"]


def length_chunks(lengths: Sequence[int], max_rows: int, overhead: int) -> list[list[int]]:
    """Row indices grouped into chunks of at most ``max_rows`` rows of similar length.

    A chunk runs padded to its longest row, and each chunk costs ``overhead`` tokens more (a
    prefix pass, call overhead). The chunks minimise the padded tokens plus the overheads: rows
    sorted longest first, cut where it pays (dynamic programming over the cut points,
    O(rows x max_rows)). Each chunk lists its rows longest first.

    Example:
        >>> length_chunks([10, 200, 12, 190], max_rows=4, overhead=50)
        [[1, 3], [2, 0]]
        >>> length_chunks([10, 200, 12, 190], max_rows=4, overhead=1000)
        [[1, 3, 2, 0]]
    """
    if max_rows < 1:
        raise ValueError(f"max_rows must be >= 1, actual value: {max_rows}.")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    count = len(order)
    best = [0.0] + [float("inf")] * count  # best[i]: the cheapest cover of the i longest rows
    cut = [0] * (count + 1)
    for end in range(1, count + 1):
        for start in range(max(0, end - max_rows), end):
            cost = best[start] + (end - start) * lengths[order[start]] + overhead
            if cost < best[end]:
                best[end], cut[end] = cost, start
    chunks = []
    end = count
    while end > 0:
        chunks.append(order[cut[end] : end])
        end = cut[end]
    return chunks[::-1]


def common_prefix_length(input_ids: Any, attention_mask: Any) -> int:
    """How many leading tokens every row of a batch shares (real tokens only).

    Example:
        >>> import torch
        >>> common_prefix_length(torch.tensor([[5, 6, 7], [5, 6, 8]]), torch.ones(2, 3))
        2
    """
    same = ((input_ids == input_ids[:1]) & (attention_mask == 1)).all(dim=0)
    return int(same.long().cumprod(dim=0).sum())


class LengthChunkedLM:
    """A causal LM with TRL's fused LM head, called on a right-padded batch one chunk of
    similar-length rows at a time (:func:`length_chunks`), each chunk's inputs first through
    ``prepare`` when given (the SFT trainer runs each chunk's shared prefix once with
    :func:`trainers.grpo.shared_prefix.shared_prefix_inputs`; chunks then cost that prefix more).

    Each row's per-token outputs are those of one call on the whole batch, to float rounding
    (under causal attention a real token never sees the padding after it), stitched back in
    the batch's row order, left-aligned and zero beyond the row's chunk: so their sums (the
    loss, TRL's entropy, accuracy and token counts) are the batch's. Use it where the caller
    calls ``model(input_ids=..., attention_mask=..., labels=..., fused_lm_head=True)`` and
    reduces the per-token fields (TRL's ``SFTTrainer.compute_loss``); :meth:`applies` says
    whether a batch suits it. ``head(model, **inputs, **kwargs)``, when given, stands in for that
    call on each chunk (:func:`trainers.sft.labelled_head.labelled_head_forward`); where it returns
    None the model's own fused head runs.
    """

    FIELDS = ("log_probs", "entropy", "log_sum_sq_probs", "mean_logits", "is_top1", "label_mask")

    def __init__(
        self,
        model: Any,
        prepare: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
        overhead: int = 64,
        head: Callable[..., Any] | None = None,
    ) -> None:
        self.model = model
        self.prepare = prepare
        self.overhead = overhead
        self.head = head

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)

    @staticmethod
    def applies(inputs: dict[str, Any]) -> bool:
        """A batch of only ``input_ids``, ``attention_mask`` and ``labels``, right-padded, with
        two rows or more."""
        if set(inputs) != {"input_ids", "attention_mask", "labels"}:
            return False
        mask = inputs["attention_mask"]
        if mask.dim() != 2 or mask.size(0) < 2:
            return False
        import torch

        lengths = mask.sum(dim=1, keepdim=True)
        return bool((mask == (torch.arange(mask.size(1), device=mask.device) < lengths)).all())

    def __call__(self, *, input_ids: Any, attention_mask: Any, labels: Any, **kwargs: Any) -> Any:
        import torch

        if not kwargs.get("fused_lm_head"):
            raise ValueError("LengthChunkedLM runs TRL's fused LM head only (fused_lm_head=True).")
        lengths = attention_mask.sum(dim=1).tolist()
        overhead = self.overhead
        if self.prepare is not None:  # each chunk may run the batch's shared prefix again
            overhead += common_prefix_length(input_ids, attention_mask)
        chunks = length_chunks(lengths, len(lengths), overhead)
        parts: list[tuple[Any, Any]] = []
        for chunk in chunks:
            index = torch.tensor(chunk, device=input_ids.device)
            cut = min(input_ids.size(1), max(2, int(lengths[chunk[0]])))
            inputs = {
                "input_ids": input_ids[index, :cut],
                "attention_mask": attention_mask[index, :cut],
                "labels": labels[index, :cut],
            }
            if self.prepare is not None:
                inputs = self.prepare(inputs)
            out = None if self.head is None else self.head(self.model, **inputs, **kwargs)
            parts.append((index, self.model(**inputs, **kwargs) if out is None else out))
        width = max(out.log_probs.size(1) for _, out in parts)
        fields: dict[str, Any] = {}
        for name in self.FIELDS:
            if getattr(parts[0][1], name, None) is None:
                continue
            value = getattr(parts[0][1], name).new_zeros((len(lengths), width))
            for index, out in parts:
                part = getattr(out, name)
                part = torch.nn.functional.pad(part, (0, width - part.size(1)))
                value = value.index_put((index,), part)
            fields[name] = value
        log_probs, mask = fields["log_probs"], fields["label_mask"]
        count = kwargs.get("num_items_in_batch")
        loss = -log_probs.sum() / (mask.sum().clamp(min=1) if count is None else count)
        return type(parts[0][1])(loss=loss, **fields)
