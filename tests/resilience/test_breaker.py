"""Circuit breaker state machine, driven by a fake clock."""

from __future__ import annotations

import pytest

from gateway.resilience.breaker import (
    BreakerEvent,
    BreakerRegistry,
    BreakerSettings,
    BreakerState,
    CircuitBreaker,
)
from gateway.resilience.failures import FailureKind
from tests.support import FakeClock


def make(**kw: float) -> tuple[CircuitBreaker, FakeClock, list[BreakerEvent]]:
    clock = FakeClock(1000.0)
    events: list[BreakerEvent] = []
    defaults = dict(
        window_s=10,
        min_requests=10,
        failure_ratio=0.5,
        consecutive_failures=0,
        cooldown_s=5,
        max_cooldown_s=20,
        half_open_probes=2,
    )
    defaults.update(kw)
    b = CircuitBreaker("p1", BreakerSettings(**defaults), clock, listeners=[events.append])
    return b, clock, events


def test_ratio_trip_needs_min_requests() -> None:
    b, _, events = make()
    for _ in range(5):
        b.record_failure(FailureKind.UPSTREAM_5XX)
    assert b.state is BreakerState.CLOSED  # 5 < min_requests, even at 100% failures
    for _ in range(4):
        b.record_success()
    assert b.state is BreakerState.CLOSED  # 9 outcomes
    b.record_failure(FailureKind.CONNECT_ERROR)  # 6/10 failed
    assert b.state is BreakerState.OPEN
    assert events[-1].reason == "failure_ratio"
    assert not b.allow() and not b.acquire()


def test_low_failure_ratio_stays_closed() -> None:
    b, _, _ = make()
    for i in range(100):
        b.record_success() if i % 4 else b.record_failure(FailureKind.FIRST_BYTE_TIMEOUT)
    assert b.state is BreakerState.CLOSED


def test_old_failures_leave_the_window() -> None:
    b, clock, _ = make()
    for _ in range(9):
        b.record_failure(FailureKind.UPSTREAM_5XX)
    clock.advance(11)  # everything above is out of the 10 s window
    for _ in range(9):
        b.record_success()
    b.record_failure(FailureKind.UPSTREAM_5XX)
    assert b.state is BreakerState.CLOSED


def test_consecutive_trip_and_success_resets_streak() -> None:
    b, _, events = make(consecutive_failures=3, min_requests=1000)
    b.record_failure(FailureKind.CONNECT_TIMEOUT)
    b.record_failure(FailureKind.CONNECT_TIMEOUT)
    b.record_success()
    b.record_failure(FailureKind.CONNECT_TIMEOUT)
    b.record_failure(FailureKind.CONNECT_TIMEOUT)
    assert b.state is BreakerState.CLOSED
    b.record_failure(FailureKind.CONNECT_TIMEOUT)
    assert b.state is BreakerState.OPEN
    assert events[-1].reason == "consecutive_failures"
    assert events[-1].remaining_s == pytest.approx(5)


def test_4xx_and_429_do_not_trip() -> None:
    b, _, _ = make(consecutive_failures=2, min_requests=2)
    for _ in range(10):
        b.record_failure(FailureKind.UPSTREAM_4XX)
        b.record_failure(FailureKind.RATE_LIMITED)
    assert b.state is BreakerState.CLOSED


def trip(b: CircuitBreaker) -> None:
    for _ in range(10):
        b.record_failure(FailureKind.UPSTREAM_5XX)


def test_half_open_limits_concurrent_probes_and_closes_on_success() -> None:
    b, clock, events = make()
    trip(b)
    clock.advance(4.9)
    assert b.state is BreakerState.OPEN and not b.allow()
    clock.advance(0.2)
    assert b.state is BreakerState.HALF_OPEN
    assert b.allow()
    assert b.acquire() and b.acquire()  # two probe slots
    assert not b.allow() and not b.acquire()  # third is refused
    b.release()  # a probe abandoned by its client frees its slot
    assert b.acquire()
    b.record_success()
    assert b.state is BreakerState.CLOSED
    assert [e.new for e in events] == [
        BreakerState.OPEN,
        BreakerState.HALF_OPEN,
        BreakerState.CLOSED,
    ]
    assert events[-1].reason == "probe_succeeded"
    # The window was cleared: a single failure after recovery does not re-trip.
    b.record_failure(FailureKind.UPSTREAM_5XX)
    assert b.state is BreakerState.CLOSED


def test_probe_failure_reopens_with_doubling_cooldown_capped() -> None:
    b, clock, events = make()
    trip(b)
    cooldowns = [events[-1].remaining_s]
    for _ in range(4):
        clock.advance(cooldowns[-1] or 0)
        assert b.acquire()
        b.record_failure(FailureKind.IDLE_TIMEOUT)
        assert b.state is BreakerState.OPEN
        assert events[-1].reason == "probe_failed"
        cooldowns.append(events[-1].remaining_s)
    assert cooldowns == [5, 10, 20, 20, 20]
    # Recovery resets the doubling.
    clock.advance(20)
    assert b.acquire()
    b.record_success()
    trip(b)
    assert events[-1].remaining_s == 5


def test_retry_after_cooldown_is_separate_from_state() -> None:
    b, clock, events = make()
    b.cool_down(3.0)
    assert b.state is BreakerState.CLOSED
    assert not b.allow() and not b.acquire()
    assert events[-1].reason == "rate_limited" and events[-1].old == events[-1].new
    b.cool_down(1.0)  # a shorter Retry-After does not shorten the running one
    clock.advance(2.0)
    assert not b.allow()
    clock.advance(1.01)
    assert b.allow() and b.acquire()
    assert b.cooldown_until is None


def test_forced_states() -> None:
    b, clock, events = make()
    b.force(BreakerState.OPEN)
    clock.advance(3600)
    assert b.state is BreakerState.OPEN and not b.acquire()  # held, no half-open
    assert events[-1].source == "admin" and events[-1].until is None
    b.force(BreakerState.HALF_OPEN)
    assert b.acquire() and b.acquire() and not b.acquire()
    b.force(BreakerState.CLOSED)
    assert b.state is BreakerState.CLOSED and b.acquire()
    b.cool_down(10)
    b.force(BreakerState.CLOSED)  # closing by hand also clears a cool-down
    assert b.allow()


def test_remote_open_and_close() -> None:
    b, clock, events = make()
    b.apply_remote(BreakerState.OPEN, 2.0)
    assert not b.allow() and events[-1].source == "remote"
    clock.advance(2.0)
    assert b.state is BreakerState.HALF_OPEN
    b.apply_remote(BreakerState.CLOSED, None)
    assert b.state is BreakerState.CLOSED and events[-1].source == "remote"


def test_listener_errors_do_not_break_requests() -> None:
    reg = BreakerRegistry(BreakerSettings(consecutive_failures=1))

    def bad(_: BreakerEvent) -> None:
        raise RuntimeError("boom")

    reg.on_transition(bad)
    seen: list[BreakerEvent] = []
    reg.on_transition(seen.append)
    reg.get("a").record_failure(FailureKind.CONNECT_ERROR)
    assert reg.get("a").state is BreakerState.OPEN
    assert seen and seen[0].name == "a"
    assert reg.snapshot()["a"]["state"] == "open"
    only_b: list[BreakerEvent] = []
    reg.get("b").on_transition(only_b.append)
    reg.get("c").record_failure(FailureKind.CONNECT_ERROR)
    reg.get("b").record_failure(FailureKind.CONNECT_ERROR)
    assert [e.name for e in only_b] == ["b"]


def test_settings_validation() -> None:
    with pytest.raises(ValueError):
        BreakerSettings(cooldown_s=10, max_cooldown_s=5)
    with pytest.raises(ValueError):
        BreakerSettings(unknown=1)  # type: ignore[call-arg]


def test_early_probe_once_per_interval_while_open() -> None:
    b, clock, _ = make()
    trip(b)
    assert not b.early_probe()  # not right after the trip
    clock.advance(1.0)
    assert b.early_probe()  # one probe before the cool-down ends...
    assert not b.early_probe()  # ...and only one at a time
    b.record_success()
    assert b.state is BreakerState.CLOSED


def test_early_probe_failure_reopens_and_waits_again() -> None:
    b, clock, _ = make()
    trip(b)
    clock.advance(1.0)
    assert b.early_probe()
    b.record_failure()
    assert b.state is BreakerState.OPEN
    assert not b.early_probe()
    clock.advance(1.0)
    assert b.early_probe()


def test_no_early_probe_during_retry_after_or_when_forced() -> None:
    b, clock, _ = make()
    trip(b)
    b.cool_down(30)
    clock.advance(2.0)
    assert not b.early_probe()
    b2, clock2, _ = make()
    b2.force(BreakerState.OPEN)
    clock2.advance(5.0)
    assert not b2.early_probe()
