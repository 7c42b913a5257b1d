"""PeakEWMA estimate and the Member that carries it."""

from __future__ import annotations

import math

import pytest

from gateway.routing import BalancerSettings, Member, PeakEwma, latency_signal
from tests.support import FakeClock


def make(clock: FakeClock, **kw: float) -> PeakEwma:
    return PeakEwma(clock=clock, **kw)


def test_unmeasured_member_is_probed_then_penalised() -> None:
    e = make(FakeClock(100.0), penalty_s=60.0)
    assert not e.has_history
    assert e.cost(0) == 0.0  # idle: try it
    assert e.cost(1) == 61.0  # first probe in flight: stay away
    assert e.cost(3) == 63.0  # and prefer the least-loaded unmeasured one


def test_estimate_decays_towards_zero_between_observations() -> None:
    c = FakeClock(100.0)
    e = make(c, decay_s=10.0)
    e.observe(1.0)
    assert e.estimate() == 1.0
    c.t += 10.0
    assert e.estimate() == pytest.approx(math.exp(-1))
    c.t += 100.0
    assert e.estimate() < 1e-4
    assert e.has_history


def test_higher_observation_jumps_to_the_peak() -> None:
    c = FakeClock(100.0)
    e = make(c)
    e.observe(0.1)
    c.t += 0.01
    e.observe(2.0)
    assert e.estimate() == 2.0


def test_lower_observation_moves_by_time_weight() -> None:
    c = FakeClock(100.0)
    e = make(c, decay_s=10.0)
    e.observe(1.0)
    c.t += 1.0
    e.observe(0.2)
    w = math.exp(-0.1)
    assert e.estimate() == pytest.approx(1.0 * w + 0.2 * (1 - w))


def test_steady_observations_converge_to_their_value() -> None:
    c = FakeClock(100.0)
    e = make(c, decay_s=10.0)
    e.observe(3.0)  # an early slow outlier
    for _ in range(2000):
        c.t += 0.05
        e.observe(0.3)
    assert e.estimate() == pytest.approx(0.3, rel=1e-3)


def test_reading_does_not_change_the_state() -> None:
    c = FakeClock(100.0)
    a, b = make(c), make(c)
    a.observe(1.0)
    b.observe(1.0)
    for _ in range(100):
        c.t += 0.01
        a.estimate()
    c.t += 1.0
    a.observe(0.5)
    b.observe(0.5)
    assert a.estimate() == b.estimate()


def test_failures_hold_the_estimate_without_changing_it() -> None:
    c = FakeClock(100.0)
    e = make(c, decay_s=10.0)
    e.observe(0.2)
    c.t += 10.0
    e.hold()  # a failure: no faster than before, but no slower either
    held = e.estimate()
    assert held == pytest.approx(0.2 * math.exp(-1))
    c.t += 0.5
    e.hold()  # failing meanwhile is no quiet spell: the estimate keeps its value
    assert e.estimate() == pytest.approx(held)
    c.t += 10.0  # once failures stop, it decays again
    assert e.estimate() == pytest.approx(held * math.exp(-1))
    assert e.observations == 1


def test_estimate_stays_finite_whatever_it_is_fed() -> None:
    c = FakeClock(100.0)
    e = make(c)
    for bad in (float("inf"), 1e300, -5.0, float("nan")):
        e.observe(bad)
        assert math.isfinite(e.estimate())
    assert e.estimate() <= 3600.0
    c.t += 1.0
    e.observe(0.05)
    assert math.isfinite(e.cost(10**6))


def test_cost_scales_with_in_flight() -> None:
    c = FakeClock(100.0)
    e = make(c)
    e.observe(0.5)
    assert e.cost(0) == 0.5
    assert e.cost(3) == 2.0


def test_decay_must_be_positive() -> None:
    with pytest.raises(ValueError):
        PeakEwma(decay_s=0)


def test_member_begin_end_tracks_load_and_outcome() -> None:
    c = FakeClock(100.0)
    m = BalancerSettings().make_member("a", max_inflight=2, clock=c)
    assert m.has_capacity()
    m.begin()
    m.begin()
    assert m.inflight == 2 and not m.has_capacity()
    m.end(0.25)
    assert m.inflight == 1 and m.ewma.estimate() == 0.25
    c.t += 1
    m.end(30.0, ok=False, error_kind="first_byte_timeout")
    assert m.inflight == 0
    assert (m.failures, m.last_error_kind, m.last_error_at) == (1, "first_byte_timeout", c.t)
    # The failure's 30 s never enter the latency estimate; the failure share carries it.
    assert m.ewma.estimate() == pytest.approx(0.25 * math.exp(-1 / 10))
    assert m.failure_share() > 0.1
    m.release()  # never below zero
    assert m.inflight == 0


def test_member_cost_uses_weight_and_load() -> None:
    c = FakeClock(100.0)
    m = Member("a", weight=2.0, clock=c)
    m.ewma.observe(1.0)
    m.begin()
    assert m.cost() == pytest.approx(1.0 * 2 / 2.0)
    assert Member("z", weight=0.0).cost() == float("inf")
    with pytest.raises(ValueError):
        Member("bad", max_inflight=0)


def test_latency_signal_rule() -> None:
    assert latency_signal("ttft", 0.3, 9.0, 500) == 0.3
    assert latency_signal("ttft", None, 0.8, 20) == 0.8  # non-streamed: total stands in
    assert latency_signal("per_token", 0.3, 10.0, 500) == pytest.approx(0.02)
    assert latency_signal("per_token", None, 4.0, 0) == 4.0  # nothing produced: not fast
    assert latency_signal("total", 0.3, 9.0, 500) == 9.0


def test_settings_configure_the_estimate() -> None:
    s = BalancerSettings.model_validate({"decay_s": 5, "penalty_ms": 1000, "failure_decay_s": 3})
    e = s.make_ewma(FakeClock(100.0))
    assert e.penalty_s == 1.0
    assert s.make_member("a", clock=FakeClock(100.0)).failure_decay_s == 3.0
    with pytest.raises(ValueError):
        BalancerSettings.model_validate({"strategy": "fastest"})
    with pytest.raises(ValueError):
        BalancerSettings.model_validate({"failure_decay_s": 0})
