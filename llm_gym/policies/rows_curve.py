"""How many episodes the decode engine keeps in flight: picked from a measured curve of tokens per
second against rows, within the key/value budget.

A decode step reads the weights once for all its rows, so tokens/s grows with the rows in flight
until the step is bound by its arithmetic; past that knee more rows only lengthen every turn and
take more key/value memory. :func:`pick_rows` (pure) picks the knee from a curve;
:func:`measure_curve` measures one on the model itself (a few decode steps at each row count,
seconds on a CPU); :func:`rows_in_flight` measures once per model, dtype and thread count in a
process and picks within the budget. ``HFPolicy(max_batch_size="auto")`` uses it.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Iterable, Mapping
from typing import Any

from llm_gym.errors import InvalidArgumentError

__all__ = [
    "CURVE_ROWS",
    "PROBE_CONTEXT",
    "TOLERANCE",
    "measure_curve",
    "pick_rows",
    "rows_in_flight",
]

CURVE_ROWS = (8, 16, 32, 64, 128)
"""Row counts :func:`measure_curve` measures by default."""

TOLERANCE = 0.05
"""Share of the best tokens/s that :func:`pick_rows` gives up for fewer rows."""

PROBE_CONTEXT = 256
"""Tokens of context each row of :func:`measure_curve` attends (a shared prefix and one own)."""


def pick_rows(
    curve: Mapping[int, float], *, most: int | None = None, tolerance: float = TOLERANCE
) -> int:
    """The fewest rows whose measured tokens/s is within ``tolerance`` of the best the curve
    reaches at or below ``most`` rows (``most`` itself when it is below every measured count).

    Args:
        curve: Tokens per second by rows in flight (at least one point).
        most: Most rows the budget allows (None: no bound).
        tolerance: Share of the best rate given up for fewer rows, in [0, 1).

    Example:
        >>> pick_rows({8: 50.0, 16: 80.0, 32: 110.0, 64: 131.0, 128: 139.0})
        128
        >>> pick_rows({8: 50.0, 16: 80.0, 32: 110.0, 64: 136.0, 128: 139.0})
        64
        >>> pick_rows({8: 50.0, 16: 80.0, 32: 110.0, 64: 131.0, 128: 139.0}, most=40)
        32
        >>> pick_rows({8: 50.0, 16: 80.0}, most=4)
        4
    """
    if not curve:
        raise InvalidArgumentError(
            "Expected a curve of at least one (rows, tokens/s) point, got none; measure one with "
            "rows_curve.measure_curve."
        )
    bad = {r: t for r, t in curve.items() if int(r) < 1 or not float(t) >= 0}
    if bad:
        raise InvalidArgumentError(
            f"Expected rows >= 1 and tokens/s >= 0 at every point, got {bad}; drop those points."
        )
    if not 0 <= tolerance < 1:
        raise InvalidArgumentError(f"Expected a tolerance in [0, 1), got {tolerance!r}.")
    if most is not None and most < 1:
        raise InvalidArgumentError(f"Expected most >= 1 rows (or None), got {most!r}.")
    allowed = {int(r): float(t) for r, t in curve.items() if most is None or r <= most}
    if not allowed:
        return int(most)  # type: ignore[arg-type]
    best = max(allowed.values())
    return min(r for r, t in allowed.items() if t >= (1 - tolerance) * best)


def measure_curve(
    model: Any,
    rows: Iterable[int] = CURVE_ROWS,
    *,
    context: int = PROBE_CONTEXT,
    steps: int = 2,
) -> dict[int, float]:
    """Decode tokens per second of ``model`` on the engine at each row count: ``rows`` rows
    sharing a ``context - 1``-token prefix of fixed ids, each with one id of its own, timed over
    ``steps`` decode steps after one warm-up step (sampling at temperature 1, seeded; no row
    stops), the rows' buffers sized to the columns they write. The prefix's prefill is not
    timed."""
    from llm_gym.policies.hf_engine import DecodeEngine

    vocab = int(model.get_output_embeddings().weight.shape[0])
    prefix = [(7 * i + 3) % vocab for i in range(max(1, context - 1))]
    curve = {}
    for count in rows:
        engine = DecodeEngine(model, eos_ids=[], pad_id=0, temperature=1.0, top_p=1.0, seed=0)
        # Buffers of the columns the probe writes, not the default width (1.5 GB for SmolLM2).
        engine.kv_budget_bytes = engine.cache.bytes_for(count, steps + 4)
        try:
            engine.step([(i, [*prefix, (i + 5) % vocab], steps + 2) for i in range(count)])
            engine.step([])
            start = time.perf_counter()
            for _ in range(steps):
                engine.step([])
            elapsed = time.perf_counter() - start
        finally:
            engine.close()
        curve[int(count)] = count * steps / elapsed
    return curve


_CURVES: weakref.WeakKeyDictionary[Any, dict[tuple[Any, ...], dict[int, float]]] = (
    weakref.WeakKeyDictionary()
)
_LOCK = threading.Lock()


def rows_in_flight(model: Any, kv_budget_bytes: int, width: int) -> int:
    """:func:`pick_rows` on ``model``'s :func:`measure_curve` (measured on the first call for
    the model, its dtype, torch's thread count and the rows measured in this process, then
    reused), at most the
    rows whose key/value buffers fit ``kv_budget_bytes`` at ``width`` columns each (at least
    one).

    Args:
        model: A causal LM the engine runs.
        kv_budget_bytes: The engine's key/value budget.
        width: Columns a row is expected to hold (its context and one turn).
    """
    import torch

    from llm_gym.policies.hf_attention import KVCache

    parameter = next(model.parameters())
    cache = KVCache.for_model(model, parameter.dtype, parameter.device)
    most = max(1, kv_budget_bytes // cache.bytes_for(1, width))
    rows = tuple(r for r in CURVE_ROWS if r <= most) or (most,)
    key = (str(parameter.dtype), torch.get_num_threads(), rows)
    with _LOCK:
        curves = _CURVES.setdefault(model, {})
        if key not in curves:
            curves[key] = measure_curve(model, rows)
        curve = curves[key]
    return pick_rows(curve, most=most)
