"""One upstream member of a pool, as the balancers see it.

A member tracks its own in-flight count and latency estimate. The caller
brackets every request with `begin()` and `end()`; which latency to report
is the caller's choice, and `latency_signal` implements the rule we use:
time to first token for interactive or streamed traffic, time per output
token for long generations (their total time says more about their length
than about the member's speed).
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Literal, Protocol

from gateway.routing.peak_ewma import Clock, PeakEwma

SignalKind = Literal["ttft", "per_token", "total"]

# Least weight of the newest outcome in the moving failure share (about the last 10 outcomes
# count under load; when outcomes are sparse, time weighs more, see `Member._outcome`).
ERROR_ALPHA = 0.1
# A member failing everything costs at most 20x its latency-based cost (the breaker handles more).
MAX_FAILURE_FACTOR = 20.0


class SlotPool(Protocol):
    """Slots shared with the other worker processes (gateway.resilience.slots.SlotFiles)."""

    capacity: int

    def try_acquire(self) -> int | None: ...
    def release(self, index: int) -> None: ...
    def close(self) -> None: ...


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


def failure_factor(share: float) -> float:
    """Cost multiplier for a member whose recent outcomes failed in this share.

    1 / success_share squared: the first failures cost little (a member must keep some traffic
    for its breaker to see them), a member failing most of its requests costs 10-20x, more than
    the in-flight load of its healthy peers can offset (a fast failure finishes at once, so its
    member always looks idle).
    """
    success = 1.0 - share
    if success <= 0:
        return MAX_FAILURE_FACTOR
    return min(MAX_FAILURE_FACTOR, 1.0 / (success * success))


class Member:
    """Routing state of one upstream: weight, concurrency limit, load, latency."""

    __slots__ = (
        "_clock",
        "_fail_share",
        "_fail_stamp",
        "_held",
        "_spare",
        "ewma",
        "failure_decay_s",
        "failures",
        "inflight",
        "last_error_at",
        "last_error_kind",
        "max_inflight",
        "name",
        "slots",
        "weight",
    )

    def __init__(
        self,
        name: str,
        weight: float = 1.0,
        max_inflight: int | None = None,
        ewma: PeakEwma | None = None,
        clock: Clock = time.monotonic,
        failure_decay_s: float = 2.0,
    ) -> None:
        if weight < 0:
            raise ValueError("weight must be >= 0")
        if failure_decay_s <= 0:
            raise ValueError("failure_decay_s must be > 0")
        if max_inflight is not None and max_inflight < 1:
            raise ValueError("max_inflight must be >= 1 or None")
        self.name = name
        self.weight = weight
        self.max_inflight = max_inflight
        self._clock = clock
        self.ewma = ewma if ewma is not None else PeakEwma(clock=clock)
        self.inflight = 0
        self.failures = 0
        # Moving share of recent outcomes that failed, forgotten with time constant
        # `failure_decay_s` while nothing happens: a shunned member is probed again soon.
        self.failure_decay_s = failure_decay_s
        self._fail_share = 0.0
        self._fail_stamp = clock()
        self.last_error_at: float | None = None
        self.last_error_kind: str | None = None
        # With several workers, a small max_inflight is shared through `slots`: a request holds
        # one while in flight (`_held`); `_spare` is one taken by `has_capacity` for the
        # `begin` that follows in the same turn of the event loop (given back after it).
        self.slots: SlotPool | None = None
        self._held: list[int | None] = []
        self._spare: int | None = None

    def __repr__(self) -> str:
        return f"Member({self.name!r}, inflight={self.inflight}, weight={self.weight})"

    def has_capacity(self) -> bool:
        """False when the member's concurrency limit is reached (with shared slots: when every
        worker's slots are taken)."""
        if self.max_inflight is not None and self.inflight >= self.max_inflight:
            return False
        if self.slots is None or self._spare is not None:
            return True
        index = self.slots.try_acquire()
        if index is None:
            return False
        # Held for the `begin` that picks this member in the same turn of the loop: another
        # worker cannot take it between the check and the start.
        self._spare = index
        try:
            asyncio.get_running_loop().call_soon(self._drop_spare)
        except RuntimeError:  # no loop (a plain call): nothing will begin in this turn
            self._drop_spare()
        return True

    def share_slots(self, slots: SlotPool | None) -> None:
        """Share the limit through `slots` (None: this process's own limit only)."""
        if self.slots is slots:
            return
        self._drop_spare()
        if self.slots is not None:
            self.slots.close()  # slots still held by requests are freed with their files
        self._held = [None] * len(self._held)
        self.slots = slots

    def _drop_spare(self) -> None:
        if self._spare is not None and self.slots is not None:
            self.slots.release(self._spare)
        self._spare = None

    def _take_slot(self) -> None:
        if self.slots is None:
            return
        index, self._spare = self._spare, None
        if index is None:
            index = self.slots.try_acquire()  # None: begun without a check (counted in flight)
        self._held.append(index)

    def _free_slot(self) -> None:
        if self._held:
            index = self._held.pop()
            if index is not None and self.slots is not None:
                self.slots.release(index)

    def failure_share(self, now: float | None = None) -> float:
        """Share of recent outcomes that failed, in [0, 1], decayed to `now`."""
        share = self._fail_share
        if not share:
            return 0.0
        if now is None:
            now = self._clock()
        dt = now - self._fail_stamp
        return share if dt <= 0 else share * math.exp(-dt / self.failure_decay_s)

    @property
    def error_rate(self) -> float:
        return self.failure_share()

    def cost(self, now: float | None = None) -> float:
        """PeakEWMA cost x (in-flight + 1), divided by weight (weight 0 = never) and by the
        recent success share, so a member that fails (fast or slow) never looks fast.

        Bounded: at most MAX_FAILURE_FACTOR times the latency cost, and the failure share
        fades within seconds once failures stop, so no sequence of failures starves a member.
        """
        if self.weight <= 0:
            return float("inf")
        if now is None:
            now = self._clock()
        share = self.failure_share(now)
        base = self.ewma.cost(self.inflight, now)
        if share and not self.ewma.has_history:
            # Never answered, only failed: as unknown as a member being probed (not free), until
            # the failures fade.
            base = max(base, share * self.ewma.penalty_s)
        return base * failure_factor(share) / self.weight

    def begin(self) -> float:
        """Count a request as in flight; returns its start time on the member's clock."""
        self.inflight += 1
        self._take_slot()
        return self._clock()

    def end(self, latency_s: float, ok: bool = True, error_kind: str | None = None) -> None:
        """Finish a request begun with `begin()` and record its outcome.

        `latency_s` is the signal chosen by the caller (see `latency_signal`). Only successes
        feed the latency estimate; a failure, fast or slow, raises the failure share instead.
        """
        if self.inflight > 0:
            self.inflight -= 1
            self._free_slot()
        now = self._clock()
        if ok:
            self._outcome(now, 0.0)
            self.ewma.observe(latency_s, now)
            return
        self._failed(now, error_kind)

    def fail_fast(self, error_kind: str | None = None) -> None:
        """Finish a request that failed (refused, 5xx, 429, broken answer, timeout...).

        A failure's time says nothing reliable about the member's speed (a hang lasts as long as
        our own timeout; a broken answer is quick), so the latency estimate is only held where
        it is; the failure lowers the member's success share (see `cost`). A dead member thus
        loses traffic gradually and keeps getting enough of it for its breaker to trip quickly
        (and tell the other replicas), and a recovered one is back within seconds.
        """
        if self.inflight > 0:
            self.inflight -= 1
            self._free_slot()
        self._failed(self._clock(), error_kind)

    def _outcome(self, now: float, failed: float) -> None:
        """Fold one outcome (1.0 failed, 0.0 succeeded) into the failure share."""
        current = self.failure_share(now)
        if not current and not failed:
            self._fail_stamp = now  # the common case: nothing failed lately
            return
        dt = max(now - self._fail_stamp, 0.0)
        # Under load each outcome weighs ERROR_ALPHA; when outcomes are sparse, elapsed time
        # does (like the latency estimate), so a lone failure after a quiet spell counts more
        # (at most half: one outcome alone never makes a member look all-failing).
        alpha = max(ERROR_ALPHA, min(0.5, 1.0 - math.exp(-dt / self.failure_decay_s)))
        self._fail_share = current * (1.0 - alpha) + failed * alpha
        self._fail_stamp = now

    def _failed(self, now: float, error_kind: str | None) -> None:
        self.failures += 1
        self._outcome(now, 1.0)
        self.ewma.hold(now)
        self.last_error_at = now
        self.last_error_kind = error_kind or "error"

    def outrun(self, elapsed_s: float) -> None:
        """Finish a request abandoned after `elapsed_s` without an answer because another
        member answered first (a hedge race): this member was at least that slow, which only
        ever raises its estimate; not a failure."""
        if self.inflight > 0:
            self.inflight -= 1
            self._free_slot()
        now = self._clock()
        if elapsed_s > self.ewma.estimate(now):
            self.ewma.observe(elapsed_s, now)

    def release(self) -> None:
        """Finish a request without recording anything (e.g. cancelled by the client)."""
        if self.inflight > 0:
            self.inflight -= 1
            self._free_slot()
