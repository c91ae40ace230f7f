"""The benchmark harness: its statistics on hand-computed examples, the interleaved order, the
recorded conditions and the result files (fast: no model)."""

from __future__ import annotations

import doctest
import json
import math
import random
import statistics

import pytest

from benchmarks import common, procstat, stats
from benchmarks.common import (
    Conditions,
    add_harness_arguments,
    check_repeats,
    interleave,
    output_dir,
    pin_threads,
    run_order,
    write_json,
)
from benchmarks.stats import median_interval, order_statistic_rank, ratio_interval


@pytest.mark.parametrize("module", [stats, common, procstat])
def test_docstring_examples(module) -> None:
    assert doctest.testmod(module).failed == 0


# --- the median's interval -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "rank", "coverage"),
    [
        (1, 1, 0.0),  # one value: [x1, x1] covers with probability 0
        (3, 1, 1 - 2 / 8),
        (5, 1, 1 - 2 / 32),  # 0.9375: no interval reaches 95% below 6 values
        (6, 1, 1 - 2 / 64),
        (7, 1, 1 - 2 / 128),
        (8, 1, 1 - 2 / 256),  # k = 2 would cover 1 - 2 * 9/256 = 0.93
        (9, 2, 1 - 2 * (1 + 9) / 512),
        (10, 2, 1 - 2 * (1 + 10) / 1024),
        (17, 5, 1 - 2 * (1 + 17 + 136 + 680 + 2380) / 2**17),  # 0.951; k = 6 would give 0.857
    ],
)
def test_order_statistic_rank_by_hand(n: int, rank: int, coverage: float) -> None:
    got_rank, got_coverage = order_statistic_rank(n)
    assert got_rank == rank
    assert got_coverage == pytest.approx(coverage, abs=1e-12)
    if rank > 1:  # the next rank would fall below 95%
        assert 1 - 2 * sum(math.comb(n, i) for i in range(rank + 1)) / 2**n < 0.95


def test_order_statistic_rank_needs_a_value() -> None:
    with pytest.raises(ValueError, match="at least one value"):
        order_statistic_rank(0)


def test_median_interval_by_hand() -> None:
    five = median_interval([3.0, 1.0, 2.0, 5.0, 4.0])
    assert (five.median, five.low, five.high, five.n) == (3.0, 1.0, 5.0, 5)
    assert five.coverage == 0.9375
    nine = median_interval([9, 1, 8, 2, 7, 3, 6, 4, 5])
    assert (nine.median, nine.low, nine.high) == (5, 2, 8)
    ten = median_interval(list(range(1, 11)))
    assert (ten.median, ten.low, ten.high) == (5.5, 2, 9)
    assert "x(2)..x(9)" in ten.method
    assert ten.as_json() == {"median": 5.5, "ci": [2.0, 9.0]}
    assert ten.format(".1f", suffix="x") == "5.5x [2.0, 9.0]"


def test_median_interval_covers_as_it_says() -> None:
    """Simulated: of 9 exponential draws, [x(2), x(8)] holds the true median (ln 2) ~96.1% of
    the time."""
    rng = random.Random(7)
    trials, hits = 4000, 0
    for _ in range(trials):
        est = median_interval([rng.expovariate(1.0) for _ in range(9)])
        hits += est.low <= math.log(2) <= est.high
    assert hits / trials == pytest.approx(order_statistic_rank(9)[1], abs=0.015)


# --- the ratio's interval ------------------------------------------------------------------------


def test_ratio_interval_two_pairs_by_hand() -> None:
    # Resamples of 2 pairs: {1,1} (p 1/4) ratio 1, {1,3} (p 1/2) ratio 2, {3,3} (p 1/4) ratio 3.
    est = ratio_interval([1.0, 3.0], [1.0, 1.0])
    assert (est.median, est.low, est.high) == (2.0, 1.0, 3.0)
    assert est.coverage == 0.95 and "exact" in est.method


def test_ratio_interval_three_pairs_by_hand() -> None:
    # Median of 3 draws from [1, 2, 4]: 1 with p 7/27, 2 with p 13/27, 4 with p 7/27.
    est = ratio_interval([1.0, 2.0, 4.0], [1.0, 1.0, 1.0])
    assert (est.median, est.low, est.high) == (2.0, 1.0, 4.0)
    # A 40% interval: quantiles 0.3 and 0.7 both fall in the middle value's 13/27.
    narrow = ratio_interval([1.0, 2.0, 4.0], [1.0, 1.0, 1.0], confidence=0.4)
    assert (narrow.low, narrow.high) == (2.0, 2.0)


def test_ratio_interval_pairs_the_repeats() -> None:
    # Both contenders slow down together (load): the ratio is exactly 2 in every repeat, and a
    # paired bootstrap says so; the medians alone vary by a factor of 5.
    b = [1.0, 5.0, 2.0, 4.0, 3.0]
    est = ratio_interval([2 * x for x in b], b)
    assert (est.median, est.low, est.high) == (2.0, 2.0, 2.0)
    many = [1.0 + i for i in range(12)]  # above the exact limit: seeded resampling
    est = ratio_interval([2 * x for x in many], many)
    assert "seeded" in est.method
    assert est.low == pytest.approx(2.0) and est.high == pytest.approx(2.0)


def test_seeded_bootstrap_is_reproducible_and_agrees_with_the_exact_one(monkeypatch) -> None:
    rng = random.Random(3)
    a = [rng.uniform(1, 2) for _ in range(6)]
    b = [rng.uniform(1, 2) for _ in range(6)]
    exact = ratio_interval(a, b)
    monkeypatch.setattr(stats, "EXACT_BOOTSTRAP_MAX", 0)
    sampled = ratio_interval(a, b, seed=1)
    assert sampled == ratio_interval(a, b, seed=1)
    assert sampled.median == exact.median
    assert sampled.low == pytest.approx(exact.low, rel=0.05)
    assert sampled.high == pytest.approx(exact.high, rel=0.05)


def test_ratio_interval_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="paired"):
        ratio_interval([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="positive"):
        ratio_interval([1.0], [0.0])


# --- interleaving --------------------------------------------------------------------------------


def test_run_order_rotates_or_shuffles_with_a_seed() -> None:
    assert run_order(["A", "B"], 3) == [["A", "B"], ["B", "A"], ["A", "B"]]
    shuffled = run_order(["A", "B", "C"], 20, "shuffle", seed=4)
    assert shuffled == run_order(["A", "B", "C"], 20, "shuffle", seed=4)
    assert all(sorted(names) == ["A", "B", "C"] for names in shuffled)
    assert len({tuple(names) for names in shuffled}) > 1
    with pytest.raises(ValueError, match="rotate"):
        run_order(["A"], 1, "random")


def test_interleave_runs_each_contender_once_per_repeat() -> None:
    calls: list[tuple[str, int]] = []

    def contender(name: str, wall: float):
        def run(repeat: int) -> dict:
            calls.append((name, repeat))
            return {"wall_s": wall, "tokens": 10}

        return run

    result = interleave(
        {"A": contender("A", 2.0), "B": contender("B", 5.0)}, 3, warmup=["B"], log=lambda _: None
    )
    assert calls == [("B", -1), ("A", 0), ("B", 0), ("B", 1), ("A", 1), ("A", 2), ("B", 2)]
    assert result.order == [["A", "B"], ["B", "A"], ["A", "B"]]
    assert result.rates("A", "tokens") == [5.0, 5.0, 5.0]
    assert [len(runs) for runs in result.runs.values()] == [3, 3]
    with pytest.raises(ValueError, match="unknown"):
        interleave({"A": contender("A", 1.0)}, 1, warmup=["C"])
    with pytest.raises(ValueError, match="repeats"):
        interleave({"A": contender("A", 1.0)}, 0)


# --- conditions, options and files ---------------------------------------------------------------


def test_pin_threads_sets_and_records_them(monkeypatch) -> None:
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    interop: list[int] = []
    monkeypatch.setattr(torch, "set_num_interop_threads", interop.append)
    for name in common.THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    try:
        settings = pin_threads(1)
        assert settings["pinned"] and settings["torch_threads"] == 1 == torch.get_num_threads()
        assert settings["OMP_NUM_THREADS"] == settings["MKL_NUM_THREADS"] == "1"
        assert interop == [1]
    finally:
        torch.set_num_threads(before)
    assert pin_threads(None)["pinned"] is False
    with pytest.raises(ValueError, match=">= 1"):
        pin_threads(0)


def test_conditions_record_the_machine_load_commit_and_time(tmp_path) -> None:
    conditions = Conditions.start(
        "demo", threads={"pinned": True, "torch_threads": 1}, settings={"n": 3}, command="cmd"
    )
    assert len(conditions.load_before) == 3 and conditions.load_after is None
    conditions.finish()
    assert len(conditions.load_after) == 3 and conditions.wall_s >= 0
    text = conditions.describe()
    assert "1 intra-op thread, pinned" in text and "`cmd`" in text and "load average" in text
    path = write_json(
        "demo", {"conditions": conditions, "ratio": median_interval([1, 2])}, tmp_path
    )
    data = json.loads(path.read_text())
    assert data["conditions"]["settings"] == {"n": 3} and data["conditions"]["command"] == "cmd"
    assert "_clock" not in data["conditions"] and "_cpu" not in data["conditions"]
    share = data["conditions"]["cpu_share"]
    if procstat.cpu_times() is not None and share is not None:  # None: no tick passed
        assert set(share) == {"busy", "idle", "steal"} and sum(share.values()) <= 1 + 1e-9
        assert "stolen by the hypervisor" in text
    assert data["ratio"] == {"median": 1.5, "ci": [1.0, 2.0]}
    if conditions.git_commit is not None:
        assert len(conditions.git_commit) == 40


def test_cpu_shares_by_hand() -> None:
    before = [100, 0, 20, 500, 0, 0, 0, 7]
    after = [160, 0, 40, 520, 0, 0, 0, 107]  # 80 busy, 20 idle, 100 stolen ticks
    assert procstat.cpu_shares(before, after) == {"busy": 0.4, "idle": 0.1, "steal": 0.5}
    assert procstat.cpu_shares(before, before) is None  # no time passed
    assert procstat.cpu_shares(None, after) is None
    assert Conditions(**{**_old_conditions(), "cpu_share": None}).describe().count("stolen") == 0


def _old_conditions() -> dict:
    """A results file's conditions from before ``cpu_share`` was recorded."""
    return dict(benchmark="b", command="c", machine="m", torch=None, threads={},
                load_before=[0.0] * 3, git_commit=None, git_dirty=None, started="s")  # fmt: skip


def test_harness_arguments_and_the_quick_convention(tmp_path) -> None:
    import argparse

    parser = argparse.ArgumentParser()
    add_harness_arguments(parser, repeats=9)
    ns = parser.parse_args(["--quick", "--order", "shuffle"])
    assert ns.quick and ns.repeats is None and ns.threads == 1 and ns.write
    assert output_dir(quick=True, out_dir=None, write=True) is None  # quick never writes results/
    assert output_dir(quick=True, out_dir=tmp_path, write=True) == tmp_path
    assert output_dir(quick=False, out_dir=None, write=True) == common.RESULTS_DIR
    assert output_dir(quick=False, out_dir=tmp_path, write=False) is None
    check_repeats(1, quick=True)
    check_repeats(5, quick=False)
    with pytest.raises(ValueError, match="at least 5"):
        check_repeats(4, quick=False)


def test_mean_interval_is_still_exported() -> None:
    mean, (low, high) = common.mean_interval([1.0, 2.0, 3.0])
    assert mean == 2.0 and low < 2.0 < high
    assert statistics.fmean([low, high]) == pytest.approx(2.0)


# --- the CPU's flags ------------------------------------------------------------------------------

CPUINFO = """processor\t: 0
model name\t: Intel(R) Xeon(R) Platinum 8481C
flags\t\t: fpu sse avx2 fma avx512f avx512fp16 avx512_bf16 amx_tile amx_bf16 amx_int8
vmx flags\t: vnmi preemption_timer avx2_fake
"""


def test_flags_are_whole_words_of_the_flags_line() -> None:
    """Only the ``flags`` line counts (not ``vmx flags``), and only whole words: ``avx512fp16``
    is no ``avx512f``, nor ``avx2_fake`` an ``avx2``; the order is :data:`CPU_FLAGS`'."""
    assert procstat.flags_present(CPUINFO) == [
        "amx_bf16", "amx_tile", "avx512_bf16", "avx512f", "avx2", "fma"
    ]  # fmt: skip
    no_avx512 = CPUINFO.replace(" avx512f ", " ").replace(" fma", "")
    assert procstat.flags_present(no_avx512) == ["amx_bf16", "amx_tile", "avx512_bf16", "avx2"]
    assert procstat.flags_present("vmx flags\t: avx2 fma\n") == []
    assert procstat.flags_present("") == []


def test_conditions_record_the_cpu_flags_and_describe_them() -> None:
    conditions = Conditions.start("demo", quick=True, command="cmd")
    assert conditions.cpu_flags == procstat.cpu_flags()
    assert conditions.as_json()["cpu_flags"] == conditions.cpu_flags
    conditions.cpu_flags = ["avx2", "fma"]
    assert "(CPU flags: avx2, fma)" in conditions.describe()
    conditions.cpu_flags = []
    assert "CPU flags: none of amx_bf16, amx_tile, avx512_bf16" in conditions.describe()
    old = Conditions(**_old_conditions())  # a results file written without the flags
    assert old.cpu_flags is None and "CPU flags" not in old.describe()
