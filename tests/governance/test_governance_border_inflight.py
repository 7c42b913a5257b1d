"""Concurrent requests against a budget: each admitted request holds its estimated cost (prompt
plus expected output at the highest price of its pools) until it is recorded, and a budget admits
while its spend plus what is held is under it. Thirty requests sent at once against a $0.05 budget
spent $0.72 (each was admitted: nothing was spent yet); now they spend about the budget, and the
ones refused for what is in flight are told to retry (a rate limit, not `insufficient_quota`).

Real gateway on loopback, the project's simulator, real Redis, the official OpenAI client.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest

from loadtests.simulator.testing import Fleet
from tests.support import GatewayServer, poll

FLEET: list[Any] = [
    {
        "name": "slow",
        "profile": "fast",
        "overrides": {"decode_tps_alone": 40, "decode_tps_full": 40},
    },
]
PRICE = "{input_per_1m: 1000, output_per_1m: 1000}"  # $0.001 a token


def _policy(fleet: Fleet, governance: str) -> str:
    return f"""
governance:
{governance}
providers:
  slow: {{base_url: '{fleet.url("slow")}', models: {{'*': sim}}, price: {PRICE}}}
pools:
  main: {{members: [slow]}}
models:
  chat: {{pool: main}}
"""


@pytest.fixture
def gw(fleet: Fleet, gateway: Callable[..., GatewayServer], redis_url, redis_prefix, monkeypatch):
    monkeypatch.setenv("GATEWAY_REDIS_PREFIX", redis_prefix)
    monkeypatch.setenv("GATEWAY_API_KEYS", "team-a:key-a,team-b:key-b")
    gov = "  tenants:\n    team-a: {budget: {daily_usd: 0.1}}"
    return gateway(_policy(fleet, gov), redis_url=redis_url)


def _spent(gw: GatewayServer, tenant: str) -> dict[str, Any]:
    doc = httpx.get(gw.url + "/admin/spend", params={"group_by": "tenant", "tenant": tenant})
    return doc.json()["total"]


async def _burst(gw: GatewayServer, key: str, n: int) -> list[Any]:
    client = openai.AsyncOpenAI(base_url=gw.base_url, api_key=key, max_retries=0, timeout=30)

    async def one(i: int) -> Any:
        try:
            return await client.chat.completions.with_raw_response.create(
                model="chat",
                messages=[{"role": "user", "content": f"hi {i}"}],
                max_tokens=20,
            )
        except openai.APIStatusError as e:
            return e

    try:
        return await asyncio.gather(*(one(i) for i in range(n)))
    finally:
        await client.close()


def test_a_burst_spends_about_the_budget_not_a_multiple_of_it(gw: GatewayServer) -> None:
    out = asyncio.run(_burst(gw, "key-a", 30))
    ok = [r for r in out if not isinstance(r, Exception)]
    refused = [r for r in out if isinstance(r, openai.APIStatusError)]
    assert ok and len(ok) + len(refused) == 30
    for e in refused:
        # Nothing is spent yet: a retry may pass, and the SDKs are let to retry.
        assert e.status_code == 429 and e.code == "rate_limit_exceeded", e.body
        assert e.response.headers["x-gateway-budget"] == "in-flight"
        assert e.response.headers.get("x-should-retry") != "false"
        assert 1 <= int(e.response.headers["retry-after"]) <= 60
    poll(lambda: _spent(gw, "team-a")["requests"] == len(ok))
    total = _spent(gw, "team-a")
    each = total["cost_usd"] / total["requests"]
    # At most one request beyond the budget (it was $0.72 of a $0.05 budget: all were admitted).
    assert total["cost_usd"] <= 0.1 + each + 1e-9, total
    assert gw.pipeline.governance.in_flight_cost == {}  # every hold released
    # Sequential requests then use what is left, and the real budget refusal comes.
    statuses = []
    for _ in range(10):
        r = httpx.post(
            gw.base_url + "/chat/completions",
            json={
                "model": "chat",
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 20,
            },
            headers={"authorization": "Bearer key-a"},
            timeout=30,
        )
        statuses.append(r.status_code)
        if r.status_code == 429:
            assert r.json()["error"]["code"] == "insufficient_quota"
            break
        poll(lambda: gw.pipeline.governance.in_flight_cost == {})
    assert statuses[-1] == 429


def test_an_unbudgeted_tenant_holds_nothing_and_is_never_refused(gw: GatewayServer) -> None:
    out = asyncio.run(_burst(gw, "key-b", 20))
    assert all(not isinstance(r, Exception) for r in out)
    assert gw.pipeline.governance.in_flight_cost == {}
