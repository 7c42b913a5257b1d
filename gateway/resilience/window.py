"""A time-bucketed sliding window of counters.

Both the breaker and the retry budget need "how many X in the last N seconds". Keeping every
event in a list costs memory and time proportional to traffic; a ring of fixed buckets costs a
constant: each bucket covers ``window_s / buckets`` seconds and is reset lazily when reused.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class BucketWindow:
    """``fields`` integer counters per bucket over a ring of ``buckets`` buckets."""

    __slots__ = ("_width", "_n", "_fields", "_epochs", "_counts", "_clock")

    def __init__(
        self,
        window_s: float,
        buckets: int = 10,
        fields: int = 2,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if window_s <= 0 or buckets < 1 or fields < 1:
            raise ValueError("window_s > 0, buckets >= 1 and fields >= 1 are required")
        self._width = window_s / buckets
        self._n = buckets
        self._fields = fields
        self._epochs = [-1] * buckets
        self._counts = [[0] * fields for _ in range(buckets)]
        self._clock = clock

    def add(self, field: int, amount: int = 1) -> None:
        epoch = int(self._clock() / self._width)
        slot = epoch % self._n
        if self._epochs[slot] != epoch:
            self._epochs[slot] = epoch
            row = self._counts[slot]
            for i in range(self._fields):
                row[i] = 0
        self._counts[slot][field] += amount

    def totals(self) -> list[int]:
        """Sum of each counter over the buckets still inside the window."""
        oldest = int(self._clock() / self._width) - self._n + 1
        sums = [0] * self._fields
        for slot in range(self._n):
            if self._epochs[slot] >= oldest:
                row = self._counts[slot]
                for i in range(self._fields):
                    sums[i] += row[i]
        return sums

    def clear(self) -> None:
        for slot in range(self._n):
            self._epochs[slot] = -1
