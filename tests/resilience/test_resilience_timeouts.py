"""Timeouts of each kind (connect, first byte, idle gap, total) are distinct, observable and retried.

Each test sends real HTTP to the gateway; the upstream misbehaves for real (a port whose handshake
never completes, a simulator that hangs, answers late or decodes slowly). The failure kind is read
from what the gateway recorded for the request (its observers) and from the error it answers.
"""

from __future__ import annotations

import httpx
import pytest

from loadtests.simulator.testing import Fleet
from tests.support import requests_at, unconnectable_port, validate, validate_sse

FAST_TIMEOUTS = "{connect_s: 0.5, first_byte_s: 0.4, idle_s: 0.4, total_s: 0.9}"
# The healthy member gets generous limits: a busy test machine must not make it fail too.
GOOD_TIMEOUTS = "{connect_s: 2.0, first_byte_s: 5.0, idle_s: 5.0, total_s: 10.0}"
# total_s below idle_s: a steady trickle of tokens can only end by the total limit.
TRICKLE_TIMEOUTS = "{connect_s: 0.5, first_byte_s: 0.4, idle_s: 2.0, total_s: 0.8}"


FLEET = ["bad", "good"]
pytestmark = pytest.mark.usefixtures("healthy_fleet")  # faults are cleared after each test


def policy(
    bad_url: str, good_url: str | None, resume: bool = False, timeouts: str = FAST_TIMEOUTS
) -> str:
    """Pool with `bad` tried first (round robin starts at the first member), then `good`."""
    members = "[bad, good]" if good_url else "[bad]"
    good = f"  good: {{base_url: '{good_url}', timeouts: {GOOD_TIMEOUTS}}}\n" if good_url else ""
    return f"""
providers:
  bad: {{base_url: '{bad_url}', timeouts: {timeouts}}}
{good}pools:
  main: {{members: {members}, balancer: {{strategy: round_robin}}}}
models:
  chat: {{pool: main, resume: {str(resume).lower()}}}
retry: {{max_attempts: 3, base_backoff_ms: 0, max_backoff_ms: 0}}
"""


def failures_of(gw) -> list[str]:  # type: ignore[no-untyped-def]
    return [f for ctx in gw.seen for f in ctx.failures]


def assert_timeout_504(r: httpx.Response, kind: str) -> None:
    assert r.status_code == 504, r.text
    body = r.json()
    validate("ErrorResponse", body)
    assert body["error"]["code"] == "upstream_timeout"
    assert kind in body["error"]["message"], body


def test_connect_timeout(fleet: Fleet, gateway) -> None:
    with unconnectable_port() as port:
        url = f"http://127.0.0.1:{port}/v1"
        gw = gateway(policy(url, fleet.url("good")))
        r = gw.chat()
        assert r.status_code == 200, r.text
        assert r.headers["x-gateway-provider"] == "good"
        assert r.headers["x-gateway-attempts"] == "2"
        assert failures_of(gw) == ["bad:connect_timeout"]

        alone = gateway(policy(url, None))
        assert_timeout_504(alone.chat(), "connect_timeout")
        assert failures_of(alone) == ["bad:connect_timeout"]


@pytest.mark.parametrize("fault", [{"hang": True}, {"slow_first_token_ms": 2000}])
def test_first_byte_timeout_on_a_stream(fleet: Fleet, gateway, fault) -> None:
    fleet.set_faults("bad", **fault)
    gw = gateway(policy(fleet.url("bad"), fleet.url("good")))
    r = gw.chat(stream=True)
    assert r.status_code == 200, r.text
    assert r.headers["x-gateway-provider"] == "good"
    validate_sse(r.content)
    assert failures_of(gw) == ["bad:first_byte_timeout"]

    alone = gateway(policy(fleet.url("bad"), None))
    assert_timeout_504(alone.chat(stream=True), "first_byte_timeout")


def test_total_timeout_unary(fleet: Fleet, gateway) -> None:
    """A non-streamed answer has no first byte before the whole generation: when first_byte_s +
    max_tokens / unary_min_tps is past total_s, total_s applies."""
    fleet.set_faults("bad", hang=True)
    gw = gateway(policy(fleet.url("bad"), fleet.url("good")))
    r = gw.chat()
    assert r.status_code == 200, r.text
    validate("CreateChatCompletionResponse", r.json())
    assert failures_of(gw) == ["bad:total_timeout"]

    alone = gateway(policy(fleet.url("bad"), None))
    assert_timeout_504(alone.chat(), "total_timeout")


# total_s far away: a non-streamed hang, stall or trickle must fail over in about first_byte_s
# (+ max_tokens / unary_min_tps) or idle_s, not total_s.
UNARY_TIMEOUTS = "{connect_s: 0.5, first_byte_s: 0.4, idle_s: 0.4, total_s: 20, unary_min_tps: 100}"


@pytest.mark.parametrize(
    ("fault", "kind"),
    [
        ({"hang": True}, "first_byte_timeout"),  # nothing before the headers
        ({"stall_after_chunks": 0}, "idle_timeout"),  # headers, then nothing
        ({"trickle_bytes_per_s": 60}, "idle_timeout"),  # headers, then a few bytes at a time
    ],
)
def test_unary_hang_stall_trickle_fail_over_in_about_first_byte_time(
    fleet: Fleet,
    gateway,
    fault: dict,
    kind: str,
) -> None:
    fleet.set_faults("bad", **fault)
    gw = gateway(policy(fleet.url("bad"), fleet.url("good"), timeouts=UNARY_TIMEOUTS))
    r = gw.chat(max_tokens=8)
    assert r.status_code == 200, r.text
    assert r.headers["x-gateway-provider"] == "good"
    validate("CreateChatCompletionResponse", r.json())
    assert failures_of(gw) == [f"bad:{kind}"]
    # first_byte_s + 8 / 100 = 0.48 s for the headers, + idle_s 0.4 for the body: well under 20 s
    assert gw.seen[-1].end - gw.seen[-1].start < 2.0


def _stream_text(r: httpx.Response) -> str:
    chunks = validate_sse(r.content)
    return "".join((c["choices"][0]["delta"].get("content") or "") for c in chunks if c["choices"])


def test_idle_gap_timeout_mid_stream(fleet: Fleet, gateway) -> None:
    """The first token comes fast, then nothing for seconds: idle_s fires, not first_byte_s.

    Bytes already reached the client, so the stream is resumed on the other member (the alias
    allows it) or, without another member, ends with an error event naming the kind.
    """
    fleet.set_faults("bad", slow_decode=20000)  # ~10 s between tokens
    gw = gateway(policy(fleet.url("bad"), fleet.url("good"), resume=True))
    r = gw.chat(stream=True, max_tokens=12, seed=3)
    assert r.status_code == 200, r.text
    assert failures_of(gw) == ["bad:idle_timeout"]
    reference = gw.chat(max_tokens=12, seed=3).json()["choices"][0]["message"]["content"]
    assert _stream_text(r) == reference

    alone = gateway(policy(fleet.url("bad"), None))
    r = alone.chat(stream=True, max_tokens=12)
    assert r.status_code == 200  # the status line went out with the first token
    assert b'"code":"idle_timeout"' in r.content, r.content[-300:]
    assert failures_of(alone) == ["bad:idle_timeout"]


def test_total_timeout_mid_stream(fleet: Fleet, gateway) -> None:
    """Tokens keep coming within idle_s, but the whole answer takes longer than total_s."""
    fleet.set_faults("bad", slow_decode=300)  # ~0.15 s between tokens, 20 tokens: ~3 s
    alone = gateway(policy(fleet.url("bad"), None, timeouts=TRICKLE_TIMEOUTS))
    before = requests_at(fleet, "bad")
    r = alone.chat(stream=True, max_tokens=20)
    assert r.status_code == 200
    assert b'"code":"total_timeout"' in r.content, r.content[-300:]
    assert failures_of(alone) == ["bad:total_timeout"]
    assert requests_at(fleet, "bad") == before + 1  # never retried after bytes were sent


def test_kinds_reach_the_breaker_and_member(fleet: Fleet, gateway) -> None:
    fleet.set_faults("bad", hang=True)
    gw = gateway(policy(fleet.url("bad"), fleet.url("good")))
    good_before = requests_at(fleet, "good")
    assert gw.chat(stream=True).status_code == 200
    bad = gw.runtime.snapshot.providers["bad"]
    assert bad.member.last_error_kind == "first_byte_timeout"
    assert gw.breaker("bad")["window_failures"] == 1
    assert requests_at(fleet, "good") == good_before + 1  # the answer came from the other member
