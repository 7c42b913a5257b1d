"""Routing through the real gateway: class rules in response headers, and the explain endpoint
and command (the decision shown without sending anything)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator

import httpx
import pytest
from typer.testing import CliRunner

from gateway.cli import app as cli_app
from gateway.pipeline.router import Router
from gateway.policy.loader import parse_policy
from gateway.runtime import Runtime
from tests.support import GatewayServer

KEY_A, KEY_BATCH = "key-team-a", "key-batch-team"
LONG_TEXT = "Summarise the quarterly report in plain words, please. " * 120  # ~1.3k tokens
SYSTEM = "You are the support agent of ACME. Be short, polite and exact. " * 6  # > 256 chars


def _sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def classes_policy(urls: dict[str, str]) -> str:
    providers = "\n".join(
        f"  {name}: {{base_url: '{url}', models: {{'*': sim-{name}}}, max_inflight: 16}}"
        for name, url in urls.items()
    )
    return f"""
auth:
  keys:
    - {{tenant: team-a, key_sha256: {_sha(KEY_A)}}}
    - {{tenant: batch-team, key_sha256: {_sha(KEY_BATCH)}}}
providers:
{providers}
pools:
  low-latency: {{members: [a, b], fallback: [big-batch]}}
  big-batch:
    members: [c]
    latency_signal: per_token
    affinity: {{enabled: true}}
  priority: {{members: [b], balancer: {{strategy: round_robin}}}}
  bulk: {{members: [slow]}}
classes:
  - {{name: priority, priority: [high]}}
  - {{name: bulk, tenants: [batch-team]}}
  - {{name: interactive, max_prompt_tokens: 500, max_output_tokens: 256}}
  - {{name: long}}
default_class: long
models:
  chat:
    pool: big-batch
    routes: {{interactive: low-latency, long: big-batch, priority: priority, bulk: bulk}}
    context_window: 32768
    response_model: provider
  small:
    pool: low-latency
    routes: {{interactive: low-latency}}
    context_window: 600
    fallback_alias: chat
"""


def body(text: str = "Hi there", *, model: str = "chat", system: str | None = None, **kw) -> dict:
    msgs = [{"role": "system", "content": system}] if system else []
    msgs.append({"role": "user", "content": text})
    return {"model": model, "messages": msgs, "max_tokens": 8, **kw}


@pytest.fixture(scope="module")
def urls(fleet) -> dict[str, str]:
    return {n: fleet.url(n) for n in ("a", "b", "c", "slow")}


@pytest.fixture(scope="module")
def gw(urls) -> Iterator[GatewayServer]:
    with GatewayServer(classes_policy(urls)) as server:
        yield server


def _post(gw, payload: dict, key: str = KEY_A, **headers: str) -> httpx.Response:
    return httpx.post(
        f"{gw.base_url}/chat/completions",
        json=payload,
        headers={"authorization": f"Bearer {key}", **headers},
        timeout=30,
    )


def test_class_rules_choose_the_pool_and_headers_say_so(gw) -> None:
    short = _post(gw, body("What time is it?"))
    assert short.status_code == 200, short.text
    assert short.headers["x-gateway-class"] == "interactive"
    assert short.headers["x-gateway-pool"] == "low-latency"
    assert short.headers["x-gateway-provider"] in ("a", "b")
    assert short.json()["model"] == f"sim-{short.headers['x-gateway-provider']}"

    long = _post(gw, body(LONG_TEXT))
    assert long.status_code == 200, long.text
    assert (long.headers["x-gateway-class"], long.headers["x-gateway-pool"]) == (
        "long",
        "big-batch",
    )
    assert long.headers["x-gateway-provider"] == "c"

    big_output = _post(gw, body("Write an essay.", max_tokens=300))
    assert big_output.headers["x-gateway-class"] == "long"

    prio = _post(gw, body("What time is it?"), **{"x-gateway-priority": "high"})
    assert prio.headers["x-gateway-class"] == "priority"
    assert (prio.headers["x-gateway-pool"], prio.headers["x-gateway-provider"]) == (
        "priority",
        "b",
    )

    tenant = _post(gw, body("What time is it?"), key=KEY_BATCH)
    assert tenant.headers["x-gateway-class"] == "bulk"
    assert (tenant.headers["x-gateway-pool"], tenant.headers["x-gateway-provider"]) == (
        "bulk",
        "slow",
    )


def test_streams_carry_the_same_headers(gw) -> None:
    with httpx.stream(
        "POST",
        f"{gw.base_url}/chat/completions",
        json=body(LONG_TEXT, stream=True),
        headers={"authorization": f"Bearer {KEY_A}"},
        timeout=30,
    ) as r:
        assert r.status_code == 200
        assert r.headers["x-gateway-class"] == "long"
        assert r.headers["x-gateway-pool"] == "big-batch"
        assert r.headers["x-gateway-provider"] == "c"
        assert b"[DONE]" in r.read()


def _explain(gw, payload: dict, key: str = KEY_A, **headers: str) -> httpx.Response:
    return httpx.post(
        f"{gw.base_url}/gateway/explain",
        json=payload,
        headers={"authorization": f"Bearer {key}", **headers},
        timeout=10,
    )


def test_explain_shows_decision_pick_and_live_state(gw, fleet) -> None:
    def observations(doc: dict) -> int:
        return sum(m["observations"] for m in doc["members"]["low-latency"])

    seen = observations(_explain(gw, body("warm up")).json())
    before = fleet.stats("a")["requests"] + fleet.stats("b")["requests"]
    assert _post(gw, body("warm up")).status_code == 200
    r = _explain(gw, body("What time is it?", temperature=0))
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["class"] == "interactive"
    assert doc["alias"] == doc["routed_alias"] == "chat" and doc["rerouted"] is False
    assert doc["pools"] == ["low-latency", "big-batch"]
    assert 5 < doc["prompt_tokens"] < 30 and doc["expected_output_tokens"] == 8
    assert doc["tenant"] == "team-a"
    assert doc["cache"]["exact"]["cacheable"] is True
    assert doc["stages"][0] == "classify" and doc["stages"][-1] == "failover"
    assert ("cache" in doc["stages"]) is True  # the alias caches: its stack has the Cache stage
    assert doc["pick"]["pool"] == "low-latency" and doc["pick"]["provider"] in ("a", "b")
    assert doc["pick"]["via"] == "balancer"
    low = {m["name"]: m for m in doc["members"]["low-latency"]}
    assert set(low) == {"a", "b"} and [m["name"] for m in doc["members"]["big-batch"]] == ["c"]
    for m in low.values():
        assert m["inflight"] == 0 and m["max_inflight"] == 16 and m["has_capacity"]
        assert m["breaker"]["state"] == "closed" and m["available"]
    assert observations(doc) == seen + 1  # the warm-up request, measured
    assert max(m["ewma_ms"] for m in low.values()) > 0
    # Nothing was sent, and nothing is left counted as in flight.
    assert fleet.stats("a")["requests"] + fleet.stats("b")["requests"] == before + 1
    again = _explain(gw, body("What time is it?")).json()
    assert all(m["inflight"] == 0 for m in again["members"]["low-latency"])
    assert again["cache"]["exact"]["cacheable"] is False  # temperature defaults to 1


def test_explain_long_prompt_affinity_and_reroute(gw) -> None:
    doc = _explain(gw, body(LONG_TEXT, system=SYSTEM)).json()
    assert doc["class"] == "long" and doc["pools"] == ["big-batch"]
    assert doc["affinity"] is True and len(bytes.fromhex(doc["prefix_key"])) == 8
    assert doc["pick"] == {"pool": "big-batch", "provider": "c", "via": "affinity"}
    other = _explain(gw, body("another question " * 200, system=SYSTEM)).json()
    assert other["prefix_key"] == doc["prefix_key"]  # same system prompt, same key

    # 'small' has a 600-token window: a long prompt is sent to its longer-context alias.
    rerouted = _explain(gw, body(LONG_TEXT, model="small")).json()
    assert rerouted["alias"] == "small" and rerouted["routed_alias"] == "chat"
    assert rerouted["rerouted"] is True and rerouted["context_window"] == 32768
    fits = _explain(gw, body("hi", model="small")).json()
    assert fits["routed_alias"] == "small" and fits["rerouted"] is False

    prio = _explain(gw, body("hi"), **{"x-gateway-priority": "high"}).json()
    assert prio["class"] == "priority" and prio["pick"]["provider"] == "b"
    assert _explain(gw, body("hi"), key=KEY_BATCH).json()["class"] == "bulk"
    completions = _explain(gw, {"model": "chat", "prompt": "Say hi", "max_tokens": 4}).json()
    assert completions["endpoint"] == "completions" and completions["class"] == "interactive"


def test_explain_needs_auth_and_answers_errors_in_openai_shape(gw) -> None:
    assert _explain(gw, body("hi"), key="wrong").status_code == 401
    missing = _explain(gw, body("hi", model="nope"))
    assert missing.status_code == 404 and missing.json()["error"]["param"] == "model"
    bad = httpx.post(
        f"{gw.base_url}/gateway/explain",
        content=b"{not json",
        headers={"authorization": f"Bearer {KEY_A}"},
    )
    assert bad.status_code == 400 and "error" in bad.json()


def test_explain_command_offline(tmp_path, urls) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(classes_policy(urls))
    short = tmp_path / "short.json"
    short.write_text(json.dumps(body("What time is it?", temperature=0)))
    runner = CliRunner()
    res = runner.invoke(cli_app, ["explain", "--policy", str(policy), str(short)])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["class"] == "interactive" and doc["pools"] == ["low-latency", "big-batch"]
    assert doc["cache"]["exact"]["cacheable"] is True and "pick" not in doc
    assert [m["name"] for m in doc["members"]["low-latency"]] == ["a", "b"]

    long = tmp_path / "long.json"
    long.write_text(json.dumps(body(LONG_TEXT, system=SYSTEM, model="small")))
    res = runner.invoke(cli_app, ["explain", "--policy", str(policy), str(long)])
    doc = json.loads(res.stdout)
    assert doc["routed_alias"] == "chat" and doc["class"] == "long" and doc["prefix_key"]

    res = runner.invoke(
        cli_app,
        ["explain", "--policy", str(policy), "--tenant", "batch-team", str(short)],
    )
    assert json.loads(res.stdout)["class"] == "bulk"
    res = runner.invoke(
        cli_app,
        ["explain", "--policy", str(policy), "--priority", "high", "-"],
        input=short.read_text(),
    )
    assert json.loads(res.stdout)["class"] == "priority"

    unknown = tmp_path / "unknown.json"
    unknown.write_text(json.dumps(body("hi", model="nope")))
    res = runner.invoke(cli_app, ["explain", "--policy", str(policy), str(unknown)])
    assert res.exit_code == 1 and "nope" in res.output


async def test_preview_changes_no_routing_state(urls) -> None:
    text = classes_policy(urls).replace(
        "members: [b], balancer: {strategy: round_robin}",
        "members: [a, b, c], balancer: {strategy: round_robin}",
    )
    runtime = Runtime(parse_policy(text))
    try:
        snap, router = runtime.snapshot, Router()
        previews = {router.preview(snap, ["priority"], None).provider.name for _ in range(5)}
        assert previews == {"a"}  # a dry run does not turn the rotation
        assert all(p.member.inflight == 0 for p in snap.providers.values())
        picked = [router.pick(snap, "priority", ()).name for _ in range(3)]
        assert picked == ["a", "b", "c"]
        assert router.preview(snap, ["priority"], None).provider.name == "a"
    finally:
        await runtime.aclose()
