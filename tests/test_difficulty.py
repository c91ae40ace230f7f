"""Online difficulty filtering: the rule as pure functions on hand-computed values, the draw's
frequencies, the saved-groups estimate, and the settings' checks."""

from __future__ import annotations

import random
from collections import Counter
from types import SimpleNamespace as NS

import pytest

from llm_gym.errors import InvalidArgumentError
from trainers.grpo.difficulty import (
    DifficultySampler,
    DifficultySettings,
    draw_tasks,
    draw_weight,
    group_outcomes,
    pass_rate,
    zero_variance_chance,
)


def test_the_estimate_discounts_older_groups_by_memory() -> None:
    sampler = DifficultySampler(1, group_size=4, settings=DifficultySettings(memory=0.5))
    assert sampler.estimate(0) is None
    sampler.update(0, successes=0, episodes=4)  # s = 0, n = 4
    sampler.update(0, successes=4, episodes=4)  # s = 0.5 * 0 + 4 = 4, n = 0.5 * 4 + 4 = 6
    assert (sampler.successes[0], sampler.episodes[0]) == (4.0, 6.0)
    assert sampler.estimate(0) == pytest.approx(4 / 6)
    with_prior = DifficultySampler(1, 4, DifficultySettings(prior=1.0, memory=1.0))
    with_prior.update(0, 4, 4)
    assert with_prior.estimate(0) == pytest.approx(5 / 6)  # (4 + 1) / (4 + 2)
    assert pass_rate(1, 4, prior=0.5) == pytest.approx(1.5 / 5)


def test_the_weight_is_the_chance_of_a_signal_with_a_floor() -> None:
    # G = 2: 1 - p^2 - (1 - p)^2 = 2 p (1 - p)
    assert draw_weight(0.5, 2, 0.05) == 0.5
    assert draw_weight(0.25, 2, 0.05) == pytest.approx(0.375)
    # G = 8, p = 0.5: 1 - 2 / 256
    assert draw_weight(0.5, 8, 0.05) == pytest.approx(254 / 256)
    assert draw_weight(1.0, 8, 0.05) == 0.05 and draw_weight(0.0, 8, 0.2) == 0.2
    assert draw_weight(0.99, 2, 0.05) == 0.05  # 2 * 0.99 * 0.01 = 0.0198, under the floor
    assert draw_weight(None, 8, 0.05) == 1.0  # never run: the most
    assert zero_variance_chance(0.25, 2) == pytest.approx(0.625)


def test_the_draw_follows_the_weights_and_never_starves_a_task() -> None:
    weights = [1.0, 0.5, 0.05]
    counts = Counter(i for seed in range(4000) for i in draw_tasks(weights, 1, random.Random(seed)))
    shares = [counts[i] / 4000 for i in range(3)]
    # one draw: probabilities w / sum w = 1 / 1.55, 0.5 / 1.55, 0.05 / 1.55
    assert shares == pytest.approx([1 / 1.55, 0.5 / 1.55, 0.05 / 1.55], abs=0.025)
    assert counts[2] > 0
    drawn = draw_tasks(weights, 3, random.Random(1))
    assert sorted(drawn) == [0, 1, 2]  # without replacement
    assert sorted(draw_tasks(weights, 5, random.Random(1))).count(0) == 2  # then again
    assert draw_tasks(weights, 2, random.Random(7)) == draw_tasks(weights, 2, random.Random(7))


def test_the_saved_groups_compare_the_draw_with_a_uniform_one() -> None:
    settings = DifficultySettings(floor=0.1, memory=1.0)
    sampler = DifficultySampler(2, group_size=2, settings=settings)
    sampler.update(0, successes=2, episodes=2)  # p = 1: z = 1, weight at the floor 0.1
    sampler.update(1, successes=1, episodes=2)  # p = 0.5: z = 0.5, weight 0.5
    indices, saved = sampler.draw(2, (0, 0, 0))
    # uniform: 2 * (1 + 0.5) / 2 = 1.5; this draw: 2 * (0.1 * 1 + 0.5 * 0.5) / 0.6 = 7 / 6
    assert saved == pytest.approx(1.5 - 7 / 6)
    assert sorted(indices) == [0, 1]
    _, again = sampler.draw(1, (0, 1, 0))
    assert sampler.saved_total == pytest.approx(saved + again)
    metrics = sampler.metrics(again)
    assert metrics["difficulty/at_floor_ratio"] == 0.5 and metrics["difficulty/tasks_seen"] == 2
    assert metrics["difficulty/estimate_mean"] == 0.75


def test_group_outcomes_count_successes_as_evaluation_does() -> None:
    won = NS(reward=1.0, metrics={}, truncated=False)
    lost = NS(reward=0.0, metrics={}, truncated=False)
    flagged = NS(reward=0.3, metrics={"success": True}, truncated=False)
    assert group_outcomes([4, 1], [[won, lost], [flagged, flagged, lost]]) == [(4, 1, 2), (1, 2, 3)]


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ({"floor": 0}, r"floor must be a number in \(0, 1\]"),
        ({"floor": 1.5}, "floor"),
        ({"memory": -0.1}, r"memory must be a number in \[0, 1\]"),
        ({"prior": "1"}, "prior"),
        ({"flor": 0.1}, "keys among"),
        ([0.1], "keys among"),
    ],
)
def test_bad_settings_are_refused(spec: object, match: str) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        DifficultySettings.of(spec)


def test_the_config_field_is_off_by_default_and_refused_with_async(tmp_path) -> None:
    from trainers import GRPOConfig

    base = dict(output_dir=str(tmp_path), max_turns=2, episodes_per_task=2, use_cpu=True)
    assert GRPOConfig(**base).difficulty_sampling is None
    assert GRPOConfig(**base, difficulty_sampling={}).difficulty_sampling == {}
    with pytest.raises(InvalidArgumentError, match="difficulty_sampling must be None with async"):
        GRPOConfig(**base, difficulty_sampling={}, max_steps_off_policy=1)
    with pytest.raises(InvalidArgumentError, match="difficulty_sampling.floor"):
        GRPOConfig(**base, difficulty_sampling={"floor": 2})
