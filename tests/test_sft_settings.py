"""trainers/sft/settings.py: the warm start's one record refuses every value it cannot train
with, by field, when it is built; its two phases' settings and the fields TRL's ``SFTConfig``
gets, on hand-computed cases."""

from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("trl")

from llm_gym.errors import InvalidArgumentError
from trainers.sft.settings import (
    SFTSettings,
    check_trl_options,
    full_phase,
    sft_config_fields,
    short_context_phase,
    short_share,
)

HOSTILE = {
    "accumulation 0": ({"gradient_accumulation_steps": 0}, "gradient_accumulation_steps must be"),
    "accumulation 1.5": ({"gradient_accumulation_steps": 1.5}, "must be an integer"),
    "logging 0": ({"logging_steps": 0}, "sft.logging_steps must be an integer >= 1"),
    "max_length 0": ({"max_length": 0}, "sft.max_length must be an integer >= 1"),
    "floor above the peak": ({"min_lr_ratio": 1.5}, "min_lr_ratio must be a finite number betw"),
    "negative floor": ({"min_lr_ratio": -0.1}, "min_lr_ratio must be a finite number between"),
    "negative decay": ({"weight_decay": -1e-4}, "sft.weight_decay must be a finite number >= 0"),
    "infinite decay": ({"weight_decay": float("inf")}, "weight_decay must be a finite number"),
    "NaN clipping": ({"max_grad_norm": float("nan")}, "sft.max_grad_norm must be a number"),
    "negative clipping": ({"max_grad_norm": -1.0}, "max_grad_norm must be a finite number >= 0"),
    "loss mask typo": ({"loss_mask": "RL"}, "sft.loss_mask must be 'rl' or 'trl'"),
    "bf16 as text": ({"bf16": "yes"}, "sft.bf16 must be a boolean"),
    "use_cpu as 1": ({"use_cpu": 1}, "sft.use_cpu must be a boolean or null"),
    "lora as a rank": ({"lora": 8}, "sft.lora must be a mapping"),
    "trl options as a list": ({"trl_options": ["seed"]}, "sft.trl_options must be a mapping"),
}


@pytest.mark.parametrize("fields", list(HOSTILE.values()), ids=list(HOSTILE))
def test_a_value_the_warm_start_cannot_train_with_is_refused_by_field(fields) -> None:
    values, message = fields
    with pytest.raises(InvalidArgumentError, match=message):
        SFTSettings(**values)


def test_the_record_is_frozen_and_a_replaced_copy_is_checked_again() -> None:
    settings = SFTSettings(max_steps=4)
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.max_steps = 0  # type: ignore[misc]
    with pytest.raises(InvalidArgumentError, match="sft.max_steps must be an integer >= 1"):
        dataclasses.replace(settings, max_steps=0)
    limits = SFTSettings(min_lr_ratio=1.0, weight_decay=0.0, max_grad_norm=0.0, max_length=None)
    assert limits.min_lr_ratio == 1.0 and limits.max_length is None  # the bounds are allowed


def test_the_phases_split_the_steps_the_warmup_and_the_budget_by_hand() -> None:
    # 30 short steps of 120 in all: a quarter of the 80 s budget; the rest goes to the full phase
    settings = SFTSettings(short_context_steps=30, max_steps=90, warmup_steps=5, time_budget_s=80)
    assert short_share(settings) == 0.25
    short = short_context_phase(settings)
    assert (short.max_steps, short.time_budget_s, short.warmup_steps) == (30, 20.0, 5)
    assert (short.lr_scheduler_type, short.short_context_steps) == ("constant", 0)
    full = full_phase(settings, short_seconds=25.0)  # the short phase ran past its share
    assert (full.max_steps, full.time_budget_s, full.warmup_steps) == (90, 55.0, 0)
    assert full.lr_scheduler_type == "cosine" and full.short_context_steps == 0
    assert full_phase(settings, short_seconds=79.0).time_budget_s == 8.0  # a tenth is kept
    # by epochs: half the budget each; without a budget, none in either phase
    by_epochs = SFTSettings(short_context_steps=30, epochs=2.0)
    assert short_share(by_epochs) == 0.5
    assert short_context_phase(by_epochs).time_budget_s is None
    assert full_phase(by_epochs, short_seconds=3.0).time_budget_s is None
    assert full_phase(by_epochs, short_seconds=3.0).epochs == 2.0


def test_the_sft_config_fields_come_from_the_record() -> None:
    settings = SFTSettings(
        learning_rate=1e-3, batch_size=4, epochs=2.0, gradient_accumulation_steps=2,
        lr_scheduler_type="linear", warmup_steps=0, weight_decay=0.01, max_grad_norm=0.5,
        max_length=512, logging_steps=1, bf16=True, progress=False,
    )  # fmt: skip
    fields = sft_config_fields(settings, "out", 7, tokenized=True, use_cpu=False)
    assert fields == {
        "output_dir": "out", "assistant_only_loss": False, "learning_rate": 1e-3,
        "num_train_epochs": 2.0, "max_steps": -1, "per_device_train_batch_size": 4,
        "gradient_accumulation_steps": 2, "lr_scheduler_type": "linear", "warmup_steps": 0,
        "weight_decay": 0.01, "max_grad_norm": 0.5, "max_length": 512, "logging_steps": 1,
        "seed": 7, "data_seed": 7, "bf16": True, "fp16": False, "use_cpu": False,
        "activation_checkpointing": False, "report_to": "none", "save_strategy": "no",
        "eval_strategy": "no", "disable_tqdm": True, "dataloader_num_workers": 0,
    }  # fmt: skip


def test_trl_options_reach_only_the_fields_the_warm_start_leaves_to_trl() -> None:
    from trl import SFTConfig

    ours = sft_config_fields(SFTSettings(), "out", 0, tokenized=False, use_cpu=True)
    assert check_trl_options(None, ours, SFTConfig) == {}
    given = {"label_smoothing_factor": 0.1, "neftune_noise_alpha": 5.0}
    assert check_trl_options(given, ours, SFTConfig) == given
    for name in ("seed", "report_to", "assistant_only_loss"):
        with pytest.raises(InvalidArgumentError, match=f"'{name}', and the warm start sets it"):
            check_trl_options({name: None}, ours, SFTConfig)
    with pytest.raises(InvalidArgumentError, match="'lr', and SFTConfig has no such field"):
        check_trl_options({"lr": 1e-3}, ours, SFTConfig)
