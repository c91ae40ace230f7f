"""Episodes to the tensors TRL's GRPO loss reads: rows, masks, advantages.

Shape names: ``B`` rows, ``P`` prompt length (left-padded), ``C`` completion length (right-padded).
A row is one token sample of one episode; rows that must not train (overlong masking, padding up to
a fixed batch) carry an all-zero ``tool_mask``; a zero-variance group's rows carry all-zero
advantages (:func:`without_silent_rows` leaves both out of the passes when that is exact).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "logprob_gap",
    "Row",
    "episode_rows",
    "group_rows",
    "importance_sampling_ratio",
    "off_policy_weights",
    "padding_row",
    "rows_to_tensors",
    "silent_rows_skippable",
    "without_silent_rows",
    "stale_token_mask",
]


@dataclass
class Row:
    """One training row."""

    prompt_ids: list[int]
    """Context before the first completion token."""
    completion_ids: list[int]
    """Sampled tokens interleaved with environment tokens."""
    env_mask: list[int]
    """1 where the token trains (sampled by the policy), 0 elsewhere."""
    logprobs: list[float]
    """The sampler's logprobs (0.0 under environment tokens)."""
    advantages: list[float] = field(default_factory=list)
    """One advantage per completion token (0.0 where ``env_mask`` is 0)."""
    policy_versions: list[int] = field(default_factory=list)
    """The weight version that sampled each token (-1: environment token or unversioned)."""


def episode_rows(
    samples: Sequence[Any],
    *,
    advantage: float,
    turn_advantages: Sequence[float] | None,
    train: bool,
    max_rows: int | None,
) -> tuple[list[Row], int]:
    """The rows of one episode and how many of its samples were dropped over ``max_rows``
    (None: every sample is a row; each carries the episode's advantages).

    With ``turn_advantages`` each token takes its turn's advantage (per-turn credit); otherwise
    every policy token takes ``advantage``. ``train=False`` keeps the rows but masks them out.
    """
    rows = []
    for sample in list(samples)[:max_rows]:
        mask = list(sample.env_mask) if train else [0] * len(sample.env_mask)
        if turn_advantages is not None:
            advantages = [
                float(turn_advantages[t]) if m and 0 <= t < len(turn_advantages) else 0.0
                for t, m in zip(sample.turn_index, mask, strict=True)
            ]
        else:
            advantages = [float(advantage) if m else 0.0 for m in mask]
        rows.append(
            Row(
                prompt_ids=list(sample.prompt_ids),
                completion_ids=list(sample.completion_ids),
                env_mask=mask,
                logprobs=list(sample.logprobs),
                advantages=advantages,
                policy_versions=list(getattr(sample, "policy_versions", None) or [])
                or [-1] * len(sample.completion_ids),
            )
        )
    return rows, 0 if max_rows is None else max(0, len(samples) - max_rows)


def padding_row(pad_id: int, prompt_ids: Sequence[int] | None = None) -> Row:
    """A row that trains nothing, to keep every batch the same size.

    ``prompt_ids``: a real row's prompt to start with (default ``[pad_id]``), so that the
    padding row shares the batch's prefix and shared-prefix scoring still applies to the batch.
    """
    return Row(
        prompt_ids=list(prompt_ids) if prompt_ids else [pad_id],
        completion_ids=[pad_id],
        env_mask=[0],
        logprobs=[0.0],
        advantages=[0.0],
        policy_versions=[-1],
    )


def group_rows(
    groups: Sequence[Sequence[Any]],
    episode_advantages: Sequence[Sequence[float]],
    turn_advantages: Sequence[Sequence[Sequence[float] | None]],
    *,
    overlong_masking: bool,
    max_rows: int | None,
    pad_id: int,
) -> tuple[list[Row], int]:
    """The rows of a batch of episode groups, ``max_rows`` per episode, and the samples dropped.

    Each episode gives its :func:`episode_rows` (masked out when ``overlong_masking`` is on and
    the episode was truncated), then :func:`padding_row` s up to ``max_rows``, so every episode
    holds the same rows of the batch. ``max_rows=None``: every sample of every episode, no
    padding (the row count varies; see :func:`pad_rows`). ``episode_advantages[g][e]`` and
    ``turn_advantages[g][e]`` belong to episode ``e`` of group ``g``.
    """
    rows: list[Row] = []
    dropped = 0
    for g, group in enumerate(groups):
        for e, episode in enumerate(group):
            own, lost = episode_rows(
                episode.samples,
                advantage=episode_advantages[g][e],
                turn_advantages=turn_advantages[g][e],
                train=not (overlong_masking and episode.truncated),
                max_rows=max_rows,
            )
            dropped += lost
            rows.extend(own)
            if max_rows is not None:
                prompt = own[0].prompt_ids if own else None
                rows.extend(padding_row(pad_id, prompt) for _ in range(max_rows - len(own)))
    return rows, dropped


def pad_rows(rows: list[Row], *, multiple: int, at_least: int, pad_id: int) -> list[Row]:
    """``rows`` and :func:`padding_row` s (on the first row's prompt) up to at least
    ``at_least`` rows and a multiple of ``multiple`` (the micro-batches of a step must split
    evenly).

    Example:
        >>> len(pad_rows([padding_row(0)] * 5, multiple=2, at_least=1, pad_id=0))
        6
    """
    target = max(len(rows), at_least, 1)
    target = -(-target // multiple) * multiple
    prompt = rows[0].prompt_ids if rows else None
    return rows + [padding_row(pad_id, prompt) for _ in range(target - len(rows))]


def silent_rows_skippable(
    *,
    loss_type: str,
    beta: float,
    top_entropy_quantile: float,
    entropy_bonus: bool,
    aux_loss: bool,
    per_token_advantages_added: bool,
) -> bool:
    """Whether rows whose every advantage is 0 may skip the forward and backward passes
    without changing the loss or its gradients (see :func:`without_silent_rows`).

    True when the per-token loss is the advantage times a factor (``dapo``, ``cispo``) and
    normalised by the batch's loss-token count (which :func:`without_silent_rows` keeps),
    without a KL term (``beta=0``), an entropy quantile mask or bonus, or an MoE auxiliary loss
    (each acts on every token, advantage or not), and when nothing adds per-token advantages
    after the batch is built (on-policy distillation's teacher term).

    Example:
        >>> silent_rows_skippable(loss_type="dapo", beta=0.0, top_entropy_quantile=1.0,
        ...                       entropy_bonus=False, aux_loss=False,
        ...                       per_token_advantages_added=False)
        True
        >>> silent_rows_skippable(loss_type="grpo", beta=0.0, top_entropy_quantile=1.0,
        ...                       entropy_bonus=False, aux_loss=False,
        ...                       per_token_advantages_added=False)
        False
    """
    return (
        loss_type in ("dapo", "cispo")
        and beta == 0.0
        and top_entropy_quantile >= 1.0
        and not (entropy_bonus or aux_loss or per_token_advantages_added)
    )


def without_silent_rows(rows: Sequence[Row]) -> tuple[list[Row], int]:
    """The rows that carry a non-zero advantage, and the loss tokens of all ``rows``.

    A zero-variance group's episodes (and padding rows) have all-zero advantages: under a loss
    :func:`silent_rows_skippable` accepts, each of their tokens adds exactly 0 to the loss and
    to every gradient, but still counts in the loss's normaliser. So the caller normalises by
    the returned count (all rows') and scores only the kept rows: the same loss and gradients,
    for the passes over the kept rows alone. (Metrics averaged over scored tokens, such as TRL's
    entropy and clip ratios and async training's stale-token ratio, then cover the kept rows.)

    Example:
        >>> rows = [Row([1], [2, 3], [1, 1], [0.0, 0.0], [0.5, 0.5]),
        ...         Row([1], [4, 5], [1, 0], [0.0, 0.0], [0.0, 0.0])]
        >>> kept, loss_tokens = without_silent_rows(rows)
        >>> [r.completion_ids for r in kept], loss_tokens
        ([[2, 3]], 3)
    """
    kept = [row for row in rows if any(a != 0.0 for a in row.advantages)]
    return kept, sum(sum(row.env_mask) for row in rows)


def rows_to_tensors(rows: Sequence[Row], pad_id: int, device: Any = "cpu") -> dict[str, Any]:
    """Left-pad prompts, right-pad completions, and stack everything TRL's loss reads.

    Returns ``prompt_ids``/``prompt_mask`` (B, P), ``completion_ids``/``completion_mask``/
    ``tool_mask`` (B, C), ``advantages`` (B, C), ``sampling_per_token_logps`` (B, C) and
    ``policy_versions`` (B, C; -1 where unknown).
    ``completion_mask`` is 1 on real tokens (sampled or environment), ``tool_mask`` is 1 only
    where the token trains, so their product is the loss mask.
    """
    import torch

    if not rows:
        raise ValueError("rows_to_tensors needs at least one row.")
    width_p = max(len(r.prompt_ids) for r in rows)
    width_c = max(len(r.completion_ids) for r in rows)
    batch = len(rows)
    prompt_ids = torch.full((batch, width_p), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros((batch, width_p), dtype=torch.long)
    completion_ids = torch.full((batch, width_c), pad_id, dtype=torch.long)
    completion_mask = torch.zeros((batch, width_c), dtype=torch.long)
    tool_mask = torch.zeros((batch, width_c), dtype=torch.long)
    advantages = torch.zeros((batch, width_c), dtype=torch.float32)
    logprobs = torch.zeros((batch, width_c), dtype=torch.float32)
    versions = torch.full((batch, width_c), -1, dtype=torch.long)
    for i, row in enumerate(rows):
        p, c = len(row.prompt_ids), len(row.completion_ids)
        prompt_ids[i, width_p - p :] = torch.tensor(row.prompt_ids, dtype=torch.long)
        prompt_mask[i, width_p - p :] = 1
        completion_ids[i, :c] = torch.tensor(row.completion_ids, dtype=torch.long)
        completion_mask[i, :c] = 1
        tool_mask[i, :c] = torch.tensor(row.env_mask, dtype=torch.long)
        advantages[i, :c] = torch.tensor(row.advantages, dtype=torch.float32)
        logprobs[i, :c] = torch.tensor(row.logprobs, dtype=torch.float32)
        if row.policy_versions:
            versions[i, :c] = torch.tensor(row.policy_versions, dtype=torch.long)
    out = {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "tool_mask": tool_mask,
        "advantages": advantages,
        "sampling_per_token_logps": logprobs,
        "policy_versions": versions,
    }
    return {k: v.to(device) for k, v in out.items()}


def importance_sampling_ratio(
    old_logps: Any,
    sampling_logps: Any,
    mask: Any,
    mode: str,
    clip_min: float | None,
    clip_max: float | None,
) -> Any:
    """The trainer's over the sampler's token probabilities, as TRL corrects vLLM's sampler.

    Args:
        old_logps: (B, C) the trainer's logprobs of the sampled tokens.
        sampling_logps: (B, C) the sampler's.
        mask: (B, C) 1 where the token trains.
        mode: TRL's ``vllm_importance_sampling_mode``: ``token_*`` ratios per token,
            ``sequence_*`` one per row (B, 1) from the summed log-ratio; ``*_truncate`` clamps
            to ``[clip_min, clip_max]``, ``*_mask`` zeroes the ratios outside it.
        clip_min: The lower bound (None: none, for the ``*_mask`` modes).
        clip_max: The upper bound (None: none, for the ``*_mask`` modes).

    Example:
        >>> import torch
        >>> old = torch.tensor([[0.0, -1.0]])
        >>> sampled = torch.tensor([[0.0, -2.0]])
        >>> mask = torch.tensor([[1, 1]])
        >>> importance_sampling_ratio(old, sampled, mask, "token_truncate", 0.5, 2.0).tolist()
        [[1.0, 2.0]]
        >>> importance_sampling_ratio(old, sampled, mask, "token_mask", 0.5, 2.0).tolist()
        [[1.0, 0.0]]
    """
    import math

    import torch

    diff = torch.nan_to_num((old_logps - sampling_logps) * mask, nan=0.0)
    if mode in ("sequence_mask", "sequence_truncate"):
        diff = diff.sum(dim=-1, keepdim=True)
    ratio = torch.exp(diff)
    if mode in ("sequence_truncate", "token_truncate"):
        return torch.clamp(ratio, min=clip_min, max=clip_max)
    low = -math.inf if clip_min is None else clip_min
    high = math.inf if clip_max is None else clip_max
    return ratio.masked_fill((ratio < low) | (ratio > high), 0.0)


def logprob_gap(old_logps: Any, sampling_logps: Any, mask: Any) -> tuple[float, float]:
    """The mean and the largest ``|old - sampled|`` logprob over the tokens where ``mask`` is 1
    (TRL's ``sampling/sampling_logp_difference``): tokens the sampler could not score (NaN) are
    left out; ``(0.0, 0.0)`` without tokens.

    Example:
        >>> import torch
        >>> old = torch.tensor([[-1.0, -2.0, -3.0]])
        >>> sampled = torch.tensor([[-1.5, float("nan"), -2.0]])
        >>> logprob_gap(old, sampled, torch.tensor([[1, 1, 1]]))
        (0.75, 1.0)
    """
    import torch

    delta = torch.abs(old_logps - sampling_logps)
    delta = delta[mask.bool() & ~torch.isnan(delta)]
    if delta.numel() == 0:
        return 0.0, 0.0
    return float(delta.float().mean()), float(delta.max())


def stale_token_mask(policy_versions: Any, current_version: int, mask: Any) -> Any:
    """1 where a training token was sampled by weights older than ``current_version``.

    Example:
        >>> import torch
        >>> versions = torch.tensor([[3, 2, -1, 2]])
        >>> stale_token_mask(versions, 3, torch.tensor([[1, 1, 0, 0]])).tolist()
        [[0, 1, 0, 0]]
    """
    return ((policy_versions >= 0) & (policy_versions < current_version)).long() * mask


def off_policy_weights(
    old_logps: Any,
    sampling_logps: Any,
    mask: Any,
    stale: Any,
    mode: str,
    clip_min: float | None,
    clip_max: float | None,
) -> Any:
    """Async training's behaviour-policy correction: an importance weight per token.

    The sampler's logprobs are the behaviour policy; ``old_logps`` (the trainer's weights at
    the start of the step) the target. Tokens sampled by older weights (``stale``) get
    :func:`importance_sampling_ratio` of the two under ``mode`` (``token_truncate`` is truncated
    importance sampling, ``min(pi_old / pi_behaviour, clip_max)``); tokens sampled by the current
    weights get exactly 1, and so does every token of a row with no stale token under the
    ``sequence_*`` modes: with zero staleness the loss is lockstep's, bit for bit.

    The trainer multiplies each token's advantage by its weight. Every GRPO loss variant TRL
    offers is positively homogeneous in the advantage (``min(w a, w b) = w min(a, b)`` for
    ``w >= 0``), so this is TRL's ``per_token_loss * importance_sampling_ratio`` without touching
    TRL's loss.

    Example:
        >>> import torch
        >>> old = torch.tensor([[-1.0, -1.0, -1.0]])
        >>> behaviour = torch.tensor([[-2.0, -0.5, -3.0]])
        >>> mask = torch.tensor([[1, 1, 1]])
        >>> stale = torch.tensor([[1, 1, 0]])
        >>> [round(w, 4) for w in off_policy_weights(
        ...     old, behaviour, mask, stale, "token_truncate", None, 2.0)[0].tolist()]
        [2.0, 0.6065, 1.0]
    """
    import torch

    ratio = importance_sampling_ratio(
        old_logps, sampling_logps, mask * stale, mode, clip_min, clip_max
    )
    if mode in ("sequence_mask", "sequence_truncate"):
        any_stale = (mask * stale).sum(dim=-1, keepdim=True) > 0
        return torch.where(any_stale, ratio, torch.ones_like(ratio))
    return torch.where((mask * stale) > 0, ratio, torch.ones_like(ratio))
