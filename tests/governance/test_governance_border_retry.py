"""Rate-limit answers stay bounded whatever the shared bucket holds: a bucket that Redis holds
deep in debt (-1e308, finite, so not caught as NaN or infinity) answered a Retry-After of 10^305
seconds and refused its scope for ever; now its debt is at most a minute's refill and every
Retry-After is at most a minute. 429s come in the API's own shape (OpenAI, Anthropic).

Real gateways on loopback, the project's simulator, real Redis, the official clients.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import anthropic
import httpx
import openai
import pytest
import redis

from gateway.governance.answers import MAX_WAIT_S, over_budget, rate_limited
from loadtests.simulator.testing import Fleet
from tests.support import GatewayServer

CHAT = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}


def _policy(fleet: Fleet, governance: str) -> str:
    return f"""
governance:
{governance}
providers:
  p: {{base_url: '{fleet.url("a")}', models: {{'*': sim}}}}
pools:
  main: {{members: [p]}}
models:
  chat: {{pool: main}}
"""


@pytest.fixture
def keys(redis_url, redis_prefix, monkeypatch) -> str:
    monkeypatch.setenv("GATEWAY_REDIS_PREFIX", redis_prefix)
    monkeypatch.setenv("GATEWAY_API_KEYS", "team-a:key-a")
    return redis_url


@pytest.mark.parametrize("held", ["-1e308", "-1e30", "-5e6"])
def test_a_bucket_deep_in_debt_answers_a_bounded_wait_and_its_debt_is_capped(
    fleet: Fleet, gateway: Callable[..., GatewayServer], keys: str, held: str
) -> None:
    gw = gateway(
        _policy(fleet, "  tenants:\n    team-a: {limits: {tokens_per_minute: 600}}"),
        redis_url=keys,
    )
    bucket = "{" + gw.prefix + "gov}:rl:t:team-a:t"
    client = redis.Redis.from_url(keys)
    client.hset(bucket, mapping={"t": held, "ts": repr(time.time())})
    r = httpx.post(
        gw.base_url + "/chat/completions",
        json=CHAT,
        headers={"authorization": "Bearer key-a"},
        timeout=10,
    )
    assert r.status_code == 429, r.text
    assert 1 <= int(r.headers["retry-after"]) <= MAX_WAIT_S
    assert 1 <= int(r.headers["retry-after-ms"]) <= MAX_WAIT_S * 1000
    err = r.json()["error"]
    assert err["code"] == "rate_limit_exceeded" and len(err["message"]) < 200
    # What Redis holds now is at most a minute's refill in debt: the scope comes back.
    assert float(client.hget(bucket, "t")) >= -600


def test_429s_in_each_apis_own_shape_with_bounded_retry_after(
    fleet: Fleet, gateway: Callable[..., GatewayServer], keys: str
) -> None:
    gw = gateway(
        _policy(fleet, "  tenants:\n    team-a: {limits: {requests_per_minute: 1}}"),
        redis_url=keys,
    )
    oa = openai.OpenAI(base_url=gw.base_url, api_key="key-a", max_retries=0)
    oa.chat.completions.create(**CHAT)
    with pytest.raises(openai.RateLimitError) as e:
        oa.chat.completions.create(**CHAT)
    assert e.value.code == "rate_limit_exceeded"
    assert 1 <= int(e.value.response.headers["retry-after"]) <= MAX_WAIT_S
    an = anthropic.Anthropic(base_url=gw.url, api_key="key-a", max_retries=0)
    with pytest.raises(anthropic.RateLimitError) as a:
        an.messages.create(model="chat", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    body = a.value.response.json()
    assert body["type"] == "error" and body["error"]["type"] == "rate_limit_error"
    assert 1 <= int(a.value.response.headers["retry-after"]) <= MAX_WAIT_S


@pytest.mark.parametrize("wait", [0.0, 0.2, 59.9, 61.0, 6e304, float("inf"), float("nan"), -3.0])
def test_retry_after_is_a_bounded_whole_number(wait: float) -> None:
    h = rate_limited("x", wait, {}).headers
    assert 1 <= int(h["retry-after"]) <= 60 and 1 <= int(h["retry-after-ms"]) <= 60_000
    h = over_budget("x", wait, {}).headers
    assert 1 <= int(h["retry-after"]) <= 31 * 86400 and h["x-should-retry"] == "false"


def test_a_request_larger_than_the_token_limit_is_not_retried_by_the_sdk(
    fleet: Fleet, gateway: Callable[..., GatewayServer], keys: str
) -> None:
    """Prompt plus max_tokens above tokens per minute can never pass: the official client, with
    its default retries, gets the 429 at once (it waited 60 s twice for the same answer)."""
    gw = gateway(
        _policy(fleet, "  tenants:\n    team-a: {limits: {tokens_per_minute: 100}}"),
        redis_url=keys,
    )
    oa = openai.OpenAI(base_url=gw.base_url, api_key="key-a", timeout=30)
    start = time.monotonic()
    with pytest.raises(openai.RateLimitError) as e:
        oa.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "hi"}], max_tokens=500
        )
    assert time.monotonic() - start < 5
    assert e.value.response.headers["x-should-retry"] == "false"
    assert "Request too large" in e.value.message
    # A request that fits is still served.
    assert oa.chat.completions.create(**CHAT).choices
