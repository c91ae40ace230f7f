"""The decode engine's key/value budget: the row buffers stay within it at every forward pass
while multi-turn widths grow, rows batch again after the largest episode leaves, an episode
larger than the budget runs alone, the queue is served head first, and the budget never changes
what a seeded episode samples."""

from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch")

from llm_gym import Task  # noqa: E402
from llm_gym.policies.hf import HFPolicy  # noqa: E402
from llm_gym.policies.hf_attention import KVCache  # noqa: E402
from llm_gym.policies.hf_engine import DecodeEngine  # noqa: E402
from llm_gym.rollout import collect_groups  # noqa: E402
from tests.test_hf_engine import _check, _ids  # noqa: E402
from tests.test_tokens import Chatty, chatty_groups  # noqa: E402

TURN = 6
"""Ids each turn may sample."""


def _engine(model, tokenizer, budget: int, seed: int = 0) -> DecodeEngine:
    engine = DecodeEngine(
        model,
        eos_ids=[tokenizer.eos_token_id],
        pad_id=tokenizer.pad_token_id,
        temperature=1.0,
        top_p=1.0,
        seed=seed,
        kv_budget_bytes=budget,
    )
    engine.cache.min_width = 8  # buffers grow through many blocks at these small widths
    return engine


def _spy(engine: DecodeEngine) -> list[dict]:
    """Record, at every forward pass over the rows, the buffers' bytes and shape, the rows in
    the pass and the widest row's columns."""
    passes: list[dict] = []
    real = engine._forward

    def forward(plan, *args):
        if not plan.prefix_mode:
            passes.append(
                {
                    "nbytes": engine.cache.nbytes,
                    "columns": engine.cache.k_rows[0].shape[2],
                    "rows": plan.decode_rows,
                    "keys": {row.key for row in engine.slots},
                    "widest": max(row.width for row in engine.slots),
                }
            )
        return real(plan, *args)

    engine._forward = forward
    return passes


def _play(engine, contexts: dict, turns: dict, grow, vocab: int, check=None) -> dict:
    """Run every episode for its ``turns``, its environment appending ``grow(key)``
    ids after each turn (drawn from a generator of the key's and turn's own); returns each
    key's sampled ids, turn by turn."""
    admits = [(key, list(ids), TURN) for key, ids in contexts.items()]
    releases: list = []
    sampled: dict = {key: [] for key in contexts}
    for _ in range(2000):
        if not (admits or releases or engine.busy or engine.queue):
            return sampled
        finished = engine.step(admits, releases)
        admits, releases = [], []
        for turn in finished:
            key = turn.key
            if check is not None:
                check(contexts[key], turn)
            sampled[key].append(turn.token_ids)
            if len(sampled[key]) == turns[key]:
                releases.append(key)
                continue
            rng = random.Random(f"{key}/{len(sampled[key])}")
            contexts[key] = contexts[key] + turn.token_ids + _ids(rng, grow(key), vocab)
            admits.append((key, contexts[key], TURN))
    raise AssertionError("the episodes did not end")


def test_the_budget_holds_at_every_pass_as_turns_grow_and_rows_batch_again(small_model):
    """Five episodes whose contexts grow turn after turn through several buffer widths, the
    first (the largest) by 40 ids a turn: the buffers never pass the budget, rows give theirs up
    and come back with every logprob still the model's over the exact ids, and once the largest
    episode has left the others run together."""
    model, tokenizer = small_model
    vocab = model.config.vocab_size
    rng = random.Random(11)
    column = KVCache.for_model(model, model.dtype, model.device).column_bytes
    budget = 3 * 121 * column  # three rows of 120 columns
    engine = _engine(model, tokenizer, budget)
    passes = _spy(engine)
    contexts = {key: _ids(rng, 10, vocab) for key in range(5)}
    turns = {0: 4, 1: 7, 2: 7, 3: 7, 4: 7}
    _play(engine, contexts, turns, lambda key: 40 if key == 0 else 8, vocab,
          check=lambda context, turn: _check(model, context, turn))  # fmt: skip
    assert all(p["nbytes"] <= budget for p in passes), max(p["nbytes"] for p in passes)
    assert engine.evictions > 0  # the budget was binding: rows gave theirs up
    assert len({p["columns"] for p in passes}) >= 4  # the widths went through several blocks
    assert max(p["widest"] for p in passes) > 120
    last_with_largest = max(i for i, p in enumerate(passes) if 0 in p["keys"])
    after = passes[last_with_largest + 1 :]
    assert after and max(p["rows"] for p in after) >= 2


def test_an_episode_larger_than_the_budget_runs_alone_then_the_engine_batches_again(
    small_model,
):
    """The first episode's second turn alone holds more than the budget: it runs alone (the
    others give their rows up), and once it has left the others share passes again within
    the budget (the oversized buffers are allocated smaller)."""
    model, tokenizer = small_model
    vocab = model.config.vocab_size
    rng = random.Random(12)
    column = KVCache.for_model(model, model.dtype, model.device).column_bytes
    budget = 4 * 41 * column  # four rows of 40 columns; the large turn holds ~200
    engine = _engine(model, tokenizer, budget)
    passes = _spy(engine)
    contexts = {key: _ids(rng, 8, vocab) for key in range(4)}
    turns = {0: 2, 1: 4, 2: 4, 3: 4}
    _play(engine, contexts, turns, lambda key: 190 if key == 0 else 2, vocab)
    oversized = [p for p in passes if p["widest"] > 160]
    assert oversized and all(p["rows"] == 1 and p["keys"] == {0} for p in oversized)
    after = passes[passes.index(oversized[-1]) + 1 :]
    assert max(p["rows"] for p in after) >= 2
    assert all(p["nbytes"] <= budget for p in after)
    assert all(p["nbytes"] <= budget or p["rows"] == 1 for p in passes)


def test_the_queue_is_served_head_first(small_model) -> None:
    """A later episode that would fit waits behind a head that does not (no episode waits for
    ever behind those that keep fitting)."""
    model, tokenizer = small_model
    vocab = model.config.vocab_size
    rng = random.Random(13)
    column = KVCache.for_model(model, model.dtype, model.device).column_bytes
    engine = _engine(model, tokenizer, 2 * 41 * column)  # two rows of 40 columns
    a, head, small = _ids(rng, 10, vocab), _ids(rng, 60, vocab), _ids(rng, 10, vocab)
    engine.step([("a", a, 4), ("head", head, 4), ("small", small, 4)])
    assert [row.key for row in engine.slots] == ["a"]
    assert [row.key for row in engine.queue] == ["head", "small"]
    while engine.rows["a"].pending:
        engine.step([])
    assert "small" not in {row.key for row in engine.slots}
    engine.step([], ["a"])
    assert [row.key for row in engine.slots] == ["head"]
    while engine.rows["head"].pending:
        engine.step([])
    engine.step([], ["head"])
    assert [row.key for row in engine.slots] == ["small"]


def test_a_seeded_episode_samples_the_same_ids_at_any_budget(small_model) -> None:
    """Each episode draws from its own stream: at a budget that batches every row and at one
    that runs them a row or two at a time (rows giving theirs up mid-turn), every episode
    samples the same ids."""
    model, tokenizer = small_model
    vocab = model.config.vocab_size
    column = KVCache.for_model(model, model.dtype, model.device).column_bytes
    runs = []
    for budget in (1 << 40, 2 * 41 * column):
        rng = random.Random(14)
        contexts = {key: _ids(rng, 10, vocab) for key in range(5)}
        engine = _engine(model, tokenizer, budget, seed=3)
        runs.append(_play(engine, contexts, dict.fromkeys(contexts, 4), lambda *_: 6, vocab))
        runs[-1]["evictions"] = engine.evictions
    assert runs[0].pop("evictions") == 0 < runs[1].pop("evictions")
    assert runs[0] == runs[1]
    assert len({tuple(map(tuple, turns)) for turns in runs[0].values()}) == 5


def test_hf_policy_samples_the_same_episodes_at_any_budget(small_model) -> None:
    """A seeded collection through HFPolicy: the byte budget bounds the rows, and changes
    neither the greedy episodes nor the sampled ones."""
    model, tokenizer = small_model
    column = KVCache.for_model(model, model.dtype, model.device).column_bytes
    for temperature in (0.0, 1.0):
        runs, sizes = {}, {}
        for name, budget in (("bounded", 2 * 43 * column), ("unbounded", 1 << 40)):
            policy = HFPolicy(model, tokenizer, temperature=temperature, max_new_tokens=6,
                              seed=7, kv_budget_bytes=budget)  # fmt: skip
            groups, stats = chatty_groups(policy, tasks=6, episodes_per_task=2, max_turns=2)
            runs[name] = [[t.token_ids for t in e.turns] for g in groups for e in g]
            sizes[name] = max(stats[0].batch_sizes[1:])  # after the shared prefix's pass
        assert runs["bounded"] == runs["unbounded"]
        assert sizes["bounded"] < 12 == sizes["unbounded"]  # second turns: 42 columns a row


def test_kv_cache_buffers_shrink_to_the_live_rows_within_the_limit() -> None:
    """Buffers over the limit are allocated again for the live rows and columns, keeping their
    keys and values; buffers within it that hold the shape are kept."""
    cache = KVCache(num_layers=2, kv_heads=1, head_dim=2, dtype=torch.float32,
                    device=torch.device("cpu"))  # fmt: skip
    assert cache.column_bytes == 2 * 2 * 1 * 2 * 4
    cache.ensure(6, 300)
    assert cache.k_rows[0].shape == (8, 1, 513, 2)
    for buffer in cache.k_rows + cache.v_rows:
        buffer.copy_(torch.randn_like(buffer))
    live = [b[:2, :, :20].clone() for b in cache.k_rows + cache.v_rows]
    limit = cache.bytes_for(2, 40)
    cache.ensure(2, 20, limit)
    assert cache.nbytes <= limit and cache.k_rows[0].shape[0] == 2
    for before, after in zip(live, cache.k_rows + cache.v_rows, strict=True):
        assert torch.equal(after[:, :, :20], before)
    held = cache.k_rows[0]
    cache.ensure(1, 10, limit)  # holds the shape within the limit: kept as it is
    assert cache.k_rows[0] is held


def test_collections_on_a_shared_pool_cache_keep_the_budget(small_model) -> None:
    """A pooled cache a larger collection left is allocated smaller at a smaller budget."""
    model, tokenizer = small_model
    column = KVCache.for_model(model, model.dtype, model.device).column_bytes
    big = HFPolicy(model, tokenizer, max_new_tokens=4, seed=0)
    collect_groups(Chatty, [Task(f"t{i}") for i in range(8)], big, episodes_per_task=4,
                   max_turns=1)  # fmt: skip
    budget = 2 * 129 * column
    engine = _engine(model, tokenizer, budget)
    passes = _spy(engine)
    rng = random.Random(15)
    contexts = {key: _ids(rng, 10, model.config.vocab_size) for key in range(3)}
    _play(engine, contexts, dict.fromkeys(contexts, 2), lambda *_: 3, model.config.vocab_size)
    assert passes and all(p["nbytes"] <= budget for p in passes)
