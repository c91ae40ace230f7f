"""The hardware's limits, measured in the run that is compared with them, and a step's floor.

A roofline bounds a piece of work's time from below: it cannot run faster than its FLOPs at the
matmul peak, nor than its bytes at the memory bandwidth, so its **floor** is the larger of
``FLOPs / peak`` and ``bytes / bandwidth`` (:func:`floor_seconds`; the work from
:mod:`benchmarks.step_work`), and a contender's **share of its floor** is ``floor / measured
time`` (1.0: at the hardware's limit; 0.1: a tenth of what the machine allows).

Measured (:func:`measure`), interleaved over repeats (each repeat times every matmul and the copy
once, in turn), the median of each kept:

* matmul peak in GFLOP/s, per dtype (fp32 and bf16), ``torch.mm`` at a large square (2048^3) and
  at the model's own shapes (:func:`model_matmuls`: decode rows x hidden x intermediate, ...);
  a dtype's peak is its best shape (a bound: the most this CPU gave). A shape that would take
  more than :data:`MAX_CALL_S` a call (bf16 without a native kernel can run 100x slower than
  fp32) is left out and named, judged from a small probe timed first;
* memory bandwidth in GB/s: a tensor copy far larger than the caches, bytes read + written / s;
* the CPU's model and its matmul-relevant flags (:data:`benchmarks.procstat.CPU_FLAGS`).

A contender's floor is the floor of its work at the dtype it computes in (:meth:`Roofline.floor_s`),
and where contenders sample different numbers of tokens, the workload's floor per sampled token
times the tokens it sampled (:func:`prorated`).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from benchmarks.procstat import cpu_flags, cpu_model, describe_flags
from benchmarks.stats import median_interval
from benchmarks.step_work import ModelShape, Work, element_bytes, require_positive
from llm_gym.errors import InvalidArgumentError

DTYPES = ("float32", "bfloat16")
"""The dtypes :func:`measure` times by default."""
LARGE = (2048, 2048, 2048)
"""The large square matmul every run times (the CPU's best case)."""
PROBE = (512, 512, 512)
"""The small matmul timed first in each dtype, to judge what the larger shapes would cost."""
MAX_CALL_S = 3.0
"""The longest one matmul call may take (judged from the probe) for its shape to be timed: fp32's
2048^3 on a slow or busy CPU is timed; bf16's on a CPU without a bf16 kernel (a minute a call)
is not."""
Shape = tuple[int, int, int]
"""``(m, k, n)`` of ``torch.mm`` over an ``m x k`` and a ``k x n`` matrix."""


def floor_seconds(work: Work, peak_flops: float, bandwidth: float) -> float:
    """The least time ``work`` can take: the larger of its FLOPs at ``peak_flops`` (FLOP/s) and
    its bytes at ``bandwidth`` (bytes/s).

    Example:
        >>> floor_seconds(Work(flops=8e9, bytes=5e8), peak_flops=1e11, bandwidth=2.5e10)
        0.08
        >>> floor_seconds(Work(flops=8e9, bytes=5e9), peak_flops=1e11, bandwidth=2.5e10)
        0.2
    """
    require_positive("peak_flops", peak_flops)
    require_positive("bandwidth", bandwidth)
    return max(work.flops / peak_flops, work.bytes / bandwidth)


def share_of_floor(floor_s: float, measured_s: float) -> float:
    """``floor_s / measured_s``: the share of the hardware's limit a run reached (1.0 at it).

    Example:
        >>> share_of_floor(0.02, 0.25)
        0.08
    """
    require_positive("floor_s", floor_s, allow_zero=True)
    require_positive("measured_s", measured_s)
    return floor_s / measured_s


def prorated(floor_s: float, workload_tokens: int, tokens: int) -> float:
    """A contender's floor from its workload's: ``floor_s`` per sampled token of the workload
    (``workload_tokens``) times the ``tokens`` it sampled. A lower bound of its own floor when it
    samples fewer (its fixed costs, the prefill, are not prorated away in truth).

    Example:
        >>> prorated(0.5, workload_tokens=100, tokens=80)
        0.4
    """
    require_positive("workload_tokens", workload_tokens)
    require_positive("tokens", tokens, allow_zero=True)
    return floor_s * tokens / workload_tokens


# --- measured ------------------------------------------------------------------------------------


def model_matmuls(shape: ModelShape, rows: int, tokens: int = 512) -> list[Shape]:
    """The matmuls a model's passes run most: a decode step of ``rows`` rows through the MLP
    (``rows x hidden x intermediate``) and attention's projections (``rows x hidden x hidden``),
    and a prefill or training pass of ``tokens`` tokens through the MLP."""
    return [
        (rows, shape.hidden, shape.intermediate),
        (rows, shape.hidden, shape.hidden),
        (tokens, shape.hidden, shape.intermediate),
    ]


def _label(shape: Shape) -> str:
    return "x".join(map(str, shape))


@dataclass
class Roofline:
    """What this CPU allows, measured in this run (:func:`measure`)."""

    cpu: str
    """The CPU's model name."""
    flags: list[str] | None
    """Its matmul-relevant flags (:data:`benchmarks.procstat.CPU_FLAGS`)."""
    matmul_gflops: dict[str, dict[str, float]]
    """``[dtype][m x k x n]``: the median GFLOP/s of ``torch.mm`` over the repeats."""
    copy_gbps: float
    """Memory bandwidth: the median of a large copy's bytes read + written per second, in GB/s."""
    repeats: int
    """Interleaved repeats behind each median."""
    skipped: dict[str, list[str]] = field(default_factory=dict)
    """``[dtype]``: shapes left out, a call judged longer than :data:`MAX_CALL_S`."""

    @property
    def dtypes(self) -> list[str]:
        """The dtypes with at least one shape timed (those a floor can be taken in)."""
        return [dtype for dtype, shapes in self.matmul_gflops.items() if shapes]

    def peak_gflops(self, dtype: str) -> float:
        """The best GFLOP/s any shape gave in ``dtype``."""
        if not self.matmul_gflops.get(dtype):
            raise InvalidArgumentError(
                f"Expected a dtype this roofline measured ({sorted(self.matmul_gflops)}), got "
                f"{dtype!r}: pass it to measure(dtypes=...)."
            )
        return max(self.matmul_gflops[dtype].values())

    def floor_s(self, work: Work, dtype: str) -> float:
        """:func:`floor_seconds` of ``work`` computed in ``dtype``, at this run's peak for it."""
        return floor_seconds(work, self.peak_gflops(dtype) * 1e9, self.copy_gbps * 1e9)

    def as_json(self) -> dict[str, Any]:
        peaks = {d: self.peak_gflops(d) for d in self.dtypes}
        return {
            "cpu": self.cpu,
            "cpu_flags": self.flags,
            "matmul_gflops": self.matmul_gflops,
            "peak_gflops": peaks,
            "copy_gbps": self.copy_gbps,
            "repeats": self.repeats,
            "skipped": self.skipped,
        }

    def describe(self) -> str:
        """One markdown paragraph: the CPU, its flags, each dtype's matmuls and the copy."""
        parts = []
        for dtype, shapes in self.matmul_gflops.items():
            cells = ", ".join(
                f"{s}: {g:,.0f}" if g >= 100 else f"{s}: {g:.3g}" for s, g in shapes.items()
            )
            left = self.skipped.get(dtype)
            skip = f" (left out, over {MAX_CALL_S:g} s a call: {', '.join(left)})" if left else ""
            parts.append(f"{dtype} {cells} GFLOP/s{skip}")
        flags = f" ({describe_flags(self.flags)})" if self.flags is not None else ""
        return (
            f"Roofline, measured in this run on {self.cpu}{flags}, median of {self.repeats} "
            f"interleaved repeats: `torch.mm` {'; '.join(parts)} (a dtype's peak is its best "
            f"shape); memory copy {self.copy_gbps:.1f} GB/s (bytes read + written). A "
            "contender's floor is the larger of its FLOPs at its dtype's peak and its bytes at "
            "that bandwidth; its share is floor / measured time (above 100% only when the "
            "machine gave these timings less than it gave the contender: a busy machine)."
        )


def _time_mm(a: Any, b: Any, calls: int) -> float:
    import torch

    start = time.perf_counter()
    for _ in range(calls):
        torch.mm(a, b)
    return (time.perf_counter() - start) / calls


def measure(
    shapes: Sequence[Shape],
    *,
    dtypes: Sequence[str] = DTYPES,
    repeats: int = 5,
    seconds: float = 0.2,
    copy_mib: int = 512,
    log: Callable[[str], None] | None = None,
) -> Roofline:
    """Time :data:`PROBE`, :data:`LARGE` and ``shapes`` in each of ``dtypes`` and a copy of
    ``copy_mib`` MiB (read, and as much written), interleaved over ``repeats`` repeats; each
    matmul timing runs about ``seconds``; the median of each kept."""
    import torch

    require_positive("repeats", repeats)
    unique = list(dict.fromkeys([PROBE, LARGE, *[tuple(s) for s in shapes]]))
    timers: dict[tuple[str, str], Callable[[], float]] = {}
    skipped: dict[str, list[str]] = {}
    for dtype in dtypes:
        kind = getattr(torch, dtype)
        element_bytes(dtype)
        probe_a, probe_b = torch.randn(*PROBE[:2], dtype=kind), torch.randn(*PROBE[1:], dtype=kind)
        fastest = min(_time_mm(probe_a, probe_b, 1) for _ in range(4))  # the first warms up
        rate = 2 * PROBE[0] * PROBE[1] * PROBE[2] / fastest
        for m, k, n in unique:
            flops = 2 * m * k * n
            if flops / rate > MAX_CALL_S:
                skipped.setdefault(dtype, []).append(_label((m, k, n)))
                continue
            a, b = torch.randn(m, k, dtype=kind), torch.randn(k, n, dtype=kind)
            calls = max(1, round(seconds * rate / flops))
            timers[dtype, _label((m, k, n))] = lambda a=a, b=b, c=calls, f=flops: (
                f / _time_mm(a, b, c)
            )
    source = torch.empty(copy_mib * 2**20 // 4, dtype=torch.float32)
    target = torch.empty_like(source)
    target.copy_(source)

    def copy() -> float:
        start = time.perf_counter()
        target.copy_(source)
        return 2 * source.numel() * 4 / (time.perf_counter() - start)

    timers["copy", "copy"] = copy
    for timer in timers.values():  # warm-up: first touch of each shape's kernels
        timer()
    samples: dict[tuple[str, str], list[float]] = {key: [] for key in timers}
    keys = list(timers)
    for repeat in range(repeats):
        for key in keys[repeat % len(keys) :] + keys[: repeat % len(keys)]:
            samples[key].append(timers[key]())
        if log is not None:
            log(f"roofline repeat {repeat + 1}/{repeats}")
    gflops: dict[str, dict[str, float]] = {d: {} for d in dtypes}
    for (dtype, label), values in samples.items():
        if dtype != "copy":
            gflops[dtype][label] = statistics.median(values) / 1e9
    return Roofline(
        cpu=cpu_model(),
        flags=cpu_flags(),
        matmul_gflops=gflops,
        copy_gbps=statistics.median(samples["copy", "copy"]) / 1e9,
        repeats=repeats,
        skipped=skipped,
    )


def measure_model(
    shape: ModelShape,
    rows: int,
    *,
    quick: bool,
    repeats: int,
    log: Callable[[str], None] | None = None,
) -> Roofline:
    """:func:`measure` at a model's shapes (:func:`model_matmuls` for ``rows`` decode rows), as
    every benchmark runs it: at least 2 repeats; a ``quick`` run times each matmul about 20 ms
    and copies 128 MiB, a full one 200 ms and 512 MiB."""
    return measure(
        model_matmuls(shape, rows),
        repeats=max(repeats, 2),
        seconds=0.02 if quick else 0.2,
        copy_mib=128 if quick else 512,
        log=log,
    )


def contender_roofline(
    runs: Sequence[dict[str, Any]], floors: Sequence[float], dtype: str, key: str = "wall_s"
) -> dict[str, Any]:
    """A contender's roofline columns from its repeats (``runs[r][key]``, seconds) and each repeat's
    floor: ``dtype``, the median ``floor_s``, and ``share_of_floor`` (median, 95% interval)."""
    if len(runs) != len(floors) or not runs:
        raise InvalidArgumentError(
            f"Expected one floor per run (at least one), got {len(floors)} floors for "
            f"{len(runs)} runs: compute a floor for every repeat."
        )
    shares = [share_of_floor(f, run[key]) for f, run in zip(floors, runs, strict=True)]
    return {
        "dtype": dtype,
        "floor_s": statistics.median(floors),
        "share_of_floor": median_interval(shares).as_json(),
    }


def share_cell(share: dict[str, Any]) -> str:
    """A share of the floor (``{"median", "ci"}``) for a table, to three significant digits.

    Example:
        >>> share_cell({"median": 0.0123, "ci": [0.011, 0.0141]})
        '1.23% [1.10%, 1.41%]'
    """
    low, high = share["ci"]
    return " ".join([percent(share["median"]), f"[{percent(low)}, {percent(high)}]"])


def percent(value: float) -> str:
    """A share as a percentage to three significant digits (``0.0123``: ``"1.23%"``)."""
    return f"{100 * value:#.3g}".rstrip(".") + "%"
