"""What a cut stream costs: the tokens a provider produced and the gateway relayed are charged
(cost, spend counters, tokens per minute, metrics) however the stream ended: the client went
away (499), the upstream broke (502), after a resume or not.

Real gateways on loopback, the project's simulator, real Redis.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from loadtests.simulator.testing import Fleet
from tests.support import AccessLines, GatewayServer, poll

# "steady": 400 tokens a second, so that a client closing mid-stream is seen before the end.
FLEET: list[Any] = [
    {
        "name": "steady",
        "profile": "fast",
        "overrides": {"decode_tps_alone": 400, "decode_tps_full": 400},
    },
    "cut1",
    "cut2",
]
pytestmark = pytest.mark.usefixtures("healthy_fleet")

PRICE = "{input_per_1m: 1000, output_per_1m: 1000}"  # $0.001 a token


def _policy(fleet: Fleet, governance: str, pool: str = "[steady]", alias: str = "") -> str:
    return f"""
governance:
{governance}
providers:
  steady: {{base_url: '{fleet.url("steady")}', models: {{'*': sim}}, price: {PRICE}}}
  cut1: {{base_url: '{fleet.url("cut1")}', models: {{'*': sim}}, price: {PRICE}}}
  cut2: {{base_url: '{fleet.url("cut2")}', models: {{'*': sim}}, price: {PRICE}}}
pools:
  main: {{members: {pool}}}
models:
  chat: {{pool: main{alias}}}
retry: {{base_backoff_ms: 0, max_backoff_ms: 0}}
"""


@pytest.fixture
def keys(redis_url, redis_prefix, monkeypatch) -> str:
    monkeypatch.setenv("GATEWAY_REDIS_PREFIX", redis_prefix)
    monkeypatch.setenv("GATEWAY_API_KEYS", "team-a:key-a")
    return redis_url


def _body(max_tokens: int, n: int = 0) -> dict[str, Any]:
    return {
        "model": "chat",
        "messages": [{"role": "user", "content": f"tell me a long story {n} {time.time()}"}],
        "max_tokens": max_tokens,
        "stream": True,
    }


async def _read_then_close(gw: GatewayServer, body: dict[str, Any], events: int) -> tuple[int, int]:
    """(status, content events read): the client closes after `events` content events."""
    got = 0
    async with (
        httpx.AsyncClient(timeout=30) as c,
        c.stream(
            "POST",
            gw.base_url + "/chat/completions",
            json=body,
            headers={"authorization": "Bearer key-a"},
        ) as r,
    ):
        if r.status_code != 200:
            await r.aread()
            return r.status_code, 0
        async for line in r.aiter_lines():
            if line.startswith("data: ") and '"content"' in line and '"role"' not in line:
                got += 1
                if got >= events:
                    break
    return 200, got


def _spend(gw: GatewayServer) -> dict[str, Any]:
    doc = httpx.get(gw.url + "/admin/spend", params={"group_by": "tenant"}).json()
    return next((g for g in doc["groups"] if g["tenant"] == "team-a"), {})


def _metric(gw: GatewayServer, name: str, tenant: str = "team-a") -> float:
    total = 0.0
    for line in httpx.get(gw.url + "/metrics").text.splitlines():
        if line.startswith(name + "{") and f'tenant="{tenant}"' in line:
            total += float(line.split()[-1])
    return total


def test_client_gone_mid_stream_is_charged_what_was_relayed(
    fleet: Fleet, gateway: Callable[..., GatewayServer], keys: str, access_log: AccessLines
) -> None:
    gw = gateway(_policy(fleet, "  tenants: {}"), redis_url=keys)
    status, read = asyncio.run(_read_then_close(gw, _body(400), 250))
    assert (status, read) == (200, 250)
    ctx = poll(lambda: next((c for c in gw.seen if c.status == 499), None))
    line = access_log.wait_for(ctx.request_id, status=499)
    relayed = ctx.output_chunks - 1  # the role chunk
    assert 250 <= relayed < 400
    # Charged: the prompt estimate plus the content events relayed, at the provider's price.
    assert line["cost_usd"] == pytest.approx((ctx.prompt_tokens + relayed) / 1000)
    spend = poll(lambda: _spend(gw))
    assert spend["output_tokens"] == relayed and spend["requests"] == 1
    assert spend["cost_usd"] == pytest.approx(line["cost_usd"])
    # The per-tenant metrics count it too, once.
    assert _metric(gw, "gateway_output_tokens_total") == relayed
    assert _metric(gw, "gateway_cost_usd_total") == pytest.approx(line["cost_usd"])
    assert sum(1 for ln in access_log.lines if ln["request_id"] == ctx.request_id) == 1


def test_cut_streams_count_against_tokens_per_minute(
    fleet: Fleet, gateway: Callable[..., GatewayServer], keys: str
) -> None:
    """Streams closed by their client after 300 of 400 tokens: the limit of 1,000 tokens a minute
    still holds (the whole reservation was refunded before, so it never did)."""
    gov = "  tenants:\n    team-a: {limits: {tokens_per_minute: 1000}}"
    gw = gateway(_policy(fleet, gov), redis_url=keys)

    async def run() -> tuple[list[tuple[int, int]], float]:
        out = []
        start = time.monotonic()
        for i in range(6):
            out.append(await _read_then_close(gw, _body(400, i), 300))
            if out[-1][0] == 429:
                break
        return out, time.monotonic() - start

    results, elapsed = asyncio.run(run())
    statuses = [s for s, _ in results]
    assert 429 in statuses, statuses
    relayed = sum(c.output_chunks for c in gw.seen if c.status == 499)
    # Each admitted stream reserved its prompt plus 400 tokens; what they relayed stays within
    # the limit plus what refilled meanwhile (1,000 / 60 a second).
    assert relayed <= 1000 + 1000 / 60 * elapsed
    assert statuses.index(429) <= 3


def test_upstream_cut_is_charged_and_so_is_a_resumed_stream_cut_again(
    fleet: Fleet, gateway: Callable[..., GatewayServer], keys: str, access_log: AccessLines
) -> None:
    fleet.set_faults("cut1", cut_stream_after_chunks=40)
    fleet.set_faults("cut2", cut_stream_after_chunks=30)
    gw = gateway(_policy(fleet, "  tenants: {}", pool="[cut1]"), redis_url=keys)
    r = httpx.post(
        gw.base_url + "/chat/completions",
        json=_body(200),
        headers={"authorization": "Bearer key-a"},
        timeout=10,
    )
    assert r.status_code == 200 and "stream_broken" in r.text
    ctx = poll(lambda: gw.seen)[-1]
    line = access_log.wait_for(ctx.request_id)
    assert line["status"] == 502 and line["cost_usd"] > 0
    spend = poll(lambda: _spend(gw))
    assert spend["output_tokens"] == 40
    assert line["cost_usd"] == pytest.approx((ctx.prompt_tokens + 40) / 1000)

    # Resumed on the second member, which breaks too: both parts were relayed, both are charged.
    gw2 = gateway(
        _policy(fleet, "  tenants: {}", pool="[cut1, cut2]", alias=", resume: true"),
        redis_url=keys,
        prefix=gw.prefix + "r:",
    )
    r = httpx.post(
        gw2.base_url + "/chat/completions",
        json=_body(200, 1),
        headers={"authorization": "Bearer key-a"},
        timeout=10,
    )
    assert r.status_code == 200
    ctx = poll(lambda: gw2.seen)[-1]
    assert ctx.resumed and ctx.status == 502
    spend = poll(lambda: _spend(gw2))
    assert spend["output_tokens"] == 70
    assert access_log.wait_for(ctx.request_id)["cost_usd"] == pytest.approx(
        (ctx.prompt_tokens + 70) / 1000
    )


def test_a_stream_that_never_reached_the_client_costs_nothing(
    fleet: Fleet, gateway: Callable[..., GatewayServer], keys: str
) -> None:
    """An upstream that fails before its first event: nothing relayed, nothing charged, and the
    token reservation comes back whole."""
    fleet.set_faults("cut1", error_rate=1.0, error_status=[500])
    gov = "  tenants:\n    team-a: {limits: {tokens_per_minute: 100000}}"
    gw = gateway(_policy(fleet, gov, pool="[cut1]"), redis_url=keys)
    r = httpx.post(
        gw.base_url + "/chat/completions",
        json=_body(50),
        headers={"authorization": "Bearer key-a"},
        timeout=10,
    )
    assert r.status_code >= 500
    ctx = poll(lambda: gw.seen)[-1]
    assert ctx.cost_usd == 0
