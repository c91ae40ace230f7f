"""The token-tree scoring of GRPO batches (:mod:`trainers.grpo.token_tree`): the plan on
hand-made batches, and the values and gradients of a per-row forward on a real model."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from trainers.grpo.token_tree import (  # noqa: E402
    plan_token_tree,
    score_token_tree,
    tree_costs,
    tree_unsupported_reason,
)


def _batch(rows: list[tuple[list[int], list[int]]]):
    """TRL's layout: prompts left-padded, completions right-padded with 0."""
    prompt_width = max(len(p) for p, _ in rows)
    width = max(len(c) for _, c in rows)
    ids, mask = [], []
    for prompt, completion in rows:
        left, right = prompt_width - len(prompt), width - len(completion)
        ids.append([0] * left + prompt + completion + [0] * right)
        mask.append([0] * left + [1] * (len(prompt) + len(completion)) + [0] * right)
    return torch.tensor(ids), torch.tensor(mask), width


def test_rows_sharing_a_turn_run_it_once_and_each_pair_is_projected_once() -> None:
    ids, mask, keep = _batch(
        [
            ([1, 2, 3], [4, 5, 6]),
            ([1, 2, 3], [4, 5, 7]),  # the same first two tokens, another third
            ([1, 2, 8], [9]),  # another question
        ]
    )
    plan = plan_token_tree(ids, mask, keep, min_prefix=1, row_tokens=8)
    assert plan.prefix_ids.tolist() == [[1, 2]]  # up to the earliest predicting position
    # Depth-first: 3 -> 4 -> 5 (the shared turn, once), then 8.
    assert plan.packed_ids.tolist() == [[3, 4, 5, 8]]
    assert plan.position_ids.tolist() == [[2, 3, 4, 2]]
    tree = plan.attention_mask[0, 0, :, 2:].int().tolist()
    assert tree == [
        [1, 0, 0, 0],
        [1, 1, 0, 0],
        [1, 1, 1, 0],
        [0, 0, 0, 1],  # 8 sees the prefix and itself, not the other branch
    ]
    assert plan.attention_mask[..., :2].all()
    pairs = list(
        zip(plan.logit_columns.tolist(), plan.targets.tolist(), strict=True)
    )  # (node column, token): 4 and 5 once although two rows score them
    assert sorted(pairs) == [(0, 4), (1, 5), (2, 6), (2, 7), (3, 9)]
    assert plan.scored.tolist() == [[True] * 3, [True] * 3, [True, False, False]]
    assert plan.gather_index[0, :2].tolist() == plan.gather_index[1, :2].tolist()
    assert plan.positions == 6  # of the 3 + 3 + 3 + 3 + 3 + 1 tokens of the rows
    # Rows as short as the longest path (3): 8 starts a second one.
    short = plan_token_tree(ids, mask, keep, min_prefix=1, row_tokens=3)
    assert short.packed_ids.tolist() == [[3, 4, 5], [8, 0, 0]]
    # Unset, the size is the least work: 4 x (2 + 4) = 24 pairs in one row against
    # 2 x 3 x (2 + 3) = 30 in rows of 3.
    one = plan_token_tree(ids, mask, keep, min_prefix=1, costs=(0.0, 1.0))
    assert one.packed_ids.tolist() == [[3, 4, 5, 8]]


def test_packed_rows_hold_whole_paths_and_never_exceed_their_size() -> None:
    rows = [([1, 2, 3], list(range(10 + 5 * i, 15 + 5 * i))) for i in range(5)]
    ids, mask, keep = _batch(rows)
    plan = plan_token_tree(ids, mask, keep, min_prefix=1, row_tokens=12)
    # Each row needs 5 tokens past the prefix [1, 2]: 3, then its completion but the last.
    assert plan.packed_ids.shape == (3, 9)  # 5 + 4 (sharing the 3), twice, then one row
    assert plan.packed_ids[:, 0].tolist() == [3, 3, 3]  # each packed row has its own copy
    assert plan.packed_ids[2, 5:].tolist() == [0] * 4
    assert plan.positions == 2 + 9 + 9 + 5  # the padding is not run for a row's sake
    padding = plan.attention_mask[2, 0, 5:, 2:]
    assert torch.equal(padding[:, 5:], torch.eye(4, dtype=torch.bool))  # only themselves
    assert not padding[:, :5].any()
    # A row longer than the packed rows' size gets a packed row of its own length.
    assert plan_token_tree(ids, mask, keep, min_prefix=1, row_tokens=2).packed_ids.shape == (5, 5)
    # Unset: 1 row of 21 positions (5 + 4 x 4; rows of up to 8 x 5 tokens) against 5 rows of 5
    # when positions cost; 5 x 5 x (2 + 5) = 175 pairs against 21 x 23 = 483 when pairs do.
    assert plan_token_tree(ids, mask, keep, min_prefix=1).packed_ids.shape == (1, 21)
    attention = plan_token_tree(ids, mask, keep, min_prefix=1, costs=(0.0, 1.0))
    assert attention.packed_ids.shape == (5, 5)


def test_tree_costs_count_a_models_matmul_weights_and_attention(small_model_dir) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(small_model_dir)
    config = model.config
    total = sum(p.numel() for p in model.parameters())  # tied: the embedding counted once
    position, pair = tree_costs(model)
    assert position == 2.0 * total  # the tied embedding is the head's matmul at each position
    head_size = config.hidden_size // config.num_attention_heads
    assert pair == 4.0 * config.num_attention_heads * head_size * config.num_hidden_layers


def test_short_prefixes_nothing_to_score_and_gaps_are_planned_or_refused() -> None:
    ids, mask, keep = _batch([([1, 2, 3], [4, 5]), ([1, 2, 3], [6])])
    assert plan_token_tree(ids, mask, keep, min_prefix=3).prefix_ids.shape == (1, 0)
    assert plan_token_tree(ids, mask, keep, min_prefix=2).prefix_ids.tolist() == [[1, 2]]
    one = plan_token_tree(ids[:1], mask[:1], keep, min_prefix=1)
    assert one.prefix_ids.shape == (1, 0) and one.packed_ids.tolist() == [[1, 2, 3, 4]]
    empty = mask.clone()
    empty[:, -keep:] = 0
    assert plan_token_tree(ids, empty, keep) is None  # no completion token at all
    gap = mask.clone()
    gap[0, -keep] = 0  # a hole before a real completion token
    assert plan_token_tree(ids, gap, keep) is None


def _rows(generator, shared: int, vocab: int):
    """Rows with a shared system prompt, two questions, a shared first turn and branches."""
    system = torch.randint(5, vocab, (shared,), generator=generator).tolist()
    turn = torch.randint(5, vocab, (6,), generator=generator).tolist()

    def tail(n):
        return torch.randint(5, vocab, (n,), generator=generator).tolist()

    return [
        ([*system, 7, 8], [*turn, *tail(5)]),
        ([*system, 7, 8], [*turn, *tail(9)]),
        ([*system, 7, 8], tail(4)),
        ([*system, 9], [*turn, *tail(3)]),
        ([*system, 9], [*turn, *tail(3)]),
    ]


def check_tree_matches_per_row_forwards(
    model, *, shared: int, min_prefix: int, row_tokens: int | None, atol: float = 1e-5
) -> None:
    """The tree's logprobs, and the gradients of a weighted sum of them (of the trainable
    weights), are those of a plain forward of each row on its own (at temperature 0.7, TRL's
    fused head's divisor): logprobs within ``atol``, each gradient within ``atol`` times its
    largest entry (at least 1)."""
    assert tree_unsupported_reason(model) is None
    vocab = min(model.config.vocab_size, 30000)
    ids, mask, keep = _batch(_rows(torch.Generator().manual_seed(0), shared, vocab))
    temperature = 0.7
    dtype = next(model.parameters()).dtype
    trained = [p for p in model.parameters() if p.requires_grad]
    weights = torch.randn(ids.shape[0], keep, generator=torch.Generator().manual_seed(1))
    weights = weights.to(dtype)

    def reference():
        model.zero_grad()
        logps = torch.zeros(ids.shape[0], keep, dtype=dtype)
        for i in range(ids.shape[0]):
            real = mask[i].bool()
            tokens = ids[i][real].unsqueeze(0)
            logits = model(input_ids=tokens).logits[0, :-1] / temperature
            values = logits.log_softmax(-1).gather(1, tokens[0, 1:].unsqueeze(1)).squeeze(1)
            count = int(mask[i, -keep:].sum())
            logps[i, :count] = values[len(values) - count :]
        (logps * weights).sum().backward()
        return logps.detach(), [p.grad.clone() for p in trained]

    def tree():
        model.zero_grad()
        plan = plan_token_tree(
            ids, mask, keep, min_prefix=min_prefix, row_tokens=row_tokens,
            costs=tree_costs(model),
        )  # fmt: skip
        assert (plan.prefix_ids.size(1) > 0) == (min_prefix <= shared)
        assert plan.packed_ids.size(0) == {1024: 1, 12: 4}.get(row_tokens, plan.packed_ids.size(0))
        logps, entropies = score_token_tree(
            model, plan, temperature=temperature, compute_entropy=True,
            autocast=lambda: torch.autocast("cpu", enabled=False),
        )  # fmt: skip
        assert entropies.shape == logps.shape and (entropies[plan.scored] > 0).all()
        (logps * weights).sum().backward()
        return logps.detach(), [p.grad.clone() for p in trained]

    expected, result = reference(), tree()
    assert torch.allclose(expected[0], result[0].to(dtype), atol=atol)
    assert len(expected[1]) == len(result[1]) > 0
    for a, b in zip(expected[1], result[1], strict=True):
        scale = float(a.abs().max())
        gap = float((a - b).abs().max())
        assert gap <= atol * max(1.0, scale), (scale, gap)


@pytest.mark.parametrize(
    ("shared", "min_prefix", "row_tokens"),
    [(40, 32, None), (40, 32, 1024), (40, 64, 1024), (40, 32, 12)],  # a prefix pass; none
)
def test_tree_scores_are_a_per_row_forwards_values_and_gradients(
    small_model_dir, shared, min_prefix, row_tokens
) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(small_model_dir, attn_implementation="sdpa")
    check_tree_matches_per_row_forwards(
        model, shared=shared, min_prefix=min_prefix, row_tokens=row_tokens
    )


def test_a_lora_adapter_in_the_backbone_scores_and_trains_through_the_tree(small_model_dir) -> None:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(small_model_dir, attn_implementation="sdpa")
    peft = get_peft_model(
        model, LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False)
    )
    base = peft.get_base_model()
    assert sum(p.requires_grad for p in base.parameters()) > 0  # only the adapters train
    check_tree_matches_per_row_forwards(base, shared=40, min_prefix=32, row_tokens=None)


def test_models_whose_attention_or_head_the_tree_cannot_take_are_named(small_model_dir) -> None:
    from transformers import AutoModelForCausalLM

    eager = AutoModelForCausalLM.from_pretrained(small_model_dir, attn_implementation="eager")
    assert "eager" in tree_unsupported_reason(eager)
    model = AutoModelForCausalLM.from_pretrained(small_model_dir, attn_implementation="sdpa")
    model.config.sliding_window, model.config.use_sliding_window = 8, True
    assert "sliding" in tree_unsupported_reason(model)
    model.config.use_sliding_window = False
    assert tree_unsupported_reason(model) is None
    model.config.final_logit_softcapping = 30.0
    assert "scaled" in tree_unsupported_reason(model)
