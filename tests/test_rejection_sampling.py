"""RFT as an advantage estimator (trainers.rejection_sampling), on hand-computed values."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("trl")

from trainers.advantages import GroupPool, advantage_estimator
from trainers.rejection_sampling import keeps_uniform_groups


def test_successes_get_one_and_everything_else_zero() -> None:
    estimator = advantage_estimator("rejection_sampling")
    credit = estimator([[1.0, 0.0, -0.1, 0.5], [1.0, 1.0], [0.0, 0.0]], [[None] * 4, [None] * 2,
                       [[0.5, 0.5], None]], "group")  # fmt: skip
    assert credit.episode == [[1.0, 0.0, 0.0, 0.0], [1.0, 1.0], [0.0, 0.0]]
    assert credit.turns == [[None] * 4, [None] * 2, [None] * 2]  # whole episodes, no per-turn


def test_a_group_that_always_succeeded_is_kept_under_rft_only() -> None:
    rft = SimpleNamespace(distillation=None, credit_assignment="rejection_sampling")
    grpo = SimpleNamespace(distillation=None, credit_assignment="per_episode")
    assert keeps_uniform_groups(rft) and not keeps_uniform_groups(grpo)
    for args, spare in ((rft, 0), (grpo, 1)):
        pool = GroupPool(wanted=2, keep_all=keeps_uniform_groups(args))
        pool.add("all solved", [1.0, 1.0])
        pool.add("mixed", [1.0, 0.0])
        assert pool.zero_variance == spare and pool.deficit == spare


def test_the_config_takes_it() -> None:
    from trainers import GRPOConfig

    config = GRPOConfig(
        output_dir="/tmp/unused", max_turns=2, episodes_per_task=2,
        credit_assignment="rejection_sampling",
    )  # fmt: skip
    assert config.credit_assignment == "rejection_sampling"
    with pytest.raises(ValueError, match="rejection_sampling"):
        GRPOConfig(output_dir="/tmp/unused", max_turns=2, credit_assignment="rejection")
