"""Governance on one gateway: managed keys, limits, budgets, 429 answers, spend, stream usage.

Real Redis, a real HTTP gateway on loopback, the official openai client; upstreams are the
project's simulator or a capture server with fixed usage (5 prompt + 3 completion tokens).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

import httpx
import openai
import pytest
from typer.testing import CliRunner

from gateway.cli import app as cli_app

CHAT = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}


def _policy(url: str, governance: str, price: str = "{input_per_1m: 0, output_per_1m: 0}") -> str:
    return f"""
governance:
{governance}
providers:
  main-p: {{base_url: '{url}', models: {{'*': sim}}, price: {price}}}
  cheap-p: {{base_url: '{url}', models: {{'*': sim}}, price: {price}}}
pools:
  main: {{members: [main-p]}}
  cheap: {{members: [cheap-p]}}
models:
  chat: {{pool: main}}
  other: {{pool: main}}
"""


@pytest.fixture
def shared(redis_url, redis_prefix, monkeypatch):
    monkeypatch.setenv("GATEWAY_REDIS_PREFIX", redis_prefix)
    monkeypatch.setenv("GATEWAY_API_KEYS", "team-a:key-a,team-b:key-b")
    return redis_url


def post(gw, key: str, body: dict | None = None) -> httpx.Response:
    return httpx.post(
        gw.base_url + "/chat/completions",
        json=body or CHAT,
        headers={"authorization": f"Bearer {key}"},
        timeout=10,
    )


def test_requests_per_minute_answers_like_openai(fleet, gateway, shared) -> None:
    gov = "  tenants:\n    team-a: {limits: {requests_per_minute: 3}}"
    gw = gateway(_policy(fleet.url("a"), gov), redis_url=shared)
    ok = [post(gw, "key-a") for _ in range(3)]
    assert [r.status_code for r in ok] == [200, 200, 200]
    assert ok[0].headers["x-ratelimit-limit-requests"] == "3"
    assert [r.headers["x-ratelimit-remaining-requests"] for r in ok] == ["2", "1", "0"]
    assert ok[0].headers["x-ratelimit-reset-requests"].endswith("s")
    refused = post(gw, "key-a")
    assert refused.status_code == 429
    err = refused.json()["error"]
    assert err["code"] == "rate_limit_exceeded" and err["type"] == "requests"
    assert 1 <= int(refused.headers["retry-after"]) <= 20  # a request refills in 20 s
    assert refused.headers["x-ratelimit-remaining-requests"] == "0"
    # The other tenant is not limited, and gets no rate-limit headers (no limit applies).
    other = post(gw, "key-b")
    assert other.status_code == 200 and "x-ratelimit-limit-requests" not in other.headers


def test_openai_sdk_retry_honours_the_429(fleet, gateway, shared) -> None:
    # 30 requests a minute: a burst of 30, then one every 2 s.
    gov = "  tenants:\n    team-a: {limits: {requests_per_minute: 30}}"
    gw = gateway(_policy(fleet.url("a"), gov), redis_url=shared)
    with httpx.Client(headers={"authorization": "Bearer key-a"}, timeout=10) as c:
        while c.post(gw.base_url + "/chat/completions", json=CHAT).status_code == 200:
            pass
    client = openai.OpenAI(base_url=gw.base_url, api_key="key-a", max_retries=3)
    start = time.monotonic()
    raw = client.chat.completions.with_raw_response.create(**CHAT)
    waited = time.monotonic() - start
    assert raw.http_response.status_code == 200
    assert raw.retries_taken >= 1
    # The SDK slept what retry-after-ms said (about 2 s), not its own short back-off.
    assert 1.0 <= waited <= 8.0
    # Without retries the SDK surfaces OpenAI's error type (the bucket emptied again first: the
    # SDK's sleep may have outlasted retry-after by enough to refill a second request).
    with httpx.Client(headers={"authorization": "Bearer key-a"}, timeout=10) as c:
        while c.post(gw.base_url + "/chat/completions", json=CHAT).status_code == 200:
            pass
    with pytest.raises(openai.RateLimitError) as e:
        openai.OpenAI(base_url=gw.base_url, api_key="key-a", max_retries=0).chat.completions.create(
            **CHAT
        )
    assert e.value.code == "rate_limit_exceeded"


def test_tokens_per_minute_reserve_and_reconcile(capture_upstream, gateway, shared) -> None:
    # 5 + 3 = 8 tokens used per request, 5 + 5 (max_tokens) reserved before it.
    gov = "  tenants:\n    team-a: {limits: {tokens_per_minute: 40}}"
    gw = gateway(_policy(capture_upstream.url, gov), redis_url=shared)
    first = post(gw, "key-a")
    assert first.status_code == 200
    assert first.headers["x-ratelimit-limit-tokens"] == "40"
    used = 40 - int(first.headers["x-ratelimit-remaining-tokens"])
    assert 10 <= used <= 20  # the estimate reserved (prompt estimate + max_tokens)
    statuses = [post(gw, "key-a").status_code for _ in range(6)]
    assert statuses.count(200) in (3, 4) and statuses[-1] == 429
    too_big = post(gw, "key-a", {**CHAT, "max_tokens": 100})
    assert too_big.status_code == 429 and "too large" in too_big.json()["error"]["message"]


def test_concurrent_requests_limit(fleet, gateway, shared) -> None:
    gov = "  tenants:\n    team-a: {limits: {max_concurrent: 2}}"
    gw = gateway(_policy(fleet.url("slow"), gov), redis_url=shared)
    slow = {**CHAT, "max_tokens": 20}  # ~1 s each on the slow member
    import concurrent.futures as cf

    with cf.ThreadPoolExecutor(4) as ex:
        statuses = sorted(
            r.status_code for r in ex.map(lambda _: post(gw, "key-a", slow), range(4))
        )
    assert statuses == [200, 200, 429, 429]
    assert post(gw, "key-a").status_code == 200  # slots came back


def test_budget_refused_exactly_at_the_limit_and_soft_routing(
    capture_upstream, gateway, shared, caplog
) -> None:
    # Each request costs 5 prompt tokens x $0.1 = $0.50; $2 a day, soft at $1.
    gov = (
        "  tenants:\n    team-a: {budget: {daily_usd: 2.0, soft_fraction: 0.5},"
        " soft_budget_pool: cheap}"
    )
    price = "{input_per_1m: 100000, output_per_1m: 0}"
    gw = gateway(_policy(capture_upstream.url, gov, price), redis_url=shared)
    caplog.set_level(logging.WARNING, logger="gateway.governance")
    results = [post(gw, "key-a") for _ in range(4)]
    assert [r.status_code for r in results] == [200] * 4
    assert [r.headers.get("x-gateway-budget") for r in results] == [None, None, "soft", "soft"]
    assert [r.headers["x-gateway-pool"] for r in results] == ["main", "main", "cheap", "cheap"]
    assert any("soft limit" in r.message for r in caplog.records)
    refused = post(gw, "key-a")
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "insufficient_quota"
    assert refused.headers["x-should-retry"] == "false"
    assert post(gw, "key-b").status_code == 200  # another tenant's budget is its own
    metrics = httpx.get(gw.url + "/metrics").text
    assert 'gateway_tenant_requests_refused_total{key="sk_' in metrics
    assert 'reason="budget",tenant="team-a"} 1.0' in metrics


def test_managed_key_lifecycle_and_cli(fleet, gateway, shared) -> None:
    gov = "  tenants: {}"
    gw = gateway(_policy(fleet.url("a"), gov), redis_url=shared)
    runner = CliRunner()
    out = runner.invoke(
        cli_app,
        [
            "keys",
            "create",
            "--url",
            gw.url,
            "--tenant",
            "team-c",
            "--name",
            "ci",
            "--alias",
            "chat",
            "--rpm",
            "100",
        ],
    )
    assert out.exit_code == 0, out.output
    created = json.loads(out.output)
    secret, key_id = created["key"], created["id"]
    assert secret.startswith("sk-gw-") and created["limits"]["requests_per_minute"] == 100
    r = post(gw, secret)
    assert r.status_code == 200 and r.headers["x-ratelimit-limit-requests"] == "100"
    # Allowed aliases only: in use, and in what /v1/models shows the key.
    assert post(gw, secret, {**CHAT, "model": "other"}).status_code == 404
    auth = {"authorization": f"Bearer {secret}"}
    models = httpx.get(gw.base_url + "/models", headers=auth).json()
    assert [m["id"] for m in models["data"]] == ["chat"]
    assert httpx.get(gw.base_url + "/models/other", headers=auth).status_code == 404
    assert httpx.get(gw.base_url + "/models/chat", headers=auth).status_code == 200
    listed = runner.invoke(cli_app, ["keys", "list", "--url", gw.url])
    assert listed.exit_code == 0 and key_id in listed.output
    assert secret not in listed.output and created["hint"] in listed.output
    # Changes apply at once (here: the key's own limit).
    patched = httpx.patch(
        f"{gw.url}/admin/keys/{key_id}", json={"limits": {"requests_per_minute": 50}}
    )
    assert patched.status_code == 200 and patched.json()["limits"]["requests_per_minute"] == 50
    assert post(gw, secret).headers["x-ratelimit-limit-requests"] == "50"
    assert httpx.patch(f"{gw.url}/admin/keys/mk_0000000000000000", json={}).status_code == 404
    # Rotate: the old secret stops, the new one works with the same id and limits.
    rotated = json.loads(runner.invoke(cli_app, ["keys", "rotate", key_id, "--url", gw.url]).output)
    assert post(gw, secret).status_code == 401
    assert post(gw, rotated["key"]).status_code == 200
    out = runner.invoke(cli_app, ["keys", "revoke", key_id, "--url", gw.url])
    assert out.exit_code == 0 and json.loads(out.output)["revoked"] is True
    assert post(gw, rotated["key"]).status_code == 401
    # Expired keys are refused; the access log names the key id, never the secret.
    exp = httpx.post(gw.url + "/admin/keys", json={"tenant": "team-c", "expires_in_s": 0.2}).json()
    assert post(gw, exp["key"]).status_code == 200
    time.sleep(0.3)
    r = post(gw, exp["key"])
    assert r.status_code == 401 and "expired" in r.json()["error"]["message"]
    bad = httpx.post(gw.url + "/admin/keys", json={"tenant": "bad tenant!"})
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_key_spec"


def test_stream_usage_is_asked_for_and_hidden(fleet, gateway, shared) -> None:
    gov = "  tenants:\n    team-a: {limits: {tokens_per_minute: 100000}}"
    price = "{input_per_1m: 1000, output_per_1m: 1000}"
    gw = gateway(_policy(fleet.url("a"), gov, price), redis_url=shared)
    client = openai.OpenAI(base_url=gw.base_url, api_key="key-a")
    chunks = list(client.chat.completions.create(**CHAT, stream=True))
    assert chunks and all(c.usage is None for c in chunks)  # not asked: not shown
    asked = list(
        client.chat.completions.create(**CHAT, stream=True, stream_options={"include_usage": True})
    )
    assert asked[-1].usage is not None and asked[-1].choices == []
    spend = httpx.get(gw.url + "/admin/spend", params={"group_by": "tenant"}).json()
    team = next(g for g in spend["groups"] if g["tenant"] == "team-a")
    assert team["requests"] == 2
    # Both streams were costed from the provider's usage (same prompt, same max_tokens).
    u = asked[-1].usage
    assert team["input_tokens"] == 2 * u.prompt_tokens
    assert team["cost_usd"] > 0


def test_spend_api_groups_and_survives_a_restart(capture_upstream, gateway, shared) -> None:
    price = "{input_per_1m: 1000, output_per_1m: 2000}"  # 5 x 0.001 + 3 x 0.002 = $0.011
    text = _policy(capture_upstream.url, "  tenants: {}", price)
    gw = gateway(text, redis_url=shared)
    for _ in range(2):
        assert post(gw, "key-a").status_code == 200
    assert post(gw, "key-b", {**CHAT, "model": "other"}).status_code == 200
    gw.__exit__(None, None, None)  # stop: counters must outlive the process
    gw2 = gateway(text, redis_url=shared)
    by_model = httpx.get(gw2.url + "/admin/spend", params={"group_by": "model"}).json()
    assert by_model["total"]["requests"] == 3
    assert by_model["total"]["cost_usd"] == pytest.approx(0.033)
    assert {g["model"]: g["requests"] for g in by_model["groups"]} == {"chat": 2, "other": 1}
    team_a = httpx.get(
        gw2.url + "/admin/spend", params={"tenant": "team-a", "group_by": "provider"}
    ).json()
    assert team_a["groups"] == [
        {
            "provider": "main-p",
            "cost_usd": pytest.approx(0.022),
            "requests": 2,
            "input_tokens": 10,
            "output_tokens": 6,
        }
    ]
    day = httpx.get(gw2.url + "/admin/spend", params={"group_by": "day"}).json()
    assert len(day["groups"]) == 1
    bad = httpx.get(gw2.url + "/admin/spend", params={"group_by": "colour"})
    assert bad.status_code == 400


def test_keys_without_redis(fleet, gateway, monkeypatch) -> None:
    """No Redis: managed keys and limits live in the process."""
    monkeypatch.delenv("GATEWAY_API_KEYS", raising=False)
    gov = "  require_key: true\n  default_tenant: {key_limits: {requests_per_minute: 2}}"
    gw = gateway(_policy(fleet.url("a"), gov))
    assert post(gw, "anything").status_code == 401
    key = httpx.post(gw.url + "/admin/keys", json={"tenant": "solo"}).json()["key"]
    assert [post(gw, key).status_code for _ in range(3)] == [200, 200, 429]


def test_fair_share_of_a_pool(fleet, gateway, shared) -> None:
    """A tenant over half the pool's max_inflight lets another tenant's waiting request go first."""
    text = f"""
governance:
  tenants:
    team-a: {{max_pool_share: 0.5}}
providers:
  s: {{base_url: '{fleet.url("slow")}', models: {{'*': sim}}, max_inflight: 4}}
pools:
  main: {{members: [s], queue: {{max_wait_s: 10, max_depth: 100}}}}
models:
  chat: {{pool: main}}
"""
    gw = gateway(text, redis_url=shared)
    slow = {**CHAT, "max_tokens": 10}  # ~0.5 s each on the slow member

    async def run() -> tuple[list[tuple[float, float]], float, float]:
        async with httpx.AsyncClient(timeout=30) as c:

            async def one(key: str) -> tuple[float, float]:
                start = time.monotonic()
                r = await c.post(
                    gw.base_url + "/chat/completions",
                    json=slow,
                    headers={"authorization": f"Bearer {key}"},
                )
                assert r.status_code == 200, r.text
                return start, time.monotonic()

            a = [asyncio.create_task(one("key-a")) for _ in range(12)]
            await asyncio.sleep(0.2)  # team-a fills the pool and its queue
            b_start, b_end = await one("key-b")
            return await asyncio.gather(*a), b_start, b_end

    a_times, b_start, b_end = asyncio.run(run())
    a_last = max(end for _, end in a_times)
    service = min(end - start for start, end in a_times)
    print(
        f"\nteam-b waited {b_end - b_start:.2f} s; team-a's last ended after "
        f"{a_last - min(s for s, _ in a_times):.2f} s (one request: {service:.2f} s)"
    )
    # team-b got the first free slot: one service time of waiting at most, not three batches.
    assert b_end - b_start < 2.2 * service
    assert b_end < a_last - 0.5 * service
    metrics = httpx.get(gw.url + "/metrics").text
    assert "gateway_fair_share_held_total" in metrics
    held = next(
        float(line.split()[-1])
        for line in metrics.splitlines()
        if line.startswith("gateway_fair_share_held_total")
    )
    assert held > 0


def test_metric_labels_are_bounded() -> None:
    from gateway.governance.stats import MAX_KEYS, MAX_TENANTS, OTHER, GovStats

    stats = GovStats()
    for i in range(MAX_TENANTS + 50):
        stats.admitted(f"t{i}", f"k{i}")
    tenants = {t for t, _ in stats.series}
    keys = {k for _, k in stats.series}
    assert len(tenants) == MAX_TENANTS + 1 and OTHER in tenants
    assert len(keys) <= MAX_KEYS + 1


def test_budget_holds_across_two_gateways(capture_upstream, gateway, shared) -> None:
    """Two replicas sharing Redis, requests alternating between them: refused at the same spend."""
    gov = "  tenants:\n    team-a: {budget: {daily_usd: 2.0}}"  # $0.50 a request (soft at $1.60)
    price = "{input_per_1m: 100000, output_per_1m: 0}"
    text = _policy(capture_upstream.url, gov, price)
    gws = [gateway(text, redis_url=shared), gateway(text, redis_url=shared)]
    statuses = []
    for i in range(6):
        statuses.append(post(gws[i % 2], "key-a").status_code)
        time.sleep(0.05)  # spend reaches the other replica within milliseconds, not at once
    assert statuses == [200, 200, 200, 200, 429, 429]
    spend = httpx.get(gws[1].url + "/admin/spend", params={"tenant": "team-a"}).json()
    assert spend["total"]["cost_usd"] == pytest.approx(2.0)


def test_stream_usage_watch_reads_usage_and_passes_null_usage_chunks() -> None:
    """A stream that asked for usage: `"usage":null` chunks pass as they are (no parse), the
    usage chunk is read for limits and spend."""
    from gateway.governance.service import Principal, Ticket

    t = Ticket(Principal("t", ""))
    plain = b'data: {"choices":[{"index":0,"delta":{"content":"a"}}],"usage":null}\n\n'
    assert t.stream_event(plain) is plain
    final = b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}\n\n'
    assert t.stream_event(final) == final and t.usage == (3, 2)
