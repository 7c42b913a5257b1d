"""A non-streamed request whose client leaves while the provider answers is charged (the
provider's usage when its answer had arrived, else the prompt estimate) and its token reservation
stays counted against tokens per minute: the provider did, and bills, the work. It was recorded
at no cost and refunded whole, so cutting requests was free.

Real gateways on loopback, the project's simulator, real Redis, the official OpenAI client.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest

from loadtests.simulator.testing import Fleet
from tests.support import AccessLines, GatewayServer, poll

FLEET: list[Any] = [
    "fast",
    {
        "name": "slow",
        "profile": "fast",
        "overrides": {"decode_tps_alone": 20, "decode_tps_full": 20},
    },
    {"name": "late", "profile": "fast", "overrides": {"ttft_base_ms": 3000}},
]
PRICE = "{input_per_1m: 1000, output_per_1m: 1000}"  # $0.001 a token


def _policy(fleet: Fleet, governance: str) -> str:
    return f"""
governance:
{governance}
providers:
  fast: {{base_url: '{fleet.url("fast")}', models: {{'*': sim}}, price: {PRICE}}}
  slow: {{base_url: '{fleet.url("slow")}', models: {{'*': sim}}, price: {PRICE}}}
  late: {{base_url: '{fleet.url("late")}', models: {{'*': sim}}, price: {PRICE}}}
pools:
  main: {{members: [fast]}}
  slowp: {{members: [slow]}}
  latep: {{members: [late]}}
models:
  chat: {{pool: main}}
  slow: {{pool: slowp}}
  late: {{pool: latep}}
"""


def _tpm_gateway(fleet: Fleet, gateway: Callable[..., GatewayServer], redis_url: str):
    gov = "  tenants:\n    team-a: {limits: {tokens_per_minute: 1000}}"
    return gateway(_policy(fleet, gov), redis_url=redis_url)


def test_client_gone_before_a_non_streamed_answer_is_charged_and_counted(
    fleet: Fleet,
    gateway: Callable[..., GatewayServer],
    redis_url: str,
    redis_prefix: str,
    monkeypatch,
    access_log: AccessLines,
) -> None:
    """The official client gives up (timeout) while the slow provider decodes 480 tokens: the
    request is recorded once as 499, charged its prompt estimate, and its reservation (prompt plus
    max_tokens) stays counted against tokens per minute; it was free and refunded whole."""
    monkeypatch.setenv("GATEWAY_REDIS_PREFIX", redis_prefix)
    monkeypatch.setenv("GATEWAY_API_KEYS", "team-a:key-a")
    gw = _tpm_gateway(fleet, gateway, redis_url)
    client = openai.OpenAI(base_url=gw.base_url, api_key="key-a", timeout=1.0, max_retries=0)
    for i in range(2):
        with pytest.raises(openai.APITimeoutError):
            client.chat.completions.create(
                model="slow",
                messages=[{"role": "user", "content": f"a long story {i}"}],
                max_tokens=480,
            )
    poll(lambda: len([c for c in gw.seen if c.status == 499]) == 2)
    # Two reservations of about 490 tokens fit in 1,000 a minute; a third does not (the two
    # were given back whole before, less their prompts).
    with pytest.raises(openai.RateLimitError):
        client.with_options(timeout=10).chat.completions.create(
            model="slow", messages=[{"role": "user", "content": "again"}], max_tokens=480
        )
    cut = [c for c in gw.seen if c.status == 499]
    for ctx in cut:
        line = access_log.wait_for(ctx.request_id, status=499)
        assert line["provider"] == "slow"
        assert line["cost_usd"] == pytest.approx(ctx.prompt_tokens / 1000)
        assert sum(1 for ln in access_log.lines if ln["request_id"] == ctx.request_id) == 1
    doc = poll(
        lambda: (
            d
            if (d := httpx.get(gw.url + "/admin/spend", params={"group_by": "tenant"}).json())[
                "total"
            ]["requests"]
            >= 2
            else None
        )
    )
    assert doc["total"]["input_tokens"] == sum(c.prompt_tokens for c in cut)
    assert doc["total"]["cost_usd"] == pytest.approx(sum(c.prompt_tokens for c in cut) / 1000)
    # The usage metrics count them too (they had left out every 499 without relayed events).
    metrics = httpx.get(gw.url + "/metrics").text
    counted = sum(
        float(ln.rsplit(" ", 1)[1])
        for ln in metrics.splitlines()
        if ln.startswith("gateway_input_tokens_total{") and 'provider="slow"' in ln
    )
    assert counted >= sum(c.prompt_tokens for c in cut)


def test_client_gone_before_a_streams_first_event_is_charged_its_prompt(
    fleet: Fleet,
    gateway: Callable[..., GatewayServer],
    redis_url: str,
    redis_prefix: str,
    monkeypatch,
    access_log: AccessLines,
) -> None:
    """The provider reads the prompt (3 s to the first token) and the client leaves before the
    first event: charged the prompt estimate, nothing for output (the stream stops with it)."""
    monkeypatch.setenv("GATEWAY_REDIS_PREFIX", redis_prefix)
    monkeypatch.setenv("GATEWAY_API_KEYS", "team-a:key-a")
    gw = gateway(_policy(fleet, "  tenants: {}"), redis_url=redis_url)
    client = openai.OpenAI(base_url=gw.base_url, api_key="key-a", timeout=0.5, max_retries=0)
    with pytest.raises(openai.APITimeoutError):
        client.chat.completions.create(
            model="late",
            messages=[{"role": "user", "content": "a story"}],
            max_tokens=50,
            stream=True,
        )
    ctx = poll(lambda: next((c for c in gw.seen if c.status == 499), None))
    line = access_log.wait_for(ctx.request_id, status=499)
    assert line["stream"] is True and line["provider"] == "late"
    assert line["cost_usd"] == pytest.approx(ctx.prompt_tokens / 1000)
    doc = poll(
        lambda: (
            d
            if (d := httpx.get(gw.url + "/admin/spend", params={"group_by": "tenant"}).json())[
                "total"
            ]["requests"]
            else None
        )
    )
    assert doc["total"]["input_tokens"] == ctx.prompt_tokens
    assert doc["total"]["output_tokens"] == 0


def test_a_request_refused_before_any_provider_costs_nothing(
    fleet: Fleet,
    gateway: Callable[..., GatewayServer],
    redis_url: str,
    redis_prefix: str,
    monkeypatch,
    access_log: AccessLines,
) -> None:
    """No provider was asked (an alias the gateway does not know): nothing to charge."""
    monkeypatch.setenv("GATEWAY_REDIS_PREFIX", redis_prefix)
    monkeypatch.setenv("GATEWAY_API_KEYS", "team-a:key-a")
    gw = gateway(_policy(fleet, "  tenants: {}"), redis_url=redis_url)
    client = openai.OpenAI(base_url=gw.base_url, api_key="key-a", max_retries=0)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(
            model="nope", messages=[{"role": "user", "content": "hi"}], max_tokens=5
        )
    ctx = poll(lambda: gw.seen)[-1]
    assert not ctx.cost_usd
