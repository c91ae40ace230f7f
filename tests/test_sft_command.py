"""trainers/sft/command.py (``llm-gym sft``): the flags build the warm start's one record, and a
value it refuses is an error that names the flag, before any episode or model is read."""

from __future__ import annotations

import dataclasses
import io

import pytest

pytest.importorskip("trl")

from llm_gym.cli import main as cli_main
from trainers.sft.command import FLAG_FIELDS, build_parser, settings_from_args
from trainers.sft.settings import SFTSettings


def test_the_flags_build_the_record() -> None:
    argv = ["--from-episodes", "eps.jsonl", "--min-reward", "1", "--epochs", "2",
            "--max-steps", "5", "--learning-rate", "1e-3", "--batch-size", "4",
            "--warmup-steps", "2", "--time-budget", "60", "--lora-r", "4",
            "--no-progress"]  # fmt: skip
    settings = settings_from_args(build_parser().parse_args(argv))
    assert settings == SFTSettings(
        source="episodes", from_episodes="eps.jsonl", min_reward=1.0, epochs=2.0, max_steps=5,
        learning_rate=1e-3, batch_size=4, warmup_steps=2, time_budget_s=60.0,
        lora={"r": 4, "lora_alpha": 8}, progress=False,
    )  # fmt: skip
    assert set(FLAG_FIELDS.values()) <= {f.name for f in dataclasses.fields(SFTSettings)}


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--batch-size", "0", "--batch-size must be an integer >= 1, actual value: 0."),
        ("--max-steps", "-3", "--max-steps must be an integer >= 1"),
        ("--epochs", "0", "--epochs must be a finite number > 0"),
        ("--learning-rate", "inf", "--learning-rate must be a finite number > 0"),
        ("--warmup-steps", "-1", "--warmup-steps must be an integer >= 0"),
        ("--time-budget", "-5", "--time-budget must be a finite number > 0"),
        ("--min-reward", "nan", "--min-reward must be a number"),
        ("--lora-r", "0", "--lora-r must be an integer >= 1"),
    ],
)
def test_a_refused_value_names_its_flag_before_the_episodes_are_read(
    flag, value, message, tmp_path, capsys
) -> None:
    missing = tmp_path / "none.jsonl"  # never read: the flags fail first
    argv = ["sft", "--from-episodes", str(missing), flag, value]
    assert cli_main(argv, out=io.StringIO()) == 2
    err = capsys.readouterr().err
    assert message in err and "No such episodes file" not in err and "sft." not in err
