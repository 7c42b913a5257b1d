"""Only a half-open breaker's probes decide it: a request admitted before the breaker opened (a
long stream, a request hanging until its timeout) that ends during the half-open period is
counted, but neither reopens the breaker (with a doubled cool-down) while the probe is still out,
nor frees a probe slot it never held (letting more probes than `half_open_probes` through)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from gateway.resilience.breaker import BreakerSettings, BreakerState, CircuitBreaker
from gateway.resilience.failures import FailureKind
from tests.support import FakeClock, GatewayServer, JsonRawServer, completion_body, poll

SETTINGS = BreakerSettings(consecutive_failures=2, cooldown_s=1.0, half_open_probes=1)


def opened_with_a_request_in_flight() -> tuple[CircuitBreaker, FakeClock, tuple[int, bool]]:
    """A breaker that opened while one request it admitted earlier was still running."""
    clock = FakeClock(100.0)
    b = CircuitBreaker("p", SETTINGS, clock)
    assert b.acquire()
    earlier = b.ticket()
    for _ in range(2):
        assert b.acquire()
        b.record_failure(FailureKind.UPSTREAM_5XX, b.ticket())
    assert b.state is BreakerState.OPEN
    return b, clock, earlier


@pytest.mark.parametrize(
    "kind", [FailureKind.FIRST_BYTE_TIMEOUT, FailureKind.UPSTREAM_5XX, FailureKind.STREAM_BROKEN]
)
def test_a_failure_admitted_before_the_trip_does_not_decide_the_half_open_breaker(
    kind: FailureKind,
) -> None:
    b, clock, earlier = opened_with_a_request_in_flight()
    clock.advance(1.1)
    assert b.acquire()  # the probe
    b.record_failure(kind, earlier)  # the old request gives up now
    assert b.state is BreakerState.HALF_OPEN
    assert b.snapshot()["window_failures"] == 3  # counted all the same
    assert not b.acquire()  # the probe's slot is still taken
    b.record_success()  # the probe answers: the provider is back
    assert b.state is BreakerState.CLOSED


@pytest.mark.parametrize("ending", ["release", "client_error", "rate_limited"])
def test_an_earlier_request_ending_without_verdict_does_not_free_the_probe_slot(
    ending: str,
) -> None:
    b, clock, earlier = opened_with_a_request_in_flight()
    clock.advance(1.1)
    assert b.acquire()
    if ending == "release":
        b.release(earlier)  # its client went away
    elif ending == "client_error":
        b.record_failure(FailureKind.UPSTREAM_4XX, earlier)
    else:
        b.record_failure(FailureKind.RATE_LIMITED, earlier)
    assert not b.acquire()  # still one probe at a time
    assert b.snapshot()["probes_in_flight"] == 1


def test_the_probe_own_outcomes_still_decide() -> None:
    b, clock, _ = opened_with_a_request_in_flight()
    clock.advance(1.1)
    assert b.acquire()
    probe = b.ticket()
    assert probe[1]
    b.release(probe)  # a probe whose client left frees its slot
    assert b.acquire()
    b.record_failure(FailureKind.UPSTREAM_5XX, b.ticket())  # a probe's failure reopens
    assert b.state is BreakerState.OPEN
    assert b.snapshot()["open_remaining_s"] == pytest.approx(2.0)  # doubled
    clock.advance(2.1)
    assert b.acquire()
    b.record_failure(FailureKind.UPSTREAM_5XX)  # without a ticket: taken as a probe's
    assert b.state is BreakerState.OPEN


# -- through the gateway ---------------------------------------------------------------------


class Scripted(JsonRawServer):
    """An upstream whose answer is named by the request's last message: `late-503` answers a
    503 after 1.5 s, `503` at once, `slow-ok` a completion after 1.2 s, anything else at once."""

    async def answer(self, request: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        what = request["messages"][-1]["content"]
        if what in ("late-503", "503"):
            await asyncio.sleep(1.5 if what == "late-503" else 0.0)
            return 503, {"error": {"message": "overloaded", "type": "server_error"}}
        if what == "slow-ok":
            await asyncio.sleep(1.2)
        return 200, completion_body("ok")


@pytest.fixture
def scripted() -> Iterator[Scripted]:
    with Scripted() as s:
        yield s


def test_a_recovered_provider_closes_although_an_old_request_fails_during_its_probe(
    scripted: Scripted, gateway: Callable[..., GatewayServer]
) -> None:
    gw = gateway(
        f"""
providers:
  p: {{base_url: '{scripted.url}', breaker: {{consecutive_failures: 2, cooldown_s: 0.5}}}}
pools:
  main: {{members: [p]}}
models:
  chat: {{pool: main, cache: {{exact: {{enabled: false}}}}}}
retry: {{max_attempts: 1}}
"""
    )

    def ask(text: str) -> httpx.Response:
        body = {"model": "chat", "messages": [{"role": "user", "content": text}]}
        return httpx.post(gw.base_url + "/chat/completions", json=body, timeout=10)

    results: dict[str, int] = {}
    old = threading.Thread(target=lambda: results.update(old=ask("late-503").status_code))
    old.start()  # admitted while closed; fails 1.5 s later, during the probe below
    time.sleep(0.1)
    assert ask("503").status_code == 502
    assert ask("503").status_code == 502
    assert gw.breaker("p")["state"] == "open"
    time.sleep(0.6)  # the cool-down ends
    probe = threading.Thread(target=lambda: results.update(probe=ask("slow-ok").status_code))
    probe.start()  # out from about 0.75 s to 1.95 s; the old request fails at 1.5 s
    poll(lambda: gw.breaker("p")["probes_in_flight"] == 1, within_s=1.0)
    assert ask("second probe?").status_code == 503  # one probe at a time
    old.join()
    probe.join()
    assert results == {"old": 502, "probe": 200}
    poll(lambda: gw.breaker("p")["state"] == "closed", within_s=2.0)
    assert ask("after").status_code == 200


# -- opens reported by other replicas ---------------------------------------------------------


def test_a_peer_open_lasts_at_most_this_breaker_max_cooldown() -> None:
    clock = FakeClock(100.0)
    b = CircuitBreaker("p", BreakerSettings(cooldown_s=5, max_cooldown_s=60), clock)
    b.apply_remote(BreakerState.OPEN, 80_000.0)  # a peer with another policy, or a forged one
    assert b.state is BreakerState.OPEN
    assert b.snapshot()["open_remaining_s"] == pytest.approx(60.0)
    assert b.blocked_for_s() == pytest.approx(60.0)
    clock.advance(60.1)
    assert b.state is BreakerState.HALF_OPEN and b.acquire()
    b.apply_remote(BreakerState.OPEN, 7.0)  # an ordinary peer trip is kept as it is
    assert b.snapshot()["open_remaining_s"] == pytest.approx(7.0)


def test_a_peer_timed_open_never_ends_an_open_held_by_hand() -> None:
    clock = FakeClock(100.0)
    b = CircuitBreaker("p", BreakerSettings(), clock)
    b.force(BreakerState.OPEN)
    b.apply_remote(BreakerState.OPEN, 5.0)
    clock.advance(10.0)
    assert b.state is BreakerState.OPEN and not b.acquire()
    b.apply_remote(BreakerState.CLOSED, None)  # a close (or a force) still ends it
    assert b.state is BreakerState.CLOSED
