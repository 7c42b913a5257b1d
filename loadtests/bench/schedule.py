"""Open-loop send schedules: when each request *should* leave, independent of responses.

Times are offsets in seconds from the start of the run. A schedule is bounded by a duration,
a count, or both (whichever ends first); at least one is required so every run stops by itself.
"""

from __future__ import annotations

import random
from typing import Literal

Arrival = Literal["constant", "poisson"]
MAX_SCHEDULED = 10_000_000  # hard cap on one schedule's length (memory guard)


def _bound(rate: float, duration: float | None, count: int | None) -> int:
    if rate <= 0:
        raise ValueError("rate must be positive")
    if duration is None and count is None:
        raise ValueError("a schedule needs a duration or a count")
    limit = count if count is not None else MAX_SCHEDULED
    return min(limit, MAX_SCHEDULED)


def constant_times(
    rate: float, duration: float | None = None, count: int | None = None
) -> list[float]:
    """Evenly spaced sends: ``i / rate``."""
    limit = _bound(rate, duration, count)
    out: list[float] = []
    i = 0
    while i < limit:
        t = i / rate
        if duration is not None and t >= duration:
            break
        out.append(t)
        i += 1
    return out


def poisson_times(
    rate: float, duration: float | None = None, count: int | None = None, seed: int = 0
) -> list[float]:
    """Poisson arrivals: exponential inter-arrival gaps with mean ``1 / rate``, seeded.

    The first request leaves at t=0 so that short runs always send something.
    """
    limit = _bound(rate, duration, count)
    rng = random.Random(seed)
    out: list[float] = []
    t = 0.0
    while len(out) < limit:
        if duration is not None and t >= duration:
            break
        out.append(t)
        t += rng.expovariate(rate)
    return out


def send_times(
    arrival: Arrival,
    rate: float,
    duration: float | None = None,
    count: int | None = None,
    seed: int = 0,
) -> list[float]:
    """Dispatch on ``arrival``."""
    if arrival == "constant":
        return constant_times(rate, duration, count)
    if arrival == "poisson":
        return poisson_times(rate, duration, count, seed)
    raise ValueError(f"unknown arrival process {arrival!r}")
