"""``VLLMPolicy`` against a stand-in for TRL's vLLM generation object (no vLLM, no GPU).

What runs here is our side of the contract: token ids in and out, logprobs, the finish reason,
the end-of-turn token kept in the ids but not in the text, the sampler settings restored, and
the collective "still active?" rounds of server mode. vLLM itself runs in benchmarks/gpu_check.py.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace as NS

import pytest

pytest.importorskip("accelerate")

from llm_gym.core.task import Task
from llm_gym.policies import PolicyRequest
from llm_gym.policies import vllm as vllm_policy
from llm_gym.policies.vllm import VLLMPolicy

EOS = 2


class FakeTokenizer:
    def decode(self, ids, skip_special_tokens=False):
        return " ".join(f"t{i}" for i in ids)


class FakeGeneration:
    """Answers each prompt with its own length + 10, 11, then EOS, or runs out of budget."""

    def __init__(self, mode: str = "colocate") -> None:
        self.mode = mode
        self.tensor_parallel_size = 1
        self.temperature = 0.7
        self.max_completion_length = 256
        self.calls: list[tuple[list[list[int]], float, int]] = []

    def generate(self, prompts, images, num_generations):
        assert images is None and num_generations == 1
        self.calls.append(
            ([list(p) for p in prompts], self.temperature, self.max_completion_length)
        )
        completions, logprobs = [], []
        for prompt in prompts:
            ids = [len(prompt) + 10, len(prompt) + 11, EOS][: self.max_completion_length]
            completions.append(ids)
            logprobs.append([[-0.5 * (j + 1)] for j in range(len(ids))])
        return prompts, completions, logprobs, None


def _trainer(generation: FakeGeneration, processes: int = 1) -> NS:
    return NS(
        vllm_generation=generation,
        processing_class=FakeTokenizer(),
        accelerator=NS(num_processes=processes),
        eos_token_ids=[EOS],
    )


def _request(prompt_ids: list[int], budget: int | None) -> PolicyRequest:
    return PolicyRequest(
        messages=[],
        tool_specs=[],
        task=Task(prompt="q"),
        action_format=None,  # type: ignore[arg-type]
        max_new_tokens=budget,
        prompt_ids=prompt_ids,
    )


def test_token_in_token_out_with_logprobs_and_finish_reasons() -> None:
    generation = FakeGeneration()
    policy = VLLMPolicy(_trainer(generation), temperature=1.0)
    out = asyncio.run(policy.act([_request([5, 6, 7], 64), _request([5], 64)]))
    assert generation.calls == [([[5, 6, 7], [5]], 1.0, 64)]
    first = out[0]
    assert first.token_ids == [13, 14, EOS]  # the end-of-turn token stays in the ids
    assert first.text == "t13 t14"  # but not in the text the action format parses
    assert first.logprobs == [-0.5, -1.0, -1.5]
    assert first.finish_reason == "stop"
    assert out[1].token_ids == [11, 12, EOS]
    # the trainer's own sampler settings are restored after each call
    assert (generation.temperature, generation.max_completion_length) == (0.7, 256)


def test_budget_cut_is_a_length_finish_and_greedy_is_near_zero_temperature() -> None:
    generation = FakeGeneration()
    policy = VLLMPolicy(_trainer(generation), temperature=0.0)
    (out,) = asyncio.run(policy.act([_request([1, 2], 2)]))
    assert out.token_ids == [12, 13] and out.text == "t12 t13"
    assert out.finish_reason == "length"
    assert generation.calls[0][1:] == (1e-6, 2)  # vLLM's greedy is temperature -> 0


def test_requests_without_a_budget_get_256_tokens() -> None:
    generation = FakeGeneration()
    asyncio.run(VLLMPolicy(_trainer(generation), temperature=1.0).act([_request([1], None)]))
    assert generation.calls[0][2] == 256


def test_collective_rounds_only_in_server_mode_with_several_processes(monkeypatch) -> None:
    assert not VLLMPolicy(_trainer(FakeGeneration("server"), 1), temperature=1.0).collective
    assert not VLLMPolicy(_trainer(FakeGeneration("colocate"), 2), temperature=1.0).collective
    policy = VLLMPolicy(_trainer(FakeGeneration("server"), 2), temperature=1.0)
    assert policy.collective
    # drain: a finished process answers with empty batches while another still runs 2 waves
    others_active = [True, True, False]
    monkeypatch.setattr(
        vllm_policy, "gather_object", lambda flags: [flags[0], others_active.pop(0)]
    )
    policy.drain()
    assert policy.generation.calls == [([], 1.0, 1), ([], 1.0, 1)]
    assert others_active == []


def test_async_collection_through_the_vllm_stand_in(small_model, tmp_path) -> None:
    """Async training with use_vllm: the rollout worker drives the vLLM policy, each token is
    stamped with the version the server held when its request went out, and the three sync
    modes map onto TRL's one ``sync_weights`` call (inline, or on a thread joined before the
    next optimizer step)."""
    import threading
    import time

    from llm_gym.envs.tool_use_game import ToolUseGameEnv, get_tasks
    from trainers import GRPOConfig, WeightSyncType
    from trainers.async_rl.collect import AsyncCollector

    _, tokenizer = small_model
    for mode in WeightSyncType:
        generation = FakeGeneration("colocate")
        synced: list[float] = []

        def sync_weights(synced=synced) -> None:
            time.sleep(0.2)
            synced.append(time.perf_counter())

        generation.sync_weights = sync_weights
        args = GRPOConfig(
            output_dir=str(tmp_path),
            max_turns=2,
            batch_size=2,
            episodes_per_task=2,
            max_tokens_per_turn=8,
            use_cpu=True,
            use_vllm=True,
            max_steps_off_policy=1,
            weight_sync_type=mode.value,
        )
        trainer = NS(
            args=args,
            state=NS(global_step=0),
            accelerator=NS(
                num_processes=1,
                process_index=0,
                device=NS(type="cpu"),
                unwrap_model=lambda model: model,
            ),
            model=NS(),
            episode_tokenizer=tokenizer,
            processing_class=tokenizer,
            eos_token_ids=[EOS],
            vllm_generation=generation,
            use_vllm=True,
            tasks=list(get_tasks("train")[:4]),
            mixture=None,
        )
        collector = AsyncCollector(trainer, ToolUseGameEnv, oracle=None)
        try:
            assert len(synced) == 1  # a resumed run's server gets the trainer's weights first
            taken = collector.take(2, lambda episodes: [e.reward for e in episodes])
            assert taken.taken == 2 and taken.dropped_stale == 0 and taken.ages == [0, 0]
            episodes = [e for g, _ in zip(*taken.pool.batch(), strict=True) for e in g]
            versions = {v for e in episodes for t in e.turns for v in t.policy_versions}
            assert versions == {0}
            start = time.perf_counter()
            collector.publish(1)
            inline = time.perf_counter() - start
            if mode is WeightSyncType.SYNCHRONOUS:
                assert inline >= 0.15 and collector.publisher.version == 1
            else:  # deferred: returns at once, done by the next optimizer step
                assert inline < 0.15
                collector.join()
                assert collector.publisher.version == 1
            assert len(synced) == 2
        finally:
            collector.close()
        assert not any(t.name.startswith("llm-gym-") for t in threading.enumerate())


def test_every_policy_on_one_generation_shares_its_lock() -> None:
    """Validation's vLLM policy and the rollout worker's must not interleave generate calls
    (each sets the sampler's fields)."""
    generation = FakeGeneration()
    first = VLLMPolicy(_trainer(generation), temperature=1.0)
    second = VLLMPolicy(_trainer(generation), temperature=0.0)
    assert first._lock is second._lock is vllm_policy.generation_lock(generation)
    assert VLLMPolicy(_trainer(FakeGeneration()), temperature=1.0)._lock is not first._lock
    stamped = VLLMPolicy(_trainer(generation), temperature=1.0, version=lambda: 7)
    (out,) = asyncio.run(stamped.act([_request([5], 8)]))
    assert out.policy_versions == [7] * len(out.token_ids)
