"""``docs/config.md`` is what ``python -m trainers.grpo.config.reference`` renders from the code."""

from __future__ import annotations

import pytest

pytest.importorskip("trl")


def test_the_config_reference_is_up_to_date() -> None:
    from trainers.grpo.config.reference import PATH, render

    assert PATH.read_text() == render(), "stale: run python -m trainers.grpo.config.reference"
    text = render()
    for name in (
        "episodes_per_task",
        "max_samples_per_episode",
        "distillation",
        "kl_coef",
        "generation_deadline_min_s",
        "max_steps_off_policy",
        "chat_template_kwargs",
        "short_context_steps",
        "trl_options",
    ):
        assert f"`{name}`" in text
