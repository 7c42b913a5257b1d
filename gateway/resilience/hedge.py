"""Hedged requests: when an attempt is slower than the pool usually is, ask a second member too.

After the hedge delay (the pool's observed time to an answer at a percentile, p95 by default, or
a fixed delay) the same request goes to a second member of the pool; the first answer wins and
the other attempt is cancelled. A hedge spends one token of the retry budget, so hedging can add
at most the budget's share of extra upstream load, and at most one hedge is sent per request.
Off by default (Envoy's hedge_on_per_try_timeout, for LLM calls: "an answer" is the response
headers and body of a non-streamed call, the first event of a stream).

The delay follows each pool's recent successful attempts (time until the answer, or the first
event of a stream) in a small ring buffer; until it holds `min_samples` of them the fixed or the
fallback delay applies.
"""

from __future__ import annotations

import math
from collections import deque

from pydantic import BaseModel, ConfigDict, Field


class HedgeSettings(BaseModel):
    """A pool's hedging policy."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(False, description="Send a second attempt when the first is slow.")
    delay_ms: float | None = Field(
        None, gt=0, description="Fixed hedge delay; null: the pool's observed percentile."
    )
    percentile: float = Field(
        95.0, gt=0, lt=100, description="Observed time to an answer the delay follows."
    )
    min_delay_ms: float = Field(
        10.0, ge=0, description="Never hedge sooner than this (a p95 of a few ms is noise)."
    )
    fallback_delay_ms: float = Field(
        1000.0, gt=0, description="Delay until enough attempts were observed."
    )
    min_samples: int = Field(20, ge=1, description="Observed attempts before the percentile.")


class HedgeTracker:
    """Recent successful attempt durations per pool, and the hedge delay they give."""

    WINDOW = 256  # attempts kept per pool
    REFRESH = 16  # the percentile is recomputed after this many new samples

    def __init__(self) -> None:
        self._samples: dict[str, deque[float]] = {}
        self._cached: dict[str, tuple[int, float, float]] = {}  # pool -> (seen, pct, value)
        self._seen: dict[str, int] = {}
        self.sent: dict[str, int] = {}  # hedges sent per pool
        self.won: dict[str, int] = {}  # ...that answered first

    def observe(self, pool: str, seconds: float) -> None:
        if not math.isfinite(seconds) or seconds < 0:
            return
        window = self._samples.get(pool)
        if window is None:
            window = self._samples[pool] = deque(maxlen=self.WINDOW)
        window.append(seconds)
        self._seen[pool] = self._seen.get(pool, 0) + 1

    def percentile_s(self, pool: str, pct: float) -> float | None:
        """The pool's observed percentile (seconds), None without samples."""
        window = self._samples.get(pool)
        if not window:
            return None
        seen = self._seen[pool]
        cached = self._cached.get(pool)
        if cached is not None and cached[1] == pct and seen - cached[0] < self.REFRESH:
            return cached[2]
        ordered = sorted(window)
        value = ordered[min(len(ordered) - 1, math.ceil(pct / 100.0 * len(ordered)) - 1)]
        self._cached[pool] = (seen, pct, value)
        return value

    def delay_s(self, pool: str, settings: HedgeSettings) -> float:
        """How long the first attempt may run before a hedge is sent."""
        if settings.delay_ms is not None:
            return settings.delay_ms / 1000.0
        window = self._samples.get(pool)
        if window is None or len(window) < settings.min_samples:
            delay = settings.fallback_delay_ms / 1000.0
        else:
            delay = self.percentile_s(pool, settings.percentile) or 0.0
        return max(delay, settings.min_delay_ms / 1000.0)

    def count(self, pool: str, won: bool) -> None:
        self.sent[pool] = self.sent.get(pool, 0) + 1
        if won:
            self.won[pool] = self.won.get(pool, 0) + 1
