"""Retry budget (after Finagle's RetryBudget and Envoy's retry budgets).

Retries are allowed while ``retries <= ratio * requests + min_retries_per_s * window_s`` over a
sliding window. During an outage every request fails; without a budget each one would be
retried ``max_attempts`` times and multiply the load on whatever is still standing. With a
budget the extra load is capped at ``ratio`` (plus a small floor so that a quiet gateway can
still retry).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from gateway.resilience.window import BucketWindow


class RetryBudget:
    """Sliding-window budget; O(buckets) per call, no per-event allocation."""

    def __init__(
        self,
        ratio: float = 0.2,
        min_retries_per_s: float = 1.0,
        window_s: float = 10.0,
        buckets: int = 10,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if ratio < 0 or min_retries_per_s < 0:
            raise ValueError("ratio and min_retries_per_s must be >= 0")
        self.ratio = ratio
        self.min_retries_per_s = min_retries_per_s
        self.window_s = window_s
        self._clock = clock
        # Two counters per bucket: [requests, retries]
        self._window = BucketWindow(window_s, buckets, fields=2, clock=clock)

    def record_request(self) -> None:
        """Count one original (first-attempt) request; retries are not deposits."""
        self._window.add(0)

    def allowance(self) -> float:
        """How many retries the window allows in total right now."""
        requests, _ = self._window.totals()
        return self.ratio * requests + self.min_retries_per_s * self.window_s

    def has_room(self) -> bool:
        """Would `try_spend` succeed now? Spends nothing."""
        requests, retries = self._window.totals()
        return retries + 1 <= self.ratio * requests + self.min_retries_per_s * self.window_s

    def try_spend(self) -> bool:
        """Reserve one retry if the budget has room; False means: do not retry."""
        requests, retries = self._window.totals()
        if retries + 1 > self.ratio * requests + self.min_retries_per_s * self.window_s:
            return False
        self._window.add(1)
        return True

    def refund(self) -> None:
        """Give back a token `try_spend` reserved for a retry that was not made after all (no
        member was left to try)."""
        if self._window.totals()[1] > 0:
            self._window.add(1, -1)

    def counts(self) -> tuple[int, int]:
        """(requests, retries) currently in the window, for metrics and tests."""
        requests, retries = self._window.totals()
        return requests, retries
