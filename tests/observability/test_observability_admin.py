"""Admin API: auth, live views, drain and forced breakers changing where requests go."""

from __future__ import annotations

import httpx
import pytest

from gateway.errors import GatewayError
from gateway.http.admin import require_admin

CHAT = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def policy(fleet) -> str:
    return f"""
providers:
  a: {{base_url: '{fleet.url("a")}', models: {{'*': sim}}, max_inflight: 8}}
  b: {{base_url: '{fleet.url("b")}', models: {{'*': sim}}}}
pools:
  main: {{members: [a, b], balancer: {{strategy: round_robin}}}}
models:
  chat: {{pool: main}}
"""


def providers_used(gw, n: int = 6) -> set[str]:
    with httpx.Client(base_url=gw.base_url) as c:
        return {
            c.post("/chat/completions", json=CHAT).headers["x-gateway-provider"] for _ in range(n)
        }


def fake_request(host: str, authorization: str | None = None):
    from starlette.requests import Request

    headers = [(b"authorization", authorization.encode())] if authorization else []
    return Request({"type": "http", "client": (host, 1234), "headers": headers})


def test_require_admin_loopback_only_without_key(monkeypatch) -> None:
    monkeypatch.delenv("GATEWAY_ADMIN_KEY", raising=False)
    require_admin(fake_request("127.0.0.1"))
    require_admin(fake_request("::1"))
    with pytest.raises(GatewayError) as e:
        require_admin(fake_request("10.1.2.3"))
    assert e.value.status == 403 and e.value.code == "admin_forbidden"


def test_require_admin_with_key(monkeypatch) -> None:
    monkeypatch.setenv("GATEWAY_ADMIN_KEY", "s3cret")
    require_admin(fake_request("10.1.2.3", "Bearer s3cret"))  # any address with the key
    for given in (None, "Bearer wrong", "s3cret"):
        with pytest.raises(GatewayError) as e:
            require_admin(fake_request("127.0.0.1", given))
        assert e.value.status == 401


def test_admin_key_enforced_over_http(fleet, gateway, monkeypatch) -> None:
    gw = gateway(policy(fleet))
    monkeypatch.setenv("GATEWAY_ADMIN_KEY", "s3cret")
    for path in ("/admin/members", "/admin/pools", "/admin/policy", "/admin/stats"):
        r = httpx.get(gw.url + path, headers={"authorization": "Bearer wrong"})
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_admin_key"
    assert httpx.post(gw.url + "/admin/members/a/drain").status_code == 401
    ok = httpx.get(gw.url + "/admin/members", headers={"authorization": "Bearer s3cret"})
    assert ok.status_code == 200
    # The dashboard page holds no data: with a key it is served to anyone, then asks for it.
    assert httpx.get(gw.url + "/dashboard").status_code == 200


def test_member_pool_policy_views(fleet, gateway) -> None:
    gw = gateway(policy(fleet))
    providers_used(gw, 2)
    members = {m["name"]: m for m in httpx.get(gw.url + "/admin/members").json()["members"]}
    assert set(members) == {"a", "b"}
    a = members["a"]
    assert a["pools"] == ["main"] and a["max_inflight"] == 8 and a["inflight"] == 0
    assert a["attempts"] == 1 and a["ewma_ms"] > 0 and a["breaker"]["state"] == "closed"
    assert a["drained"] is False and a["recent_errors"] == []
    (pool,) = httpx.get(gw.url + "/admin/pools").json()["pools"]
    assert pool["name"] == "main" and pool["members"] == ["a", "b"] and pool["healthy"] == 2
    assert pool["queue"]["depth"] == 0 and pool["strategy"] == "round_robin"
    pol = httpx.get(gw.url + "/admin/policy").json()
    assert pol["source"] == str(gw.policy_path) and pol["version"] and pol["reload_failures"] == 0
    full = httpx.get(gw.url + "/admin/policy?full=1").json()
    assert full["policy"]["pools"]["main"]["members"] == ["a", "b"]
    stats = httpx.get(gw.url + "/admin/stats").json()
    assert stats["traffic"]["total_requests"] == 2
    assert stats["traffic"]["recent"][0]["provider"] in ("a", "b")
    breakers = httpx.get(gw.url + "/admin/breakers").json()
    assert breakers["b"]["state"] == "closed"


def test_drain_moves_traffic_away(fleet, gateway) -> None:
    gw = gateway(policy(fleet))
    assert providers_used(gw) == {"a", "b"}
    r = httpx.post(gw.url + "/admin/members/a/drain")
    assert r.status_code == 200 and r.json()["drained"] is True
    before = fleet.stats("a")["requests"]
    assert providers_used(gw) == {"b"}
    assert fleet.stats("a")["requests"] == before
    httpx.post(gw.url + "/admin/members/a/undrain")
    assert providers_used(gw) == {"a", "b"}
    assert httpx.post(gw.url + "/admin/members/nope/drain").status_code == 404


def test_forced_breaker_moves_traffic_away(fleet, gateway) -> None:
    gw = gateway(policy(fleet))
    r = httpx.post(gw.url + "/admin/members/b/breaker", json={"state": "open"})
    assert r.status_code == 200 and r.json()["breaker"]["state"] == "open"
    assert providers_used(gw) == {"a"}
    members = {m["name"]: m for m in httpx.get(gw.url + "/admin/members").json()["members"]}
    assert members["b"]["available"] is False
    httpx.post(gw.url + "/admin/members/b/breaker", json={"state": "closed"})
    assert providers_used(gw) == {"a", "b"}
    bad = httpx.post(gw.url + "/admin/members/b/breaker", json={"state": "sideways"})
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_breaker_state"
