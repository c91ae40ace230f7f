"""Async training: the config's refusals, versioned weights, the engine's weight swaps, the
off-policy correction on hand-computed values, the rollout worker, and short async runs."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl")

from llm_gym.core.task import Task  # noqa: E402
from llm_gym.errors import InvalidArgumentError  # noqa: E402
from llm_gym.policies.weights import VersionedWeights  # noqa: E402
from trainers import GRPOConfig, WeightSyncType  # noqa: E402
from trainers.async_rl.weight_sync import CallbackPublisher, InProcessPublisher  # noqa: E402
from trainers.grpo.batch import off_policy_weights, stale_token_mask  # noqa: E402
from trainers.grpo.scoring import reference_logps  # noqa: E402

SYNC, BACKGROUND, PIPELINE = (m.value for m in WeightSyncType)


def _no_worker_threads() -> bool:
    deadline = time.time() + 5
    while time.time() < deadline:
        names = [t.name for t in threading.enumerate()]
        if not any(n.startswith("llm-gym-") for n in names):
            return True
        time.sleep(0.05)
    return False


# --- the config ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "named", "allowed"),
    [
        ({"weight_sync_type": BACKGROUND}, "weight_sync_type", "need max_steps_off_policy"),
        ({"weight_sync_type": PIPELINE}, "weight_sync_type", "need max_steps_off_policy"),
        (
            {"weight_sync_type": PIPELINE, "max_steps_off_policy": 1, "use_lora": True},
            "weight_sync_type",
            "full-weight",
        ),
        ({"weight_sync_type": "WEIGHT_SYNC_TYPE_ASYNC"}, "weight_sync_type", "one of"),
        ({"max_steps_off_policy": -1}, "max_steps_off_policy", "int >= 0"),
        ({"max_steps_off_policy": 1.5}, "max_steps_off_policy", "int >= 0"),
        ({"max_steps_off_policy": True}, "max_steps_off_policy", "int >= 0"),
        ({"max_steps_off_policy": 1, "groups_in_flight": 0}, "groups_in_flight", "int >= 1"),
        ({"groups_in_flight": 8}, "groups_in_flight", "set max_steps_off_policy"),
        ({"num_generator_replicas": 0}, "num_generator_replicas", "int >= 1"),
        ({"num_generator_replicas": 2}, "num_generator_replicas", "1 in lockstep"),
        ({"generator_threads": 0}, "generator_threads", "int >= 1"),
        ({"max_steps_off_policy": 1, "num_iterations": 2}, "num_iterations", "1 with"),
        ({"max_steps_off_policy": 1, "loss_type": "vespo"}, "loss_type", "not 'vespo'"),
    ],
)
def test_async_settings_are_refused_with_the_field_named(fields, named, allowed, tmp_path) -> None:
    with pytest.raises(InvalidArgumentError) as error:
        GRPOConfig(output_dir=str(tmp_path), max_turns=2, use_cpu=True, **fields)
    assert str(error.value).startswith(named) and allowed in str(error.value)


def test_the_seeds_async_settings_are_accepted(tmp_path) -> None:
    config = GRPOConfig(
        output_dir=str(tmp_path),
        model="Qwen/Qwen3.6-35B-A3B",  # only a name: nothing loads here
        max_turns=6,
        batch_size=4,
        episodes_per_task=8,
        max_steps_off_policy=1,
        groups_in_flight=8,
        num_generator_replicas=2,
        use_cpu=True,
    )
    assert config.is_async and config.resolved_groups_in_flight == 8
    assert config.weight_sync_type == WeightSyncType.SYNCHRONOUS.value
    lockstep = GRPOConfig(output_dir=str(tmp_path), max_turns=6, batch_size=4, use_cpu=True)
    assert not lockstep.is_async and lockstep.resolved_groups_in_flight == 4
    enum_value = GRPOConfig(
        output_dir=str(tmp_path),
        max_turns=2,
        max_steps_off_policy=0,
        weight_sync_type=WeightSyncType.PIPELINE,
        use_cpu=True,
    )
    assert enum_value.weight_sync_type == PIPELINE


# --- versioned weights ----------------------------------------------------------------------------


def _linear(value: float) -> torch.nn.Module:
    layer = torch.nn.Linear(2, 2, bias=False)
    with torch.no_grad():
        layer.weight.fill_(value)
    return layer


def test_versioned_weights_stage_then_swap_without_copying_back() -> None:
    generator = _linear(0.0)
    weights = VersionedWeights(generator, version=3)
    source = _linear(1.0)
    weights.stage(source.named_parameters(), 4)
    assert weights.pending and weights.latest == 4 and weights.version == 3
    assert generator.weight.sum().item() == 0.0  # nothing changes before the swap
    with torch.no_grad():
        source.weight.fill_(2.0)  # the trainer moves on: the staged copy is its own
    weights.stage(source.named_parameters(), 5)  # a newer version replaces the staged one
    assert weights.apply() and not weights.apply()
    assert weights.version == 5 and generator.weight.sum().item() == 8.0
    assert weights.wait_for(5, timeout=0.01) and not weights.wait_for(6, timeout=0.01)
    weights.stage(_linear(3.0).named_parameters(), 6)  # reuses the old tensors as staging
    weights.apply()
    assert generator.weight.sum().item() == 12.0


def test_versioned_weights_refuse_unknown_names_and_shapes() -> None:
    weights = VersionedWeights(_linear(0.0))
    with pytest.raises(KeyError, match="no parameter 'bias'"):
        weights.stage([("bias", torch.zeros(2))], 1)
    with pytest.raises(ValueError, match="shape"):
        weights.stage([("weight", torch.zeros(3, 2))], 1)
    with pytest.raises(InvalidArgumentError, match="swap must be one of"):
        VersionedWeights(_linear(0.0), swap="whenever")


def test_in_process_publisher_synchronous_waits_for_the_swap() -> None:
    trainer_model = _linear(1.0)
    weights = VersionedWeights(_linear(0.0))
    calls = []

    def swap_later() -> None:
        time.sleep(0.2)
        weights.apply()

    weights.listen(lambda: calls.append("woken") or threading.Thread(target=swap_later).start())
    seconds = InProcessPublisher(trainer_model, [weights], WeightSyncType.SYNCHRONOUS).publish(1)
    assert calls == ["woken"] and weights.version == 1 and seconds >= 0.15
    deferred = InProcessPublisher(trainer_model, [weights], WeightSyncType.PIPELINE)
    assert deferred.publish(2) < 0.15 and weights.pending and weights.version == 1


def test_callback_publisher_maps_the_modes_onto_one_sync_call() -> None:
    """vLLM's ``sync_weights``: inline when synchronous, on a thread joined before the next
    optimizer step when deferred."""
    started = []

    def slow_sync() -> None:
        started.append(time.perf_counter())
        time.sleep(0.3)

    inline = CallbackPublisher(slow_sync, WeightSyncType.SYNCHRONOUS)
    assert inline.publish(1) >= 0.25 and inline.version == 1
    for mode in (WeightSyncType.BACKGROUND_PUBLISH, WeightSyncType.PIPELINE):
        deferred = CallbackPublisher(slow_sync, mode)
        assert deferred.publish(1) < 0.2 and deferred.version == 0
        deferred.join()
        assert deferred.version == 1

    def broken() -> None:
        raise OSError("server gone")

    failing = CallbackPublisher(broken, WeightSyncType.PIPELINE)
    failing.publish(1)
    with pytest.raises(RuntimeError, match="server gone"):
        failing.join()


def test_a_deferred_vllm_sync_lands_between_generate_calls() -> None:
    """The sync holds the generation's lock, as every generate call does: while it holds it,
    ``latest`` already names the new version, and a request never sees half an update."""
    lock = threading.Lock()
    seen = []

    def sync() -> None:
        seen.append(("sync", publisher.latest))
        time.sleep(0.1)

    publisher = CallbackPublisher(sync, WeightSyncType.BACKGROUND_PUBLISH, version=3, lock=lock)
    with lock:  # a generate call in flight
        publisher.publish(4)
        time.sleep(0.05)
        assert publisher.latest == 3 and seen == []  # the sync waits for the call
    publisher.join()
    assert seen == [("sync", 4)] and publisher.version == publisher.latest == 4


# --- the off-policy correction, by hand -----------------------------------------------------------


def test_stale_tokens_are_those_older_weights_sampled() -> None:
    versions = torch.tensor([[2, 1, 0, -1, 2]])
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    assert stale_token_mask(versions, 2, mask).tolist() == [[0, 1, 1, 0, 0]]
    assert stale_token_mask(versions, 0, mask).tolist() == [[0, 0, 0, 0, 0]]


def _flat(tensor) -> list[float]:
    return tensor.flatten().tolist()


def test_off_policy_weights_by_hand() -> None:
    old = torch.tensor([[-1.0, -1.0, -1.0, -1.0], [-2.0, -2.0, -2.0, -2.0]])
    behaviour = torch.tensor([[-2.0, -0.5, -1.5, -1.0], [-2.5, -2.0, -1.0, -2.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    stale = torch.tensor([[1, 1, 0, 1], [0, 0, 0, 0]])
    e = math.e
    # token_truncate: min(exp(old - behaviour), 2) on stale training tokens, 1 elsewhere
    truncated = off_policy_weights(old, behaviour, mask, stale, "token_truncate", None, 2.0)
    assert _flat(truncated) == pytest.approx([2.0, e**-0.5, 1.0, 1.0] + [1.0] * 4)
    # token_mask: ratios outside [0.7, 2] are zeroed
    masked = off_policy_weights(old, behaviour, mask, stale, "token_mask", 0.7, 2.0)
    assert _flat(masked) == pytest.approx([0.0, 0.0, 1.0, 1.0] + [1.0] * 4)
    # sequence_truncate: exp(sum over stale tokens) = exp(1 - 0.5) for row 0; row 1 has none
    sequence = off_policy_weights(old, behaviour, mask, stale, "sequence_truncate", None, 3.0)
    assert _flat(sequence) == pytest.approx([e**0.5, 1.0])
    sequence_mask = off_policy_weights(old, behaviour, mask, stale, "sequence_mask", None, 1.5)
    assert _flat(sequence_mask) == pytest.approx([0.0, 1.0])
    # zero staleness: exactly one, whatever the logprobs say
    none = off_policy_weights(
        old, behaviour, mask, torch.zeros_like(mask), "token_truncate", 0.5, 2
    )
    assert torch.equal(none, torch.ones_like(old))


# --- the engine under new weights ---------------------------------------------------------------


def _logprob_of_next(model, ids: list[int], token: int) -> float:
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, -1].float()
    return torch.log_softmax(logits, dim=-1)[token].item()


def _perturbed(model):
    import copy

    other = copy.deepcopy(model)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return other


def test_engine_invalidate_samples_from_the_new_weights_over_the_whole_context(small_model):
    """A turn in flight when the weights change (PIPELINE): after ``invalidate`` every cached key
    and value is the new weights', so the next token's logprob is the new model's over the
    whole context (prefix, earlier tokens of the turn included)."""
    import copy

    from llm_gym.policies.hf_engine import DecodeEngine

    model, _ = small_model
    generator = copy.deepcopy(model).eval()
    new = _perturbed(model).eval()
    prompts = {"a": list(range(5, 40)), "b": [*range(5, 30), 77, 78]}
    engine = DecodeEngine(generator, eos_ids=[], pad_id=0, temperature=1.0, top_p=1.0)
    engine.step([(key, ids, 6) for key, ids in prompts.items()])
    engine.step([])
    weights = VersionedWeights(generator, version=0, swap="between_passes")
    weights.stage(new.named_parameters(), 1)
    weights.apply()
    engine.version = 1
    engine.invalidate()
    finished = []
    while len(finished) < 2:
        finished += engine.step([])
    for turn in finished:
        assert turn.versions == [-1, -1, 1, 1, 1, 1]
        context = prompts[turn.key] + turn.token_ids[:2]
        expected = _logprob_of_next(new, context, turn.token_ids[2])
        assert turn.logprobs[2] == pytest.approx(expected, abs=1e-4)


def _stream_run(small_model, swap: str, stage_after_steps: int):
    """Two episodes' first turns through an HFPolicy stream with versioned weights; version 1
    is staged from the engine's thread after ``stage_after_steps`` forward passes."""
    import copy

    from llm_gym.policies import HFPolicy, PolicyRequest
    from llm_gym.policies.hf_engine import DecodeEngine

    model, tokenizer = small_model
    generator = copy.deepcopy(model).eval()
    new = _perturbed(model).eval()
    weights = VersionedWeights(generator, version=0, swap=swap)
    policy = HFPolicy(
        generator, tokenizer, temperature=1.0, seed=0, max_new_tokens=12, weights=weights
    )
    original = DecodeEngine.step
    calls = []

    def step(self, admits, releases=()):
        calls.append(1)
        if len(calls) == stage_after_steps:
            weights.stage(new.named_parameters(), 1)
        return original(self, admits, releases)

    async def run():
        stream = policy.open_stream()
        request = PolicyRequest(messages=[], tool_specs=[], task=Task("q"), action_format=None)
        turns = []
        for key, ids in (("a", list(range(5, 40))), ("b", list(range(5, 44)))):
            request = PolicyRequest(
                messages=[], tool_specs=[], task=Task("q"), action_format=None, prompt_ids=ids
            )
            turns.append(stream.act(key, request))
        out = await asyncio.gather(*turns)
        await stream.aclose()
        return out

    DecodeEngine.step = step
    try:
        generations = asyncio.run(run())
    finally:
        DecodeEngine.step = original
    return generations, weights


def test_pipeline_turns_in_flight_go_on_under_the_new_weights(small_model) -> None:
    generations, weights = _stream_run(small_model, "between_passes", stage_after_steps=3)
    assert weights.version == 1
    for generation in generations:
        versions = generation.policy_versions
        assert versions[0] == 0 and versions[-1] == 1 and versions == sorted(versions)
        assert len(versions) == len(generation.token_ids) == len(generation.logprobs)


def test_background_publish_lets_turns_in_flight_finish_under_the_old_weights(small_model):
    generations, weights = _stream_run(small_model, "between_turns", stage_after_steps=3)
    for generation in generations:
        assert set(generation.policy_versions) == {0}  # one version per turn
    assert weights.version == 1  # swapped in once the turns were done


# --- the trainer ----------------------------------------------------------------------------------


def _trainer(model_dir, output_dir, env_factory=None, tasks=None, agent=None, **config):
    from llm_gym.envs.tool_use_game import ToolUseGameEnv, get_tasks
    from trainers.grpo.trainer import MultiTurnGRPOTrainer

    settings = dict(
        output_dir=str(output_dir),
        model=str(model_dir),
        batch_size=2,
        episodes_per_task=2,
        num_steps=3,
        max_turns=2,
        max_model_length=1024,
        max_tokens_per_turn=12,
        use_cpu=True,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        learning_rate=1e-3,
    )
    settings.update(config)
    return MultiTurnGRPOTrainer(
        args=GRPOConfig(**settings),
        env_factory=env_factory or ToolUseGameEnv,
        tasks=tasks or list(get_tasks("train")[:6]),
        val_tasks=list(get_tasks("val")[:2]),
        agent=agent,
    )


def _rows_batch(versions: list[int]):
    from llm_gym.rollout import TokenSample
    from trainers.grpo.batch import samples_to_tensors

    samples = [
        TokenSample(
            [11, 12, 13],
            [20, 21, 30, 22],
            env_mask=[1, 1, 0, 1],
            logprobs=[-1.0, -2.0, 0.0, -0.5],
            policy_versions=[versions[0]] * 2 + [-1] + [versions[0]],
        ),
        TokenSample(
            [11, 12],
            [23, 24, 25],
            env_mask=[1, 1, 1],
            logprobs=[-3.0, -1.0, -0.2],
            policy_versions=[versions[1]] * 3,
        ),
    ]
    return samples_to_tensors(samples, [(1.0, None, True), (-1.0, None, True)], pad_id=0)


def _loss_and_grads(trainer, batch):
    trainer.model.zero_grad()
    batch = {k: v for k, v in batch.items() if k not in ("sampling_per_token_logps",)}
    batch["num_items_in_batch"] = (batch["completion_mask"] * batch["tool_mask"]).sum()
    loss = trainer._compute_loss(trainer.model, batch)
    loss.backward()
    return loss.item(), [p.grad.clone() for p in trainer.model.parameters() if p.grad is not None]


def test_zero_staleness_gives_lockstep_loss_and_gradients_and_stale_tokens_are_corrected(
    small_model_dir, tmp_path
) -> None:
    lockstep = _trainer(small_model_dir, tmp_path / "l", loss_type="grpo")
    async_run = _trainer(small_model_dir, tmp_path / "a", loss_type="grpo", max_steps_off_policy=1)
    batches = {}
    for name, trainer in (("lockstep", lockstep), ("async", async_run)):
        batch = _rows_batch([0, 0])
        metrics = reference_logps(trainer, batch)
        batches[name] = (batch, metrics)
    (lock_batch, _), (async_batch, async_metrics) = batches["lockstep"], batches["async"]
    assert async_metrics == {"async/stale_token_ratio": 0.0}
    assert torch.equal(lock_batch["advantages"], async_batch["advantages"])
    assert "old_per_token_logps" not in async_batch
    loss_l, grads_l = _loss_and_grads(lockstep, lock_batch)
    loss_a, grads_a = _loss_and_grads(async_run, async_batch)
    assert loss_l == loss_a and all(
        torch.equal(a, b) for a, b in zip(grads_l, grads_a, strict=True)
    )

    # One step later the same tokens are stale: their advantages times min(pi/mu, 3) in the
    # loss, pi from the loss's own forward pass (the trainer's weights at the step's start).
    async_run.state.global_step = 1
    stale = _rows_batch([0, 1])  # row 0 sampled by version 0, row 1 by version 1
    sampling = stale["sampling_per_token_logps"].clone()
    metrics = reference_logps(async_run, stale)
    assert metrics == {"async/stale_token_ratio": pytest.approx(3 / 6)}
    assert "old_per_token_logps" not in stale and stale["stale_mask"].sum() == 3
    ids = torch.cat([stale["prompt_ids"], stale["completion_ids"]], dim=1)
    mask = torch.cat([stale["prompt_mask"], stale["completion_mask"]], dim=1)
    with torch.no_grad():
        logps, _, _ = lockstep._get_per_token_logps_and_entropies(lockstep.model, ids, mask, 4)
    by_hand = _rows_batch([0, 0])
    for col in (0, 1, 3):  # row 0's training tokens
        by_hand["advantages"][0, col] *= min(math.exp(logps[0, col] - sampling[0, col]), 3.0)
    assert not torch.equal(by_hand["advantages"], _rows_batch([0, 0])["advantages"])
    reference_logps(lockstep, by_hand)
    loss_a, grads_a = _loss_and_grads(async_run, stale)
    loss_h, grads_h = _loss_and_grads(lockstep, by_hand)
    assert loss_a == pytest.approx(loss_h, abs=1e-6)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(grads_a, grads_h, strict=True))
    logged = async_run._metrics["train"] if async_run.model.training else async_run._metrics["eval"]
    assert logged["async/off_policy_weight_mean"]


def _log_keys(trainer) -> set[str]:
    keys = {key for record in trainer.state.log_history for key in record}
    assert not (missing := undocumented_metrics(keys)), f"not in docs/metrics.md: {missing}"
    return keys


def undocumented_metrics(keys: set[str]) -> list[str]:
    """The ``keys`` that ``docs/metrics.md`` lists nowhere (``<name>`` there: any name)."""
    import re

    text = (Path(__file__).resolve().parents[1] / "docs" / "metrics.md").read_text()
    first_cells = [line.split("|")[1] for line in text.splitlines() if line.startswith("| `")]
    listed = [key for cell in first_cells for key in re.findall(r"`([a-z_/<>]+)`", cell)]
    patterns = [re.compile(re.escape(k).replace("<name>", "[^/]+") + "$") for k in listed]
    return sorted(k for k in keys if not any(p.match(k) for p in patterns))


@pytest.mark.parametrize("mode", [SYNC, BACKGROUND, PIPELINE])
def test_async_training_runs_with_dynamic_sampling_validation_and_checkpoints(
    small_model_dir, tmp_path, mode
) -> None:
    import json

    trainer = _trainer(
        small_model_dir,
        tmp_path,
        max_steps_off_policy=1,
        groups_in_flight=4,
        weight_sync_type=mode,
        max_sampling_attempts=2,
        overlong_masking=True,
        validation_interval=2,
        save_strategy="steps",
        save_steps=2,
        logging_steps=1,
    )
    trainer.train()
    assert trainer.state.global_step == 3 and trainer._async is None
    assert _no_worker_threads()
    keys = _log_keys(trainer)
    for key in (
        "async/train_wait_s",
        "async/dropped_stale_groups",
        "async/staleness_mean",
        "async/staleness_max",
        "async/generator_idle_s",
        "async/weight_sync_s",
        "zero_variance_skip_ratio",
    ):
        assert key in keys, key
    staleness = [r["async/staleness_max"] for r in trainer.state.log_history if "loss" in r]
    assert max(staleness) <= 1
    assert [r["step"] for r in trainer.validation_history] == [0, 2, 3]  # before, every 2, after
    state = json.loads((tmp_path / "checkpoint-2" / "trainer_state.json").read_text())
    assert any("async/train_wait_s" in record for record in state["log_history"])


class _FailingPolicyError(RuntimeError):
    pass


def test_a_policy_failure_stops_the_worker_and_reaches_the_trainer(small_model_dir, tmp_path):
    from llm_gym.policies import hf_stream
    from trainers.async_rl.rollout import RolloutWorkerError

    trainer = _trainer(small_model_dir, tmp_path, max_steps_off_policy=1)
    original = hf_stream.HFStream.act

    async def broken(self, key, request):
        raise _FailingPolicyError("generator out of memory")

    hf_stream.HFStream.act = broken
    try:
        with pytest.raises(RolloutWorkerError, match="generator out of memory"):
            trainer.train()
    finally:
        hf_stream.HFStream.act = original
    assert trainer._async is None and _no_worker_threads()


def test_keyboard_interrupt_shuts_the_worker_down(small_model_dir, tmp_path) -> None:
    from transformers import TrainerCallback

    class Interrupt(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            raise KeyboardInterrupt

    trainer = _trainer(small_model_dir, tmp_path, max_steps_off_policy=1, groups_in_flight=4)
    trainer.add_callback(Interrupt())
    with pytest.raises(KeyboardInterrupt):
        trainer.train()
    assert trainer._async is None and _no_worker_threads()


def test_an_env_that_raises_is_an_episode_outcome_not_a_crash(small_model_dir, tmp_path):
    from llm_gym.envs.tool_use_game import ToolUseGameEnv

    class Flaky(ToolUseGameEnv):
        async def step(self, message):
            raise ConnectionError("tool service down")

    trainer = _trainer(
        small_model_dir, tmp_path, env_factory=Flaky, max_steps_off_policy=0, num_steps=2
    )
    trainer.train()
    assert trainer.state.global_step == 2 and _no_worker_threads()
    steps = [r for r in trainer.state.log_history if "episodes/env_truncated_ratio" in r]
    # every episode whose action parsed reached the raising step: ENV truncation, never a crash
    assert steps and all(r["truncated_ratio"] == 1.0 for r in steps)
    assert all(r["episodes/env_truncated_ratio"] + r["parse_failure_ratio"] == 1.0 for r in steps)
    assert max(r["episodes/env_truncated_ratio"] for r in steps) > 0


def test_async_with_lora_and_two_generator_replicas(small_model_dir, tmp_path) -> None:
    """LoRA publishes only the adapter; two replicas share the groups in flight."""
    trainer = _trainer(
        small_model_dir,
        tmp_path,
        max_steps_off_policy=1,
        groups_in_flight=4,
        num_generator_replicas=2,
        use_lora=True,
        lora_r=4,
        lora_alpha=8,
        weight_sync_type=BACKGROUND,
        num_steps=2,
        logging_steps=1,
    )
    seen = {}
    original = trainer._async_pool

    def spy(wanted):
        out = original(wanted)
        collector = trainer._async
        seen["replicas"] = len(collector.replicas)
        seen["started"] = collector.worker.groups_started
        seen["staged"] = sorted(
            name for name in collector.replicas[0]._staged or {} if "lora" not in name
        )
        return out

    trainer._async_pool = spy
    trainer.train()
    assert trainer.state.global_step == 2 and _no_worker_threads()
    assert seen["replicas"] == 2 and seen["started"] >= 4 and seen["staged"] == []


def test_async_per_turn_credit_on_guess_number(small_model_dir, tmp_path) -> None:
    """Per-turn credit: each token's advantage is its turn's (GuessNumber grades turns); the
    off-policy correction multiplies it like any other."""
    from llm_gym.envs.guess_number.env import GuessNumberEnv, get_tasks

    trainer = _trainer(
        small_model_dir,
        tmp_path,
        env_factory=GuessNumberEnv,
        tasks=list(get_tasks("train")[:6]),
        max_steps_off_policy=1,
        credit_assignment="per_turn",
        action_format="hermes",
        max_turns=3,
        num_steps=2,
        logging_steps=1,
    )
    trainer.val_tasks = []
    trainer.train()
    assert trainer.state.global_step == 2 and _no_worker_threads()
    assert "async/staleness_mean" in _log_keys(trainer)


async def _two_call_agent(base_url: str, task: Task) -> float:
    """Two calls on the training endpoint (the second continues the first); the reward is
    the share of the token budget the replies used (it differs between episodes)."""
    import openai

    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
    messages = [{"role": "user", "content": task.prompt}]
    used = 0
    for question in ("", "And then?"):
        if question:
            messages.append({"role": "user", "content": question})
        reply = await client.chat.completions.create(model="m", messages=messages, max_tokens=12)
        messages.append({"role": "assistant", "content": reply.choices[0].message.content or ""})
        used += reply.usage.completion_tokens
    return used / 24


@pytest.mark.parametrize("mode", [SYNC, PIPELINE])
def test_an_agent_trains_async_on_its_served_replica(
    small_model_dir, tmp_path, monkeypatch, mode
) -> None:
    """max_steps_off_policy with an agent: its groups run against the generator replica's own
    endpoint; every trained token is one the replica's engine sampled, with the version that
    sampled it; the async metrics are logged; the last publication reaches the served copy
    (SYNCHRONOUS: swapped in; deferred: staged, swapped in at the next call)."""
    pytest.importorskip("uvicorn")
    pytest.importorskip("openai")
    import llm_gym.serving.engine as engine_module
    from trainers.async_rl.collect import AsyncCollector
    from trainers.grpo.agent_rollouts import AgentCollector

    sampled: list[list[int]] = []  # every generation's tokens, as the engine sampled them
    real = engine_module.sample_tokens

    def spy(model, prompt_ids, sampling, *, on_token, **kw) -> None:
        tokens: list[int] = []
        sampled.append(tokens)

        def seen(token) -> bool:
            tokens.append(token.token_id)
            return on_token(token)

        real(model, prompt_ids, sampling, on_token=seen, **kw)

    monkeypatch.setattr(engine_module, "sample_tokens", spy)
    collected = []
    group = AgentCollector.group

    async def keep(self, replica, task, key):
        episodes = await group(self, replica, task, key)
        collected.extend(episodes)
        return episodes

    monkeypatch.setattr(AgentCollector, "group", keep)
    closing = {}
    close = AsyncCollector.close

    def check_replica(self) -> None:
        close(self)
        (replica,) = self.served
        engine = replica.server.engine
        closing["version"] = engine.weights.latest
        engine.weights.take_latest()  # what the next call would do first
        trainer_params = dict(self.trainer.accelerator.unwrap_model(self.trainer.model)
                              .named_parameters())  # fmt: skip
        closing["same"] = all(
            torch.equal(p, trainer_params[n]) for n, p in engine.model.named_parameters()
        )

    monkeypatch.setattr(AsyncCollector, "close", check_replica)
    trainer = _trainer(
        small_model_dir, tmp_path, max_steps_off_policy=1, num_steps=2, logging_steps=1,
        max_tokens_per_turn=12, agent_timeout_s=60, weight_sync_type=mode, agent=_two_call_agent,
    )  # fmt: skip
    trainer.val_tasks = []
    trainer.train()
    assert trainer.state.global_step == 2 and _no_worker_threads()
    keys = _log_keys(trainer)
    for key in ("async/staleness_mean", "async/staleness_max", "async/generator_idle_s"):
        assert key in keys, key
    assert closing == {"version": 2, "same": True}
    assert collected and all(e.error is None for e in collected), [e.error for e in collected]
    generations = [tuple(ids) for ids in sampled]
    for episode in collected:
        assert len(episode.turns) == 2
        trained = [
            (token, version)
            for sample in episode.samples
            for token, version, mask in zip(
                sample.completion_ids, sample.policy_versions, sample.env_mask, strict=True
            )
            if mask
        ]
        assert [t for t, _ in trained] == [t for turn in episode.turns for t in turn.token_ids]
        for turn in episode.turns:  # each call's ids: one generation's, as sampled
            ids = tuple(turn.token_ids)
            assert any(g[: len(ids)] == ids for g in generations)
            assert len(set(turn.policy_versions)) == 1  # one version per call
        assert all(0 <= version <= 1 for _, version in trained)
