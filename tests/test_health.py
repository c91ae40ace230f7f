"""trainers.grpo.health: each check on a hand-computed history that trips it and one that does not,
the callback's once-only warning, metric and stop, and the config field."""

from __future__ import annotations

import math
import warnings
from types import SimpleNamespace as NS

import pytest

pytest.importorskip("transformers")

from trainers.grpo.health import (
    HEALTH_CHECKS,
    HealthCallback,
    HealthWarning,
    check_health_action,
    run_health_checks,
    series,
)


def _history(**columns: list[float]) -> list[dict[str, float]]:
    """One record per position: ``_history(a=[1, 2])`` -> ``[{"a": 1, "step": 1}, ...]``."""
    length = max(len(v) for v in columns.values())
    return [
        {"step": i + 1, **{k: v[i] for k, v in columns.items() if i < len(v)}}
        for i in range(length)
    ]


# (check, a history that trips it, the value it reports, a history that does not)
CASES = [
    # tool calls 2 -> (1 + 0.5 + 0.5) / 3 = 0.667 < 0.5 x 2, reward flat at 0.3
    (
        "tool_use_collapse",
        _history(**{"episodes/tool_calls_mean": [2, 2, 2, 1, 0.5, 0.5], "reward": [0.3] * 6}),
        2 / 3,
        # the same fall while the reward rises 0.1 -> 0.6 (by more than 0.05): learning
        _history(
            **{
                "episodes/tool_calls_mean": [2, 2, 2, 1, 0.5, 0.5],
                "reward": [0.1, 0.1, 0.1, 0.5, 0.6, 0.7],
            }
        ),
    ),
    # entropy (0.06 + 0.03 + 0.03) / 3 = 0.04 < 0.05; (0.06 + 0.05 + 0.05) / 3 = 0.0533
    (
        "entropy_collapse",
        _history(entropy=[0.9, 0.06, 0.03, 0.03]),
        0.04,
        _history(entropy=[0.9, 0.06, 0.05, 0.05]),
    ),
    # capped share (0.4 + 0.5 + 0.6) / 3 = 0.5 >= 0.5; (0.4 + 0.5 + 0.5) / 3 = 0.467
    (
        "length_at_cap",
        _history(**{"episodes/capped_turn_ratio": [0.0, 0.4, 0.5, 0.6]}),
        0.5,
        _history(**{"episodes/capped_turn_ratio": [0.9, 0.4, 0.5, 0.5]}),
    ),
    # truncated 0.3 vs the mean of 0.1, 0.0, 0.2 (0.1): a rise of 0.2 < 0.25; 0.4: 0.3 >= 0.25
    (
        "truncation_spike",
        _history(truncated_ratio=[0.1, 0.0, 0.2, 0.4]),
        0.4,
        _history(truncated_ratio=[0.1, 0.0, 0.2, 0.3]),
    ),
    (
        "parse_failure_spike",
        _history(parse_failure_ratio=[0.0, 0.0, 0.0, 0.25]),
        0.25,
        _history(parse_failure_ratio=[0.0, 0.0, 0.0, 0.2]),
    ),
    # zero variance (0.9 + 0.9 + 1.0) / 3 = 0.933 >= 0.9; (0.8 + 0.9 + 0.9) / 3 = 0.867
    (
        "zero_variance_groups",
        _history(zero_variance_skip_ratio=[0.9, 0.9, 1.0]),
        2.8 / 3,
        _history(zero_variance_skip_ratio=[0.8, 0.9, 0.9]),
    ),
    # gap (0.05 + 0.15 + 0.16) / 3 = 0.12 > 0.1; (0.05 + 0.1 + 0.12) / 3 = 0.09
    (
        "logprob_gap",
        _history(**{"sampling/sampling_logp_difference/mean": [0.05, 0.15, 0.16]}),
        0.12,
        _history(**{"sampling/sampling_logp_difference/mean": [0.05, 0.1, 0.12]}),
    ),
    # val 0.5 -> 0.6 -> 0.45 (0.15 below its best) while the reward rises 0.2 -> 0.5 (by 0.3)
    (
        "reward_up_val_down",
        _history(reward=[0.2, 0.2, 0.2, 0.5, 0.5, 0.5], **{"val/success_rate": [0.5, 0.6, 0.45]}),
        0.45,
        # val only 0.05 below its best
        _history(reward=[0.2, 0.2, 0.2, 0.5, 0.5, 0.5], **{"val/success_rate": [0.5, 0.6, 0.55]}),
    ),
    ("nonfinite_loss", _history(loss=[0.5, math.nan]), 1.0, _history(loss=[0.5, 0.4])),
]


def test_every_registered_check_has_a_case() -> None:
    assert {name for name, *_ in CASES} == set(HEALTH_CHECKS)


@pytest.mark.parametrize(("name", "trips", "value", "passes"), CASES, ids=[c[0] for c in CASES])
def test_each_check_trips_on_its_history_and_not_on_the_other(name, trips, value, passes) -> None:
    check = HEALTH_CHECKS[name]
    finding = check.run(trips)
    assert finding is not None and finding.value == pytest.approx(value)
    assert check.run(passes) is None
    assert check.run(trips[:1]) is None  # too short a history never fires


def test_only_the_checks_of_the_trainer_kind_run() -> None:
    history = _history(entropy=[0.0, 0.0, 0.0], loss=[1.0, 1.0, math.inf])
    assert {c.name for c, _ in run_health_checks(history, "rl")} == {
        "entropy_collapse",
        "nonfinite_loss",
    }
    # SFT on demonstrations lowers entropy by design: only the loss check applies
    assert [c.name for c, _ in run_health_checks(history, "sft")] == ["nonfinite_loss"]
    assert run_health_checks(history, "sft", skip={"nonfinite_loss"}) == []


def _state(history: list[dict]) -> NS:
    return NS(log_history=history, global_step=history[-1]["step"], is_world_process_zero=True)


def test_the_callback_fires_once_with_a_metric_and_a_warning() -> None:
    callback = HealthCallback("warn")
    history = _history(entropy=[0.01, 0.01, 0.01])
    control = NS(should_training_stop=False, should_save=False)
    logs = dict(history[-1])
    with pytest.warns(HealthWarning, match=r"entropy_collapse fired at step 3.*Likely cause.*Try"):
        callback.on_log(None, _state(history), control, logs=logs)
    assert history[-1]["health/entropy_collapse"] == pytest.approx(0.01)
    assert logs["health/entropy_collapse"] == pytest.approx(0.01)
    assert not control.should_training_stop and not control.should_save
    history.append({"step": 4, "entropy": 0.01})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second warning would raise
        callback.on_log(None, _state(history), control, logs={})
    assert "health/entropy_collapse" not in history[-1]
    assert [f["check"] for f in callback.fired] == ["entropy_collapse"]
    assert callback.fired[0]["step"] == 3 and callback.fired[0]["remedy"]


def test_stop_ends_the_run_with_a_checkpoint_and_off_checks_nothing() -> None:
    history = _history(entropy=[0.01, 0.01, 0.01])
    control = NS(should_training_stop=False, should_save=False)
    with pytest.warns(HealthWarning, match="ends after this step with a checkpoint"):
        HealthCallback("stop").on_log(None, _state(history), control, logs={})
    assert control.should_training_stop and control.should_save
    quiet = NS(should_training_stop=False, should_save=False)
    off = HealthCallback("off")
    off.on_log(None, _state(_history(entropy=[0.01, 0.01, 0.01])), quiet, logs={})
    assert not off.fired and not quiet.should_training_stop


def test_the_end_of_run_summary_is_not_checked() -> None:
    history = _history(loss=[math.nan])
    callback = HealthCallback("warn")
    callback.on_log(None, _state(history), NS(), logs={"train_runtime": 1.0})
    assert not callback.fired


@pytest.mark.parametrize("value", ["halt", None, 1])
def test_health_action_is_refused_by_name(value) -> None:
    with pytest.raises(ValueError, match=r"health_action must be one of \['warn', 'stop', 'off'\]"):
        check_health_action(value)


def test_the_config_refuses_an_unknown_health_action(tmp_path) -> None:
    pytest.importorskip("trl")
    from trainers import GRPOConfig

    with pytest.raises(ValueError, match=r"health_action must be one of .*'halt'"):
        GRPOConfig(
            output_dir=str(tmp_path), report_to="none", episodes_per_task=2, health_action="halt"
        )
    config = GRPOConfig(
        output_dir=str(tmp_path), report_to="none", episodes_per_task=2, health_action="stop"
    )
    assert config.health_action == "stop"


@pytest.fixture
def always_fires(monkeypatch):
    """A check registered for the test that fires on the first record with a reward (RL) or a
    loss (SFT)."""
    from trainers.grpo import health

    def first_record(history):
        logged = series(history, "reward") or series(history, "loss")
        return health.Finding(1.0, "a step was logged") if logged else None

    monkeypatch.setitem(
        health.HEALTH_CHECKS,
        "test_fires",
        health.HealthCheck("test_fires", first_record, "a test", "nothing", ("rl", "sft")),
    )


@pytest.mark.parametrize("off_policy", [None, 1], ids=["lockstep", "async"])
def test_health_action_stop_ends_training_after_the_step_with_a_checkpoint(
    small_model_dir, tmp_path, always_fires, off_policy
) -> None:
    pytest.importorskip("trl")
    from llm_gym.envs.tool_use_game import ToolUseGameEnv, get_tasks
    from trainers import GRPOConfig
    from trainers.grpo.trainer import MultiTurnGRPOTrainer

    config = GRPOConfig(
        output_dir=str(tmp_path), model=str(small_model_dir), batch_size=2, episodes_per_task=2,
        num_steps=3, max_turns=2, max_model_length=1024, max_tokens_per_turn=8, use_cpu=True,
        save_strategy="no", report_to="none", disable_tqdm=True, logging_steps=1,
        health_action="stop", max_steps_off_policy=off_policy,
    )  # fmt: skip
    trainer = MultiTurnGRPOTrainer(
        args=config, env_factory=ToolUseGameEnv, tasks=list(get_tasks("train")[:4])
    )
    with pytest.warns(HealthWarning, match="test_fires fired at step 1"):
        trainer.train()
    assert trainer.state.global_step == 1  # of 3
    assert (tmp_path / "checkpoint-1" / "trainer_state.json").exists()
    [record] = [r for r in trainer.state.log_history if "health/test_fires" in r]
    assert record["step"] == 1 and "reward" in record
    assert trainer.health.fired[0]["check"] == "test_fires"


def test_sft_runs_its_checks_and_stops_on_them(small_model_dir, tmp_path, always_fires) -> None:
    pytest.importorskip("trl")
    from llm_gym.envs.tool_use_game import get_tasks
    from trainers.sft.data import oracle_sft_dataset
    from trainers.sft.settings import SFTSettings
    from trainers.sft.train import build_sft_run

    dataset = oracle_sft_dataset("ToolUseGame-v0", list(get_tasks("train")[:4]))
    settings = SFTSettings(max_steps=3, batch_size=1, logging_steps=1, progress=False)
    trainer = build_sft_run(
        small_model_dir, tmp_path, dataset, settings, health_action="stop"
    ).trainer
    with pytest.warns(HealthWarning, match="test_fires fired at step 1"):
        trainer.train()
    assert trainer.state.global_step == 1  # of 3
    [health] = [c for c in trainer.callback_handler.callbacks if isinstance(c, HealthCallback)]
    assert health.trainer == "sft" and [f["check"] for f in health.fired] == ["test_fires"]


def test_the_logprob_gap_is_logged_and_small_for_the_same_weights(small_model_dir, tmp_path):
    """With ``num_iterations=2`` the trainer scores the sampled tokens itself: the gap between
    the in-process sampler's logprobs and its own is logged (TRL's key), and for the same
    weights it stays far below the ``logprob_gap`` bound."""
    pytest.importorskip("trl")
    from llm_gym.envs.tool_use_game import ToolUseGameEnv, get_tasks
    from trainers import GRPOConfig
    from trainers.grpo.health import LOGPROB_GAP_BOUND
    from trainers.grpo.trainer import MultiTurnGRPOTrainer

    config = GRPOConfig(
        output_dir=str(tmp_path), model=str(small_model_dir), batch_size=2, episodes_per_task=2,
        num_steps=1, max_turns=2, max_model_length=1024, max_tokens_per_turn=8, use_cpu=True,
        save_strategy="no", report_to="none", disable_tqdm=True, logging_steps=1,
        num_iterations=2,
    )  # fmt: skip
    trainer = MultiTurnGRPOTrainer(
        args=config, env_factory=ToolUseGameEnv, tasks=list(get_tasks("train")[:4])
    )
    trainer.train()
    [gap] = [
        r["sampling/sampling_logp_difference/mean"]
        for r in trainer.state.log_history
        if "sampling/sampling_logp_difference/mean" in r
    ]
    assert 0 <= gap < LOGPROB_GAP_BOUND / 10
