"""Failures are bounded in their effect on routing: a recovered member is back within seconds.

Property: after any sequence of failures (fast or slow, any kind, any latency, inf and NaN
included), the latency estimate stays finite, and one success plus a few seconds make the
member cost about as much as an identical member that never failed.
"""

from __future__ import annotations

import math
import random

import pytest

from gateway.routing import BalancerSettings, Member, P2CPeakEwma
from tests.routing.test_routing_balancer import Backend, Sim, share
from tests.support import FakeClock

KINDS = ("connect_error", "first_byte_timeout", "idle_timeout", "upstream_5xx", "broken_answer")
LATENCIES = (0.0, 0.001, 0.5, 3.0, 30.0, 600.0, 1e9, float("inf"), float("nan"))


def twins(clock: FakeClock) -> tuple[Member, Member]:
    """Two members with the same healthy history."""
    s = BalancerSettings(decay_s=10.0, failure_decay_s=2.0)
    a, b = s.make_member("failing", clock=clock), s.make_member("peer", clock=clock)
    for _ in range(20):
        clock.t += 0.05
        for m in (a, b):
            m.begin()
            m.end(0.05)
    return a, b


def fail_randomly(m: Member, clock: FakeClock, rng: random.Random, n: int) -> None:
    for _ in range(n):
        clock.t += rng.choice((0.0, 0.001, 0.05, 1.0, 30.0))
        m.begin()
        if rng.random() < 0.5:
            m.fail_fast(rng.choice(KINDS))
        else:  # the old slow-failure path: a failure with its (possibly absurd) latency
            m.end(rng.choice(LATENCIES), ok=False, error_kind=rng.choice(KINDS))
        assert math.isfinite(m.ewma.estimate())
        assert math.isfinite(m.cost())


@pytest.mark.parametrize("seed", range(40))
def test_any_failure_sequence_one_success_and_four_seconds_bring_it_back(seed: int) -> None:
    rng = random.Random(seed)
    clock = FakeClock()
    failing, peer = twins(clock)
    fail_randomly(failing, clock, rng, rng.choice((1, 5, 50, 720, 3000)))
    failing.begin()
    failing.end(0.05)  # one success
    peer.begin()
    peer.end(0.05)
    clock.t += 4.0
    assert math.isfinite(failing.cost())
    assert failing.cost() <= 1.5 * peer.cost(), (failing.failure_share(), failing.ewma.estimate())


@pytest.mark.parametrize("seed", range(10))
def test_a_shunned_member_is_probed_again_without_any_success(seed: int) -> None:
    """Decay towards a probe: with no traffic at all, failures fade within seconds."""
    rng = random.Random(100 + seed)
    clock = FakeClock()
    failing, peer = twins(clock)
    fail_randomly(failing, clock, rng, 200)
    clock.t += 6.0
    peer.begin()
    peer.end(0.05)  # the peer keeps serving at its usual latency
    assert failing.cost() <= 1.1 * peer.cost()


def test_a_member_that_never_answered_and_failed_is_probed_again() -> None:
    clock = FakeClock()
    m = BalancerSettings().make_member("new", clock=clock)
    for _ in range(100):
        m.begin()
        m.fail_fast("connect_error")
    assert m.cost() >= 50.0  # unknown and failing: not free
    clock.t += 20.0
    assert m.cost() < 0.01  # faded: it will be probed


def test_estimate_is_finite_after_hundreds_of_slow_failures() -> None:
    """The old rule multiplied the estimate by 4 per slow failure: inf after ~720 of them."""
    clock = FakeClock()
    failing, peer = twins(clock)
    for _ in range(720):
        clock.t += 0.01
        failing.begin()
        failing.end(3.0, ok=False, error_kind="first_byte_timeout")
    assert failing.ewma.estimate() <= 0.05
    assert math.isfinite(failing.cost())
    for m in (failing, peer):
        m.begin()
        m.end(0.05)
    clock.t += 4.0
    assert failing.cost() <= 1.5 * peer.cost()


@pytest.mark.parametrize("fault", ["hang", "refuse", "broken"])
def test_recovered_member_back_in_rotation_within_seconds(fault: str) -> None:
    """Three members at 30 req/s; one fails for 30 s; then it is healthy again. Its share of
    traffic in 1-second windows is back to half its fair share within 5 s."""
    sim = Sim(P2CPeakEwma(), rate=30, seed=7, settings=BalancerSettings(decay_s=10.0))
    for n in ("a", "b", "x"):
        sim.add(n, Backend(0.1))
    sim.run(10)
    sim.backends["x"] = {
        "hang": Backend(3.0, ok=False),  # first-byte timeouts after 3 s
        "refuse": Backend(0.001, ok=False),
        "broken": Backend(0.002, ok=False),
    }[fault]
    during = sim.run(30)
    assert share(during, "x") < 0.2
    sim.backends["x"] = Backend(0.1)
    back_after = None
    for second in range(1, 16):
        if share(sim.run(1.0), "x") >= 1 / 6:
            back_after = second
            break
    assert back_after is not None and back_after <= 5, back_after
