"""Summary statistics for latency samples.

Percentile method: linear interpolation between closest ranks, exactly numpy's default
(``method="linear"``, Hyndman & Fan type 7): for sorted values ``x[0..n-1]`` the q-th
percentile sits at rank ``h = (n - 1) * q / 100`` and equals
``x[i] + (h - i) * (x[i + 1] - x[i])`` with ``i = floor(h)``.
Standard deviation is the population one (ddof=0), also numpy's default.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

DEFAULT_QUANTILES: tuple[float, ...] = (50.0, 90.0, 99.0)


def percentile_sorted(sorted_values: Sequence[float], q: float) -> float:
    """Percentile ``q`` (0..100) of already sorted values; NaN when empty."""
    n = len(sorted_values)
    if n == 0:
        return math.nan
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile must be within 0..100, got {q}")
    h = (n - 1) * q / 100.0
    lo = math.floor(h)
    hi = min(lo + 1, n - 1)
    return sorted_values[lo] + (h - lo) * (sorted_values[hi] - sorted_values[lo])


def percentiles(values: Iterable[float], qs: Sequence[float] = DEFAULT_QUANTILES) -> list[float]:
    """Several percentiles of unsorted values with one sort."""
    ordered = sorted(values)
    return [percentile_sorted(ordered, q) for q in qs]


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and population standard deviation (ddof=0); NaN when empty."""
    n = len(values)
    if n == 0:
        return math.nan, math.nan
    mean = math.fsum(values) / n
    var = math.fsum((v - mean) ** 2 for v in values) / n
    return mean, math.sqrt(var)


@dataclass(frozen=True, slots=True)
class Summary:
    """Distribution summary of one metric (seconds for latencies)."""

    count: int
    mean: float
    std: float
    min: float
    p50: float
    p90: float
    p99: float
    p999: float
    max: float

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


def summarize(values: Iterable[float]) -> Summary:
    """Count, mean, std, min, p50, p90, p99, p99.9 and max (NaN fields when empty)."""
    ordered = sorted(values)
    mean, std = mean_std(ordered)
    if not ordered:
        nan = math.nan
        return Summary(0, nan, nan, nan, nan, nan, nan, nan, nan)
    p = [percentile_sorted(ordered, q) for q in (50.0, 90.0, 99.0, 99.9)]
    return Summary(len(ordered), mean, std, ordered[0], p[0], p[1], p[2], p[3], ordered[-1])


def log_edges(lo: float, hi: float, bins: int) -> list[float]:
    """Logarithmically spaced bin edges from ``lo`` to ``hi`` (latencies span decades)."""
    if lo <= 0 or hi <= lo or bins < 1:
        raise ValueError("need 0 < lo < hi and bins >= 1")
    step = (math.log(hi) - math.log(lo)) / bins
    return [math.exp(math.log(lo) + i * step) for i in range(bins + 1)]


def histogram(values: Iterable[float], edges: Sequence[float]) -> list[int]:
    """Counts per bin ``[edges[i], edges[i+1])``; values outside go to the first or last bin."""
    import bisect

    counts = [0] * (len(edges) - 1)
    last = len(counts) - 1
    for v in values:
        i = bisect.bisect_right(edges, v) - 1
        counts[min(max(i, 0), last)] += 1
    return counts


def window_index(times: Iterable[float], width: float, start: float = 0.0) -> dict[int, list[int]]:
    """Group positions of ``times`` into windows of ``width`` seconds from ``start``."""
    if width <= 0:
        raise ValueError("window width must be positive")
    groups: dict[int, list[int]] = {}
    for i, t in enumerate(times):
        groups.setdefault(int((t - start) // width), []).append(i)
    return groups


def ratio(value: float, reference: float) -> float:
    """``value / reference``, NaN when the reference is zero or missing."""
    if reference == 0 or math.isnan(reference) or math.isnan(value):
        return math.nan
    return value / reference
