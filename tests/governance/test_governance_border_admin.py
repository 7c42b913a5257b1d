"""The admin border of governance: numbers in key specs are strict, finite and bounded and are
checked before anything is stored; records in Redis that do not validate never break a listing or
a change; the CLI encodes what it sends; server-side failures are typed as such; per-tenant usage
metrics are bounded. Real gateways on loopback, real Redis.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable

import httpx
import pytest
import redis
from typer.testing import CliRunner

from gateway.cli import app as cli_app
from gateway.governance.keys import KeyRecord
from gateway.governance.stats import MAX_TENANTS
from loadtests.simulator.testing import Fleet
from tests.support import GatewayServer, RedisProcess

CHAT = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}


def _policy(url: str, price: str = "{input_per_1m: 1000, output_per_1m: 1000}") -> str:
    return f"""
providers:
  p: {{base_url: '{url}', models: {{'*': sim}}, price: {price}}}
pools:
  main: {{members: [p]}}
models:
  chat: {{pool: main}}
  other: {{pool: main}}
"""


@pytest.fixture
def gw(fleet: Fleet, gateway: Callable[..., GatewayServer], redis_url, redis_prefix, monkeypatch):
    monkeypatch.setenv("GATEWAY_REDIS_PREFIX", redis_prefix)
    monkeypatch.delenv("GATEWAY_API_KEYS", raising=False)
    return gateway(_policy(fleet.url("a")), redis_url=redis_url)


def _stored(gw: GatewayServer) -> list[bytes]:
    client = redis.Redis.from_url(gw.pipeline.governance.state.url)
    return list(client.scan_iter(match=gw.prefix.replace("*", r"\*") + "*"))


BAD_SPECS: list[tuple[bytes, str]] = [
    (b'{"tenant":"v","limits":{"requests_per_minute":99999999999999999999}}', "limits"),
    (b'{"tenant":"v","limits":{"tokens_per_minute":1e30}}', "limits"),
    (b'{"tenant":"v","limits":{"max_concurrent":10000001}}', "limits"),
    (b'{"tenant":"v","limits":{"requests_per_minute":"10"}}', "limits"),
    (b'{"tenant":"v","limits":{"requests_per_minute":true}}', "limits"),
    (b'{"tenant":"v","limits":{"requests_per_minute":10.0}}', "limits"),
    (b'{"tenant":"v","limits":{"requests_per_minute":0}}', "limits"),
    (b'{"tenant":"v","budget":{"daily_usd":Infinity}}', "budget"),
    (b'{"tenant":"v","budget":{"daily_usd":NaN}}', "budget"),
    (b'{"tenant":"v","budget":{"daily_usd":"inf"}}', "budget"),
    (b'{"tenant":"v","budget":{"weekly_usd":"10"}}', "budget"),
    (b'{"tenant":"v","budget":{"monthly_usd":true}}', "budget"),
    (b'{"tenant":"v","budget":{"daily_usd":1e300}}', "budget"),
    (b'{"tenant":"v","budget":{"daily_usd":-1}}', "budget"),
    (b'{"tenant":"v","budget":{"soft_fraction":NaN}}', "budget"),
    (b'{"tenant":"v","expires_at":NaN}', "expires_at"),
    (b'{"tenant":"v","expires_at":Infinity}', "expires_at"),
    (b'{"tenant":"v","expires_at":1e300}', "expires_at"),
    (b'{"tenant":"v","expires_at":"1900000000"}', "expires_at"),
    (b'{"tenant":"v","expires_in_s":Infinity}', "expires_in_s"),
    (b'{"tenant":"v","expires_in_s":1e300}', "expires_in_s"),
    (b'{"tenant":"v","aliases":"chat"}', "aliases"),
    (b'{"tenant":"v","name":5}', "name"),
    (b'{"tenant":5}', "tenant"),
    (b"not json", ""),
]


@pytest.mark.parametrize(("body", "field"), BAD_SPECS)
def test_bad_numbers_are_refused_before_anything_is_stored(
    gw: GatewayServer, body: bytes, field: str
) -> None:
    r = httpx.post(
        gw.url + "/admin/keys", content=body, headers={"content-type": "application/json"}
    )
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "invalid_key_spec" and err["type"] == "invalid_request_error"
    assert (err["param"] or "").startswith(field)
    assert not any(b":key:" in k for k in _stored(gw))
    listed = httpx.get(gw.url + "/admin/keys")
    assert listed.status_code == 200 and listed.json() == {"keys": []}


def test_patch_is_checked_the_same_way_and_changes_nothing_when_refused(gw: GatewayServer) -> None:
    key = httpx.post(
        gw.url + "/admin/keys", json={"tenant": "v", "limits": {"requests_per_minute": 5}}
    ).json()
    for body, _ in BAD_SPECS:
        r = httpx.patch(
            f"{gw.url}/admin/keys/{key['id']}",
            content=body.replace(b'"tenant":"v",', b""),
            headers={"content-type": "application/json"},
        )
        assert r.status_code == 400, (body, r.text)
    now = httpx.get(f"{gw.url}/admin/keys/{key['id']}").json()
    assert now["limits"]["requests_per_minute"] == 5 and now["expires_at"] is None
    # Values at the bounds are fine and answer as they were stored.
    ok = httpx.patch(
        f"{gw.url}/admin/keys/{key['id']}",
        json={"limits": {"requests_per_minute": 10**9}, "budget": {"daily_usd": 1e9}},
    )
    assert ok.status_code == 200 and ok.json()["limits"]["requests_per_minute"] == 10**9


def _inject(gw: GatewayServer, key_id: str, raw: bytes) -> None:
    client = redis.Redis.from_url(gw.pipeline.governance.state.url)
    group = "{" + gw.prefix + "gov}"
    client.set(f"{group}:key:{key_id}", raw)
    client.sadd(f"{group}:keys", key_id)


def test_malformed_records_in_redis_never_break_list_or_revoke(
    fleet: Fleet, gw: GatewayServer, gateway: Callable[..., GatewayServer], redis_url
) -> None:
    good = httpx.post(gw.url + "/admin/keys", json={"tenant": "team+x", "name": "good"}).json()
    doc = KeyRecord.model_validate(
        {
            "id": "mk_" + "1" * 16,
            "tenant": "v",
            "hash": "a" * 64,
            "created": 1.0,
            "updated": 1.0,
        }
    ).model_dump(mode="json")
    # What an older gateway stored before numbers were bounded, and what anyone with write access
    # to Redis might put there.
    _inject(
        gw,
        "mk_" + "1" * 16,
        json.dumps({**doc, "limits": {"requests_per_minute": 10**20}}).encode(),
    )
    _inject(gw, "mk_" + "2" * 16, b"\xff\xfe not json")
    _inject(gw, "mk_" + "3" * 16, json.dumps({**doc, "id": "mk_" + "4" * 16}).encode())
    _inject(
        gw, "mk_" + "5" * 16, json.dumps({**doc, "id": "mk_" + "5" * 16, "created": "1"}).encode()
    )
    _inject(gw, "mk_" + "6" * 16, b'{"id": "mk_6666666666666666", "created": NaN}')
    _inject(gw, "not-an-id\xff", b"{}")
    _inject(gw, "mk_" + "7" * 16, b"x" * 100_000)
    client = redis.Redis.from_url(redis_url)
    client.sadd("{" + gw.prefix + "gov}:keys", b"\xff\xfe")

    fresh = gateway(_policy(fleet.url("a")), redis_url=redis_url)
    for g in (gw, fresh):
        r = httpx.get(g.url + "/admin/keys")
        assert r.status_code == 200, r.text
        assert [k["id"] for k in r.json()["keys"]] == [good["id"]]
    runner = CliRunner()
    out = runner.invoke(cli_app, ["keys", "list", "--url", fresh.url])
    assert out.exit_code == 0 and good["id"] in out.output
    assert httpx.get(f"{fresh.url}/admin/keys/mk_{'1' * 16}").status_code == 404
    assert httpx.post(f"{fresh.url}/admin/keys/mk_{'2' * 16}/revoke").status_code == 404
    out = runner.invoke(cli_app, ["keys", "revoke", good["id"], "--url", fresh.url])
    assert out.exit_code == 0 and json.loads(out.output)["revoked"] is True
    metrics = httpx.get(fresh.url + "/metrics").text
    malformed = re.search(r"^gateway_managed_keys_malformed_total (\S+)$", metrics, re.M)
    assert malformed is not None and float(malformed.group(1)) >= 6


def test_cli_encodes_the_tenant_and_503s_are_server_errors(
    fleet: Fleet, gateway: Callable[..., GatewayServer], monkeypatch
) -> None:
    monkeypatch.delenv("GATEWAY_API_KEYS", raising=False)
    private = RedisProcess()
    private.start()
    try:
        gw = gateway(_policy(fleet.url("a")), redis_url=private.url)
        for tenant in ("team+x", "team/x@y:z", "team-x"):
            assert httpx.post(gw.url + "/admin/keys", json={"tenant": tenant}).status_code == 201
        runner = CliRunner()
        for tenant, expected in (("team+x", 1), ("team/x@y:z", 1), ("nobody", 0)):
            out = runner.invoke(cli_app, ["keys", "list", "--url", gw.url, "--tenant", tenant])
            assert out.exit_code == 0, out.output
            keys = json.loads(out.output)["keys"]
            assert [k["tenant"] for k in keys] == [tenant] * expected
        private.kill()
        r = httpx.post(gw.url + "/admin/keys", json={"tenant": "t"})
        assert r.status_code == 503
        assert r.json()["error"]["type"] == "server_error"
        assert r.json()["error"]["code"] == "key_store_unavailable"
        spend = httpx.get(gw.url + "/admin/spend")
        assert spend.status_code == 503 and spend.json()["error"]["type"] == "server_error"
    finally:
        private.kill()


def test_per_tenant_usage_metrics_are_bounded(
    capture_upstream, gateway: Callable[..., GatewayServer], monkeypatch
) -> None:
    n = MAX_TENANTS + 20
    monkeypatch.setenv("GATEWAY_API_KEYS", ",".join(f"t{i}:k{i}" for i in range(n)))
    gw = gateway(_policy(capture_upstream.url))
    with httpx.Client(timeout=10) as c:
        for i in range(n):
            r = c.post(
                gw.base_url + "/chat/completions",
                json=CHAT,
                headers={"authorization": f"Bearer k{i}"},
            )
            assert r.status_code == 200
    text = httpx.get(gw.url + "/metrics").text
    for family in (
        "gateway_cost_usd_total",
        "gateway_input_tokens_total",
        "gateway_output_tokens_total",
    ):
        tenants = set(re.findall(rf'^{family}{{[^}}]*tenant="([^"]+)"', text, re.M))
        assert len(tenants) == MAX_TENANTS + 1 and "other" in tenants, family
    # Nothing lost: the folded tenants are counted under "other".
    total = sum(
        float(m) for m in re.findall(r"^gateway_input_tokens_total{[^}]*} (\S+)$", text, re.M)
    )
    assert total == pytest.approx(5 * n)


def test_visible_models_follow_the_keys_allowed_aliases() -> None:
    from gateway.governance.service import GovernanceService, Principal

    rec = KeyRecord(id="mk_" + "8" * 16, tenant="t", hash="b" * 64, created=1.0, aliases=["chat"])
    names = ["chat", "other"]
    assert GovernanceService.visible_models(Principal("t", rec.id, rec), names) == ["chat"]
    assert GovernanceService.visible_models(Principal("t", "sk_x"), names) == names


def test_spend_counters_that_are_not_numbers_fail_nothing_and_are_repaired(
    capture_upstream, gateway: Callable[..., GatewayServer], redis_url, redis_prefix, monkeypatch
) -> None:
    """A budget counter and a spend field holding text (Redis is not trusted): requests, budget
    checks and /admin/spend still answer, and the next write replaces the values."""
    monkeypatch.setenv("GATEWAY_REDIS_PREFIX", redis_prefix)
    monkeypatch.setenv("GATEWAY_API_KEYS", "team-a:key-a")
    gov = "governance:\n  tenants:\n    team-a: {budget: {daily_usd: 0.02}}\n"
    gw = gateway(gov + _policy(capture_upstream.url), redis_url=redis_url)
    ledger = gw.pipeline.governance.ledger
    now = time.time()
    bk = ledger.budget_key("t:team-a", "day", now)
    day = ledger.day(now)
    client = redis.Redis.from_url(redis_url)
    client.set(bk, "lots")
    spend_key = "{" + redis_prefix + "gov}:spend:" + day
    client.hset(spend_key, "team-a\tsk_x\tchat\tp\tc", "1.5e9")
    statuses = []
    for _ in range(4):
        r = httpx.post(
            gw.base_url + "/chat/completions",
            json=CHAT,
            headers={"authorization": "Bearer key-a"},
            timeout=10,
        )
        statuses.append(r.status_code)
        time.sleep(0.3)  # written between requests
    # $0.008 a request (5 + 3 tokens at $1 per 1,000): the third reaches the $0.02 budget.
    assert statuses == [200, 200, 200, 429]
    assert int(client.get(bk)) == 24_000_000
    spend = httpx.get(gw.url + "/admin/spend", params={"group_by": "tenant"})
    assert spend.status_code == 200
    metrics = httpx.get(gw.url + "/metrics").text
    assert re.search(r"^gateway_spend_counters_repaired_total [1-9]", metrics, re.M)
