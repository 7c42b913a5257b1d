"""A retry-budget token pays for a retry that is made: a failure with no member left to try (a
pool of one, a chain tried through, a broken stream with nobody to resume on) spends none, so a
failing pool cannot drain the process's budget and refuse the real retries of other requests
(real simulators on loopback)."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from loadtests.simulator.testing import Fleet
from tests.support import GatewayServer, poll

FLEET = ["solo", "broken", "good", "cutter", "an"]
pytestmark = pytest.mark.usefixtures("healthy_fleet")  # faults are cleared after each test

NO_BREAKER = "breaker: {consecutive_failures: 0, min_requests: 1000}"


def policy(fleet: Fleet) -> str:
    # Budget: no ratio, 0.3 retries a second over the 10 s window = 3 tokens in all.
    return f"""
providers:
  solo: {{base_url: '{fleet.url("solo")}', {NO_BREAKER}}}
  broken: {{base_url: '{fleet.url("broken")}', {NO_BREAKER}}}
  good: {{base_url: '{fleet.url("good")}'}}
  cutter: {{base_url: '{fleet.url("cutter")}', {NO_BREAKER}}}
  an: {{type: anthropic, base_url: '{fleet.root_url("an")}'}}
pools:
  solo: {{members: [solo]}}
  main: {{members: [broken, good], balancer: {{strategy: round_robin}}}}
  cut: {{members: [cutter]}}
  mixed: {{members: [an, solo], balancer: {{strategy: round_robin}}}}
models:
  solo: {{pool: solo, cache: {{exact: {{enabled: false}}}}}}
  chat: {{pool: main, cache: {{exact: {{enabled: false}}}}}}
  cut: {{pool: cut, resume: true, cache: {{exact: {{enabled: false}}}}}}
  mixed: {{pool: mixed, cache: {{exact: {{enabled: false}}}}}}
retry: {{base_backoff_ms: 0, max_backoff_ms: 0, budget_ratio: 0, budget_min_per_s: 0.3}}
"""


def spent(gw: GatewayServer) -> int:
    return int(gw.pipeline.dispatcher.budget.counts()[1])


def real_retries_still_work(gw: GatewayServer) -> None:
    """`chat` tries `broken` first (round robin), then `good`: a retry the budget must allow."""
    for _ in range(2):
        r = gw.chat()
        assert r.status_code == 200, r.text
        assert r.headers["x-gateway-provider"] == "good"
        assert r.headers["x-gateway-attempts"] == "2"


def test_a_failing_pool_of_one_spends_no_retry_token(
    fleet: Fleet, gateway: Callable[..., GatewayServer]
) -> None:
    fleet.set_faults("solo", error_rate=1.0, error_status=[503])
    fleet.set_faults("broken", error_rate=1.0, error_status=[503])
    gw = gateway(policy(fleet))
    for stream in (False, True, False, True, False):
        r = gw.chat(model="solo", stream=stream)
        assert r.status_code == 502, r.text
    assert spent(gw) == 0
    real_retries_still_work(gw)
    assert spent(gw) == 2


def test_an_unsupported_member_then_a_failure_spends_no_retry_token(
    fleet: Fleet, gateway: Callable[..., GatewayServer]
) -> None:
    fleet.set_faults("solo", error_rate=1.0, error_status=[503])
    fleet.set_faults("broken", error_rate=1.0, error_status=[503])
    gw = gateway(policy(fleet))
    for _ in range(4):  # `an` cannot embed (nothing sent), `solo` fails: nobody is left
        r = httpx.post(
            gw.base_url + "/embeddings", json={"model": "mixed", "input": "hello"}, timeout=10
        )
        assert r.status_code == 502, r.text
    assert spent(gw) == 0
    real_retries_still_work(gw)


def test_a_broken_stream_with_nobody_to_resume_on_spends_no_retry_token(
    fleet: Fleet, gateway: Callable[..., GatewayServer]
) -> None:
    fleet.set_faults("cutter", cut_stream_after_chunks=2)
    fleet.set_faults("broken", error_rate=1.0, error_status=[503])
    gw = gateway(policy(fleet))
    for _ in range(4):
        r = gw.chat(model="cut", stream=True, max_tokens=30)
        assert r.status_code == 200
        assert b'"error"' in r.content  # ended with an error event: nothing to resume on
    poll(lambda: len(gw.seen) == 4)
    assert all(ctx.status == 502 for ctx in gw.seen)
    assert spent(gw) == 0
    real_retries_still_work(gw)
