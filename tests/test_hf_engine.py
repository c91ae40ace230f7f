"""The continuous-batching engine: every sampled logprob matches a teacher-forced forward pass
over the exact ids, through extensions, rebuilt rows, partial prefixes, released rows and queues;
and HFPolicy gives the same episodes with either batching."""

from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch")

from llm_gym import Task  # noqa: E402
from llm_gym.policies.hf import HFPolicy  # noqa: E402
from llm_gym.policies.hf_engine import DecodeEngine, unsupported_reason  # noqa: E402
from llm_gym.rollout import collect_groups  # noqa: E402
from tests.test_tokens import Chatty, chatty_groups  # noqa: E402


def _engine(model, tokenizer, **kwargs) -> DecodeEngine:
    options = dict(temperature=1.0, top_p=1.0, seed=0)
    options.update(kwargs)
    return DecodeEngine(
        model, eos_ids=[tokenizer.eos_token_id], pad_id=tokenizer.pad_token_id, **options
    )


def _run(engine: DecodeEngine, admits, releases=()) -> dict:
    """Step until every admitted turn has finished."""
    waiting = {key for key, _, _ in admits}
    done = {}
    first = True
    while waiting:
        for turn in engine.step(admits if first else [], releases if first else []):
            done[turn.key] = turn
            waiting.discard(turn.key)
        first = False
    return done


def _check(model, context: list[int], turn, tol: float = 1e-4) -> None:
    ids = torch.tensor([context + turn.token_ids])
    with torch.no_grad():
        logits = model(ids).logits[0].float()
    logps = torch.log_softmax(logits[:-1], dim=-1).gather(-1, ids[0, 1:, None])[:, 0]
    forced = logps[len(context) - 1 :].tolist()
    assert len(forced) == len(turn.logprobs)
    for recorded, teacher in zip(turn.logprobs, forced, strict=True):
        assert recorded == pytest.approx(teacher, abs=tol)


def _ids(rng: random.Random, n: int, vocab: int) -> list[int]:
    return [rng.randrange(3, vocab) for _ in range(n)]


def test_the_small_model_is_supported(small_model) -> None:
    model, _ = small_model
    assert unsupported_reason(model) is None
    assert "model_type" in unsupported_reason(object())


def test_turns_extend_rows_and_match_teacher_forcing(small_model) -> None:
    model, tokenizer = small_model
    rng = random.Random(0)
    vocab = model.config.vocab_size
    system = _ids(rng, 30, vocab)
    contexts = {k: system + _ids(rng, 3 + k, vocab) for k in range(5)}
    engine = _engine(model, tokenizer)
    for _turn in range(3):
        done = _run(engine, [(k, ids, 6) for k, ids in contexts.items()])
        for key, turn in done.items():
            _check(model, contexts[key], turn)
            assert 1 <= len(turn.token_ids) <= 6
            if turn.finish_reason == "stop":
                assert turn.token_ids[-1] == tokenizer.eos_token_id
            else:
                assert len(turn.token_ids) == 6 and tokenizer.eos_token_id not in turn.token_ids
            contexts[key] = contexts[key] + turn.token_ids + _ids(rng, rng.randrange(0, 9), vocab)
    assert engine.prefix_ids == system[: len(engine.prefix_ids)] and len(engine.prefix_ids) >= 30
    # Each turn prefilled only what the environment appended, never the whole context again.
    assert engine.prefilled_tokens < sum(len(c) for c in contexts.values())


def test_a_context_that_is_not_an_extension_rebuilds_the_row(small_model) -> None:
    model, tokenizer = small_model
    rng = random.Random(1)
    vocab = model.config.vocab_size
    system = _ids(rng, 20, vocab)
    contexts = {k: system + _ids(rng, 4, vocab) for k in range(3)}
    engine = _engine(model, tokenizer)
    done = _run(engine, [(k, ids, 5) for k, ids in contexts.items()])
    # Key 0's history is rewritten (its last turn dropped); key 1 truncated inside the prefix.
    contexts[0] = contexts[0] + _ids(rng, 3, vocab)
    contexts[1] = system[:10] + _ids(rng, 5, vocab)
    contexts[2] = contexts[2] + done[2].token_ids + _ids(rng, 2, vocab)
    done = _run(engine, [(k, ids, 5) for k, ids in contexts.items()])
    for key, turn in done.items():
        _check(model, contexts[key], turn)


def test_rows_that_share_only_part_of_the_prefix(small_model) -> None:
    model, tokenizer = small_model
    rng = random.Random(2)
    vocab = model.config.vocab_size
    system = _ids(rng, 25, vocab)
    engine = _engine(model, tokenizer)
    first = {k: system + _ids(rng, 3, vocab) for k in range(2)}
    pending = [(k, ids, 4) for k, ids in first.items()]
    # Newcomers while the first rows decode: one shares 12 prefix tokens, one shares none.
    late = {2: system[:12] + _ids(rng, 6, vocab), 3: _ids(rng, 7, vocab)}
    engine.step(pending)
    done = _run(engine, [(k, ids, 4) for k, ids in late.items()])
    for key, turn in done.items():
        _check(model, {**first, **late}[key], turn)
    assert {2, 3} <= set(done) and engine.rows[2].prefix_len == 12
    assert engine.rows[3].prefix_len == 0


def test_released_rows_are_compacted_and_queued_turns_start(small_model) -> None:
    model, tokenizer = small_model
    rng = random.Random(3)
    vocab = model.config.vocab_size
    system = _ids(rng, 15, vocab)
    contexts = {k: system + _ids(rng, 2 + k, vocab) for k in range(4)}
    engine = _engine(model, tokenizer, max_rows=3)
    engine.step([(k, ids, 4) for k, ids in contexts.items()])
    assert len(engine.slots) == 3 and len(engine.queue) == 1
    done: dict = {}
    while len(done) < 3:
        done.update({t.key: t for t in engine.step([])})
    for key in range(3):
        _check(model, contexts[key], done[key])
        contexts[key] = contexts[key] + done[key].token_ids + _ids(rng, 3, vocab)
    # Key 0 ends: the last row moves into its slot and queued key 3 takes a row.
    done = _run(engine, [(k, contexts[k], 4) for k in (1, 2)], releases=[0])
    assert 3 in engine.rows and 0 not in engine.rows
    while 3 not in done:
        done.update({t.key: t for t in engine.step([])})
    for key in (1, 2, 3):
        _check(model, contexts[key], done[key])


def test_greedy_and_top_p_sampling(small_model) -> None:
    model, tokenizer = small_model
    rng = random.Random(4)
    contexts = {k: _ids(rng, 12, model.config.vocab_size) for k in range(3)}
    greedy = _run(
        _engine(model, tokenizer, temperature=0.0), [(k, c, 5) for k, c in contexts.items()]
    )
    nucleus = _run(
        _engine(model, tokenizer, temperature=0.7, top_p=1e-6),
        [(k, c, 5) for k, c in contexts.items()],
    )
    for key, context in contexts.items():
        _check(model, context, greedy[key])
        # A vanishing top_p keeps only the most likely token: greedy ids, tempered logprobs.
        assert nucleus[key].token_ids == greedy[key].token_ids
        ids = torch.tensor([context + greedy[key].token_ids])
        with torch.no_grad():
            logits = model(ids).logits[0, len(context) - 1 : -1].float() / 0.7
        expected = torch.log_softmax(logits, -1).gather(-1, ids[0, len(context) :, None])[:, 0]
        assert nucleus[key].logprobs == pytest.approx(expected.tolist(), abs=1e-4)


def test_continuous_and_wave_batching_give_the_same_greedy_episodes(small_model) -> None:
    model, tokenizer = small_model
    runs = {}
    for mode in ("continuous", "waves"):
        policy = HFPolicy(model, tokenizer, temperature=0.0, max_new_tokens=10, batching=mode)
        groups = collect_groups(
            Chatty, [Task("hello"), Task("numbers 123")], policy, episodes_per_task=2, max_turns=3
        )
        runs[mode] = [e for g in groups for e in g]
    for fast, slow in zip(runs["continuous"], runs["waves"], strict=True):
        assert [t.token_ids for t in fast.turns] == [t.token_ids for t in slow.turns]
        assert fast.samples[0].completion_ids == slow.samples[0].completion_ids
        assert fast.samples[0].logprobs == pytest.approx(slow.samples[0].logprobs, abs=1e-4)


def test_seeded_continuous_batching_is_reproducible(small_model) -> None:
    model, tokenizer = small_model
    texts = []
    for _ in range(2):
        policy = HFPolicy(model, tokenizer, temperature=1.0, max_new_tokens=8, seed=5)
        groups = collect_groups(
            Chatty, [Task(f"t{i}") for i in range(3)], policy, episodes_per_task=2, max_turns=3
        )
        texts.append([[t.token_ids for t in e.turns] for g in groups for e in g])
    assert texts[0] == texts[1]


def test_seeded_wave_batching_is_reproducible_and_leaves_the_global_generator(
    small_model,
) -> None:
    """Waves sample through ``generate`` from the batch's own generator: the same seed gives the
    same episodes, and torch's global generator is not reseeded by the policy."""
    model, tokenizer = small_model
    before = torch.get_rng_state()
    texts = []
    for _ in range(2):
        policy = HFPolicy(model, tokenizer, temperature=1.0, max_new_tokens=8, seed=5,
                          batching="waves")  # fmt: skip
        groups = collect_groups(
            Chatty, [Task(f"t{i}") for i in range(3)], policy, episodes_per_task=2, max_turns=3
        )
        texts.append([[t.token_ids for t in e.turns] for g in groups for e in g])
    assert texts[0] == texts[1]
    assert len({tuple(map(tuple, episode)) for episode in texts[0]}) > 1
    assert torch.equal(torch.get_rng_state(), before)


def test_continuous_batching_serves_every_group_in_each_forward_pass(small_model) -> None:
    model, tokenizer = small_model
    policy = HFPolicy(model, tokenizer, max_new_tokens=4, seed=0)
    groups, stats = chatty_groups(policy, tasks=8, episodes_per_task=4, max_turns=3)
    assert sum(len(g) for g in groups) == 32
    assert policy.generate_calls == 0 and policy.forward_passes == stats[0].policy_calls
    # One pass for the shared prefix, then at most 3 turns x 4 tokens: an episode whose turn
    # ended rejoins the very next pass, and every pass carries the episodes of all 8 groups.
    assert stats[0].policy_calls <= 1 + 3 * 4
    assert max(stats[0].batch_sizes) == 32
    assert sum(stats[0].batch_sizes) >= 32 * 3


@pytest.mark.parametrize("model_type", ["llama", "mistral", "qwen2", "qwen3"])
def test_each_supported_architecture_matches_teacher_forcing(small_model, model_type) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    _, tokenizer = small_model
    config = AutoConfig.for_model(
        model_type,
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=256,
        sliding_window=None,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    assert unsupported_reason(model) is None
    rng = random.Random(5)
    system = _ids(rng, 20, 128)
    contexts = {k: system + _ids(rng, 2 + k, 128) for k in range(3)}
    engine = _engine(model, tokenizer)
    for _ in range(2):
        done = _run(engine, [(k, c, 4) for k, c in contexts.items()])
        for key, turn in done.items():
            _check(model, contexts[key], turn)
            contexts[key] = contexts[key] + turn.token_ids + _ids(rng, 3, 128)


def test_a_failing_engine_stops_the_collection_loudly(small_model, monkeypatch) -> None:
    from llm_gym.policies import PolicyError

    model, tokenizer = small_model

    def broken(self, admits, releases=()):
        raise RuntimeError("out of memory")

    monkeypatch.setattr(DecodeEngine, "step", broken)
    policy = HFPolicy(model, tokenizer, max_new_tokens=4)
    with pytest.raises(PolicyError, match="out of memory"):
        collect_groups(Chatty, [Task("a"), Task("b")], policy, episodes_per_task=2, max_turns=2)


def test_max_batch_size_bounds_the_rows(small_model) -> None:
    model, tokenizer = small_model
    policy = HFPolicy(model, tokenizer, max_new_tokens=3, seed=0, max_batch_size=3)
    groups, stats = chatty_groups(policy, tasks=4, episodes_per_task=2, max_turns=2)
    assert all(e.num_turns == 2 for g in groups for e in g)
    assert max(stats[0].batch_sizes[1:]) <= 3


def test_engines_on_one_model_reuse_its_kv_cache(small_model) -> None:
    from llm_gym.policies.hf_attention import POOL

    model, tokenizer = small_model
    rng = random.Random(8)
    contexts = {k: _ids(rng, 10 + k, model.config.vocab_size) for k in range(4)}
    admits = [(k, c, 6) for k, c in contexts.items()]
    POOL.clear()
    first = _engine(model, tokenizer)
    held = first.cache
    fresh = _run(first, admits)
    other = _engine(model, tokenizer)  # the first still holds its cache: a new one
    assert other.cache is not held
    first.close()
    other.close()
    again = _engine(model, tokenizer)  # the idle buffers, keys and values of the last run in them
    assert again.cache is held and all(p is None for p in again.cache.prefix_k)
    reused = _run(again, admits)
    for key, context in contexts.items():
        assert reused[key].token_ids == fresh[key].token_ids
        assert reused[key].logprobs == fresh[key].logprobs  # masked columns weigh exactly zero
        _check(model, context, reused[key])
    again._stepping = True  # closed while a step runs in another thread: not given back
    again.close()
    assert _engine(model, tokenizer).cache is not held


def test_a_cache_is_not_reused_after_a_nan_or_on_an_accelerator(small_model, monkeypatch) -> None:
    from llm_gym.policies import hf_engine
    from llm_gym.policies.hf_attention import POOL, KVCache

    model, tokenizer = small_model
    POOL.clear()
    engine = _engine(model, tokenizer)
    real = hf_engine.sample
    monkeypatch.setattr(
        hf_engine, "sample", lambda *a, **k: (real(*a, **k)[0], [float("nan")] * len(a[0]))
    )
    _run(engine, [("a", [5, 6, 7], 2)])
    held = engine.cache
    engine.close()  # the model produced a NaN: its buffers may hold one
    assert _engine(model, tokenizer).cache is not held
    monkeypatch.setattr(hf_engine, "sample", real)
    on_gpu = KVCache(2, 1, 4, torch.float32, torch.device("meta"))
    on_gpu.ensure(2, 2)
    POOL.give_back(model, on_gpu)  # not a CPU cache: never held idle
    assert _engine(model, tokenizer).cache is not on_gpu
