"""``MultiTurnGRPOConfig.dtype`` (trainers.grpo.config.dtype): bad values and contradictions
with ``bf16`` / ``fp16`` are refused with the allowed values named; explicit values skip the
probe; ``train.py --dtype`` overrides the config."""

from __future__ import annotations

import pytest

from llm_gym.errors import InvalidArgumentError
from tests.conftest import ROOT

pytest.importorskip("trl")


def _config(**fields):
    from trainers import GRPOConfig

    return GRPOConfig(
        output_dir="unused", use_cpu=True, report_to="none", wandb_project=None,
        episodes_per_task=2, **fields,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("value", "hint"),
    [("bf16", " Did you mean 'bfloat16'?"), ("fp32", ""), ("", ""), (16, ""), (None, "")],
)
def test_a_bad_dtype_names_the_allowed_values(value, hint) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        _config(dtype=value)
    message = str(caught.value)
    assert message.startswith("dtype must be one of ['auto', 'float32', 'bfloat16'], actual ")
    assert f"{value!r}." in message and message.endswith(f".{hint}")
    assert isinstance(caught.value, ValueError)


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"dtype": "float32", "bf16": True}, "bf16 must be None or False with dtype='float32'"),
        ({"dtype": "bfloat16", "bf16": False}, "bf16 must be None or True with dtype='bfloat16'"),
        ({"dtype": "bfloat16", "fp16": True}, "fp16 must be False with dtype='bfloat16'"),
    ],
)
def test_a_contradiction_with_bf16_or_fp16_is_refused(fields, named) -> None:
    with pytest.raises(InvalidArgumentError, match=named):
        _config(**fields)


@pytest.mark.parametrize(
    ("fields", "sampling", "training"),
    [
        ({"dtype": "float32"}, False, False),
        ({"dtype": "bfloat16"}, True, True),
        ({"dtype": "bfloat16", "bf16": True}, True, True),
        ({"bf16": True}, False, True),  # auto: an explicit bf16 decides training only
        ({"bf16": False}, False, False),
    ],
)
def test_explicit_settings_fix_the_precision_without_the_probe(
    fields, sampling, training, monkeypatch
) -> None:
    import trainers.grpo.precision as precision_module

    def no_probe(*args):
        raise AssertionError("the probe ran")

    monkeypatch.setattr(precision_module, "probe_matmuls", no_probe)
    config = _config(**fields)
    assert config.bf16 is training
    assert config.mixed_precision == ("bf16" if training else "no")
    chosen = precision_module.settle_precision(config, model=None)
    assert (chosen.sampling_bf16, chosen.training_bf16) == (sampling, training)
    assert "no probe" in chosen.reason


def test_auto_on_a_cpu_leaves_the_choice_to_the_trainer() -> None:
    config = _config()
    assert config.dtype == "auto" and config.precision is None and config.bf16 is False


def test_train_py_dtype_overrides_the_config_and_set(monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(ROOT))
    import train

    config = str(ROOT / "configs" / "tool_use_game_tiny.yaml")
    args = train.parse_args(["--config", config, "--set", "grpo.dtype=float32", "--dtype",
                             "bfloat16"])  # fmt: skip
    assert train._checked_config(args).grpo["dtype"] == "bfloat16"
    plain = train._checked_config(train.parse_args(["--config", config]))
    assert "dtype" not in plain.grpo
    with pytest.raises(SystemExit):
        train.parse_args(["--config", config, "--dtype", "bf16"])


def test_train_py_prints_the_trainers_start_up_lines(monkeypatch, capsys) -> None:
    import logging

    monkeypatch.syspath_prepend(str(ROOT))
    import train

    log = logging.getLogger("trainers")
    monkeypatch.setattr(log, "handlers", [])
    monkeypatch.setattr(log, "level", logging.NOTSET)
    train.show_trainer_log()
    train.show_trainer_log()  # once per process
    logging.getLogger("trainers.grpo.precision").info("precision: %s", "sampling float32")
    assert capsys.readouterr().err == "   precision: sampling float32\n"
