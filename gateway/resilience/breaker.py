"""Per-provider circuit breaker: closed -> open -> half-open -> closed.

* **closed**: requests flow; outcomes feed a bucketed sliding window. The breaker trips when
  the failure ratio over ``window_s`` reaches ``failure_ratio`` (once ``min_requests`` were
  seen) or after ``consecutive_failures`` failures in a row.
* **open**: nothing is sent for the cool-down; repeated trips double it up to ``max_cooldown_s``.
* **half-open**: at most ``half_open_probes`` requests at a time probe the provider; a probe
  success closes the breaker, a probe failure opens it again.

An outcome only counts as a probe's verdict when it comes from a probe: a request admitted before the
breaker opened (a long stream, a request hanging until its timeout) that ends during the half-open
period is counted in the window, but does not reopen the breaker nor free a probe slot it never held
(see :meth:`CircuitBreaker.ticket`).

A 429 with Retry-After is not a failure trip: :meth:`CircuitBreaker.cool_down` blocks the member
until a timestamp, independently of the state machine. Every change is reported to listeners
as a :class:`BreakerEvent` so metrics, logs and replica sharing hook in from outside.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gateway.resilience.failures import (
    MAX_RETRY_AFTER_S,
    FailureKind,
    counts_against_breaker,
    trips_at_once,
)
from gateway.resilience.window import BucketWindow

log = logging.getLogger(__name__)

Source = Literal["local", "remote", "admin"]
_OK, _FAIL = 0, 1


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class BreakerSettings(BaseModel):
    """Thresholds of one breaker (defaults suit an LLM provider seeing a few requests/s)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    window_s: float = Field(default=30.0, gt=0, description="Sliding window for the failure ratio.")
    buckets: int = Field(default=10, ge=1, le=600, description="Buckets the window is split into.")
    min_requests: int = Field(
        default=10, ge=1, description="Outcomes needed before the ratio counts."
    )
    failure_ratio: float = Field(
        default=0.5, gt=0, le=1, description="Trip at or above this ratio."
    )
    consecutive_failures: int = Field(
        default=5, ge=0, description="Trip after N in a row; 0 = off."
    )
    cooldown_s: float = Field(default=5.0, gt=0, description="Open time after the first trip.")
    max_cooldown_s: float = Field(default=60.0, gt=0, description="Cap of the doubling open time.")
    half_open_probes: int = Field(default=1, ge=1, description="Concurrent probes when half-open.")
    early_probe_interval_s: float = Field(
        default=0.5,
        gt=0,
        description="While every member a request could use is open, one request per interval "
        "probes the member whose cool-down ends soonest (recovery is noticed within about this).",
    )

    @model_validator(mode="after")
    def _check(self) -> BreakerSettings:
        if self.max_cooldown_s < self.cooldown_s:
            raise ValueError("max_cooldown_s must be >= cooldown_s")
        return self


@dataclass(frozen=True, slots=True)
class BreakerEvent:
    """One transition (or a cool-down, where ``old == new``).

    ``until`` is on the breaker's (monotonic) clock; ``remaining_s`` is the same deadline as a
    duration, which is what crosses process boundaries. Both are None when open indefinitely
    (forced) or when closing.
    """

    name: str
    old: BreakerState
    new: BreakerState
    reason: str
    until: float | None
    remaining_s: float | None
    source: Source


Listener = Callable[[BreakerEvent], None]
# What an admission was (see CircuitBreaker.ticket): the breaker's period and whether it was a probe.
Ticket = tuple[int, bool]


class CircuitBreaker:
    """One provider's breaker. Not thread-safe: it lives on the event loop's thread."""

    def __init__(
        self,
        name: str,
        settings: BreakerSettings | None = None,
        clock: Callable[[], float] = time.monotonic,
        listeners: list[Listener] | None = None,
    ) -> None:
        self.name = name
        self.settings = settings or BreakerSettings()
        self._clock = clock
        self._listeners: list[Listener] = listeners if listeners is not None else []  # shared
        self._own_listeners: list[Listener] = []
        self._window = BucketWindow(
            self.settings.window_s, self.settings.buckets, fields=2, clock=clock
        )
        self._state = BreakerState.CLOSED
        self._open_until = 0.0  # math.inf when forced open
        self._cooldown_until = 0.0
        self._consecutive = 0
        self._trips = 0  # trips since the last close: drives the doubling cool-down
        self._probes = 0  # probes in flight while half-open
        self._last_early_probe = 0.0  # last trip or early probe (see early_probe)
        self._period = 0  # counts state changes: tells a probe from a request admitted before

    def on_transition(self, callback: Listener) -> None:
        """Call ``callback(event)`` on every transition of this breaker only."""
        self._own_listeners.append(callback)

    # ---- read-only views -------------------------------------------------------------------

    @property
    def state(self) -> BreakerState:
        """The state as of now (an elapsed open period reads as half-open)."""
        if self._state is BreakerState.OPEN and self._clock() >= self._open_until:
            return BreakerState.HALF_OPEN
        return self._state

    @property
    def cooldown_until(self) -> float | None:
        """End of a Retry-After cool-down still running (breaker clock), else None."""
        return self._cooldown_until if self._clock() < self._cooldown_until else None

    @property
    def open_until(self) -> float | None:
        """End of the open period (breaker clock) while open, else None."""
        return self._open_until if self._state is BreakerState.OPEN else None

    def allow(self) -> bool:
        """Could a request be sent now? No side effects; use :meth:`acquire` to send."""
        if self._clock() < self._cooldown_until:
            return False
        state = self.state
        if state is BreakerState.CLOSED:
            return True
        if state is BreakerState.HALF_OPEN:
            probes = 0 if self._state is BreakerState.OPEN else self._probes
            return probes < self.settings.half_open_probes
        return False

    def probe_wanted(self) -> bool:
        """Half-open with a probe slot free: the next request should go here to test recovery."""
        if self._state is BreakerState.CLOSED:
            return False
        return self.state is BreakerState.HALF_OPEN and self.allow()

    def early_probe(self, min_interval_s: float | None = None) -> bool:
        """Admit one probe before the open period ends, at most once per interval
        (`early_probe_interval_s` unless given).

        For when every member a request could use is open: rather than answer degraded for the
        rest of a (possibly doubled) cool-down after providers came back, one request at a time
        tests the member. Never during a Retry-After cool-down or a breaker held open by hand.
        Like :meth:`acquire`, a True must be followed by one outcome call.
        """
        now = self._clock()
        if min_interval_s is None:
            min_interval_s = self.settings.early_probe_interval_s
        if (
            self._state is not BreakerState.OPEN
            or math.isinf(self._open_until)
            or now < self._cooldown_until
            or now - self._last_early_probe < min_interval_s
        ):
            return False
        self._last_early_probe = now
        self._open_until = now
        return self.acquire()

    def blocked_for_s(self) -> float | None:
        """Seconds until this breaker admits requests again; None when it admits now or when it
        is held open by hand (no known end)."""
        now = self._clock()
        until = self._cooldown_until
        if self._state is BreakerState.OPEN and now < self._open_until:
            until = max(until, self._open_until)
        if until <= now or math.isinf(until):
            return None
        return until - now

    def snapshot(self) -> dict[str, Any]:
        now = self._clock()
        ok, failed = self._window.totals()
        return {
            "state": self.state.value,
            "open_remaining_s": _remaining(self._open_until, now)
            if self._state is BreakerState.OPEN
            else None,
            "cooldown_remaining_s": _remaining(self._cooldown_until, now)
            if now < self._cooldown_until
            else None,
            "window_successes": ok,
            "window_failures": failed,
            "consecutive_failures": self._consecutive,
            "probes_in_flight": self._probes,
        }

    # ---- request path ----------------------------------------------------------------------

    def acquire(self) -> bool:
        """Admit one request now; in half-open this reserves a probe slot.

        Every True must be followed by exactly one of :meth:`record_success`,
        :meth:`record_failure` or :meth:`release`.
        """
        now = self._clock()
        self._advance(now)
        if now < self._cooldown_until:
            return False
        if self._state is BreakerState.CLOSED:
            return True
        if self._state is BreakerState.HALF_OPEN and self._probes < self.settings.half_open_probes:
            self._probes += 1
            return True
        return False

    def ticket(self) -> Ticket:
        """What the admission just granted by :meth:`acquire` (or :meth:`early_probe`) is: pass
        it back with its outcome, so that only a probe of the current half-open period decides
        it (or frees its slot). Outcomes without a ticket count as probes when half-open."""
        return self._period, self._state is BreakerState.HALF_OPEN

    def _is_probe(self, ticket: Ticket | None) -> bool:
        return ticket is None or ticket == (self._period, True)

    def release(self, ticket: Ticket | None = None) -> None:
        """Give back an admission without an outcome (e.g. the client went away)."""
        if self._state is BreakerState.HALF_OPEN and self._probes > 0 and self._is_probe(ticket):
            self._probes -= 1

    def record_success(self) -> None:
        now = self._clock()
        self._advance(now)
        self._window.add(_OK)
        self._consecutive = 0
        if self._state is BreakerState.HALF_OPEN:
            self._close("probe_succeeded", "local")

    def record_failure(
        self, kind: FailureKind = FailureKind.UPSTREAM_5XX, ticket: Ticket | None = None
    ) -> None:
        """Count a failed attempt; kinds that are no health signal only free a probe slot.

        While half-open only a probe's failure reopens the breaker: a request admitted before it
        opened says nothing about the provider since then."""
        now = self._clock()
        self._advance(now)
        if not counts_against_breaker(kind):
            self.release(ticket)
            return
        self._window.add(_FAIL)
        self._consecutive += 1
        if self._state is BreakerState.HALF_OPEN:
            if self._is_probe(ticket):
                self._trip(now, "probe_failed")
        elif self._state is BreakerState.CLOSED:
            reason = kind.value if trips_at_once(kind) else self._trip_reason()
            if reason is not None:
                self._trip(now, reason)

    def cool_down(self, seconds: float, source: Source = "local") -> None:
        """Block this member for ``seconds`` (a 429's Retry-After); never shortens one."""
        if seconds <= 0 or not math.isfinite(seconds):
            return
        now = self._clock()
        until = now + min(seconds, MAX_RETRY_AFTER_S)
        if until <= self._cooldown_until:
            return
        self._cooldown_until = until
        state = self.state
        self._emit(state, state, "rate_limited", until, seconds, source)

    # ---- admin and replica sharing ---------------------------------------------------------

    def force(self, state: BreakerState, source: Source = "admin") -> None:
        """Set the state by hand. Forced open holds until forced to another state."""
        now = self._clock()
        if state is BreakerState.CLOSED:
            self._cooldown_until = 0.0
            self._close("forced", source)
        elif state is BreakerState.OPEN:
            old = self.state
            self._state, self._open_until, self._probes = BreakerState.OPEN, math.inf, 0
            self._period += 1
            self._emit(old, BreakerState.OPEN, "forced", None, None, source)
        else:
            old = self.state
            self._state, self._probes = BreakerState.HALF_OPEN, 0
            self._period += 1
            self._emit(old, BreakerState.HALF_OPEN, "forced", now, 0.0, source)

    def apply_remote(self, state: BreakerState, remaining_s: float | None) -> None:
        """Apply a transition seen on another replica (reported with ``source="remote"``).

        ``remaining_s`` None with OPEN means held open (forced there). A timed open lasts at
        most this breaker's own ``max_cooldown_s`` (a peer's message never keeps a provider out
        longer than this process itself would) and never ends an open held here by hand.
        """
        if state is BreakerState.CLOSED:
            if self._state is not BreakerState.CLOSED:
                self._close("remote", "remote")
            return
        if state is BreakerState.OPEN:
            now = self._clock()
            if remaining_s is not None:
                if self._state is BreakerState.OPEN and math.isinf(self._open_until):
                    return  # held open by hand here: only a close or a force ends that
                remaining_s = min(max(0.0, remaining_s), self.settings.max_cooldown_s)
            until = math.inf if remaining_s is None else now + remaining_s
            old = self.state
            self._state, self._open_until, self._probes = BreakerState.OPEN, until, 0
            self._consecutive = 0
            self._period += 1
            self._emit(old, BreakerState.OPEN, "remote", _finite(until), remaining_s, "remote")

    # ---- internals -------------------------------------------------------------------------

    def _trip_reason(self) -> str | None:
        s = self.settings
        if s.consecutive_failures and self._consecutive >= s.consecutive_failures:
            return "consecutive_failures"
        ok, failed = self._window.totals()
        total = ok + failed
        if total >= s.min_requests and failed >= s.failure_ratio * total:
            return "failure_ratio"
        return None

    def _trip(self, now: float, reason: str) -> None:
        s = self.settings
        self._trips += 1
        cooldown = min(s.cooldown_s * 2.0 ** min(self._trips - 1, 32), s.max_cooldown_s)
        old = self._state
        self._state, self._open_until = BreakerState.OPEN, now + cooldown
        self._probes = self._consecutive = 0
        self._period += 1
        self._last_early_probe = now
        self._emit(old, BreakerState.OPEN, reason, self._open_until, cooldown, "local")

    def _close(self, reason: str, source: Source) -> None:
        old = self.state
        self._state, self._open_until = BreakerState.CLOSED, 0.0
        self._probes = self._consecutive = self._trips = 0
        self._period += 1
        self._window.clear()  # failures from before the outage must not re-trip at once
        if old is not BreakerState.CLOSED or reason == "forced":
            self._emit(old, BreakerState.CLOSED, reason, None, None, source)

    def _advance(self, now: float) -> None:
        if self._state is BreakerState.OPEN and now >= self._open_until:
            self._state, self._probes = BreakerState.HALF_OPEN, 0
            self._period += 1
            self._emit(BreakerState.OPEN, BreakerState.HALF_OPEN, "cooldown_elapsed", now, 0.0)

    def _emit(
        self,
        old: BreakerState,
        new: BreakerState,
        reason: str,
        until: float | None,
        remaining_s: float | None,
        source: Source = "local",
    ) -> None:
        event = BreakerEvent(self.name, old, new, reason, until, remaining_s, source)
        for listener in (*self._listeners, *self._own_listeners):
            try:
                listener(event)
            except Exception:  # a broken listener must not break the request path
                log.exception("breaker listener failed for %s", self.name)


def _remaining(until: float, now: float) -> float | None:
    return None if math.isinf(until) else max(0.0, until - now)


def _finite(until: float) -> float | None:
    return None if math.isinf(until) else until


class BreakerRegistry:
    """All breakers of one gateway process, created on first use, sharing listeners."""

    def __init__(
        self,
        settings: BreakerSettings | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings or BreakerSettings()
        self._clock = clock
        self._breakers: dict[str, CircuitBreaker] = {}
        self._listeners: list[Listener] = []

    def get(self, name: str, settings: BreakerSettings | None = None) -> CircuitBreaker:
        """The breaker for ``name``; ``settings`` only applies when it is created."""
        breaker = self._breakers.get(name)
        if breaker is None:
            breaker = CircuitBreaker(
                name, settings or self.settings, self._clock, listeners=self._listeners
            )
            self._breakers[name] = breaker
        return breaker

    def find(self, name: str) -> CircuitBreaker | None:
        """The breaker for ``name`` if this process has one (never creates it)."""
        return self._breakers.get(name)

    def on_transition(self, callback: Listener) -> None:
        """Call ``callback(event)`` on every transition of every breaker, present and future."""
        self._listeners.append(callback)

    def names(self) -> list[str]:
        return list(self._breakers)

    def snapshot(self) -> dict[str, dict[str, Any]]:
        return {name: b.snapshot() for name, b in self._breakers.items()}
