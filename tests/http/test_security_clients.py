"""Untrusted clients and tenants: what a request may carry, and what one tenant can do to another.

Real gateway on loopback (the same ASGI entry and HTTP protocol as `gateway serve`), simulated
providers or a capturing upstream, real Redis, the official `openai` client.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest
import redis

from gateway.context import Context
from gateway.governance.static_keys import hash_key
from gateway.infra.shared_state import SharedState
from tests.http.test_api import policy_for
from tests.support import run, validate

MSG = [{"role": "user", "content": "Say hello"}]


def capture_policy(cap: Any, extra: str = "") -> str:
    return f"""
providers:
  cap: {{base_url: '{cap.url}'}}
pools:
  main: {{members: [cap]}}
models:
  chat: {{pool: main}}
{extra}
"""


# -- request ids --------------------------------------------------------------------------------


def test_client_request_id_is_bounded_in_length_and_charset(fleet, gateway, access_log) -> None:
    gw = gateway(policy_for(fleet))
    body = {"model": "chat", "messages": MSG, "max_tokens": 2}
    ok = httpx.post(
        gw.base_url + "/chat/completions", json=body, headers={"x-request-id": "trace-42.a:b_c"}
    )
    assert ok.headers["x-request-id"] == "trace-42.a:b_c"
    for bad in ("x" * 60_000, "a b", "ü-id".encode(), "id\twith-tab", "<script>", "x" * 129):
        r = httpx.post(
            gw.base_url + "/chat/completions", json=body, headers={"x-request-id": bad}, timeout=10
        )
        assert r.status_code == 200
        rid = r.headers["x-request-id"]
        assert rid != bad and len(rid) == 32 and all(c in "0123456789abcdef" for c in rid)
        assert access_log.wait_for(rid)["status"] == 200


# -- body fields, n, nesting --------------------------------------------------------------------


def test_sdk_and_proxy_fields_never_reach_the_provider(capture_upstream, gateway) -> None:
    gw = gateway(capture_policy(capture_upstream))
    client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0)
    client.chat.completions.create(
        model="chat",
        messages=MSG,
        extra_body={
            "api_base": "http://169.254.169.254/latest",
            "base_url": "http://evil.example/v1",
            "api_key": "sk-stolen",
            "extra_headers": {"x-admin": "1"},
            "extra_query": {"q": 1},
            "extra_body": {"a": 1},
            "seed": 7,  # a real OpenAI field: kept
        },
    )
    sent = capture_upstream.last_body
    for field in ("api_base", "base_url", "api_key", "extra_headers", "extra_query", "extra_body"):
        assert field not in sent
    assert sent["seed"] == 7


def test_n_is_bounded_by_the_policy(capture_upstream, gateway) -> None:
    gw = gateway(capture_policy(capture_upstream, "server: {max_n: 3}"))
    client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="chat", messages=MSG, n=4)
    assert e.value.status_code == 400 and e.value.body["param"] == "n"  # type: ignore[index]
    capture_upstream.last_body = {}
    client.chat.completions.create(model="chat", messages=MSG, n=3)
    assert capture_upstream.last_body["n"] == 3
    default = gateway(capture_policy(capture_upstream))  # default max_n: 8
    r = httpx.post(
        default.base_url + "/chat/completions",
        json={"model": "chat", "messages": MSG, "n": 1000},
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "n"


@pytest.mark.parametrize("depth", [100, 300, 900])
def test_deep_json_is_a_400_with_its_access_log_line(
    capture_upstream, gateway, access_log, depth: int
) -> None:
    gw = gateway(capture_policy(capture_upstream))
    nested = "[" * depth + "]" * depth
    raw = (
        '{"model": "chat", "messages": [{"role": "user", "content": "x"}], "tools": ' + nested + "}"
    )
    rid = uuid.uuid4().hex
    r = httpx.post(
        gw.base_url + "/chat/completions",
        content=raw,
        headers={"content-type": "application/json", "x-request-id": rid},
    )
    assert r.status_code == 400, r.text
    validate("ErrorResponse", r.json())
    assert "nested more than 64 levels" in r.json()["error"]["message"]
    assert access_log.wait_for(rid)["status"] == 400
    shallow = '{"model": "chat", "messages": [{"role": "user", "content": "x"}], "metadata": %s}'
    ok = httpx.post(
        gw.base_url + "/chat/completions",
        content=shallow.replace("%s", "[" * 20 + "]" * 20),
        headers={"content-type": "application/json"},
    )
    assert ok.status_code == 200


def test_no_redirect_is_built_from_the_host_header(fleet, gateway) -> None:
    gw = gateway(policy_for(fleet))
    for path in ("/health/", "/v1/models/", "/ready/", "/admin/members/"):
        r = httpx.get(gw.url + path, headers={"host": "evil.example"}, follow_redirects=False)
        assert not (300 <= r.status_code < 400), (path, r.status_code, r.headers)
        assert "evil.example" not in r.headers.get("location", "")


# -- what anonymous callers see -----------------------------------------------------------------


def test_metrics_and_detailed_ready_need_the_admin_key(fleet, gateway, monkeypatch) -> None:
    monkeypatch.setenv("GATEWAY_ADMIN_KEY", "secin-admin")
    gw = gateway(policy_for(fleet))
    httpx.post(gw.base_url + "/chat/completions", json={"model": "chat", "messages": MSG})
    anonymous = httpx.get(gw.url + "/metrics")
    assert anonymous.status_code == 401
    assert "gateway_" not in anonymous.text
    admin = {"authorization": "Bearer secin-admin"}
    scraped = httpx.get(gw.url + "/metrics", headers=admin)
    assert scraped.status_code == 200 and "gateway_requests_total" in scraped.text
    ready = httpx.get(gw.url + "/ready").json()
    assert set(ready) == {"status"}  # no provider names for anonymous callers
    detailed = httpx.get(gw.url + "/ready", headers=admin).json()
    assert set(detailed["providers"]) == {"a", "b"}
    public = gateway(policy_for(fleet, extra="metrics: {public: true}"))
    assert httpx.get(public.url + "/metrics").status_code == 200
    assert "providers" in httpx.get(public.url + "/ready").json()


# -- cache TTLs and Redis failures --------------------------------------------------------------


def test_client_ttl_is_clamped_and_a_refused_command_is_not_redis_down(
    fleet, gateway, redis_url, monkeypatch
) -> None:
    prefix = f"secin:{uuid.uuid4().hex[:8]}:"
    monkeypatch.setenv("GATEWAY_REDIS_PREFIX", prefix)
    monkeypatch.setenv("GATEWAY_API_KEYS", "team-a:key-a,team-b:key-b")
    policy = policy_for(fleet).replace(
        "chat: {pool: main}", "chat: {pool: main, cache: {exact: {ttl_s: 600}}}"
    )
    gw = gateway(policy, redis_url=redis_url)
    a = openai.OpenAI(base_url=gw.base_url, api_key="key-a", max_retries=0)
    b = openai.OpenAI(base_url=gw.base_url, api_key="key-b", max_retries=0)

    def ask(client: openai.OpenAI, text: str, ttl: str | None = None) -> str:
        headers = {"x-gateway-cache-ttl": ttl} if ttl else {}
        raw = client.chat.completions.with_raw_response.create(
            model="chat",
            messages=[{"role": "user", "content": text}],
            max_tokens=3,
            temperature=0,
            extra_headers=headers,
        )
        return raw.headers["x-gateway-cache"]

    r = redis.Redis.from_url(redis_url)
    assert ask(a, "warm entry") == "miss"
    time.sleep(0.2)
    assert ask(a, "warm entry") == "hit-exact"
    for ttl in ("99999999999999999", "315360000", "999999999999999999999999"):
        assert ask(b, f"ttl {ttl}", ttl) == "miss"
        time.sleep(0.2)
        # Tenant B's absurd TTL neither took Redis "down" for tenant A...
        assert ask(a, "warm entry") == "hit-exact"
    keys = [k for k in r.scan_iter(match=f"{prefix}exact:*")]
    assert len(keys) == 4
    # ...nor reached Redis beyond the policy's TTL.
    assert all(0 < r.ttl(k) <= 600 for k in keys)
    assert ask(b, "short", "5") == "miss"
    time.sleep(0.2)
    assert min(r.ttl(k) for k in r.scan_iter(match=f"{prefix}exact:*")) <= 5
    r.close()


def test_one_refused_redis_command_fails_only_itself(redis_url) -> None:
    async def main() -> None:
        state = SharedState(redis_url, prefix=f"secin:{uuid.uuid4().hex[:8]}:")
        try:
            key = state.key("k")
            bad = await state.call(lambda r: r.set(key, b"v", ex=10**17), "default")
            assert bad == "default"
            assert state.available  # Redis answered: it is not down
            assert await state.call(lambda r: r.set(key, b"v", ex=5), None) is True
            assert await state.call(lambda r: r.get(key), None) == b"v"
            await state.call(lambda r: r.delete(key), 0)
        finally:
            await state.aclose()

    run(main())


# -- any exception inside an attempt ------------------------------------------------------------


def test_an_exception_inside_an_attempt_is_that_attempts_failure(fleet, gateway) -> None:
    gw = gateway(policy_for(fleet).replace("pools:", "retry: {base_backoff_ms: 0}\npools:"))
    seen: list[Context] = []
    gw.app.state.pipeline.observers.append(seen.append)
    broken = gw.app.state.runtime.snapshot.providers["a"].client

    async def boom(*args: Any, **kwargs: Any) -> Any:
        raise ValueError("a provider setting the HTTP client refuses")

    broken.send = boom
    broken.open_stream = boom
    client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0)
    for _ in range(4):
        raw = client.chat.completions.with_raw_response.create(
            model="chat", messages=MSG, max_tokens=2
        )
        assert raw.http_response.status_code == 200
        assert raw.headers["x-gateway-provider"] == "b"
        chunks = list(
            client.chat.completions.create(model="chat", messages=MSG, max_tokens=2, stream=True)
        )
        assert chunks
    deadline = time.monotonic() + 2
    while len(seen) < 8 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert any("a:attempt_error" in c.failures for c in seen)
    assert all(c.status == 200 for c in seen)


# -- deferred requests belong to their tenant ---------------------------------------------------

RULES = """
rules:
  - name: queued
    match: {keywords: [report]}
    queue: true
    template: "Queued as {request_id}."
default:
  template: "Degraded."
"""


@pytest.fixture
def tenants(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv("SECIN_KEY_A", "key-tenant-a")
    monkeypatch.setenv("SECIN_KEY_B", "key-tenant-b")
    monkeypatch.setenv("GATEWAY_REDIS_PREFIX", f"secin:{uuid.uuid4().hex[:8]}:")
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "rules.yaml").write_text(RULES)
    return tmp_path / "rules"


def deferred_policy(fleet: Any, rules: Path) -> str:
    breaker = "breaker: {cooldown_s: 0.2, max_cooldown_s: 0.4}"
    return f"""
providers:
  a: {{base_url: '{fleet.url("a")}', {breaker}}}
  c: {{base_url: '{fleet.url("c")}', {breaker}}}
pools:
  main: {{members: [a]}}
  vip: {{members: [c]}}
classes:
  - {{name: vip, tenants: [team-a]}}
models:
  chat: {{pool: main, routes: {{vip: vip}}}}
retry: {{base_backoff_ms: 0, max_backoff_ms: 0}}
degradation: {{rules: '{rules}'}}
auth:
  keys:
    - {{tenant: team-a, key_env: SECIN_KEY_A}}
    - {{tenant: team-b, key_env: SECIN_KEY_B}}
"""


def test_deferred_ids_are_generated_and_bound_to_the_tenant(
    fleet, gateway, tenants, redis_url
) -> None:
    gw = gateway(deferred_policy(fleet, tenants), redis_url=redis_url)
    for name in ("a", "c"):
        fleet.set_faults(name, error_rate=1.0, error_status=[503])
    try:

        def queue(key: str) -> httpx.Response:
            return httpx.post(
                gw.base_url + "/chat/completions",
                json={"model": "chat", "messages": [{"role": "user", "content": "a report"}]},
                headers={"authorization": f"Bearer {key}", "x-request-id": "shared-id"},
                timeout=15,
            )

        first, second = queue("key-tenant-a"), queue("key-tenant-b")
        ida, idb = first.headers["x-gateway-deferred"], second.headers["x-gateway-deferred"]
        # The client's x-request-id is echoed for correlation; the deferred id is the gateway's.
        assert first.headers["x-request-id"] == "shared-id" and ida != "shared-id" != idb
        assert ida != idb and ida in first.text

        def fetch(deferred_id: str, key: str) -> httpx.Response:
            return httpx.get(
                f"{gw.base_url}/gateway/deferred/{deferred_id}",
                headers={"authorization": f"Bearer {key}"},
            )

        assert fetch(ida, "key-tenant-a").json()["tenant"] == "team-a"
        assert fetch(idb, "key-tenant-b").json()["tenant"] == "team-b"
        for other in (fetch(ida, "key-tenant-b"), fetch("shared-id", "key-tenant-b")):
            assert other.status_code == 404
            assert other.json()["error"]["code"] == "deferred_not_found"
        long_id = fetch("x" * 5000, "key-tenant-a")
        assert long_id.status_code == 404 and "xxxx" not in long_id.text
    finally:
        for name in ("a", "c"):
            fleet.clear_faults(name)


def test_replays_run_as_the_tenant_and_are_cached_and_recorded(
    fleet, gateway, tenants, redis_url, access_log
) -> None:
    gw = gateway(deferred_policy(fleet, tenants), redis_url=redis_url)
    for name in ("a", "c"):
        fleet.set_faults(name, error_rate=1.0, error_status=[503])
    body = {
        "model": "chat",
        "messages": [{"role": "user", "content": "the quarterly report"}],
        "max_tokens": 5,
        "temperature": 0,
    }
    key_a = {"authorization": "Bearer key-tenant-a"}
    try:
        queued = httpx.post(gw.base_url + "/chat/completions", json=body, headers=key_a)
        deferred_id = queued.headers["x-gateway-deferred"]
    finally:
        at_a = fleet.stats("a")["by_endpoint"].get("chat", 0)
        at_c = fleet.stats("c")["by_endpoint"].get("chat", 0)
        for name in ("a", "c"):
            fleet.clear_faults(name)
    url = f"{gw.base_url}/gateway/deferred/{deferred_id}"
    deadline = time.monotonic() + 15
    while (doc := httpx.get(url, headers=key_a).json())["status"] != "done":
        assert time.monotonic() < deadline, doc
        time.sleep(0.05)
    assert doc["http_status"] == 200
    # Team A's class rule applied: the replay went to the vip pool's member, not to "main".
    assert fleet.stats("c")["by_endpoint"].get("chat", 0) > at_c
    assert fleet.stats("a")["by_endpoint"].get("chat", 0) == at_a
    # Recorded like a live request (each replay attempt has its line; here the one that answered).
    line = access_log.wait_for(deferred_id, status=200)
    assert (line["tenant"], line["class"], line["provider"]) == ("team-a", "vip", "c")
    assert line["key"] == "sk_" + hash_key("key-tenant-a")[:12]  # and as the key that sent it
    # The replayed answer is in team A's cache: the same request now is a hit, no upstream call.
    again = httpx.post(gw.base_url + "/chat/completions", json=body, headers=key_a)
    assert again.headers["x-gateway-cache"] == "hit-exact"
    assert again.json()["choices"] == orjson.loads(doc["body"])["choices"]
    other = httpx.post(
        gw.base_url + "/chat/completions",
        json=body,
        headers={"authorization": "Bearer key-tenant-b"},
    )
    assert other.headers["x-gateway-cache"] == "miss"  # never another tenant's entry


def test_a_replay_runs_as_its_key_and_fails_once_that_key_is_revoked(
    fleet, gateway, tenants, redis_url
) -> None:
    gw = gateway(deferred_policy(fleet, tenants), redis_url=redis_url)
    made = httpx.post(gw.url + "/admin/keys", json={"tenant": "team-a"}).json()
    managed = {"authorization": f"Bearer {made['key']}"}
    for name in ("a", "c"):
        fleet.set_faults(name, error_rate=1.0, error_status=[503])
    try:
        queued = httpx.post(
            gw.base_url + "/chat/completions",
            json={"model": "chat", "messages": [{"role": "user", "content": "a report"}]},
            headers=managed,
            timeout=15,
        )
        deferred_id = queued.headers["x-gateway-deferred"]
        revoked = httpx.post(f"{gw.url}/admin/keys/{made['id']}/revoke")
        assert revoked.status_code == 200
    finally:
        for name in ("a", "c"):
            fleet.clear_faults(name)
    url = f"{gw.base_url}/gateway/deferred/{deferred_id}"
    other_key = {"authorization": "Bearer key-tenant-a"}  # same tenant, a key still valid
    deadline = time.monotonic() + 15
    while (doc := httpx.get(url, headers=other_key).json())["status"] == "queued":
        assert time.monotonic() < deadline, doc
        time.sleep(0.05)
    assert (doc["status"], doc["http_status"]) == ("failed", 401)
    assert "no longer valid" in doc["body"]
