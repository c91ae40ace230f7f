"""``dtype``: the probe's decision on hand-made times, the config's table, the bf16 sampler's
copy, and runs on the tiny model (bf16 sampling and training; ``auto`` on a CPU without bf16
hardware). The SmolLM2 numerics test is slow."""

from __future__ import annotations

import logging
import math
from types import SimpleNamespace

import pytest

from trainers.grpo.config.dtype import Precision, static_precision
from trainers.grpo.precision import (
    BF16_MARGIN,
    ProbeTimes,
    bf16_pays,
    choose_precision,
    cpu_bf16_flags,
    generator_copy,
    model_shapes,
)

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.cpu_precision  # the probe measures this CPU (tests/conftest.py)


def _probe(decode: tuple[float, float], train: tuple[float, float]) -> ProbeTimes:
    return ProbeTimes(
        decode_shape=(32, 576, 1536),
        train_shape=(256, 576, 1536),
        decode_fp32_s=decode[0],
        decode_bf16_s=decode[1],
        train_fp32_s=train[0],
        train_bf16_s=train[1],
        threads=1,
    )


# --- the decision, on hand-made times --------------------------------------------------------


@pytest.mark.parametrize(
    ("fp32_s", "bf16_s", "pays"),
    [
        (0.010, 0.004, True),  # 2.5x: AMX-like
        (0.010, 0.008, True),  # exactly the margin, 1.25x
        (0.010, 0.0081, False),  # just under it
        (0.010, 0.009, False),  # 1.11x: not worth the logprob gap
        (0.0008, 0.0037, False),  # this EPYC's decode shape: bf16 4.6x slower
        (0.010, 0.0, False),  # an impossible time
        (math.nan, 0.004, False),
        (0.010, math.inf, False),
    ],
)
def test_bf16_pays_only_past_the_margin(fp32_s, bf16_s, pays) -> None:
    assert BF16_MARGIN == 1.25
    assert bf16_pays(fp32_s, bf16_s) is pays


def test_the_margin_is_a_parameter() -> None:
    assert bf16_pays(0.010, 0.009, margin=1.1) and not bf16_pays(0.010, 0.009, margin=1.2)


def test_choose_decides_sampling_and_training_on_their_own_shapes() -> None:
    # AMX-like: bf16 3x faster at the training shape, 1.1x at the decode shape
    chosen = choose_precision(_probe(decode=(0.0011, 0.0010), train=(0.030, 0.010)))
    assert (chosen.sampling_bf16, chosen.training_bf16) == (False, True)
    assert "decode 32x576x1536: fp32 1.100 ms, bf16 1.000 ms (1.10x) -> fp32" in chosen.reason
    assert "training 256x576x1536: fp32 30.000 ms, bf16 10.000 ms (3.00x) -> bf16" in chosen.reason
    both = choose_precision(_probe(decode=(0.002, 0.001), train=(0.030, 0.010)))
    assert (both.sampling_bf16, both.training_bf16) == (True, True)
    neither = choose_precision(_probe(decode=(0.0008, 0.0037), train=(0.006, 0.044)))
    assert (neither.sampling_bf16, neither.training_bf16) == (False, False)
    assert neither.probe.as_json()["train_bf16_ms"] == 44.0
    assert neither.metrics()["precision/probe_train_bf16_ms"] == pytest.approx(44.0)


def test_cpu_flags_are_read_as_whole_words() -> None:
    amx = "flags\t: fpu sse2 avx512f avx512_bf16 amx_bf16 amx_tile\n"
    assert cpu_bf16_flags(amx) == ("amx_bf16", "avx512_bf16")
    assert cpu_bf16_flags("flags\t: fpu sse2 avx2 fma\n") == ()
    assert cpu_bf16_flags("flags\t: no_amx_bf16_here\n") == ()


def test_model_shapes_read_the_config() -> None:
    assert model_shapes(SimpleNamespace(hidden_size=576, intermediate_size=1536)) == (576, 1536)
    assert model_shapes(SimpleNamespace(n_embd=768, n_inner=None)) == (768, 3072)


def test_the_probe_times_each_cell_and_keeps_the_threads() -> None:
    from trainers.grpo.precision import MIN_WIDTH, probe_matmuls

    threads = torch.get_num_threads()
    probe = probe_matmuls(32, 64)  # a tiny model: widths raised to MIN_WIDTH
    assert torch.get_num_threads() == threads
    assert probe.decode_shape == (32, MIN_WIDTH, MIN_WIDTH) and probe.threads == 1
    times = [probe.decode_fp32_s, probe.decode_bf16_s, probe.train_fp32_s, probe.train_bf16_s]
    assert all(0 < t < 1 for t in times)


# --- the config's table ------------------------------------------------------------------------


def _config(dtype: str = "auto", bf16: bool | None = None, fp16: bool = False):
    return SimpleNamespace(dtype=dtype, bf16=bf16, fp16=fp16)


@pytest.mark.parametrize(
    ("dtype", "bf16", "gpu", "gpu_bf16", "expected"),
    [
        ("float32", None, False, False, (False, False)),
        ("float32", False, True, True, (False, False)),
        ("bfloat16", None, False, False, (True, True)),
        ("bfloat16", True, True, True, (True, True)),
        ("auto", True, False, False, (False, True)),  # bf16 set explicitly: training only
        ("auto", False, True, True, (False, False)),
        ("auto", None, True, True, (False, True)),  # transformers' rule on a GPU
        ("auto", None, True, False, (False, False)),
        ("auto", None, False, False, None),  # a CPU: the probe decides, in the trainer
    ],
)
def test_static_precision_follows_the_table(dtype, bf16, gpu, gpu_bf16, expected) -> None:
    precision = static_precision(_config(dtype, bf16), gpu, gpu_bf16)
    if expected is None:
        assert precision is None
    else:
        assert (precision.sampling_bf16, precision.training_bf16) == expected


def test_fp16_under_auto_keeps_bf16_off() -> None:
    precision = static_precision(_config(fp16=True), False, False)
    assert precision == Precision(False, False, precision.reason) and "fp16" in precision.reason


def test_the_run_keeps_vllm_and_sharded_samplers_as_they_are() -> None:
    from trainers.grpo.precision import settle_precision

    def args(**kw):
        fields = dict(use_vllm=False, fsdp="", deepspeed=None)
        return SimpleNamespace(precision=Precision(True, True, "dtype='bfloat16'"), **{
            **fields, **kw})  # fmt: skip

    assert settle_precision(args(), None).sampling_bf16
    vllm = settle_precision(args(use_vllm=True), None)
    assert not vllm.sampling_bf16 and vllm.training_bf16 and "vLLM samples" in vllm.reason
    sharded = settle_precision(args(fsdp="full_shard"), None)
    assert not sharded.sampling_bf16 and "sharded" in sharded.reason


# --- the sampler's bf16 copy ---------------------------------------------------------------------


def test_the_bf16_copy_casts_parameters_keeps_buffers_and_follows_the_weights(small_model):
    from trainers.grpo.precision import SamplingCopy

    model, _ = small_model
    model = generator_copy(model)  # a copy this test may change
    copy = SamplingCopy()
    sampler = copy.of(model)
    assert sampler is not model and not sampler.training
    assert {p.dtype for p in sampler.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    theirs = dict(model.named_buffers())
    for name, buffer in sampler.named_buffers():
        assert buffer.dtype == theirs[name].dtype  # rotary frequencies stay fp32
    embed = sampler.get_input_embeddings().weight
    if model.get_output_embeddings().weight is model.get_input_embeddings().weight:
        assert sampler.get_output_embeddings().weight is embed  # still tied
    with torch.no_grad():
        model.get_input_embeddings().weight.add_(1.0)
    assert copy.of(model) is sampler  # built once, refreshed
    expected = model.get_input_embeddings().weight.to(torch.bfloat16)
    assert torch.equal(sampler.get_input_embeddings().weight, expected)


# --- runs on the tiny model ----------------------------------------------------------------------


def _trainer(small_model_dir, tmp_path, **fields):
    pytest.importorskip("trl")
    from llm_gym.envs.tool_use_game import ToolUseGameEnv, get_tasks
    from trainers import GRPOConfig
    from trainers.grpo.trainer import MultiTurnGRPOTrainer

    settings = dict(
        output_dir=str(tmp_path), model=str(small_model_dir), batch_size=2, episodes_per_task=2,
        num_steps=1, max_turns=2, max_model_length=1024, max_tokens_per_turn=8, use_cpu=True,
        save_strategy="no", report_to="none", disable_tqdm=True, logging_steps=1,
    )  # fmt: skip
    config = GRPOConfig(**{**settings, **fields})
    return MultiTurnGRPOTrainer(
        args=config, env_factory=ToolUseGameEnv, tasks=list(get_tasks("train")[:4])
    )


def test_a_bf16_run_samples_and_trains_in_bf16_with_a_small_logged_gap(small_model_dir, tmp_path):
    """dtype='bfloat16': the sampler is a bf16 copy, training runs under bf16 autocast, the
    sampler's logprob gap to the trainer is logged (finite, small) and its tokens are
    corrected (the weight's mean logged)."""
    from trainers.grpo.health import LOGPROB_GAP_BOUND

    # every row trains (the untrained model's groups have no reward signal to keep them)
    trainer = _trainer(small_model_dir, tmp_path, dtype="bfloat16", skip_silent_rows=False)
    assert trainer.args.bf16 and trainer.accelerator.mixed_precision == "bf16"
    trainer.train()
    sampler = trainer.sampling_copy.model
    assert {p.dtype for p in sampler.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in trainer.model.parameters()} == {torch.float32}  # master weights
    [record] = [r for r in trainer.state.log_history if "reward" in r]
    gap = record["sampling/sampling_logp_difference/mean"]
    assert math.isfinite(gap) and 0 < gap < LOGPROB_GAP_BOUND
    assert math.isfinite(record["sampling/sampling_logp_difference/max"])
    assert 0 < record["sampling/importance_weight_mean"] <= 3.0  # TRL's clip_max
    assert record["precision/sampling_bf16"] == 1.0 and record["precision/training_bf16"] == 1.0
    from tests.test_async import undocumented_metrics

    assert not undocumented_metrics(set(record)), "keys missing from docs/metrics.md"


def test_async_generators_sample_from_bf16_replicas(small_model_dir, tmp_path, monkeypatch):
    """Async with dtype='bfloat16': each generator replica is a bf16 copy, every published
    version is cast as it is staged, and every trained token is corrected (logged under
    async/)."""
    import trainers.async_rl.collect as collect

    replicas = []

    def kept(model, **options):
        replicas.append(generator_copy(model, **options))
        return replicas[-1]

    monkeypatch.setattr(collect, "generator_copy", kept)
    trainer = _trainer(
        small_model_dir, tmp_path, dtype="bfloat16", skip_silent_rows=False, num_steps=2,
        max_steps_off_policy=1, learning_rate=1e-3,
    )  # fmt: skip
    trainer.train()
    assert trainer.sampling_copy is not None and trainer.sampling_copy.model is None  # unused
    [replica] = replicas
    assert {p.dtype for p in replica.parameters()} == {torch.bfloat16}
    from llm_gym.policies.weights import VersionedWeights

    weights = VersionedWeights(replica)  # a version is published into it as the run does
    weights.stage(trainer.model.named_parameters(), version=3)
    assert weights.apply()
    trained = dict(trainer.model.named_parameters())
    for name, param in replica.named_parameters():  # cast as staged
        assert param.dtype == torch.bfloat16
        assert torch.equal(param, trained[name].detach().to(torch.bfloat16)), name
    records = [r for r in trainer.state.log_history if "reward" in r]
    assert len(records) == 2
    for record in records:
        gap = record["sampling/sampling_logp_difference/mean"]
        assert math.isfinite(gap) and 0 < gap < 0.1
        assert 0 < record["async/off_policy_weight_mean"] <= 3.0


@pytest.mark.skipif(bool(cpu_bf16_flags()), reason="this CPU has bf16 hardware")
def test_auto_on_a_cpu_without_bf16_hardware_picks_float32_and_says_why(
    small_model_dir, tmp_path, caplog
) -> None:
    caplog.set_level(logging.INFO, logger="trainers.grpo.precision")
    trainer = _trainer(small_model_dir, tmp_path)  # dtype="auto"
    precision = trainer.precision
    assert (precision.sampling_bf16, precision.training_bf16) == (False, False)
    assert not trainer.args.bf16 and trainer.accelerator.mixed_precision == "no"
    assert trainer.sampling_copy is None
    [line] = [r.getMessage() for r in caplog.records if r.name == "trainers.grpo.precision"]
    assert line.startswith("precision: sampling float32, training float32: auto on a CPU")
    assert "bf16 flags: none of amx_bf16, avx512_bf16" in line and "-> fp32" in line
    probe = precision.probe
    assert probe.decode_bf16_s * BF16_MARGIN > probe.decode_fp32_s  # the times behind it
    assert trainer.precision.as_json()["probe"]["decode_shape"] == [32, 512, 512]
