"""One upstream member of a pool, as the balancers see it.

A member tracks its own in-flight count and latency estimate. The caller
brackets every request with `begin()` and `end()`; which latency to report
is the caller's choice, and `latency_signal` implements the rule we use:
time to first token for interactive or streamed traffic, time per output
token for long generations (their total time says more about their length
than about the member's speed).
"""

from __future__ import annotations

import time
from typing import Literal

from gateway.routing.peak_ewma import Clock, PeakEwma

SignalKind = Literal["ttft", "per_token", "total"]

# Weight of the newest outcome in the moving failure share (about the last 10 outcomes count).
ERROR_ALPHA = 0.1
# A member failing everything costs at most 20x its latency-based cost (the breaker handles more).
MIN_SUCCESS_SHARE = 0.05


def latency_signal(
    kind: SignalKind,
    ttft_s: float | None,
    total_s: float,
    output_tokens: int | None,
) -> float:
    """The latency to feed the estimate for one finished request.

    - "ttft": time to first token; a non-streamed response has no first token
      of its own, so its total time stands in.
    - "per_token": total time per output token (0 or unknown tokens fall back
      to the total time; a member that returned nothing is not fast).
    - "total": the whole request time.
    Pools should use one kind consistently: the estimates are compared.
    """
    if kind == "ttft":
        return ttft_s if ttft_s is not None else total_s
    if kind == "per_token":
        if output_tokens and output_tokens > 0:
            return total_s / output_tokens
        return total_s
    return total_s


class Member:
    """Routing state of one upstream: weight, concurrency limit, load, latency."""

    __slots__ = (
        "_clock",
        "error_rate",
        "ewma",
        "failures",
        "inflight",
        "last_error_at",
        "last_error_kind",
        "max_inflight",
        "name",
        "weight",
    )

    def __init__(
        self,
        name: str,
        weight: float = 1.0,
        max_inflight: int | None = None,
        ewma: PeakEwma | None = None,
        clock: Clock = time.monotonic,
    ) -> None:
        if weight < 0:
            raise ValueError("weight must be >= 0")
        if max_inflight is not None and max_inflight < 1:
            raise ValueError("max_inflight must be >= 1 or None")
        self.name = name
        self.weight = weight
        self.max_inflight = max_inflight
        self._clock = clock
        self.ewma = ewma if ewma is not None else PeakEwma(clock=clock)
        self.inflight = 0
        self.failures = 0
        self.error_rate = 0.0  # moving share of recent outcomes that failed
        self.last_error_at: float | None = None
        self.last_error_kind: str | None = None

    def __repr__(self) -> str:
        return f"Member({self.name!r}, inflight={self.inflight}, weight={self.weight})"

    def has_capacity(self) -> bool:
        """False when the member's concurrency limit is reached."""
        return self.max_inflight is None or self.inflight < self.max_inflight

    def cost(self, now: float | None = None) -> float:
        """PeakEWMA cost x (in-flight + 1), divided by weight (weight 0 = never) and by the
        recent success share, so a member that fails fast never looks fast."""
        if self.weight <= 0:
            return float("inf")
        base = self.ewma.cost(self.inflight, now)
        if self.error_rate and not self.ewma.has_history:
            # Never answered, only failed: as unknown as a member being probed, not free.
            base = max(base, self.ewma.penalty_s)
        success = max(MIN_SUCCESS_SHARE, 1.0 - self.error_rate)
        return base / (self.weight * success)

    def begin(self) -> float:
        """Count a request as in flight; returns its start time on the member's clock."""
        self.inflight += 1
        return self._clock()

    def end(self, latency_s: float, ok: bool = True, error_kind: str | None = None) -> None:
        """Finish a request begun with `begin()` and record its outcome.

        `latency_s` is the signal chosen by the caller (see `latency_signal`).
        A failure is recorded as a penalised latency (see PeakEwma).
        """
        if self.inflight > 0:
            self.inflight -= 1
        now = self._clock()
        if ok:
            self.error_rate *= 1.0 - ERROR_ALPHA
            self.ewma.observe(latency_s, now)
            return
        self._failed(now, error_kind)
        self.ewma.observe_failure(latency_s, now)

    def fail_fast(self, error_kind: str | None = None) -> None:
        """Finish a request that failed at once (refused, 5xx, 429, broken stream).

        Its time says nothing about the member's speed, so the latency estimate is left alone;
        the failure lowers the member's success share instead (see `cost`). A dead member thus
        loses traffic gradually and keeps getting enough of it for its breaker to trip quickly
        (and tell the other replicas), and a recovered one is not shunned for minutes.
        """
        if self.inflight > 0:
            self.inflight -= 1
        self._failed(self._clock(), error_kind)

    def _failed(self, now: float, error_kind: str | None) -> None:
        self.failures += 1
        self.error_rate = self.error_rate * (1.0 - ERROR_ALPHA) + ERROR_ALPHA
        self.last_error_at = now
        self.last_error_kind = error_kind or "error"

    def release(self) -> None:
        """Finish a request without recording anything (e.g. cancelled by the client)."""
        if self.inflight > 0:
            self.inflight -= 1
