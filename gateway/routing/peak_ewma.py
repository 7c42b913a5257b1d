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

Failures are not latencies: they never enter the estimate (a member's
failure share is kept next to it, see `Member`). A failure only `hold`s the
estimate where it is: a member that keeps failing is no evidence of a member
that got faster, so its estimate must not decay towards zero meanwhile.
Every input is clamped to `[0, MAX_LATENCY_S]`, so the estimate is always finite.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

Clock = Callable[[], float]

# No observation counts as more than an hour: the estimate stays finite whatever it is fed.
MAX_LATENCY_S = 3600.0


class PeakEwma:
    """Latency estimate in seconds; not thread-safe (one event loop owns it)."""

    __slots__ = ("_clock", "_cost", "_holding", "_stamp", "_tau", "observations", "penalty_s")

    def __init__(
        self, decay_s: float = 10.0, penalty_s: float = 60.0, clock: Clock = time.monotonic
    ) -> None:
        if decay_s <= 0:
            raise ValueError("decay_s must be > 0")
        self._tau = decay_s
        self.penalty_s = penalty_s
        self._clock = clock
        self._cost = 0.0
        self._stamp = clock()
        self._holding = False  # the last event was a failure
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
        if latency_s != latency_s:  # NaN says nothing
            return
        if now is None:
            now = self._clock()
        latency_s = min(max(latency_s, 0.0), MAX_LATENCY_S)
        dt = max(now - self._stamp, 0.0)
        w = math.exp(-dt / self._tau)
        decayed = self._cost * w
        # Peak: a slower observation replaces the estimate outright.
        self._cost = latency_s if latency_s > decayed else decayed + latency_s * (1.0 - w)
        self._stamp = now
        self._holding = False
        self.observations += 1

    def hold(self, now: float | None = None) -> None:
        """A failure: time spent failing does not count as a quiet spell, so the estimate keeps
        its value from one failure to the next instead of decaying towards zero meanwhile."""
        if now is None:
            now = self._clock()
        if not self._holding:
            self._cost = self.estimate(now)  # the quiet spell before the first failure counts
            self._holding = True
        self._stamp = max(self._stamp, now)

    def cost(self, in_flight: int, now: float | None = None) -> float:
        """Load-weighted cost for power-of-two-choices: estimate x (in_flight + 1)."""
        if self.observations == 0:
            return 0.0 if in_flight <= 0 else self.penalty_s + in_flight
        return self.estimate(now) * (in_flight + 1)
