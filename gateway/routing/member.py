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
        self.last_error_at: float | None = None
        self.last_error_kind: str | None = None

    def __repr__(self) -> str:
        return f"Member({self.name!r}, inflight={self.inflight}, weight={self.weight})"

    def has_capacity(self) -> bool:
        """False when the member's concurrency limit is reached."""
        return self.max_inflight is None or self.inflight < self.max_inflight

    def cost(self, now: float | None = None) -> float:
        """PeakEWMA cost x (in-flight + 1), divided by weight (weight 0 = never)."""
        if self.weight <= 0:
            return float("inf")
        return self.ewma.cost(self.inflight, now) / self.weight

    def begin(self) -> float:
        """Count a request as in flight; returns its start time on the member's clock."""
        self.inflight += 1
        return self._clock()

    def end(
        self, latency_s: float, ok: bool = True, error_kind: str | None = None, floor: bool = True
    ) -> None:
        """Finish a request begun with `begin()` and record its outcome.

        `latency_s` is the signal chosen by the caller (see `latency_signal`).
        A failure is recorded as a penalised latency (see PeakEwma).
        """
        if self.inflight > 0:
            self.inflight -= 1
        now = self._clock()
        if ok:
            self.ewma.observe(latency_s, now)
            return
        self.failures += 1
        self.last_error_at = now
        self.last_error_kind = error_kind or "error"
        self.ewma.observe_failure(latency_s, now, floor=floor)

    def release(self) -> None:
        """Finish a request without recording anything (e.g. cancelled by the client)."""
        if self.inflight > 0:
            self.inflight -= 1
