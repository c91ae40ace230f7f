"""The decode engine's sampling law: inverse-CDF draws, the logprobs it reports, and the
guard against a zero-probability id."""

from __future__ import annotations

from unittest import mock

import pytest

torch = pytest.importorskip("torch")

from llm_gym.policies import hf_sampling  # noqa: E402
from llm_gym.policies.hf_sampling import GeneratorSampling, draw, row_stream, sample  # noqa: E402


def test_reported_logprobs_are_log_softmax_of_the_tempered_logits() -> None:
    logits = torch.randn(16, 300, generator=torch.Generator().manual_seed(0)) * 4
    for temperature, top_p in ((1.0, 1.0), (0.7, 1.0), (0.7, 0.9), (0.0, 1.0)):
        ids, logprobs = sample(
            logits,
            temperature=temperature,
            top_p=top_p,
            generator=torch.Generator().manual_seed(1),
        )
        scale = temperature or 1.0
        expected = torch.log_softmax(logits / scale, dim=-1)[torch.arange(16), torch.tensor(ids)]
        assert logprobs == pytest.approx(expected.tolist(), abs=1e-6)
    greedy, _ = sample(logits, temperature=0.0, top_p=1.0)
    assert greedy == logits.argmax(dim=-1).tolist()


def test_draws_follow_the_probabilities() -> None:
    probs = torch.tensor([[0.1, 0.0, 0.6, 0.3]]).repeat(20_000, 1)
    counts = torch.bincount(draw(probs, torch.Generator().manual_seed(3)), minlength=4)
    share = (counts / counts.sum()).tolist()
    assert share[1] == 0.0
    # 20,000 draws: each share within ~4 standard errors (<= 0.014) of its probability.
    assert share == pytest.approx([0.1, 0.0, 0.6, 0.3], abs=0.014)


def test_a_draw_that_rounds_onto_a_zero_probability_id_takes_the_argmax() -> None:
    probs = torch.tensor([[0.2, 0.5, 0.3, 0.0], [0.1, 0.0, 0.9, 0.0]])
    # u = 1 puts the draw past the last positive id, which rounding can do at the top of the CDF.
    with mock.patch.object(hf_sampling.torch, "rand", lambda shape, **_: torch.ones(shape)):
        assert draw(probs).tolist() == [1, 2]


def test_the_generate_processor_draws_what_sample_draws() -> None:
    """``GeneratorSampling`` (``generate``'s sampling from a generator of the caller's) keeps
    exactly the id :func:`sample` draws from the same generator, and -inf elsewhere."""
    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(0)) * 3
    for temperature, top_p in ((1.0, 1.0), (0.7, 0.9)):
        kept = GeneratorSampling(temperature, top_p, torch.Generator().manual_seed(4))(None, logits)
        ids, _ = sample(
            logits, temperature=temperature, top_p=top_p, generator=torch.Generator().manual_seed(4)
        )
        assert kept.argmax(dim=-1).tolist() == ids
        assert (kept == 0).sum().item() == 6 and torch.isinf(kept).sum().item() == 6 * 49
    with pytest.raises(ValueError, match="temperature > 0"):
        GeneratorSampling(0.0, 1.0)


def test_each_row_draws_its_own_uniform_and_leaves_torch_alone() -> None:
    """Given uniforms, row ``i``'s id is the inverse CDF at ``uniforms[i]``, whatever the other
    rows are, and no torch generator is read."""
    probs = torch.tensor([[0.2, 0.5, 0.3, 0.0], [0.1, 0.0, 0.9, 0.0]])
    before = torch.get_rng_state()
    assert draw(probs, uniforms=[0.1, 0.05]).tolist() == [0, 0]
    assert draw(probs, uniforms=[0.69, 0.11]).tolist() == [1, 2]
    assert draw(probs[1:], uniforms=[0.11]).tolist() == [2]  # alone: the same id
    assert torch.equal(torch.get_rng_state(), before)
    ids, _ = sample(torch.log(probs + 1e-30), temperature=1.0, top_p=1.0, uniforms=[0.69, 0.11])
    assert ids == [1, 2]


def test_row_streams_depend_on_the_seed_and_key_only() -> None:
    first = [row_stream(5, (0, 1)).random() for _ in range(2)]
    assert first[0] == first[1] == 0.1222262255418366  # the same in every process and machine
    others = {row_stream(5, (1, 0)).random(), row_stream(6, (0, 1)).random(), first[0]}
    assert len(others) == 3


def reference_draw(probs: torch.Tensor, uniforms: list[float]) -> torch.Tensor:
    """The obvious inverse CDF: one sequential ``cumsum`` over the whole vocabulary."""
    cdf = probs.cumsum(dim=-1)
    u = torch.tensor(uniforms, dtype=cdf.dtype).view(-1, 1)
    tokens = torch.searchsorted(cdf, u * cdf[:, -1:], right=True)[:, 0]
    tokens = tokens.clamp_(max=probs.shape[1] - 1)
    zero = probs.gather(1, tokens[:, None])[:, 0] <= 0
    return torch.where(zero, probs.argmax(dim=-1), tokens)


@pytest.mark.parametrize("vocab", [49_152, 1_000, 300, 7])
def test_the_blocked_draw_matches_the_plain_inverse_cdf(vocab: int) -> None:
    """Seeded draws of :func:`draw` (two-level CDF) are the plain ``cumsum`` inverse CDF's,
    on vocabularies that fill their last block or not, tempered, truncated and peaked rows."""
    gen = torch.Generator().manual_seed(vocab)
    logits = torch.randn(64, vocab, generator=gen) * 4
    rng = row_stream(0, vocab)
    for temperature, top_p in ((1.0, 1.0), (0.6, 1.0), (1.0, 0.9), (0.2, 0.5)):
        probs = hf_sampling.nucleus(logits / temperature, top_p)
        uniforms = [rng.random() for _ in range(64)]
        uniforms[:2] = [0.0, 0.5]
        assert draw(probs, uniforms=uniforms).tolist() == reference_draw(probs, uniforms).tolist()
        # At the top of the CDF the two summation orders may part (a rounding boundary), but
        # never onto an id of probability zero.
        top = draw(probs, uniforms=[1.0 - 2**-24] * 64)
        assert bool((probs.gather(1, top[:, None]) > 0).all())


def test_a_unit_temperature_sample_is_the_tempered_law_at_one() -> None:
    logits = torch.randn(8, 700, generator=torch.Generator().manual_seed(2)) * 3
    uniforms = [row_stream(1, i).random() for i in range(8)]
    ids, logprobs = sample(logits, temperature=1.0, top_p=1.0, uniforms=uniforms)
    assert ids == reference_draw(torch.softmax(logits, dim=-1), uniforms).tolist()
    expected = torch.log_softmax(logits, dim=-1)[torch.arange(8), torch.tensor(ids)]
    assert logprobs == pytest.approx(expected.tolist(), abs=1e-6)
