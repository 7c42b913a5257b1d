"""Peak-sensitive, time-decayed latency estimate (after Finagle's PeakEwma).

The estimate reacts at once to a slower observation (it jumps to the peak)
and recovers only gradually: a lower observation moves it towards the new
value by `1 - exp(-dt / decay_s)`, where `dt` is the time since the previous
observation, so the weight of history depends on time, not on how many
requests arrived. Between observations the estimate decays towards zero with
the same time constant; a member that was slow and then left alone therefore
becomes cheap again after a while and gets re-probed (its next observation
puts the estimate back where it belongs). Reading never changes the state.

No history: like Finagle, a member nobody has measured costs 0 while idle
(so it is probed at once) and `penalty_s + in_flight` while its first
requests are in flight (so it is not flooded before its first answer).

Failures: an error is observed as a latency of
`max(latency, estimate * failure_multiplier, failure_penalty_s)`, so a
member that fails fast never looks fast.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

Clock = Callable[[], float]


class PeakEwma:
    """Latency estimate in seconds; not thread-safe (one event loop owns it)."""

    __slots__ = (
        "_clock",
        "_cost",
        "_stamp",
        "_tau",
        "failure_multiplier",
        "failure_penalty_s",
        "observations",
        "penalty_s",
    )

    def __init__(
        self,
        decay_s: float = 10.0,
        penalty_s: float = 60.0,
        failure_penalty_s: float = 5.0,
        failure_multiplier: float = 4.0,
        clock: Clock = time.monotonic,
    ) -> None:
        if decay_s <= 0:
            raise ValueError("decay_s must be > 0")
        self._tau = decay_s
        self.penalty_s = penalty_s
        self.failure_penalty_s = failure_penalty_s
        self.failure_multiplier = failure_multiplier
        self._clock = clock
        self._cost = 0.0
        self._stamp = clock()
        self.observations = 0

    @property
    def has_history(self) -> bool:
        return self.observations > 0

    def estimate(self, now: float | None = None) -> float:
        """Current latency estimate (seconds), decayed to `now`."""
        if now is None:
            now = self._clock()
        dt = now - self._stamp
        if dt <= 0:
            return self._cost
        return self._cost * math.exp(-dt / self._tau)

    def observe(self, latency_s: float, now: float | None = None) -> None:
        """Fold one successful observation into the estimate."""
        if now is None:
            now = self._clock()
        latency_s = max(latency_s, 0.0)
        dt = max(now - self._stamp, 0.0)
        w = math.exp(-dt / self._tau)
        decayed = self._cost * w
        # Peak: a slower observation replaces the estimate outright.
        self._cost = latency_s if latency_s > decayed else decayed + latency_s * (1.0 - w)
        self._stamp = now
        self.observations += 1

    def observe_failure(self, latency_s: float = 0.0, now: float | None = None) -> None:
        """Fold a failure in as a high latency (never lower than the penalty floor)."""
        if now is None:
            now = self._clock()
        current = self.estimate(now)
        self.observe(max(latency_s, current * self.failure_multiplier, self.failure_penalty_s), now)

    def cost(self, in_flight: int, now: float | None = None) -> float:
        """Load-weighted cost for power-of-two-choices: estimate x (in_flight + 1)."""
        if self.observations == 0:
            return 0.0 if in_flight <= 0 else self.penalty_s + in_flight
        return self.estimate(now) * (in_flight + 1)
