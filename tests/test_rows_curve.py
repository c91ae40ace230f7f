"""Rows in flight from a measured curve: the pick on hand-made curves, a measured curve on the
small model, and ``HFPolicy(max_batch_size="auto")`` seating what the pick says."""

from __future__ import annotations

import pytest

from llm_gym.errors import InvalidArgumentError
from llm_gym.policies import rows_curve
from llm_gym.policies.rows_curve import pick_rows

RISING = {8: 48.0, 16: 79.0, 32: 111.0, 64: 131.0, 128: 139.0}
"""SmolLM2 on one EPYC core: still rising at 128 rows."""


def test_the_pick_is_the_fewest_rows_within_the_tolerance_of_the_best() -> None:
    assert pick_rows(RISING) == 128  # 131 < 0.95 * 139
    assert pick_rows(RISING, tolerance=0.10) == 64  # 131 >= 0.90 * 139
    assert pick_rows({8: 100.0, 16: 190.0, 32: 200.0, 64: 201.0}) == 32  # a plateau: its start
    assert pick_rows({8: 100.0, 16: 300.0, 32: 250.0, 64: 120.0}) == 16  # a peak, then a fall
    assert pick_rows({8: 10.0, 16: 10.0}, tolerance=0.0) == 8  # a tie: the fewer rows


def test_the_budget_bounds_the_pick() -> None:
    assert pick_rows(RISING, most=100) == 64
    assert pick_rows(RISING, most=64) == 64
    assert pick_rows(RISING, most=31) == 16  # 79 >= 0.95 * 79; 8 rows are not
    assert pick_rows(RISING, most=5) == 5  # below every measured count: what fits
    assert pick_rows({32: 5.0}) == 32


@pytest.mark.parametrize(
    ("curve", "options", "match"),
    [
        ({}, {}, "at least one"),
        ({0: 5.0}, {}, "rows >= 1"),
        ({8: -1.0}, {}, "tokens/s >= 0"),
        ({8: float("nan")}, {}, "tokens/s >= 0"),
        ({8: 1.0}, {"tolerance": 1.0}, "tolerance"),
        ({8: 1.0}, {"most": 0}, "most >= 1"),
    ],
)
def test_a_bad_curve_or_bound_is_refused(curve, options, match) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        pick_rows(curve, **options)


def test_a_curve_measured_on_the_small_model(small_model) -> None:
    model, _ = small_model
    curve = rows_curve.measure_curve(model, [1, 3], context=12, steps=1)
    assert sorted(curve) == [1, 3] and all(rate > 0 for rate in curve.values())


def test_auto_rows_come_from_the_curve_within_the_budget(small_model, monkeypatch) -> None:
    from llm_gym.policies.hf import HFPolicy
    from llm_gym.policies.hf_attention import KVCache

    model, tokenizer = small_model
    measured: list[list[int]] = []

    def fake(model, rows, **_):
        measured.append(list(rows))
        return {r: RISING[r] for r in rows}

    monkeypatch.setattr(rows_curve, "measure_curve", fake)
    monkeypatch.setattr(rows_curve, "_CURVES", rows_curve.weakref.WeakKeyDictionary())
    row = KVCache.for_model(model, model.dtype, model.device).bytes_for(1, 256 + 8)
    policy = HFPolicy(model, tokenizer, max_new_tokens=8, max_batch_size="auto")
    assert policy.engine_rows(1000 * row) == 128
    assert policy.engine_rows(40 * row) == 32  # fits 40 rows: measured up to 32
    assert measured == [[8, 16, 32, 64, 128], [8, 16, 32]]
    assert policy.engine_rows(1000 * row) == 128 and len(measured) == 2  # measured once
    policy.kv_budget_bytes = 40 * row
    stream = policy.open_stream()  # the continuous engine seats what the pick says
    assert stream is not None and stream.engine.max_rows == 32 and len(measured) == 2
    assert HFPolicy(model, tokenizer, max_batch_size=3).engine_rows(row) == 3


@pytest.mark.parametrize("value", [0, -2, "many", 2.5, True])
def test_max_batch_size_is_an_int_auto_or_none(small_model, value) -> None:
    from llm_gym.policies.hf import HFPolicy

    model, tokenizer = small_model
    with pytest.raises(InvalidArgumentError, match="max_batch_size"):
        HFPolicy(model, tokenizer, max_batch_size=value)
