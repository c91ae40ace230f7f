"""GRPOConfig's field checks (:mod:`trainers.grpo.config.checks`,
:mod:`trainers.grpo.config.field_types`): a value of the wrong type or out of range is an
InvalidArgumentError naming the field when the config is built, before any model work; only plain
annotations are checked.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest

from llm_gym.errors import InvalidArgumentError

# --- configs --------------------------------------------------------------------------------------

GRPO_FIELDS = {
    "learning_rate as text": ({"learning_rate": "x"}, "learning_rate must be a number"),
    "beta as text": ({"beta": "0.1"}, "beta must be a number"),
    "max_turns true": ({"max_turns": True}, "max_turns must be an integer or null"),
    "NaN failed_parse_reward": ({"failed_parse_reward": math.nan}, "not NaN"),
    "no rows a device": ({"per_device_train_batch_size": 0}, "must divide the rows"),
    "negative temperature": ({"temperature": -1.0}, "temperature must be a finite number"),
    "top_p 0": ({"top_p": 0}, r"top_p must be a number in \(0, 1\]"),
    "seed past numpy": ({"seed": 2**40}, "seed must be an integer in"),
}


@pytest.fixture(scope="module")
def grpo_config() -> Any:
    pytest.importorskip("trl")
    from trainers import GRPOConfig

    return GRPOConfig


@pytest.mark.parametrize("name", list(GRPO_FIELDS))
def test_grpo_config_values_of_the_wrong_type_or_range_are_named(grpo_config, name) -> None:
    fields, message = GRPO_FIELDS[name]
    with pytest.raises(InvalidArgumentError, match=message):
        grpo_config(output_dir="unused", model="tiny", use_cpu=True, episodes_per_task=2, **fields)


@dataclass
class Settings:
    steps: int = 1
    rate: float = 0.5
    name: str | None = None
    mode: Literal["a", "b"] = "a"
    other: list[int] | dict[str, int] | None = None  # a container: not checked here


def test_check_field_types_reads_plain_annotations_only() -> None:
    from trainers.grpo.config.field_types import check_field_types

    check_field_types(Settings(steps=3, rate=2, name=Path("x"), other="any"))  # type: ignore[arg-type]
    for fields, message in (({"steps": True}, "steps must be an integer"),
                            ({"rate": "0.1"}, "rate must be a number"),
                            ({"rate": math.nan}, r"rate must be a number \(not NaN\)"),
                            ({"name": 5}, "name must be a string or null"),
                            ({"mode": "c"}, "mode must be 'a' or 'b'")):  # fmt: skip
        with pytest.raises(InvalidArgumentError, match=message):
            check_field_types(Settings(**fields))
