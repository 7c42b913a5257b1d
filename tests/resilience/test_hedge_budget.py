"""A hedge spends a retry-budget token only when it is sent: slow requests in a hedging pool with
no second member free (a pool of one, the other member open or full) leave the budget to the
retries of every other request of the process (real simulators on loopback)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from gateway.resilience.breaker import BreakerState
from loadtests.simulator.testing import Fleet
from tests.support import GatewayServer

FLEET = ["slow", "other", "broken", "good"]
pytestmark = pytest.mark.usefixtures("healthy_fleet")  # faults are cleared after each test


def policy(fleet: Fleet, hedged_members: str) -> str:
    # Budget: no ratio, 0.3 retries a second over the 10 s window = 3 tokens in all.
    return f"""
providers:
  slow: {{base_url: '{fleet.url("slow")}'}}
  other: {{base_url: '{fleet.url("other")}', max_inflight: 1}}
  broken: {{base_url: '{fleet.url("broken")}', breaker: {{consecutive_failures: 0}}}}
  good: {{base_url: '{fleet.url("good")}'}}
pools:
  hedged:
    members: [{hedged_members}]
    balancer: {{strategy: round_robin}}
    hedge: {{enabled: true, delay_ms: 30}}
  main:
    members: [broken, good]
    balancer: {{strategy: round_robin}}
models:
  chat: {{pool: main, cache: {{exact: {{enabled: false}}}}}}
  hedged: {{pool: hedged, cache: {{exact: {{enabled: false}}}}}}
retry: {{base_backoff_ms: 0, max_backoff_ms: 0, budget_ratio: 0, budget_min_per_s: 0.3}}
"""


@pytest.mark.parametrize("hedged_members", ["slow", "slow, other"])
@pytest.mark.parametrize("stream", [False, True])
def test_hedges_never_sent_spend_no_retry_budget(
    fleet: Fleet,
    gateway: Callable[..., GatewayServer],
    hedged_members: str,
    stream: bool,
) -> None:
    fleet.set_faults("slow", spike_rate=1.0, spike_ms=300, slow_first_token_ms=300)
    fleet.set_faults("other", refuse_connections=True)
    fleet.set_faults("broken", error_rate=1.0, error_status=[503])
    gw = gateway(policy(fleet, hedged_members))
    if "other" in hedged_members:
        # The second member's breaker is held open: no hedge can go there.
        gw.runtime.snapshot.providers["other"].breaker.force(BreakerState.OPEN)
    for _ in range(5):  # each outlasts the hedge delay; no second member can take a hedge
        r = gw.chat(model="hedged", stream=stream)
        assert r.status_code == 200, r.text
        assert r.headers["x-gateway-provider"] == "slow"
        assert "x-gateway-hedged" not in r.headers
    assert gw.pipeline.dispatcher.budget.counts()[1] == 0
    # The budget is whole: a request whose first member fails is retried on the next one.
    for _ in range(2):
        r = gw.chat(stream=stream)
        assert r.status_code == 200, r.text
        assert r.headers["x-gateway-provider"] == "good"
        assert r.headers["x-gateway-attempts"] == "2"
        assert gw.seen[-1].failures == ["broken:upstream_5xx"]


def test_a_hedge_sent_still_spends_its_token(
    fleet: Fleet, gateway: Callable[..., GatewayServer]
) -> None:
    fleet.set_faults("slow", spike_rate=1.0, spike_ms=600)
    gw = gateway(policy(fleet, "slow, good"))
    r = gw.chat(model="hedged")
    assert r.status_code == 200, r.text
    assert r.headers["x-gateway-hedged"] == "true"
    assert r.headers["x-gateway-provider"] == "good"
    assert gw.pipeline.dispatcher.budget.counts()[1] == 1
