"""The work of a step (:mod:`benchmarks.step_work`), on hand-computed examples."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from benchmarks import step_work
from benchmarks.step_work import (
    ModelShape,
    Work,
    decode_step,
    element_bytes,
    generation,
    prefill,
    stream_work,
    train_step,
)
from llm_gym.errors import InvalidArgumentError

SMOLLM2 = ModelShape(
    parameters=134_515_008, layers=30, hidden=576, intermediate=1536, kv_heads=3, head_dim=64,
    vocab=49_152,
)  # fmt: skip
TOY = ModelShape(parameters=1000, layers=2, hidden=8, intermediate=16, kv_heads=1, head_dim=4,
                 vocab=50)  # fmt: skip
"""2 x 2 layers x 1 head x 4 = 16 key/value elements a token: 64 bytes in fp32, 32 in bf16."""


def test_docstring_examples() -> None:
    import doctest

    assert doctest.testmod(step_work).failed == 0


def test_a_smollm2_decode_step_of_32_rows() -> None:
    """8.6 GFLOP and 538 MB of fp32 weights (269 MB in bf16), plus 46,080 bytes of keys and
    values a cached token in fp32 (30 layers x 2 x 3 heads x 64 x 4 bytes)."""
    assert SMOLLM2.kv_bytes_per_token(4) == 46_080
    step = decode_step(SMOLLM2, rows=32, context_tokens=32 * 521, element=4)
    assert step.flops == 8_608_960_512  # 2 x 134,515,008 x 32
    assert step.bytes == 538_060_032 + 46_080 * 16_672
    bf16 = decode_step(SMOLLM2, rows=32, context_tokens=0, element=2)
    assert bf16 == Work(8_608_960_512, 269_030_016)


def test_the_head_is_the_vocabulary_times_the_hidden_size_and_the_body_the_rest() -> None:
    assert (TOY.head_parameters, TOY.body_parameters, TOY.matmul_parameters) == (400, 600, 1000)
    assert SMOLLM2.head_parameters == 28_311_552  # 49,152 x 576, tied to the embedding table
    untied = ModelShape(1400, 2, 8, 16, 1, 4, 50, untied_embedding=400)
    assert (untied.body_parameters, untied.matmul_parameters) == (600, 1000)


def test_a_shape_of_a_model_counts_an_untied_embedding_table_apart() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    sizes = dict(vocab_size=50, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                 num_attention_heads=2, num_key_value_heads=1)  # fmt: skip
    tied = ModelShape.of(LlamaForCausalLM(LlamaConfig(**sizes, tie_word_embeddings=True)))
    untied = ModelShape.of(LlamaForCausalLM(LlamaConfig(**sizes, tie_word_embeddings=False)))
    assert tied.untied_embedding == 0 and untied.untied_embedding == 400
    assert untied.parameters == tied.parameters + 400
    assert untied.body_parameters == tied.body_parameters


def test_prefill_reads_the_context_and_writes_its_tokens() -> None:
    """The body's 600 parameters for each token, the head's 400 for each sampled position."""
    assert prefill(TOY, tokens=3, element=4) == Work(3600, 4000 + 64 * 3)
    assert prefill(TOY, tokens=3, element=4, context_tokens=5, logits=1) == Work(
        4400, 4000 + 64 * 8
    )


def test_a_generation_is_its_prefills_and_decode_steps() -> None:
    """Three rows of 10, 12 and 14 tokens sharing 8: the prefix once (8 tokens), the rows' 12
    own tokens reading it (logits at each row's last), then 3 decode steps of 3 rows reading
    20 + 3, + 6, + 9 columns."""
    work = generation(TOY, [10, 12, 14], shared=8, new_tokens=4, element=4)
    assert work.flops == 2 * 600 * 8 + (2 * 600 * 12 + 2 * 400 * 3) + 3 * 3 * 2000
    assert work.bytes == 5 * 4000 + 64 * (8 + (8 + 12) + 23 + 26 + 29)
    # no shared prefix: one prefill of every prompt token; one new token: no decode step
    assert generation(TOY, [4, 6], shared=0, new_tokens=1, element=2) == Work(
        2 * 600 * 10 + 2 * 400 * 2, 2000 + 320
    )
    # every prompt the shared prefix: its last logits give every row's first token
    assert generation(TOY, [5, 5], shared=5, new_tokens=1, element=4).flops == 2 * 600 * 5 + 800


def test_stream_work_batches_every_streams_kth_op_into_pass_k() -> None:
    """Two streams after a 5-token shared prefix: A feeds [1, 2, 3] at column 0 then one token at
    column 3; B one token at column 0. Pass 0 feeds 4 tokens and reads the prefix once plus
    columns 0..3 of A and 0 of B; pass 1 feeds 1 token and reads the prefix and A's 0..3."""
    op = SimpleNamespace
    a = [op(prefix_len=5, column=0, ids=[1, 2, 3]), op(prefix_len=5, column=3, ids=[4])]
    streams = [SimpleNamespace(ops=a), SimpleNamespace(ops=[op(prefix_len=5, column=0, ids=[9])])]
    work = stream_work(TOY, prefix=5, streams=streams, element=4)
    prefix = Work(1200 * 5, 4000 + 64 * 5)  # no logits
    first = Work(1200 * 4 + 800 * 2, 4000 + 64 * (5 + 3 + 1))  # two ops, one sample each
    second = Work(1200 * 1 + 800 * 1, 4000 + 64 * (5 + 4))
    assert work == prefix + first + second
    assert stream_work(TOY, prefix=0, streams=[], element=4) == Work(0, 0)


def test_a_training_step_is_six_flops_a_body_parameter_a_position_and_a_head_one_a_logit() -> None:
    assert train_step(SMOLLM2, tokens=8 * 512, trained=8 * 64, element=4) == Work(
        6 * (106_203_456 * 4096 + 28_311_552 * 512), 3 * 134_515_008 * 4
    )
    assert train_step(TOY, tokens=0, trained=0, element=4) == Work(0, 0)  # no pass


def test_rows_that_share_a_prompt_need_its_positions_once() -> None:
    """A group of three rows after the same 4-token prompt, two of them sampling the same two
    first tokens: 4 prompt positions, then the first row's 5 completion positions and one new
    position each for the others; the logits are those at the first row's 5 prefixes (the
    others score their tokens from prefixes the first row computes)."""
    prompt = [7, 8, 9, 10]
    rows = [
        ([*prompt, 1, 2, 3, 4, 5], [0] * 4 + [1] * 5),
        ([*prompt, 1, 2, 6], [0] * 4 + [1, 1, 1]),
        ([*prompt, 11], [0] * 4 + [1]),
    ]
    assert step_work.prefix_tree_work(rows) == (4 + 5 + 1 + 1, 5)
    # a tool result is forwarded, not scored
    assert step_work.prefix_tree_work([([1, 2, 3, 4], [0, 1, 0, 1])]) == (4, 2)
    assert step_work.prefix_tree_work([]) == (0, 0)


@pytest.mark.parametrize(
    "call",
    [
        lambda: decode_step(TOY, rows=0, context_tokens=0, element=4),
        lambda: prefill(TOY, tokens=-1, element=4),
        lambda: generation(TOY, [3, 4], shared=5, new_tokens=2, element=4),
        lambda: generation(TOY, [], shared=0, new_tokens=2, element=4),
        lambda: train_step(TOY, tokens=-3, trained=0, element=4),
        lambda: train_step(TOY, tokens=3, trained=4, element=4),
        lambda: prefill(TOY, tokens=2, element=4, logits=3),
        lambda: step_work.prefix_tree_work([([1, 2], [1])]),
        lambda: element_bytes("int4"),
    ],
)
def test_impossible_counts_are_refused_with_the_expectation(call) -> None:
    with pytest.raises(InvalidArgumentError, match="Expected"):
        call()


def test_the_shape_of_a_transformers_model(small_model) -> None:
    model, _ = small_model
    shape = ModelShape.of(model)
    config = model.config
    assert shape.parameters == sum(p.numel() for p in model.parameters())
    assert (shape.layers, shape.hidden) == (config.num_hidden_layers, config.hidden_size)
    assert shape.kv_heads * shape.head_dim <= config.hidden_size
    assert step_work.dtype_of(model) == "float32"
