"""Episodes to the tensors TRL's GRPO loss reads: the episodes' token samples, one row each, with
the advantages added as a column.

Shape names: ``B`` rows, ``P`` prompt length (left-padded), ``C`` completion length (right-padded).
A row is one :class:`~llm_gym.rollout.TokenSample` of one episode, put straight into the tensors
(:func:`episode_batch`); rows that must not train (overlong masking, padding up to a fixed batch)
carry an all-zero ``tool_mask``; a zero-variance group's rows carry all-zero advantages
(:func:`without_silent_rows` leaves both out of the passes when that is exact); :func:`pad_rows`
fills the batch up to whole micro-batches.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain
from typing import Any, TypeAlias

from llm_gym.errors import InvalidArgumentError
from llm_gym.rollout.tokens import TokenSample

__all__ = [
    "BATCH_FILL",
    "episode_batch",
    "importance_sampling_ratio",
    "logprob_gap",
    "off_policy_weights",
    "pad_rows",
    "padding_sample",
    "samples_to_tensors",
    "silent_rows_skippable",
    "stale_token_mask",
    "without_silent_rows",
]

Credit: TypeAlias = tuple[float, Sequence[float] | None, bool]
"""One row's credit: the episode's advantage, its per-turn advantages (None: the episode's for
every token) and whether the row trains."""

BATCH_FILL = {
    "prompt_mask": 0,
    "completion_mask": 0,
    "tool_mask": 0,
    "advantages": 0.0,
    "sampling_per_token_logps": 0.0,
    "policy_versions": -1,
}
"""The value of each tensor of a batch where a row has no token (``prompt_ids`` and
``completion_ids`` hold the pad id there)."""


def padding_sample(pad_id: int, prompt_ids: Sequence[int] | None = None) -> TokenSample:
    """A sample that trains nothing (one environment token), to keep every batch the same size.

    ``prompt_ids``: a real row's prompt to start with (default ``[pad_id]``), so that the
    padding row shares the batch's prefix and shared-prefix scoring still applies to the batch.
    """
    return TokenSample(
        prompt_ids=list(prompt_ids) if prompt_ids else [pad_id],
        completion_ids=[pad_id],
        env_mask=[0],
        logprobs=[0.0],
        turn_index=[-1],
        policy_versions=[-1],
    )


def _checked(sample: TokenSample, where: str) -> int:
    """The sample's completion length, its per-token columns checked to match it."""
    length = len(sample.completion_ids)
    for name in ("env_mask", "logprobs", "turn_index", "policy_versions"):
        column = getattr(sample, name)  # the last two may be empty: unknown (-1 every token)
        if len(column) != length and (column or name in ("env_mask", "logprobs")):
            raise InvalidArgumentError(
                f"{where}: expected one {name} value per completion token ({length}), got "
                f"{len(column)}; a TokenSample's per-token columns all have the completion's "
                "length (build samples with llm_gym.rollout.TokenTracker)."
            )
    return length


def samples_to_tensors(
    samples: Sequence[TokenSample], credits: Sequence[Credit], pad_id: int
) -> dict[str, Any]:
    """One row per sample, with its credit (:data:`Credit`) as the advantage column: left-padded
    prompts, right-padded completions, everything TRL's loss reads.

    Returns ``prompt_ids``/``prompt_mask`` (B, P), ``completion_ids``/``completion_mask``/
    ``tool_mask`` (B, C), ``advantages`` (B, C), ``sampling_per_token_logps`` (B, C) and
    ``policy_versions`` (B, C; -1 where unknown). ``completion_mask`` is 1 on real tokens
    (sampled or environment), ``tool_mask`` is 1 only where the token trains (its ``env_mask``,
    in a row that trains), so their product is the loss mask. A token's advantage is 0 where
    ``tool_mask`` is 0; elsewhere its turn's per-turn advantage (0 for a turn without one), or
    the episode's advantage.

    Example:
        >>> sample = TokenSample([1, 2], [5, 6, 7], env_mask=[1, 0, 1], logprobs=[-1.0, 0.0, -2.0],
        ...                      turn_index=[0, -1, 1])
        >>> credits = [(0.5, None, True), (0.0, [1.0, -1.0], True)]
        >>> batch = samples_to_tensors([sample, sample], credits, pad_id=0)
        >>> batch["advantages"].tolist(), batch["tool_mask"].tolist()
        ([[0.5, 0.0, 0.5], [1.0, 0.0, -1.0]], [[1, 0, 1], [1, 0, 1]])
    """
    import numpy
    import torch

    numpy_type = {torch.long: numpy.int64, torch.float32: numpy.float32}
    if len(samples) != len(credits):
        raise InvalidArgumentError(
            f"Expected one credit per sample ({len(samples)}), got {len(credits)}."
        )
    lengths = [_checked(s, f"sample {i}") for i, s in enumerate(samples)]
    rows = len(samples)
    prompt_len = torch.tensor([len(s.prompt_ids) for s in samples], dtype=torch.long)
    completion_len = torch.tensor(lengths, dtype=torch.long)
    width_p = int(prompt_len.max()) if rows else 0
    width_c = int(completion_len.max()) if rows else 0
    # Boolean-mask assignment fills row by row, left to right: the samples' tokens, in order.
    prompt_at = torch.arange(width_p) >= (width_p - prompt_len)[:, None]
    completion_at = torch.arange(width_c) < completion_len[:, None]

    def column(values: Any, fill: Any, dtype: Any, at: Any = completion_at) -> Any:
        out = torch.full(at.shape, fill, dtype=dtype)
        flat = numpy.fromiter(
            chain.from_iterable(values), dtype=numpy_type[dtype], count=int(at.sum())
        )
        out[at] = torch.from_numpy(flat)
        return out

    trains = torch.tensor([credit[2] for credit in credits], dtype=torch.long)
    tool_mask = column((s.env_mask for s in samples), 0, torch.long) * trains[:, None]
    # The advantage column: the episode's advantage on every token, or each token's turn's.
    episode_advantage = torch.tensor(
        [a if turns is None else 0.0 for a, turns, _ in credits], dtype=torch.float32
    )
    advantages = episode_advantage[:, None].expand(rows, width_c).clone()
    per_turn = [(i, turns) for i, (_, turns, _) in enumerate(credits) if turns is not None]
    if per_turn:
        rows_t = [i for i, _ in per_turn]
        most = max(len(turns) for _, turns in per_turn)
        table = torch.zeros((len(per_turn), most + 1), dtype=torch.float32)  # last: no turn
        for k, (_, turns) in enumerate(per_turn):
            table[k, : len(turns)] = torch.tensor(list(turns), dtype=torch.float32)
        turn_index = column(
            (samples[i].turn_index or [-1] * lengths[i] for i in rows_t),
            -1,
            torch.long,
            completion_at[rows_t],
        )
        turn_index = torch.where(turn_index >= 0, turn_index.clamp(max=most), most)
        advantages[rows_t] = torch.gather(table, 1, turn_index)
    advantages = advantages * tool_mask
    return {
        "prompt_ids": column((s.prompt_ids for s in samples), pad_id, torch.long, prompt_at),
        "prompt_mask": prompt_at.long(),
        "completion_ids": column((s.completion_ids for s in samples), pad_id, torch.long),
        "completion_mask": completion_at.long(),
        "tool_mask": tool_mask,
        "advantages": advantages,
        "sampling_per_token_logps": column((s.logprobs for s in samples), 0.0, torch.float32),
        "policy_versions": column(
            (s.policy_versions or [-1] * n for s, n in zip(samples, lengths, strict=True)),
            -1,
            torch.long,
        ),
    }


def episode_batch(
    groups: Sequence[Sequence[Any]],
    episode_advantages: Sequence[Sequence[float]],
    turn_advantages: Sequence[Sequence[Sequence[float] | None]],
    *,
    overlong_masking: bool,
    max_rows: int | None,
    pad_id: int,
) -> tuple[dict[str, Any], int]:
    """The tensors of a batch of episode groups (:func:`samples_to_tensors`), ``max_rows`` rows
    per episode, and how many samples were dropped over ``max_rows``.

    Each episode gives its first ``max_rows`` token samples (None: all of them), masked out
    when ``overlong_masking`` is on and the episode was truncated, then :func:`padding_sample`
    s up to ``max_rows`` on its first sample's prompt, so every episode holds the same rows of
    the batch (``max_rows=None``: no padding; the row count varies, see :func:`pad_rows`).
    ``episode_advantages[g][e]`` and ``turn_advantages[g][e]`` belong to episode ``e`` of group
    ``g``: with per-turn advantages each token takes its turn's (per-turn credit), otherwise
    every trained token takes the episode's.
    """
    samples: list[TokenSample] = []
    credits: list[Credit] = []
    dropped = 0
    silent: Credit = (0.0, None, False)
    for g, group in enumerate(groups):
        for e, episode in enumerate(group):
            own = list(episode.samples)
            kept = own if max_rows is None else own[:max_rows]
            dropped += len(own) - len(kept)
            credit = (
                float(episode_advantages[g][e]),
                turn_advantages[g][e],
                not (overlong_masking and episode.truncated),
            )
            samples.extend(kept)
            credits.extend([credit] * len(kept))
            if max_rows is not None and len(kept) < max_rows:
                prompt = kept[0].prompt_ids if kept else None
                samples.extend(padding_sample(pad_id, prompt) for _ in range(max_rows - len(kept)))
                credits.extend([silent] * (max_rows - len(kept)))
    return samples_to_tensors(samples, credits, pad_id), dropped


def _widened(batch: dict[str, Any], width_p: int, width_c: int, pad_id: int) -> dict[str, Any]:
    """``batch`` with its prompts left-padded to ``width_p`` and its completions right-padded to
    ``width_c`` (each tensor with its :data:`BATCH_FILL` value)."""
    import torch.nn.functional as F

    out = {}
    for key, tensor in batch.items():
        fill = BATCH_FILL.get(key, pad_id)
        if key.startswith("prompt_"):
            out[key] = F.pad(tensor, (width_p - tensor.size(1), 0), value=fill)
        else:
            out[key] = F.pad(tensor, (0, width_c - tensor.size(1)), value=fill)
    return out


def pad_rows(batch: dict[str, Any], *, multiple: int, at_least: int, pad_id: int) -> dict[str, Any]:
    """``batch`` (:func:`episode_batch`'s tensors) and rows of :func:`padding_sample` s (on the
    first row's prompt) up to at least ``at_least`` rows and a multiple of ``multiple`` (the
    micro-batches of a step must split evenly).

    Example:
        >>> batch = samples_to_tensors([padding_sample(0)] * 5, [(0.0, None, False)] * 5, 0)
        >>> len(pad_rows(batch, multiple=2, at_least=1, pad_id=0)["prompt_ids"])
        6
    """
    import torch

    rows = len(batch["prompt_ids"])
    target = max(rows, at_least, 1)
    target = -(-target // multiple) * multiple
    if target == rows:
        return batch
    prompt = None
    if rows:
        prompt = batch["prompt_ids"][0][batch["prompt_mask"][0].bool()].tolist()
    padding = samples_to_tensors(
        [padding_sample(pad_id, prompt)] * (target - rows),
        [(0.0, None, False)] * (target - rows),
        pad_id,
    )
    if not rows:
        return padding
    width_p = max(batch["prompt_ids"].size(1), padding["prompt_ids"].size(1))
    width_c = max(batch["completion_ids"].size(1), padding["completion_ids"].size(1))
    batch = _widened(batch, width_p, width_c, pad_id)
    padding = _widened(padding, width_p, width_c, pad_id)
    return {key: torch.cat([batch[key], padding[key]]) for key in batch}


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


def without_silent_rows(batch: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """The rows of ``batch`` that carry a non-zero advantage (the tensors only as wide as they
    need), and the loss tokens of all its rows.

    A zero-variance group's episodes (and padding rows) have all-zero advantages: under a loss
    :func:`silent_rows_skippable` accepts, each of their tokens adds exactly 0 to the loss and
    to every gradient, but still counts in the loss's normaliser. So the caller normalises by
    the returned count (all rows') and scores only the kept rows: the same loss and gradients,
    for the passes over the kept rows alone. (Metrics averaged over scored tokens, such as TRL's
    entropy and clip ratios and async training's stale-token ratio, then cover the kept rows.)

    Example:
        >>> a = TokenSample([1], [2, 3], env_mask=[1, 1], logprobs=[0.0, 0.0])
        >>> b = TokenSample([1], [4, 5, 6], env_mask=[1, 0, 1], logprobs=[0.0, 0.0, 0.0])
        >>> batch = samples_to_tensors([a, b], [(0.5, None, True), (0.0, None, True)], 0)
        >>> kept, loss_tokens = without_silent_rows(batch)
        >>> kept["completion_ids"].tolist(), loss_tokens
        ([[2, 3]], 4)
    """
    loss_tokens = int(batch["tool_mask"].sum())
    keep = batch["advantages"].ne(0).any(dim=1)
    if bool(keep.all()):
        return batch, loss_tokens
    prompt_mask, completion_mask = batch["prompt_mask"][keep], batch["completion_mask"][keep]
    width_p = int(prompt_mask.sum(dim=1).max()) if len(prompt_mask) else 0
    width_c = int(completion_mask.sum(dim=1).max()) if len(completion_mask) else 0
    start = batch["prompt_ids"].size(1) - width_p
    return {
        key: tensor[keep][:, start:] if key.startswith("prompt_") else tensor[keep][:, :width_c]
        for key, tensor in batch.items()
    }, loss_tokens


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
