"""Golden tests of the trainer's pure parts against hand computation, and the masked loss."""

from __future__ import annotations

import math
from types import SimpleNamespace
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llm_gym import TruncationCause
from llm_gym.errors import InvalidArgumentError
from llm_gym.policies import HFPolicy

pytest.importorskip("torch")
pytest.importorskip("trl")

from llm_gym.rollout import TokenSample
from trainers.grpo.advantages import (
    group_advantages,
    is_zero_variance,
    per_turn_group_advantages,
    shaped_reward,
    soft_overlong_penalty,
)
from trainers.grpo.batch import (
    episode_batch,
    pad_rows,
    padding_sample,
    samples_to_tensors,
    without_silent_rows,
)
from trainers.grpo.scoring import reference_logps, training_batch

EPS = 1e-4


def test_per_episode_advantages_by_hand() -> None:
    # Group [1, 0, 0, 1]: mean 0.5, unbiased std sqrt(1/3) = 0.57735.
    (adv,) = group_advantages([[1.0, 0.0, 0.0, 1.0]])
    std = math.sqrt(1 / 3)
    a = 0.5 / (std + EPS)
    assert adv == pytest.approx([a, -a, -a, a])
    (centred,) = group_advantages([[1.0, 0.0, -0.1]], scale_rewards="none")
    assert centred == pytest.approx([1 - 0.3, -0.3, -0.1 - 0.3])
    # batch scaling: std over all 4 rewards [1, 0, 1, 1] = 0.5
    adv_b = group_advantages([[1.0, 0.0], [1.0, 1.0]], scale_rewards="batch")
    assert adv_b[0] == pytest.approx([0.5 / (0.5 + EPS), -0.5 / (0.5 + EPS)])
    assert adv_b[1] == [0.0, 0.0]
    with pytest.raises(InvalidArgumentError, match="scale_rewards"):
        group_advantages([[1.0]], scale_rewards="std")


def test_per_turn_advantages_by_hand() -> None:
    # Episode A turns [0, 1], episode B turns [0, 0, 1]: all five turns form the baseline.
    (group,) = per_turn_group_advantages([[[0.0, 1.0], [0.0, 0.0, 1.0]]], scale_rewards="none")
    assert group[0] == pytest.approx([-0.4, 0.6])
    assert group[1] == pytest.approx([-0.4, -0.4, 0.6])
    (scaled,) = per_turn_group_advantages([[[0.0, 1.0], [0.0, 0.0, 1.0]]])
    std = math.sqrt((3 * 0.16 + 2 * 0.36) / 4)
    assert scaled[0] == pytest.approx([-0.4 / (std + EPS), 0.6 / (std + EPS)])


def test_soft_overlong_penalty_values() -> None:
    assert soft_overlong_penalty(800, 1000, 200, 1.0) == 0.0
    assert soft_overlong_penalty(850, 1000, 200, 1.0) == pytest.approx(-0.25)
    assert soft_overlong_penalty(1000, 1000, 200, 0.5) == pytest.approx(-0.5)
    assert soft_overlong_penalty(1500, 1000, 200, 1.0) == -1.0
    with pytest.raises(InvalidArgumentError, match="buffer"):
        soft_overlong_penalty(10, 100, 0, 1.0)


@pytest.mark.parametrize(
    ("cause", "tokens", "expected"),
    [
        (None, 2000, 1.0),  # terminated: never penalised
        (TruncationCause.CONTEXT_OVERFLOW, 1900, 1.0 - 0.5),  # (1900 - 1800) / 200
        (TruncationCause.MAX_TURNS, 100, 1.0 - 1.0),  # the whole turn budget: full factor
        (TruncationCause.ENV, 2000, 1.0),  # no penalty
        (TruncationCause.PARSE_FAILURE, 2000, 1.0),  # no penalty
    ],
)
def test_shaped_reward_penalises_only_length_budget_causes(cause, tokens, expected) -> None:
    value = shaped_reward(
        1.0, cause, tokens, max_model_length=2000, overlong_buffer=200, overlong_penalty_factor=1.0
    )
    assert value == pytest.approx(expected)
    off = shaped_reward(
        1.0, cause, tokens, max_model_length=2000, overlong_buffer=None, overlong_penalty_factor=1.0
    )
    assert off == 1.0


def test_an_episodes_total_tokens_are_its_longest_sample_or_its_overflow() -> None:
    from llm_gym import Task
    from llm_gym.rollout import Episode

    episode = Episode(Task("q"), 0, 0, [], [], 0.0, False, True)
    assert episode.total_tokens == 0  # no sample, no overflow
    episode.samples = [
        _sample([1, 2], [3, 4, 5], [1, 0, 1], [0, -1, 1]),
        _sample([1], [2], [1], [0]),
    ]
    assert episode.total_tokens == 5  # 2 + 3
    episode.overflow_tokens = 9  # a reply too long for the context needed 9
    assert episode.total_tokens == 9


def test_zero_variance() -> None:
    assert is_zero_variance([1.0, 1.0, 1.0]) and is_zero_variance([-0.1, -0.1])
    assert not is_zero_variance([1.0, 0.0])


def _sample(prompt, completion, mask, turns, versions=None):
    return TokenSample(
        prompt_ids=prompt,
        completion_ids=completion,
        env_mask=mask,
        logprobs=[-0.5] * len(completion),
        turn_index=turns,
        policy_versions=versions or [],
    )


def _tensors(samples, advantages):
    """The batch of ``samples``, one row each, every row training with its advantage."""
    return samples_to_tensors(samples, [(a, None, True) for a in advantages], pad_id=0)


def test_overlong_masking_keeps_the_baseline() -> None:
    # Group rewards [1, 0, 0(truncated)]: the truncated episode still counts in the baseline.
    (adv,) = group_advantages([[1.0, 0.0, 0.0]], scale_rewards="none")
    assert adv == pytest.approx([2 / 3, -1 / 3, -1 / 3])
    sample = _sample([1, 2], [5, 6, 7], [1, 0, 1], [0, -1, 1])
    batch = samples_to_tensors([sample, sample], [(adv[0], None, True), (adv[2], None, False)], 0)
    assert batch["tool_mask"].tolist() == [[1, 0, 1], [0, 0, 0]]
    assert batch["advantages"][0].tolist() == pytest.approx([2 / 3, 0, 2 / 3])
    assert batch["advantages"][1].tolist() == [0.0, 0.0, 0.0]
    assert batch["completion_mask"].tolist() == [[1, 1, 1], [1, 1, 1]]  # still the tokens


def test_rows_per_turn_advantages_and_padding() -> None:
    sample = _sample([1, 2], [5, 6, 7, 8], [1, 0, 1, 1], [0, -1, 1, 2], versions=[3, -1, 4, 4])
    episode = SimpleNamespace(samples=[sample, sample], truncated=False)
    # Turn 2 has no per-turn advantage (two values for three turns): its tokens get 0.
    batch, dropped = episode_batch(
        [[episode]], [[9.0]], [[[0.5, -1.0]]], overlong_masking=True, max_rows=1, pad_id=0
    )
    assert dropped == 1 and batch["advantages"].tolist() == [[0.5, 0.0, -1.0, 0.0]]
    batch = samples_to_tensors([sample, padding_sample(0)], [(9.0, None, True)] * 2, pad_id=0)
    assert batch["prompt_ids"].tolist() == [[1, 2], [0, 0]]
    assert batch["prompt_mask"].tolist() == [[1, 1], [0, 1]]
    assert batch["completion_ids"].tolist() == [[5, 6, 7, 8], [0, 0, 0, 0]]
    assert batch["completion_mask"].tolist() == [[1, 1, 1, 1], [1, 0, 0, 0]]
    assert batch["tool_mask"].tolist() == [[1, 0, 1, 1], [0, 0, 0, 0]]
    assert batch["advantages"].tolist() == [[9.0, 0.0, 9.0, 9.0], [0.0, 0.0, 0.0, 0.0]]
    assert batch["sampling_per_token_logps"].tolist() == [[-0.5] * 4, [0.0] * 4]
    assert batch["policy_versions"].tolist() == [[3, -1, 4, 4], [-1] * 4]


def test_episode_batch_pads_every_episode_and_masks_truncated_ones() -> None:
    sample = _sample([1, 2], [5, 6], [1, 1], [0, 0])
    done = SimpleNamespace(samples=[sample], truncated=False)
    cut = SimpleNamespace(samples=[sample, sample, sample], truncated=True)
    batch, dropped = episode_batch(
        [[done, cut]], [[0.5, -0.5]], [[None, None]], overlong_masking=True, max_rows=2, pad_id=0
    )
    assert dropped == 1  # two rows per episode, the third sample dropped
    assert batch["tool_mask"].tolist() == [[1, 1], [0, 0], [0, 0], [0, 0]]
    assert batch["completion_mask"].tolist() == [[1, 1], [1, 0], [1, 1], [1, 1]]
    assert batch["advantages"].tolist() == [[0.5, 0.5], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0]]
    # the padding row holds the episode's prompt: the batch's prefix stays shared
    assert batch["prompt_ids"].tolist() == [[1, 2]] * 4


def test_silent_rows_leave_the_batch_and_its_width_with_them() -> None:
    long_silent = _sample([7, 8, 9, 10], [1, 2, 3, 4, 5], [1] * 5, [0] * 5)
    signal = _sample([8, 9], [6, 7], [1, 0], [0, -1])
    batch = _tensors([long_silent, signal, padding_sample(0)], [0.0, 1.5, 0.0])
    kept, loss_tokens = without_silent_rows(batch)
    assert loss_tokens == 6  # every row's trained tokens: the loss's normaliser
    assert kept.keys() == batch.keys()
    assert kept["prompt_ids"].tolist() == [[8, 9]] and kept["prompt_mask"].tolist() == [[1, 1]]
    assert kept["completion_ids"].tolist() == [[6, 7]] and kept["tool_mask"].tolist() == [[1, 0]]
    assert kept["advantages"].tolist() == [[1.5, 0.0]]
    assert without_silent_rows(kept)[0] is kept  # nothing silent: the same tensors
    none, tokens = without_silent_rows(_tensors([long_silent], [0.0]))
    assert tokens == 5 and none["completion_ids"].shape == (0, 0)
    assert pad_rows(none, multiple=2, at_least=1, pad_id=0)["prompt_ids"].tolist() == [[0], [0]]


def test_pad_rows_fill_whole_micro_batches_on_the_first_rows_prompt() -> None:
    short = _sample([5], [6], [1], [0])
    long = _sample([1, 2, 3], [4, 5, 6], [1, 1, 0], [0, 0, -1], versions=[2, 2, -1])
    batch = pad_rows(_tensors([short, long], [1.0, -1.0]), multiple=4, at_least=3, pad_id=0)
    assert batch["prompt_ids"].tolist() == [[0, 0, 5], [1, 2, 3], [0, 0, 5], [0, 0, 5]]
    assert batch["prompt_mask"].tolist() == [[0, 0, 1], [1, 1, 1], [0, 0, 1], [0, 0, 1]]
    assert batch["completion_mask"][2:].tolist() == [[1, 0, 0]] * 2
    assert batch["tool_mask"][2:].sum() == 0 and batch["advantages"][2:].abs().sum() == 0
    assert batch["policy_versions"].tolist()[1:] == [[2, 2, -1], [-1] * 3, [-1] * 3]
    same = pad_rows(batch, multiple=2, at_least=4, pad_id=0)
    assert same is batch  # already whole micro-batches


def test_a_sample_whose_columns_disagree_is_refused() -> None:
    ragged = _sample([1], [5, 6, 7], [1, 1], [0, 0, 0])  # two mask values for three tokens
    with pytest.raises(InvalidArgumentError, match="env_mask.*completion token"):
        _tensors([_sample([1], [2], [1], [0]), ragged], [1.0, 1.0])
    with pytest.raises(InvalidArgumentError, match="one credit per sample"):
        samples_to_tensors([ragged], [], pad_id=0)


def test_promote_staged_checkpoint(tmp_path) -> None:
    from trainers.grpo.checkpoints import promote_staged_checkpoint, staging_dir

    run = str(tmp_path)
    for step in (1, 2):
        (tmp_path / f"checkpoint-{step}").mkdir()
    (tmp_path / ".staging-1").mkdir()  # left by a run killed while saving
    staged = tmp_path / ".staging-3" / "checkpoint-3"
    staged.mkdir(parents=True)
    (staged / "weights").write_text("w")
    best = promote_staged_checkpoint(run, 3, str(staged), save_total_limit=2)
    assert best == str(tmp_path / "checkpoint-3") and staging_dir(run, 3).endswith(".staging-3")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-2", "checkpoint-3"]
    assert (tmp_path / "checkpoint-3" / "weights").read_text() == "w"


def _small_trainer(model_dir, output_dir: str, **config):
    """A MultiTurnGRPOTrainer on the small test model: one task, groups of two, CPU."""
    from llm_gym.envs.tool_use_game import ToolUseGameEnv, get_tasks
    from trainers import GRPOConfig
    from trainers.grpo.trainer import MultiTurnGRPOTrainer

    args = GRPOConfig(
        output_dir=output_dir,
        model=str(model_dir),
        batch_size=1,
        episodes_per_task=2,
        max_turns=2,
        max_model_length=1024,
        max_tokens_per_turn=16,
        use_cpu=True,
        save_strategy="no",
        **{"num_steps": 1, **config},
    )
    return MultiTurnGRPOTrainer(
        args=args, env_factory=ToolUseGameEnv, tasks=list(get_tasks("train")[:2])
    )


def test_masked_loss_ignores_env_token_targets(small_model_dir) -> None:
    """The loss and its gradients do not move when environment tokens' targets change."""
    import torch

    trainer = _small_trainer(small_model_dir, "/tmp/llm_gym_test_loss", loss_type="grpo")
    # Two rows whose last tokens are environment tokens (after every policy token).
    samples = [
        _sample([11, 12, 13], [20, 21, 22, 30, 31], [1, 1, 1, 0, 0], [0, 0, 0, -1, -1]),
        _sample([11, 14], [23, 24, 32, 33, 34], [1, 1, 0, 0, 0], [0, 0, -1, -1, -1]),
    ]

    def loss_and_grads(batch):
        trainer.model.zero_grad()
        batch = dict(batch)
        batch.pop("sampling_per_token_logps")
        batch["num_items_in_batch"] = (batch["completion_mask"] * batch["tool_mask"]).sum()
        loss = trainer._compute_loss(trainer.model, batch)
        loss.backward()
        return loss.item(), [
            p.grad.clone() for p in trainer.model.parameters() if p.grad is not None
        ]

    base = _tensors(samples, [1.0, -1.0])
    perturbed = {k: v.clone() for k, v in base.items()}
    env = perturbed["tool_mask"] == 0
    perturbed["completion_ids"][env & (perturbed["completion_mask"] == 1)] = 99
    perturbed["advantages"][env] = 1e6
    loss_a, grads_a = loss_and_grads(base)
    loss_b, grads_b = loss_and_grads(perturbed)
    assert loss_a == pytest.approx(loss_b, abs=1e-7)
    assert all(torch.allclose(a, b, atol=1e-7) for a, b in zip(grads_a, grads_b, strict=True))
    assert any(g.abs().sum() > 0 for g in grads_a)


def test_shared_prefix_scoring_matches_the_full_forward(small_model_dir) -> None:
    """Scoring the rows' shared prefix once, or their token tree, gives TRL's log-probs,
    entropies, loss and grads."""
    import torch

    trainer = _small_trainer(
        small_model_dir,
        "/tmp/llm_gym_test_shared_prefix",
        loss_type="dapo",
        temperature=0.7,  # the fused head divides by it on both paths
    )
    generator = torch.Generator().manual_seed(0)
    shared = torch.randint(5, 400, (40,), generator=generator).tolist()
    specs = [  # prompts of different lengths (left padding), completions with env tokens
        ([*shared, 7, 8, 9], [20, 21, 22, 30, 31, 24], [1, 1, 1, 0, 0, 1]),
        ([*shared, 7], [23, 24, 32, 33, 34], [1, 1, 0, 0, 1]),
        ([*shared, 10, 11], [25, 26], [1, 1]),
    ]
    batch = _tensors([_sample(p, c, m, [0] * len(c)) for p, c, m in specs], [1.0, -0.5, 0.25])
    batch.pop("sampling_per_token_logps")
    batch["num_items_in_batch"] = (batch["completion_mask"] * batch["tool_mask"]).sum()
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    attention = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    keep = batch["completion_ids"].size(1)
    mask = batch["completion_mask"].bool()

    def run(shared_prefix: bool, token_tree: bool = False):
        trainer.args.shared_prefix = shared_prefix
        trainer.args.token_tree = token_tree
        trainer.model.zero_grad()
        with torch.no_grad():
            logps, entropies, _ = trainer._get_per_token_logps_and_entropies(
                trainer.model, ids, attention, keep, batch_size=2, compute_entropy=True
            )
        loss = trainer._compute_loss(trainer.model, dict(batch))
        loss.backward()
        grads = [p.grad.clone() for p in trainer.model.parameters() if p.grad is not None]
        return logps, entropies, loss.item(), grads

    from trl import GRPOTrainer

    full = run(False)
    with mock.patch.object(  # the fast path must not fall back to TRL's
        GRPOTrainer, "_get_per_token_logps_and_entropies", side_effect=AssertionError
    ):
        fast = run(True)
        with mock.patch(  # the token tree is the default, before the shared prefix alone
            "trainers.grpo.scoring.score_shared_prefix", side_effect=AssertionError
        ):
            tree = run(True, token_tree=True)
    assert mask.sum() < mask.numel()  # padded completion columns: 0.0 on every path
    for other in (fast, tree):
        assert torch.allclose(full[0], other[0], atol=1e-5)
        assert torch.allclose(full[1], other[1], atol=1e-5)
        assert other[2] == pytest.approx(full[2], abs=1e-6)
        assert len(full[3]) == len(other[3])
        assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(full[3], other[3], strict=True))
    # A model with gradient checkpointing on (no KV cache in training) takes TRL's path.
    trainer.model.activation_checkpointing_enable()
    trainer.model.train()
    try:
        logps, _, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, ids, attention, keep
        )
        assert torch.allclose(logps.detach(), full[0], atol=1e-5)
    finally:
        trainer.model.activation_checkpointing_disable()
        trainer.model.eval()
    # Short prefixes take TRL's path.
    from trainers.grpo.shared_prefix import plan_shared_prefix

    assert plan_shared_prefix(ids, attention, keep, min_length=64) is None
    assert plan_shared_prefix(ids, attention, keep, min_length=32).prefix_ids.shape == (1, 40)


@settings(max_examples=200, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 300), min_size=1, max_size=40),
    max_rows=st.integers(1, 12),
    overhead=st.integers(0, 500),
)
def test_length_chunks_cover_every_row_once_and_beat_sequential_chunks(
    lengths, max_rows, overhead
) -> None:
    from trainers.grpo.length_chunks import length_chunks

    chunks = length_chunks(lengths, max_rows, overhead)
    assert sorted(i for chunk in chunks for i in chunk) == list(range(len(lengths)))
    assert all(1 <= len(chunk) <= max_rows for chunk in chunks)

    def cost(parts):
        return sum(len(p) * max(lengths[i] for i in p) + overhead for p in parts)

    sequential = [list(range(s, min(s + max_rows, len(lengths)))) for s in
                  range(0, len(lengths), max_rows)]  # fmt: skip
    assert cost(chunks) <= cost(sequential)  # never worse than the chunks scoring ran before
    assert all(lengths[c[0]] == max(lengths[i] for i in c) for c in chunks)  # longest first


def test_silent_rows_skip_the_passes_not_the_loss(small_model_dir) -> None:
    """Rows with all-zero advantages (a zero-variance group) leave the passes, not the loss:
    the same loss and gradients from fewer rows; a loss they do change keeps them."""
    import torch

    trainer = _small_trainer(small_model_dir, "/tmp/llm_gym_test_silent", loss_type="dapo")
    generator = torch.Generator().manual_seed(1)
    shared = torch.randint(5, 400, (40,), generator=generator).tolist()

    def episode(i: int, length: int):
        completion = torch.randint(5, 400, (length,), generator=generator).tolist()
        mask = [1] * (length - 3) + [0, 0, 1]
        return SimpleNamespace(
            samples=[_sample([*shared, 7 + i], completion, mask, [0] * length)], truncated=False
        )

    groups = [[episode(0, 9), episode(1, 5)], [episode(2, 30), episode(3, 12)]]
    advantages = SimpleNamespace(episode=[[0.5, -0.5], [0.0, 0.0]], turns=[[None] * 2] * 2)

    def run(skip: bool):
        trainer.args.skip_silent_rows = skip
        batch, _, _ = training_batch(trainer, groups, advantages)
        trainer.model.zero_grad()
        loss = trainer._compute_loss(trainer.model, batch)
        loss.backward()
        grads = [p.grad.clone() for p in trainer.model.parameters() if p.grad is not None]
        return batch, loss.item(), grads

    full, fast = run(False), run(True)
    assert full[0]["completion_ids"].shape == (4, 30)
    assert fast[0]["completion_ids"].shape == (2, 9)  # the long silent row left the passes
    assert int(fast[0]["num_items_in_batch"]) == int(full[0]["num_items_in_batch"]) == 48
    assert fast[1] == pytest.approx(full[1], abs=1e-6) and full[1] != 0.0
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(full[2], fast[2], strict=True))
    trainer.loss_type = "grpo"  # a per-row mean: the silent rows count in it, so they stay
    trainer.args.skip_silent_rows = True
    assert training_batch(trainer, groups, advantages)[0]["completion_ids"].shape == (4, 30)


def test_lora_reference_logps_with_kl(small_model_dir) -> None:
    """LoRA with beta != 0 scores the reference with the adapter off, on both scoring paths."""
    import torch

    trainer = _small_trainer(
        small_model_dir, "/tmp/llm_gym_test_lora_ref", loss_type="dapo", beta=0.05, use_lora=True
    )
    shared = list(range(5, 45))
    samples = [
        _sample([*shared, 7 + i], [20 + i, 21, 30, 22], [1, 1, 0, 1], [0, 0, -1, 1])
        for i in range(2)
    ]
    logps = []
    for shared_prefix in (False, True):
        trainer.args.shared_prefix = shared_prefix
        batch = _tensors(samples, [1.0, 0.0])
        reference_logps(trainer, batch)
        logps.append(batch["ref_per_token_logps"])
    assert torch.allclose(logps[0], logps[1], atol=1e-5)


class CountingPolicy(HFPolicy):
    """The HF backend, counting its collections (a backend registered only in this test)."""

    calls = 0

    def open_stream(self):
        CountingPolicy.calls += 1
        return super().open_stream()


def test_the_trainer_generates_through_the_registered_backend(small_model_dir, tmp_path) -> None:
    from llm_gym.policies import register_policy
    from llm_gym.policies.registry import unregister_policy

    register_policy("counting", "tests.test_trainer_math:CountingPolicy")
    try:
        trainer = _small_trainer(
            small_model_dir, str(tmp_path), generation_backend="counting", max_steps=1
        )
        CountingPolicy.calls = 0
        groups = trainer.collect(
            trainer.tasks[:1], episodes_per_task=2, temperature=1.0, max_turns=2
        )
        assert CountingPolicy.calls >= 1 and [len(g) for g in groups] == [2]
    finally:
        unregister_policy("counting")


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("credit_assignment", "per_tunr", "advantage estimators"),
        ("action_format", "hermez", "one of"),
        ("generation_backend", "nope", "None or a model backend"),
        ("generation_backend", "oracle", "None or a model backend"),
        ("generation_backend", "vllm", "exactly when use_vllm"),
    ],
)
def test_choices_are_checked_against_their_registries(field, value, message, tmp_path) -> None:
    from trainers import GRPOConfig

    with pytest.raises(InvalidArgumentError, match=message):
        GRPOConfig(output_dir=str(tmp_path), max_turns=2, use_cpu=True, **{field: value})


@pytest.mark.parametrize(
    ("tokens", "turn_budget", "buffer", "expected"),
    [
        (1800, 256, 128, 0.0),  # needed 2,056 > 2,048: the full factor (was no penalty at all)
        (1700, 256, 512, 1.0 - 420 / 512),  # needed 1,956: (1,956 - 1,536) / 512 of the ramp
        (1900, 0, 200, 1.0 - 0.26),  # no turn budget known: its own length, (1,900 - 1,848) / 200
    ],
)
def test_context_overflow_is_penalised_at_the_length_it_needed(
    tokens, turn_budget, buffer, expected
) -> None:
    value = shaped_reward(
        1.0,
        TruncationCause.CONTEXT_OVERFLOW,
        tokens,
        max_model_length=2048,
        overlong_buffer=buffer,
        overlong_penalty_factor=1.0,
        max_new_tokens=turn_budget,
    )
    assert value == pytest.approx(expected)


def test_validation_runs_before_the_first_step_every_interval_and_after_the_last(
    small_model_dir, tmp_path
) -> None:
    from llm_gym.envs.tool_use_game import get_tasks

    trainer = _small_trainer(
        small_model_dir, str(tmp_path), num_steps=3, validation_interval=2, logging_steps=1
    )
    trainer.val_tasks = list(get_tasks("val")[:2])
    trainer.train()
    assert [r["step"] for r in trainer.validation_history] == [0, 2, 3]
    logged = [r for r in trainer.state.log_history if "val/success_rate" in r]
    assert [r["step"] for r in logged] == [1, 2, 3]  # step 0's rides with step 1's record


def test_log_completions_prints_the_sampled_episodes(small_model_dir, tmp_path, capsys) -> None:
    """TRL's ``log_completions``: a table of sampled episodes (prompt, the rest of the
    conversation, reward, advantage, how it ended) in the console at each log."""
    trainer = _small_trainer(
        small_model_dir,
        str(tmp_path),
        log_completions=True,
        num_completions_to_print=2,
        logging_steps=1,
        report_to="none",
    )
    trainer.train()
    assert len(trainer._logs["prompt"]) == 2 and len(trainer._logs["advantages"]) == 2
    assert trainer._logs["prompt"][0][-1]["role"] == "user"
    assert set(trainer._logs["extra"]["ended"]) <= {
        "terminated",
        "max_turns",
        "parse_failure",
        "context_overflow",
        "env",
    }
    out = capsys.readouterr().out
    assert all(header in out for header in ("Prompt", "Completion", "Advantage", "ended"))


def test_reward_funcs_add_to_the_env_reward_with_their_weights(small_model_dir, tmp_path):
    """TRL's reward_funcs/reward_weights: reward = env reward + sum_k w_k f_k(prompts,
    completions, **kwargs), computed by hand on a real group; bad values name the function."""
    import math

    from llm_gym.errors import InvalidArgumentError
    from trainers.grpo.rewards import combined_rewards
    from trainers.grpo.trainer import MultiTurnGRPOTrainer

    seen = {}

    def turns(prompts, completions, **kwargs):
        seen.update(kwargs, prompts=prompts, completions=completions)
        return [sum(m["role"] == "assistant" for m in c) for c in completions]

    def undecided(prompts, completions, **kwargs):
        return [None] * len(prompts)

    from llm_gym.envs.tool_use_game import ToolUseGameEnv, get_tasks
    from trainers import GRPOConfig

    args = GRPOConfig(
        output_dir=str(tmp_path),
        model=str(small_model_dir),
        batch_size=1,
        episodes_per_task=2,
        max_turns=2,
        max_model_length=1024,
        max_tokens_per_turn=16,
        use_cpu=True,
        save_strategy="no",
        reward_weights=[0.5, 3.0],
    )
    tasks = list(get_tasks("train")[:2])
    trainer = MultiTurnGRPOTrainer(
        args=args, env_factory=ToolUseGameEnv, tasks=tasks, reward_funcs=[turns, undecided]
    )
    [group] = trainer.collect(trainer.tasks[:1], episodes_per_task=2, temperature=1.0, max_turns=2)
    rewards = trainer.group_rewards(group)
    for episode, reward in zip(group, rewards, strict=True):
        assert reward == pytest.approx(trainer.rewards.shaped(episode) + 0.5 * episode.num_turns)
    assert seen["prompts"][0][-1]["role"] == "user" and seen["tasks"][0] is group[0].task
    assert seen["env_rewards"] == [trainer.rewards.shaped(e) for e in group]
    assert (
        trainer._metrics["eval"]["rewards/turns/mean"]
        or trainer._metrics["train"]["rewards/turns/mean"]
    )

    def broken(prompts, completions, **kwargs):
        return [math.inf]

    with pytest.raises(InvalidArgumentError, match="broken returned inf for episode 0"):
        combined_rewards([0.0], group[:1], [broken], [1.0])
    with pytest.raises(InvalidArgumentError, match="reward_funcs must be callables"):
        MultiTurnGRPOTrainer(
            args=args, env_factory=ToolUseGameEnv, tasks=tasks, reward_funcs=["a/reward-model"]
        )


def test_per_turn_credit_is_refused_for_native_tool_calling_envs(small_model_dir, tmp_path):
    with pytest.raises(InvalidArgumentError, match="per_turn.*native tool-calling.*lookup"):
        _small_trainer(small_model_dir, str(tmp_path), credit_assignment="per_turn")


def test_per_turn_credit_warns_when_a_multi_turn_group_falls_back() -> None:
    import warnings
    from types import SimpleNamespace

    from trainers.grpo.advantages import warn_per_turn_fallback

    def episode(turns: int, vector: list[float] | None):
        return SimpleNamespace(turns=[None] * turns, per_turn_rewards=vector)

    with pytest.warns(UserWarning, match="1 group\\(s\\) have multi-turn episodes"):
        assert warn_per_turn_fallback([[episode(2, None), episode(1, [1.0])]]) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # single-turn episodes: the same credit, no warning
        assert warn_per_turn_fallback([[episode(1, None), episode(1, None)]]) == 0
        assert warn_per_turn_fallback([[episode(2, [0.0, 1.0]), episode(3, [1, 1, 1])]]) == 0


def test_episodes_the_infrastructure_ended_neither_train_nor_enter_the_baseline() -> None:
    from types import SimpleNamespace

    from llm_gym.core.env import TruncationCause
    from trainers.grpo.advantages import per_episode_credit, without_void_episodes

    def episode(cause=None):
        return SimpleNamespace(truncation_cause=cause, per_turn_rewards=None)

    ok, wrong = episode(), episode(TruncationCause.PARSE_FAILURE)
    failed, hung = episode(TruncationCause.POLICY_ERROR), episode(TruncationCause.DEADLINE)
    groups, rewards = without_void_episodes(
        [[ok, wrong, failed], [hung, hung]], [[1.0, 0.0, 0.0], [0.0, 0.0]]
    )
    assert groups == [[ok, wrong]] and rewards == [[1.0, 0.0]]  # the all-void group is gone
    # the baseline is the mean of the two real episodes (0.5), not of three (0.33)
    assert per_episode_credit(rewards, [[None, None]], "none").episode == [[0.5, -0.5]]


def test_advantages_refuse_what_is_not_finite() -> None:
    from trainers.grpo.advantages import group_advantages, per_turn_group_advantages

    with pytest.raises(InvalidArgumentError, match=r"rewards\[0\]\[1\] is nan"):
        group_advantages([[1.0, math.nan]])
    with pytest.raises(InvalidArgumentError, match=r"advantages\[0\]\[0\] is nan"):
        group_advantages([[1e308, 1e308, -1e308]], "batch")  # finite rewards, overflowing sums
    with pytest.raises(InvalidArgumentError, match="turn rewards"):
        per_turn_group_advantages([[[1.0, math.inf], [0.0]]])
    assert group_advantages([[1.0, 0.0]], "none") == [[0.5, -0.5]]
