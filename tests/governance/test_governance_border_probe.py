"""Governance border, third probe: absurd-but-finite numbers (a subnormal budget, a fraction of
5e-324) and JSON members given twice are refused by the admin API before anything is stored, and
the policy refuses the same numbers; a credential header given twice is
refused in the API's own shape; the admin key is read like an API key (scheme in any case).

Real gateways on loopback, the project's simulator, real Redis, the official clients.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

import anthropic
import httpx
import openai
import pytest
import redis
from pydantic import ValidationError

from gateway.governance.settings import Governance
from loadtests.simulator.testing import Fleet
from tests.support import GatewayServer

FLEET: list[Any] = [
    "fast",
    {
        "name": "slow",
        "profile": "fast",
        "overrides": {"decode_tps_alone": 20, "decode_tps_full": 20},
    },
]
PRICE = "{input_per_1m: 1000, output_per_1m: 1000}"  # $0.001 a token


def _policy(fleet: Fleet, governance: str = "  tenants: {}") -> str:
    return f"""
governance:
{governance}
providers:
  fast: {{base_url: '{fleet.url("fast")}', models: {{'*': sim}}, price: {PRICE}}}
  slow: {{base_url: '{fleet.url("slow")}', models: {{'*': sim}}, price: {PRICE}}}
pools:
  main: {{members: [fast]}}
  slowp: {{members: [slow]}}
models:
  chat: {{pool: main}}
  slow: {{pool: slowp}}
"""


@pytest.fixture
def gw(fleet: Fleet, gateway: Callable[..., GatewayServer], redis_url, redis_prefix, monkeypatch):
    monkeypatch.setenv("GATEWAY_REDIS_PREFIX", redis_prefix)
    monkeypatch.setenv("GATEWAY_API_KEYS", "team-a:key-a")
    monkeypatch.delenv("GATEWAY_ADMIN_KEY", raising=False)
    return gateway(_policy(fleet), redis_url=redis_url)


def _stored_keys(gw: GatewayServer) -> list[bytes]:
    client = redis.Redis.from_url(gw.pipeline.governance.state.url)
    pattern = gw.prefix.replace("*", r"\*") + "*"
    return [k for k in client.scan_iter(match="*" + pattern) if b":key:" in k]


# (body, the param the error names)
ABSURD: list[tuple[bytes, str]] = [
    (b'{"tenant":"v","budget":{"daily_usd":5e-324}}', "budget.daily_usd"),
    (b'{"tenant":"v","budget":{"daily_usd":1e-300}}', "budget.daily_usd"),
    (b'{"tenant":"v","budget":{"weekly_usd":2.2e-308}}', "budget.weekly_usd"),
    (b'{"tenant":"v","budget":{"monthly_usd":1e-9}}', "budget.monthly_usd"),
    (b'{"tenant":"v","budget":{"daily_usd":-5e-324}}', "budget.daily_usd"),
    (b'{"tenant":"v","budget":{"daily_usd":1,"soft_fraction":5e-324}}', "budget.soft_fraction"),
    (b'{"tenant":"v","expires_at":5e-324}', "expires_at"),
    (b'{"tenant":"v","expires_at":0.5}', "expires_at"),
    (b'{"tenant":"v","expires_in_s":5e-324}', "expires_in_s"),
    # Members given twice: a JSON parser keeps one of them; which was meant is unknown.
    (b'{"tenant":"v","tenant":"w"}', "tenant"),
    (
        b'{"tenant":"v","limits":{"requests_per_minute":5,"requests_per_minute":100000}}',
        "limits.requests_per_minute",
    ),
    (b'{"tenant":"v","budget":{"daily_usd":1},"budget":{"daily_usd":1000}}', "budget"),
    (b'{"tenant":"v","aliases":["chat"],"name":"x","aliases":[]}', "aliases"),
    (b'{"tenant":"v","limits":{"max_concurrent":1,"max_concurrent":1}}', "limits.max_concurrent"),
]


@pytest.mark.parametrize(("body", "param"), ABSURD)
def test_absurd_numbers_and_repeated_members_are_refused_and_nothing_is_stored(
    gw: GatewayServer, body: bytes, param: str
) -> None:
    headers = {"content-type": "application/json"}
    r = httpx.post(gw.url + "/admin/keys", content=body, headers=headers)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["code"] == "invalid_key_spec"
    assert err["param"] == param and err["message"].startswith(param + ":")
    assert _stored_keys(gw) == [] and httpx.get(gw.url + "/admin/keys").json() == {"keys": []}

    # PATCH: refused the same way, the key unchanged.
    key = httpx.post(gw.url + "/admin/keys", json={"tenant": "v", "budget": {"daily_usd": 2}})
    assert key.status_code == 201
    key_id = key.json()["id"]
    r = httpx.patch(f"{gw.url}/admin/keys/{key_id}", content=body, headers=headers)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    now = httpx.get(f"{gw.url}/admin/keys/{key_id}").json()
    assert now["budget"]["daily_usd"] == 2 and now["tenant"] == "v"
    assert now["expires_at"] is None and now["limits"]["requests_per_minute"] is None


def test_smallest_sensible_numbers_are_kept(gw: GatewayServer) -> None:
    spec = {
        "tenant": "v",
        "budget": {"daily_usd": 1e-6, "soft_fraction": 0.001},
        "expires_in_s": 3600,
        "limits": {"requests_per_minute": 1},
    }
    r = httpx.post(gw.url + "/admin/keys", json=spec)
    assert r.status_code == 201, r.text
    assert r.json()["budget"]["daily_usd"] == 1e-6
    assert r.json()["budget"]["soft_fraction"] == 0.001
    # The same member in two different objects is not a repetition.
    r = httpx.patch(
        f"{gw.url}/admin/keys/{r.json()['id']}",
        content=b'{"limits":{"requests_per_minute":2},"budget":{"daily_usd":2}}',
    )
    assert r.status_code == 200, r.text


def test_breaker_body_with_a_repeated_member_is_refused(gw: GatewayServer) -> None:
    r = httpx.post(
        gw.url + "/admin/members/fast/breaker", content=b'{"state":"closed","state":"open"}'
    )
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_breaker_state"
    assert gw.breaker("fast")["state"] == "closed"


@pytest.mark.parametrize(
    ("governance", "path"),
    [
        ({"default_tenant": {"budget": {"daily_usd": 5e-324}}}, "daily_usd"),
        (
            {"tenants": {"t": {"budget": {"daily_usd": 1, "soft_fraction": 5e-324}}}},
            "soft_fraction",
        ),
        ({"tenants": {"t": {"max_pool_share": 5e-324}}}, "max_pool_share"),
        ({"sync": {"spend_flush_s": 5e-324}}, "spend_flush_s"),
        ({"sync": {"key_refresh_s": 1e-300}}, "key_refresh_s"),
        ({"sync": {"lease_fraction": 5e-324}}, "lease_fraction"),
    ],
)
def test_policy_refuses_the_same_absurd_numbers(governance: dict[str, Any], path: str) -> None:
    """A spend flush every 5e-324 s would spin a process; a subnormal budget is no budget."""
    with pytest.raises(ValidationError) as e:
        Governance.model_validate(governance)
    assert path in str(e.value.errors()[0]["loc"])


def _raw(gw: GatewayServer, path: str, headers: list[tuple[str, str]], body: bytes) -> bytes:
    head = f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-length: {len(body)}\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers) + "connection: close\r\n\r\n"
    with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as s:
        s.sendall(head.encode() + body)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out


CHAT = b'{"model":"chat","messages":[{"role":"user","content":"hi"}],"max_tokens":5}'
MESSAGES = b'{"model":"chat","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}'


@pytest.mark.parametrize(
    ("path", "body", "headers"),
    [
        ("/v1/chat/completions", CHAT, [("authorization", "Bearer key-a")] * 2),
        (
            "/v1/chat/completions",
            CHAT,
            [("authorization", "Bearer key-a"), ("Authorization", "Bearer other")],
        ),
        (
            "/v1/chat/completions",
            CHAT,
            [("authorization", "Bearer nope"), ("authorization", "Bearer key-a")],
        ),
        ("/v1/messages", MESSAGES, [("x-api-key", "key-a"), ("x-api-key", "key-a")]),
        ("/v1/messages", MESSAGES, [("authorization", "Bearer key-a")] * 2),
    ],
)
def test_a_credential_header_given_twice_is_refused_in_the_apis_shape(
    gw: GatewayServer, path: str, body: bytes, headers: list[tuple[str, str]]
) -> None:
    out = _raw(gw, path, [("content-type", "application/json"), *headers], body)
    assert out.startswith(b"HTTP/1.1 401"), out[:300]
    payload = out.split(b"\r\n\r\n", 1)[1]
    if path == "/v1/messages":
        assert b'"type":"error"' in payload and b'"authentication_error"' in payload, payload
    else:
        assert b'"code":"invalid_api_key"' in payload, payload
    assert b"key-a" not in out


def test_one_credential_each_still_works_with_the_official_clients(gw: GatewayServer) -> None:
    oa = openai.OpenAI(base_url=gw.base_url, api_key="key-a", max_retries=0)
    assert oa.chat.completions.create(model="chat", messages=[{"role": "user", "content": "hi"}])
    an = anthropic.Anthropic(base_url=gw.url, api_key="key-a", max_retries=0)
    msg = an.messages.create(
        model="chat", max_tokens=5, messages=[{"role": "user", "content": "hi"}]
    )
    assert msg.content
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=gw.url, api_key="nope", max_retries=0).messages.create(
            model="chat", max_tokens=5, messages=[{"role": "user", "content": "hi"}]
        )


def test_admin_key_scheme_in_any_case_and_never_from_the_query(
    gw: GatewayServer, monkeypatch
) -> None:
    monkeypatch.setenv("GATEWAY_ADMIN_KEY", "adm-123")
    url = gw.url + "/admin/keys"
    for value in ("Bearer adm-123", "bearer adm-123", "BEARER   adm-123"):
        assert httpx.get(url, headers={"authorization": value}).status_code == 200, value
    for value in ("Bearer adm-1234", "Bearer adm-12", "adm-123", "Basic adm-123", "Bearer"):
        r = httpx.get(url, headers={"authorization": value})
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_admin_key"
        assert "adm-123" not in r.text
    assert httpx.get(url, params={"key": "adm-123"}).status_code == 401
    # A key of spaces is no key: the loopback rule, not "Bearer " for everyone.
    monkeypatch.setenv("GATEWAY_ADMIN_KEY", "   ")
    assert httpx.get(url, headers={"authorization": "Bearer"}).status_code == 200  # loopback


@pytest.mark.parametrize("field", ["name", "tenant", "aliases", "limits", "budget"])
def test_patch_with_null_is_refused_and_changes_nothing(gw: GatewayServer, field: str) -> None:
    """`{"aliases": null}` was a 500 (the record cannot hold it); read as "every alias" it would
    widen the key. A null is refused with the field's name; leaving it out keeps it."""
    spec = {
        "tenant": "v",
        "name": "n",
        "aliases": ["chat"],
        "limits": {"requests_per_minute": 5},
        "budget": {"daily_usd": 2},
        "expires_in_s": 3600,
    }
    key = httpx.post(gw.url + "/admin/keys", json=spec).json()
    r = httpx.patch(f"{gw.url}/admin/keys/{key['id']}", json={field: None})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == field and err["code"] == "invalid_key_spec"
    now = httpx.get(f"{gw.url}/admin/keys/{key['id']}").json()
    assert {k: now[k] for k in ("name", "tenant", "aliases")} == {
        "name": "n",
        "tenant": "v",
        "aliases": ["chat"],
    }
    assert now["limits"]["requests_per_minute"] == 5 and now["budget"]["daily_usd"] == 2
    # null where it means something: no expiry, no limit of that kind.
    r = httpx.patch(
        f"{gw.url}/admin/keys/{key['id']}",
        json={"expires_at": None, "limits": {"requests_per_minute": None}},
    )
    assert r.status_code == 200, r.text
    assert r.json()["expires_at"] is None and r.json()["limits"]["requests_per_minute"] is None


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/models"),
        ("GET", "/v1/models/chat"),
        ("GET", "/v1/responses/resp_x"),
        ("DELETE", "/v1/responses/resp_x"),
        ("POST", "/v1/messages/count_tokens"),
    ],
)
def test_routes_outside_the_pipeline_refuse_a_credential_given_twice(
    gw: GatewayServer, method: str, path: str
) -> None:
    """The routes that authenticate without the pipeline's stage (model lists, stored
    responses, token counts) took the first of two Authorization headers."""
    body = MESSAGES if method == "POST" else b""
    head = f"{method} {path} HTTP/1.1\r\nhost: x\r\ncontent-length: {len(body)}\r\n"
    head += "content-type: application/json\r\n"
    head += "authorization: Bearer key-a\r\nauthorization: Bearer other\r\n"
    head += "connection: close\r\n\r\n"
    with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as s:
        s.sendall(head.encode() + body)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    assert out.startswith(b"HTTP/1.1 401"), out[:300]
    assert b"key-a" not in out
