"""Next-token sampling: temperature, top-p, and one draw per row, from a generator of the
caller's or from each row's own stream.

Pure functions of the logits (and a generator or the rows' uniforms), so the engine's scheduling
never touches the sampling law. With :func:`row_stream` each episode draws from a stream of its
own, so how its turns are batched (which rows share a pass, in which order) never changes the
draws it samples with. ``top_p`` follows transformers' ``TopPLogitsWarper`` to the letter, so
the engine samples what ``generate`` would. :class:`GeneratorSampling` brings the same draw to
``model.generate`` (whose own sampling takes no generator: it draws from torch's global one), so
a seeded generation neither reads nor moves the global generator.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Hashable, Sequence

import torch

from llm_gym.errors import InvalidArgumentError

__all__ = ["BLOCK", "GeneratorSampling", "draw", "nucleus", "row_stream", "sample"]


def sample(
    logits: torch.Tensor,
    *,
    temperature: float,
    top_p: float,
    generator: torch.Generator | None = None,
    uniforms: Sequence[float] | None = None,
) -> tuple[list[int], list[float]]:
    """One id per row of ``logits`` (rows, vocabulary), and its logprob.

    Args:
        logits: The last position's logits of each row.
        temperature: 0 for greedy decoding.
        top_p: Nucleus mass (1.0: no truncation).
        generator: The sampling generator (None: torch's global one).
        uniforms: One draw in [0, 1) per row (from each row's :func:`row_stream`), used instead
            of ``generator``.

    Returns:
        The ids, and ``log_softmax(logits / temperature)`` of each (plain ``log_softmax`` when
        greedy): the generator's logprobs, before top-p truncation.
    """
    logits = logits.float()
    if temperature == 0:
        tokens = logits.argmax(dim=-1)
        chosen = torch.log_softmax(logits, dim=-1).gather(1, tokens[:, None])[:, 0]
        return tokens.tolist(), chosen.tolist()
    scores = logits / temperature if temperature != 1 else logits
    probs = nucleus(scores, top_p)
    tokens = draw(probs, generator, uniforms)
    if top_p < 1.0:
        chosen = torch.log_softmax(scores, dim=-1).gather(1, tokens[:, None])[:, 0]
    else:
        # No truncation: the drawn id's logprob is the log of the probability it was drawn with
        # (within float rounding of log_softmax, ~1e-7), which saves a pass over the vocabulary.
        chosen = probs.gather(1, tokens[:, None])[:, 0].log()
    return tokens.tolist(), chosen.tolist()


def nucleus(scores: torch.Tensor, top_p: float) -> torch.Tensor:
    """The sampling probabilities of tempered ``scores`` (rows, vocabulary): their softmax over
    the top-p nucleus (transformers' ``TopPLogitsWarper``, to the letter), 0 elsewhere."""
    if top_p >= 1.0:
        return torch.softmax(scores, dim=-1)
    sorted_scores, order = torch.sort(scores, descending=False)
    cumulative = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
    remove_sorted = cumulative <= (1 - top_p)
    remove_sorted[..., -1:] = False
    remove = remove_sorted.scatter(1, order, remove_sorted)
    return torch.softmax(scores.masked_fill(remove, float("-inf")), dim=-1)


BLOCK = 256
"""Ids per block of :func:`draw`'s two-level inverse CDF."""


def draw(
    probs: torch.Tensor,
    generator: torch.Generator | None = None,
    uniforms: Sequence[float] | None = None,
) -> torch.Tensor:
    """One id per row from ``probs`` by inverse CDF (the same law as ``torch.multinomial``, and
    cheaper on a CPU for a batch of rows), from ``uniforms`` (one draw in [0, 1) per row) when
    given, else from ``generator``.

    The CDF is walked in two levels: the sums of blocks of :data:`BLOCK` ids, then the one block
    the draw lands in. A full-vocabulary ``cumsum`` is sequential and took ~2 ms for 32 rows of
    SmolLM2's 49,152 ids on one core (``python -m benchmarks.decode_profile``); block sums
    vectorise (~0.1 ms). The id drawn is the plain ``cumsum`` inverse CDF's for every uniform
    except one within float rounding (~1e-7 of the row's mass) of a boundary between two ids,
    where the summation order can tip it to the neighbour.
    """
    rows, vocab = probs.shape
    if uniforms is not None:
        u = torch.tensor(uniforms, dtype=probs.dtype).view(-1, 1).to(probs.device)
    else:
        u = torch.rand((rows, 1), generator=generator, device=probs.device, dtype=probs.dtype)
    blocks = -(-vocab // BLOCK)
    padded = probs
    if blocks * BLOCK != vocab:
        padded = torch.nn.functional.pad(probs, (0, blocks * BLOCK - vocab))
    per_block = padded.view(rows, blocks, BLOCK)
    block_mass = per_block.sum(dim=-1)  # (rows, blocks)
    block_cdf = block_mass.cumsum(dim=-1)
    target = u * block_cdf[:, -1:]
    block = torch.searchsorted(block_cdf, target, right=True).clamp_(max=blocks - 1)
    before = block_cdf.gather(1, block) - block_mass.gather(1, block)  # mass of earlier blocks
    inside = per_block[torch.arange(rows, device=probs.device), block[:, 0]]  # (rows, BLOCK)
    cdf = inside.cumsum(dim=-1) + before
    offset = torch.searchsorted(cdf, target, right=True).clamp_(max=BLOCK - 1)
    tokens = (block * BLOCK + offset)[:, 0].clamp_(max=vocab - 1)
    # Rounding at the very top of the CDF could land on a zero-probability id: never keep it
    # (the argmax, a full pass over the vocabulary, only in the rare batch where it happened).
    zero = probs.gather(1, tokens[:, None])[:, 0] <= 0
    if bool(zero.any()):
        tokens = torch.where(zero, probs.argmax(dim=-1), tokens)
    return tokens


def row_stream(seed: int, key: Hashable) -> random.Random:
    """The sampling stream of the episode ``key`` under ``seed``: a generator seeded from both
    (a digest of ``repr((seed, key))``, so the same on every machine and in every process for
    keys whose ``repr`` is stable: ints, strings, tuples of them). One uniform is drawn from it
    per token the episode samples, whatever rows share its passes.

    Example:
        >>> row_stream(0, (1, 2)).random() == row_stream(0, (1, 2)).random()
        True
        >>> row_stream(0, (1, 2)).random() == row_stream(0, (2, 1)).random()
        False
    """
    digest = hashlib.blake2b(repr((seed, key)).encode(), digest_size=8).digest()
    return random.Random(int.from_bytes(digest, "big"))


class GeneratorSampling:
    """A logits processor for ``model.generate(do_sample=False, ...)`` that samples each next
    token itself, from ``generator``, with :func:`sample`'s law (temperature, then top-p): it
    returns scores that keep only the drawn id (every other one ``-inf``), which greedy
    decoding then takes. Put it last among the processors.

    Args:
        temperature: Above 0.
        top_p: Nucleus mass, in (0, 1].
        generator: The generator every draw comes from, on the model's device (None: torch's
            global one).
    """

    def __init__(
        self, temperature: float, top_p: float, generator: torch.Generator | None = None
    ) -> None:
        if not temperature > 0:
            raise InvalidArgumentError(
                f"GeneratorSampling samples at a temperature > 0, actual: {temperature!r}; "
                "decode greedily (do_sample=False, no GeneratorSampling) at temperature 0."
            )
        self.temperature = temperature
        self.top_p = top_p
        self.generator = generator

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        probs = nucleus(scores.float() / self.temperature, self.top_p)
        tokens = draw(probs, self.generator)
        kept = torch.full_like(scores, float("-inf"))
        return kept.scatter_(1, tokens[:, None], 0.0)
