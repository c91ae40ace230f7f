"""The roofline (:mod:`benchmarks.roofline`): the floor and the share on hand-computed values,
the measured record, and a measurement small enough for the default suite."""

from __future__ import annotations

import pytest

from benchmarks import roofline
from benchmarks.roofline import (
    Roofline,
    contender_roofline,
    floor_seconds,
    model_matmuls,
    prorated,
    share_cell,
    share_of_floor,
)
from benchmarks.step_work import ModelShape, Work, decode_step
from llm_gym.errors import InvalidArgumentError

SMOLLM2 = ModelShape(134_515_008, 30, 576, 1536, 3, 64, 49_152)


def test_docstring_examples() -> None:
    import doctest

    assert doctest.testmod(roofline).failed == 0


def test_the_floor_is_the_slower_of_compute_and_memory() -> None:
    """A SmolLM2 decode step of 32 rows, no cache: 8.61 GFLOP and 538 MB in fp32. At 300 GFLOP/s
    and 28 GB/s compute binds (28.7 ms against 19.2 ms); at 1,000 GFLOP/s memory does (8.6 ms
    against 19.2 ms). In bf16 at 1,450 GFLOP/s, half the bytes: memory binds (5.9 against 9.6
    ms)."""
    fp32 = decode_step(SMOLLM2, rows=32, context_tokens=0, element=4)
    bf16 = decode_step(SMOLLM2, rows=32, context_tokens=0, element=2)
    assert floor_seconds(fp32, 300e9, 28e9) == pytest.approx(8_608_960_512 / 300e9)
    assert floor_seconds(fp32, 1000e9, 28e9) == pytest.approx(538_060_032 / 28e9)
    assert floor_seconds(bf16, 1450e9, 28e9) == pytest.approx(269_030_016 / 28e9)
    assert floor_seconds(Work(0, 0), 1e9, 1e9) == 0.0


def test_the_share_of_the_floor_and_its_proration() -> None:
    assert share_of_floor(0.03, 0.3) == pytest.approx(0.1)
    assert share_of_floor(0.0, 0.3) == 0.0
    assert prorated(2.0, workload_tokens=1536, tokens=1200) == pytest.approx(1.5625)
    for call in (
        lambda: share_of_floor(0.03, 0.0),
        lambda: share_of_floor(-1.0, 1.0),
        lambda: floor_seconds(Work(1, 1), peak_flops=0.0, bandwidth=1.0),
        lambda: prorated(1.0, workload_tokens=0, tokens=5),
    ):
        with pytest.raises(InvalidArgumentError, match="Expected"):
            call()


def _roof() -> Roofline:
    return Roofline(
        cpu="Test CPU",
        flags=["avx2", "fma"],
        matmul_gflops={"float32": {"2048x2048x2048": 300.0, "32x576x1536": 120.0},
                       "bfloat16": {"32x576x1536": 5.0}},
        copy_gbps=25.0,
        repeats=5,
        skipped={"bfloat16": ["2048x2048x2048"]},
    )  # fmt: skip


def test_a_roofline_takes_each_dtypes_best_shape_as_its_peak() -> None:
    roof = _roof()
    assert roof.peak_gflops("float32") == 300.0 and roof.peak_gflops("bfloat16") == 5.0
    work = Work(flops=6e9, bytes=1e8)
    assert roof.floor_s(work, "float32") == pytest.approx(0.02)  # 6e9 / 3e11 > 1e8 / 2.5e10
    assert roof.floor_s(work, "bfloat16") == pytest.approx(1.2)  # 6e9 / 5e9
    with pytest.raises(InvalidArgumentError, match="float16"):
        roof.floor_s(work, "float16")
    data = roof.as_json()
    assert data["peak_gflops"] == {"float32": 300.0, "bfloat16": 5.0}
    assert data["cpu_flags"] == ["avx2", "fma"] and data["copy_gbps"] == 25.0
    text = roof.describe()
    assert "Test CPU (CPU flags: avx2, fma)" in text and "25.0 GB/s" in text
    assert "2048x2048x2048: 300" in text and "left out, over 3 s a call: 2048x2048x2048" in text


def test_a_contenders_columns_from_its_repeats() -> None:
    runs = [{"wall_s": 2.0}, {"wall_s": 4.0}, {"wall_s": 1.0}]
    columns = contender_roofline(runs, [0.5, 0.5, 0.5], "float32")
    assert columns["dtype"] == "float32" and columns["floor_s"] == 0.5
    assert columns["share_of_floor"] == {"median": 0.25, "ci": [0.125, 0.5]}
    steps = [{"wall_s": 9.0, "train_s": 1.0}]
    assert contender_roofline(steps, [0.1], "bfloat16", key="train_s")["share_of_floor"] == {
        "median": 0.1, "ci": [0.1, 0.1]
    }  # fmt: skip
    with pytest.raises(InvalidArgumentError, match="one floor per run"):
        contender_roofline(runs, [0.5], "float32")
    assert share_cell({"median": 1.0, "ci": [0.5, 1.0]}) == "100% [50.0%, 100%]"


def test_the_model_shapes_timed() -> None:
    assert model_matmuls(SMOLLM2, rows=32) == [(32, 576, 1536), (32, 576, 576), (512, 576, 1536)]


def test_a_small_measurement(monkeypatch) -> None:
    """Every shape in every dtype gets a positive median, the copy a bandwidth; a shape whose
    call would exceed the cap is left out and named, not timed."""
    pytest.importorskip("torch")
    monkeypatch.setattr(roofline, "LARGE", (128, 128, 128))
    monkeypatch.setattr(roofline, "PROBE", (32, 32, 32))
    lines: list[str] = []
    roof = roofline.measure([(4, 16, 32)], repeats=2, seconds=0.001, copy_mib=4, log=lines.append)
    assert set(roof.matmul_gflops) == {"float32", "bfloat16"}
    for shapes in roof.matmul_gflops.values():
        assert set(shapes) == {"32x32x32", "128x128x128", "4x16x32"}
        assert all(g > 0 for g in shapes.values())
    assert roof.copy_gbps > 0 and roof.repeats == 2 and len(lines) == 2 and roof.skipped == {}
    monkeypatch.setattr(roofline, "MAX_CALL_S", 1e-12)
    capped = roofline.measure([], dtypes=("float32",), repeats=1, seconds=0.001, copy_mib=4)
    assert capped.skipped == {"float32": ["32x32x32", "128x128x128"]}
    assert capped.matmul_gflops == {"float32": {}} and capped.as_json()["peak_gflops"] == {}
    assert capped.dtypes == [] and roof.dtypes == ["float32", "bfloat16"]
