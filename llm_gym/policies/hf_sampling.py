"""Next-token sampling for the decode engine: temperature, top-p, and one draw per row.

Pure functions of the logits (and a generator), so the engine's scheduling never touches the
sampling law. ``top_p`` follows transformers' ``TopPLogitsWarper`` to the letter, so the engine
samples what ``generate`` would.
"""

from __future__ import annotations

import torch

__all__ = ["draw", "sample"]


def sample(
    logits: torch.Tensor,
    *,
    temperature: float,
    top_p: float,
    generator: torch.Generator | None = None,
) -> tuple[list[int], list[float]]:
    """One id per row of ``logits`` (rows, vocabulary), and its logprob.

    Args:
        logits: The last position's logits of each row.
        temperature: 0 for greedy decoding.
        top_p: Nucleus mass (1.0: no truncation).
        generator: The sampling generator (None: torch's global one).

    Returns:
        The ids, and ``log_softmax(logits / temperature)`` of each (plain ``log_softmax`` when
        greedy): the generator's logprobs, before top-p truncation.
    """
    logits = logits.float()
    if temperature == 0:
        tokens = logits.argmax(dim=-1)
        chosen = torch.log_softmax(logits, dim=-1).gather(1, tokens[:, None])[:, 0]
        return tokens.tolist(), chosen.tolist()
    scores = logits / temperature
    if top_p < 1.0:  # transformers' TopPLogitsWarper, to the letter
        logprobs = torch.log_softmax(scores, dim=-1)
        sorted_scores, order = torch.sort(scores, descending=False)
        cumulative = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
        remove_sorted = cumulative <= (1 - top_p)
        remove_sorted[..., -1:] = False
        remove = remove_sorted.scatter(1, order, remove_sorted)
        tokens = draw(torch.softmax(scores.masked_fill(remove, float("-inf")), dim=-1), generator)
        chosen = logprobs.gather(1, tokens[:, None])[:, 0]
        return tokens.tolist(), chosen.tolist()
    # No truncation: the drawn id's logprob is the log of the probability it was drawn with
    # (within float rounding of log_softmax, ~1e-7), which saves a pass over the vocabulary.
    probs = torch.softmax(scores, dim=-1)
    tokens = draw(probs, generator)
    chosen = probs.gather(1, tokens[:, None])[:, 0].log()
    return tokens.tolist(), chosen.tolist()


def draw(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One id per row from ``probs`` by inverse CDF (the same law as ``torch.multinomial``, and
    cheaper on a CPU for a batch of rows)."""
    cdf = probs.cumsum(dim=-1)
    u = torch.rand((probs.shape[0], 1), generator=generator, device=probs.device, dtype=cdf.dtype)
    tokens = torch.searchsorted(cdf, u * cdf[:, -1:], right=True)[:, 0]
    tokens = tokens.clamp_(max=probs.shape[1] - 1)
    # Rounding at the very top of the CDF could land on a zero-probability id: never keep it
    # (the argmax, a full pass over the vocabulary, only in the rare batch where it happened).
    zero = probs.gather(1, tokens[:, None])[:, 0] <= 0
    if bool(zero.any()):
        tokens = torch.where(zero, probs.argmax(dim=-1), tokens)
    return tokens
