"""The benchmarks' statistics: a median with a distribution-free interval, and the ratio of two
medians with a paired bootstrap interval.

**The median's interval** (:func:`median_interval`) is the order-statistic interval: for ``n``
values sorted ``x(1) <= ... <= x(n)``, the interval ``[x(k), x(n+1-k)]`` contains the population
median with probability ``1 - 2 * P(B <= k-1)``, ``B ~ Binomial(n, 1/2)``, whatever the
distribution (continuous; independent repeats). We take the largest ``k`` whose coverage is at
least 95%. Below 6 values no ``k`` reaches it: ``[min, max]`` is reported with the coverage it
has (93.75% for 5 values), and :attr:`Estimate.coverage` always says the true figure. We chose it
over a bootstrap of the median because it is exact at the small ``n`` a benchmark affords (a
bootstrap percentile interval of a median from 5 values undercovers and depends on a seed).

**The ratio's interval** (:func:`ratio_interval`) is a percentile bootstrap over paired repeats:
repeat ``r`` measured both contenders under the same load, so resampling draws whole repeats
(pairs) with replacement and recomputes ``median(a) / median(b)``. Up to 8 repeats the bootstrap
distribution is enumerated exactly (every multiset of repeats, weighted by its multinomial
probability; no randomness); above, it is sampled with a seeded generator.

Examples:
    >>> est = median_interval([3.0, 1.0, 2.0, 5.0, 4.0])
    >>> est.median, (est.low, est.high), est.coverage
    (3.0, (1.0, 5.0), 0.9375)
    >>> ratio_interval([1.0, 3.0], [1.0, 1.0]).as_json()
    {'median': 2.0, 'ci': [1.0, 3.0]}
"""

from __future__ import annotations

import itertools
import math
import random
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Estimate", "mean_interval", "median_interval", "order_statistic_rank", "ratio_interval"]

EXACT_BOOTSTRAP_MAX = 8
"""Most paired repeats whose bootstrap distribution is enumerated exactly (6,435 multisets at
8; 24,310 at 9)."""
BOOTSTRAP_SAMPLES = 20_000
"""Resamples of the seeded bootstrap above :data:`EXACT_BOOTSTRAP_MAX` repeats."""


@dataclass(frozen=True)
class Estimate:
    """A point estimate with an interval."""

    median: float
    """The median (or, from :func:`ratio_interval`, the ratio of two medians)."""
    low: float
    """The interval's lower end."""
    high: float
    """The interval's upper end."""
    coverage: float
    """The interval's coverage: exact for :func:`median_interval`, the nominal level for the
    bootstrap of :func:`ratio_interval`."""
    n: int
    """Values (or pairs) it comes from."""
    method: str
    """How the interval was made."""

    def as_json(self) -> dict[str, float | list[float]]:
        """``{"median": ..., "ci": [low, high]}`` (the results files' shape)."""
        return {"median": self.median, "ci": [self.low, self.high]}

    def format(self, spec: str = ".2f", scale: float = 1.0, suffix: str = "") -> str:
        """``"1.23 [1.10, 1.40]"``, each value times ``scale``."""
        a, b, c = (format(v * scale, spec) for v in (self.median, self.low, self.high))
        return f"{a}{suffix} [{b}, {c}]"


def mean_interval(values: list[float]) -> tuple[float, tuple[float, float]]:
    """The mean of ``values`` and its 95% normal interval.

    Example:
        >>> mean, (low, high) = mean_interval([0.0, 1.0])
        >>> mean, round(low, 2), round(high, 2)
        (0.5, -0.48, 1.48)
    """
    mean = statistics.fmean(values)
    half = 1.959964 * statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else 0
    return mean, (mean - half, mean + half)


def order_statistic_rank(n: int, confidence: float = 0.95) -> tuple[int, float]:
    """The rank ``k`` of the interval ``[x(k), x(n+1-k)]`` for the median and its coverage: the
    largest ``k`` with coverage >= ``confidence``, else ``k = 1``.

    Example:
        >>> order_statistic_rank(5), order_statistic_rank(6), order_statistic_rank(9)
        ((1, 0.9375), (1, 0.96875), (2, 0.9609375))
    """
    if n < 1:
        raise ValueError(f"Expected at least one value, got {n}.")
    best, best_coverage = 1, _coverage(n, 1)
    for k in range(2, (n + 1) // 2 + 1):
        coverage = _coverage(n, k)
        if coverage < confidence:
            break
        best, best_coverage = k, coverage
    return best, best_coverage


def _coverage(n: int, k: int) -> float:
    """``P(x(k) <= median <= x(n+1-k)) = 1 - 2 P(Binomial(n, 1/2) <= k - 1)``."""
    tail = sum(math.comb(n, i) for i in range(k)) / 2**n
    return max(0.0, 1.0 - 2.0 * tail)


def median_interval(values: Sequence[float], confidence: float = 0.95) -> Estimate:
    """The median of ``values`` with its order-statistic interval (see the module docstring)."""
    ordered = sorted(float(v) for v in values)
    n = len(ordered)
    k, coverage = order_statistic_rank(n, confidence)
    return Estimate(
        median=statistics.median(ordered),
        low=ordered[k - 1],
        high=ordered[n - k],
        coverage=coverage,
        n=n,
        method=f"order statistics x({k})..x({n + 1 - k}) of {n}",
    )


def ratio_interval(
    numerator: Sequence[float],
    denominator: Sequence[float],
    confidence: float = 0.95,
    *,
    seed: int = 0,
    samples: int = BOOTSTRAP_SAMPLES,
) -> Estimate:
    """``median(numerator) / median(denominator)`` with a paired percentile bootstrap interval.

    ``numerator[r]`` and ``denominator[r]`` come from the same repeat ``r``. The interval's ends
    are the smallest bootstrap ratios whose cumulative probability reaches ``(1 - confidence)/2``
    and ``(1 + confidence)/2``.
    """
    a = [float(v) for v in numerator]
    b = [float(v) for v in denominator]
    if len(a) != len(b) or not a:
        raise ValueError(
            f"Expected two equally long, non-empty paired sequences, got {len(a)} and {len(b)}."
        )
    if min(b) <= 0:
        raise ValueError(f"Expected positive denominators, got {b}.")
    n = len(a)
    ratios: list[tuple[float, float]] = []  # (ratio, probability)
    if n <= EXACT_BOOTSTRAP_MAX:
        method = f"paired percentile bootstrap, exact over {n} repeats"
        total = n**n
        for picks in itertools.combinations_with_replacement(range(n), n):
            weight = math.factorial(n)
            for count in Counter(picks).values():
                weight //= math.factorial(count)
            ratios.append((_resampled_ratio(a, b, picks), weight / total))
    else:
        method = f"paired percentile bootstrap, {samples} seeded resamples of {n} repeats"
        rng = random.Random(seed)
        for _ in range(samples):
            picks = [rng.randrange(n) for _ in range(n)]
            ratios.append((_resampled_ratio(a, b, picks), 1.0 / samples))
    ratios.sort()
    alpha = (1.0 - confidence) / 2
    return Estimate(
        median=statistics.median(a) / statistics.median(b),
        low=_quantile(ratios, alpha),
        high=_quantile(ratios, 1.0 - alpha),
        coverage=confidence,
        n=n,
        method=method,
    )


def _resampled_ratio(a: list[float], b: list[float], picks: Sequence[int]) -> float:
    return statistics.median(a[i] for i in picks) / statistics.median(b[i] for i in picks)


def _quantile(weighted: list[tuple[float, float]], q: float) -> float:
    """The smallest value whose cumulative probability reaches ``q`` (``weighted`` sorted)."""
    cumulative = 0.0
    for value, weight in weighted:
        cumulative += weight
        if cumulative >= q - 1e-12:
            return value
    return weighted[-1][0]
