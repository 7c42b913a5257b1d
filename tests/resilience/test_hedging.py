"""Hedged requests: a second member when the first is slow, first answer wins, bounded by budget."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
import pytest

from gateway.resilience.hedge import HedgeSettings, HedgeTracker
from loadtests.simulator.testing import Fleet
from tests.support import GatewayServer, poll, requests_at, validate, validate_sse

FLEET = ["slow", "ok"]
pytestmark = pytest.mark.usefixtures("healthy_fleet")  # faults are cleared after each test


def policy(fleet: Fleet, hedge: str = "", retry: str = "") -> str:
    return f"""
providers:
  slow: {{base_url: '{fleet.url("slow")}'}}
  ok: {{base_url: '{fleet.url("ok")}'}}
pools:
  main:
    members: [slow, ok]
    balancer: {{strategy: round_robin}}
    {hedge}
models:
  chat: {{pool: main}}
retry: {{base_backoff_ms: 0, max_backoff_ms: 0 {retry}}}
"""


HEDGE = "hedge: {enabled: true, delay_ms: 100}"


def metric(gw: GatewayServer, outcome: str) -> float:
    for line in httpx.get(gw.url + "/metrics", timeout=5).text.splitlines():
        if line.startswith(f'gateway_hedges_total{{outcome="{outcome}",pool="main"}}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_slow_first_member_is_hedged_and_the_fast_answer_wins(
    fleet: Fleet,
    gateway: Callable[..., GatewayServer],
) -> None:
    fleet.set_faults("slow", spike_rate=1.0, spike_ms=2000)
    gw = gateway(policy(fleet, HEDGE))
    t0 = time.monotonic()
    r = gw.chat()
    took = time.monotonic() - t0
    assert r.status_code == 200, r.text
    validate("CreateChatCompletionResponse", r.json())
    assert r.headers["x-gateway-hedged"] == "true"
    assert r.headers["x-gateway-provider"] == "ok"
    assert r.headers["x-gateway-attempts"] == "2"
    assert took < 1.0  # not the 2 s of the slow member
    assert (metric(gw, "sent"), metric(gw, "won")) == (1.0, 1.0)
    assert gw.seen[-1].hedged and gw.seen[-1].failures == []
    slow = gw.runtime.snapshot.providers["slow"]
    poll(lambda: slow.member.inflight == 0)  # the losing attempt was cancelled and settled
    poll(lambda: fleet.stats("slow")["in_flight"] == 0)  # and its upstream request dropped


def test_streams_are_hedged_on_their_first_event(
    fleet: Fleet,
    gateway: Callable[..., GatewayServer],
) -> None:
    fleet.set_faults("slow", slow_first_token_ms=2000)
    gw = gateway(policy(fleet, HEDGE))
    r = gw.chat(stream=True)
    assert r.status_code == 200
    validate_sse(r.content)
    assert r.headers["x-gateway-hedged"] == "true"
    assert r.headers["x-gateway-provider"] == "ok"
    poll(lambda: fleet.stats("slow")["in_flight"] == 0)


def test_no_hedge_when_off_fast_or_out_of_budget(
    fleet: Fleet,
    gateway: Callable[..., GatewayServer],
) -> None:
    fleet.set_faults("slow", spike_rate=1.0, spike_ms=600)
    off = gateway(policy(fleet))  # off by default
    r = off.chat()
    assert r.headers["x-gateway-provider"] == "slow" and "x-gateway-hedged" not in r.headers
    no_budget = gateway(policy(fleet, HEDGE, retry=", budget_ratio: 0, budget_min_per_s: 0"))
    r = no_budget.chat()
    assert r.headers["x-gateway-provider"] == "slow" and "x-gateway-hedged" not in r.headers
    fleet.clear_faults("slow")
    fast = gateway(policy(fleet, HEDGE))
    before = requests_at(fleet, "ok")
    for _ in range(4):
        r = fast.chat()
        assert r.status_code == 200 and "x-gateway-hedged" not in r.headers
    assert requests_at(fleet, "ok") == before + 2  # round robin only: no extra upstream calls


def test_a_failing_first_attempt_lets_the_hedge_answer(
    fleet: Fleet,
    gateway: Callable[..., GatewayServer],
) -> None:
    """The hedge was sent; the slow first attempt then fails: the hedge's answer is taken."""
    fleet.set_faults("slow", hang=True)
    gw = gateway(
        policy(fleet, HEDGE).replace(
            f"slow: {{base_url: '{fleet.url('slow')}'}}",
            f"slow: {{base_url: '{fleet.url('slow')}', timeouts: {{first_byte_s: 0.3, "
            "total_s: 0.3}}",
        )
    )
    r = gw.chat()
    assert r.status_code == 200 and r.headers["x-gateway-provider"] == "ok"
    assert r.headers["x-gateway-hedged"] == "true"


def test_tracker_follows_the_observed_percentile() -> None:
    tracker = HedgeTracker()
    s = HedgeSettings(enabled=True, min_samples=20, fallback_delay_ms=700, min_delay_ms=5)
    assert tracker.delay_s("p", s) == pytest.approx(0.7)  # nothing observed yet
    for i in range(100):
        tracker.observe("p", (i + 1) / 1000.0)  # 1..100 ms
    assert tracker.delay_s("p", s) == pytest.approx(0.095)
    assert tracker.delay_s("p", s.model_copy(update={"percentile": 50.0})) == pytest.approx(0.05)
    assert tracker.delay_s("p", s.model_copy(update={"delay_ms": 30.0})) == pytest.approx(0.03)
    assert tracker.delay_s("p", s.model_copy(update={"min_delay_ms": 500.0})) == 0.5
    tracker.observe("p", float("nan"))  # ignored
    for _ in range(300):
        tracker.observe("p", 0.2)  # the window moves on
    assert tracker.delay_s("p", s) == pytest.approx(0.2)
