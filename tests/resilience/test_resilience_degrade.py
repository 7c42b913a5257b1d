"""When nothing can answer: degradation rules (JSON and SSE), deferred replay, admission shedding."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from loadtests.simulator.testing import Fleet, run_fleet
from tests.resilience.test_resilience_helpers import healthy_fleet, poll, requests_at, start_gateway  # noqa: F401 - fixture
from tests.support import validate, validate_sse

RULES = """
rules:
  - name: queued
    match: {keywords: [report]}
    queue: true
    template: "Queued: fetch {request_id} later."
  - name: code
    match: {regex: '(?i)\\btraceback\\b'}
    template: "Code help for {alias} is down; resend in {retry_after_s} s."
  - name: refuse
    match: {keywords: [dosage]}
    status: 503
    retry_after_s: 60
    template: "Not while degraded."
default:
  template: "Degraded answer for {alias} ({request_id})."
"""


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    slow = {"decode_tps_alone": 25, "decode_tps_full": 25}
    with run_fleet(
        [
            {"name": "a", "profile": "fast"},
            {"name": "b", "profile": "fast"},
            {"name": "slow1", "profile": "fast", "overrides": slow},
            {"name": "slow2", "profile": "fast", "overrides": slow},
        ]
    ) as f:
        yield f


@pytest.fixture
def rules_dir(tmp_path: Path) -> Path:
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "10-rules.yaml").write_text(RULES)
    return tmp_path / "rules"


def policy(fleet: Fleet, rules: Path | None, extra: str = "") -> str:
    degradation = f"degradation: {{rules: '{rules}'}}" if rules else ""
    return f"""
providers:
  a: {{base_url: '{fleet.url("a")}', breaker: {{cooldown_s: 0.2, max_cooldown_s: 0.4}}}}
  b: {{base_url: '{fleet.url("b")}', breaker: {{cooldown_s: 0.2, max_cooldown_s: 0.4}}}}
pools:
  main: {{members: [a, b]}}
models:
  chat: {{pool: main}}
retry: {{base_backoff_ms: 0, max_backoff_ms: 0}}
{degradation}
{extra}
"""


def ask(gw, text: str, stream: bool = False, key: str | None = None) -> httpx.Response:  # type: ignore[no-untyped-def]
    headers = {"authorization": f"Bearer {key}"} if key else {}
    body = {"model": "chat", "messages": [{"role": "user", "content": text}], "max_tokens": 6}
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    return httpx.post(gw.base_url + "/chat/completions", json=body, headers=headers, timeout=15)


def all_down(fleet: Fleet) -> None:
    fleet.set_faults("a", error_rate=1.0, error_status=[503])
    fleet.set_faults("b", refuse_connections=True)


def test_degraded_answers_in_both_modes_and_rule_selection(
    fleet: Fleet,
    start_gateway,  # noqa: F811
    rules_dir: Path,
) -> None:
    gw = start_gateway(policy(fleet, rules_dir))
    all_down(fleet)

    r = ask(gw, "How is the weather?")
    assert r.status_code == 200 and r.headers["x-gateway-degraded"] == "true"
    assert r.headers["x-gateway-rule"] == "default"
    body = r.json()
    validate("CreateChatCompletionResponse", body)
    assert body["choices"][0]["message"]["content"].startswith("Degraded answer for chat (")

    r = ask(gw, "Here is my Traceback, help", stream=True)
    assert r.status_code == 200 and r.headers["x-gateway-degraded"] == "true"
    assert r.headers["content-type"].startswith("text/event-stream")
    assert r.headers["x-gateway-rule"] == "code"
    chunks = validate_sse(r.content)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text.startswith("Code help for chat is down")
    assert chunks[-1]["usage"] is not None  # include_usage is honoured

    r = ask(gw, "What dosage?", stream=True)  # an error status is JSON even for a stream
    assert r.status_code == 503 and r.headers["retry-after"] == "60"
    assert r.headers["x-gateway-degraded"] == "true"
    validate("ErrorResponse", r.json())


def test_without_rules_the_honest_error_stays(fleet: Fleet, start_gateway) -> None:  # noqa: F811
    gw = start_gateway(policy(fleet, None))
    all_down(fleet)
    r = ask(gw, "hello")
    assert r.status_code in (502, 503)
    assert "x-gateway-degraded" not in r.headers
    validate("ErrorResponse", r.json())


def test_queued_request_is_replayed_after_recovery(
    fleet: Fleet,
    start_gateway,  # noqa: F811
    rules_dir: Path,
    redis_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RES_KEY_A", "key-tenant-a")
    monkeypatch.setenv("RES_KEY_B", "key-tenant-b")
    auth = """
auth:
  keys:
    - {tenant: team-a, key_env: RES_KEY_A}
    - {tenant: team-b, key_env: RES_KEY_B}
"""
    gw = start_gateway(policy(fleet, rules_dir, auth), redis_url=redis_url)
    all_down(fleet)
    r = ask(gw, "Please write the quarterly report", stream=True, key="key-tenant-a")
    assert r.status_code == 200 and r.headers["x-gateway-rule"] == "queued"
    request_id = r.headers["x-gateway-deferred"]
    # Generated by the gateway, not the client's correlation id (which another tenant could pick).
    assert request_id.startswith("dfr_") and request_id != r.headers["x-request-id"]
    validate_sse(r.content)
    stream_key = gw.state.tagged_key("deferred") + ":replay"
    assert gw.pipeline.fallbacks.queue.stream == stream_key  # in Redis, under this prefix

    def fetch(key: str) -> httpx.Response:
        return httpx.get(
            f"{gw.base_url}/gateway/deferred/{request_id}",
            headers={"authorization": f"Bearer {key}"},
            timeout=5,
        )

    assert fetch("key-tenant-a").json()["status"] == "queued"
    assert fetch("key-tenant-b").status_code == 404  # another tenant never sees it

    before = requests_at(fleet, "a") + requests_at(fleet, "b")
    fleet.clear_faults("a")
    fleet.clear_faults("b")
    doc = poll(lambda: (d := fetch("key-tenant-a").json())["status"] == "done" and d, within_s=15)
    assert doc["http_status"] == 200 and doc["tenant"] == "team-a"
    answer = httpx.Response(200, content=doc["body"]).json()
    validate("CreateChatCompletionResponse", answer)
    assert answer["usage"]["completion_tokens"] == 6
    assert requests_at(fleet, "a") + requests_at(fleet, "b") > before
    assert fetch("key-tenant-b").status_code == 404
    depth = asyncio.run(_xlen(redis_url, stream_key))
    assert depth == 0  # acknowledged and removed once answered


async def _xlen(url: str, key: str) -> int:
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(url)
    try:
        return int(await client.xlen(key))
    finally:
        await client.aclose()


# -- admission control -------------------------------------------------------------------------


def admission_policy(fleet: Fleet, rules: Path | None) -> str:
    degradation = f"degradation: {{rules: '{rules}'}}" if rules else ""
    return f"""
providers:
  slow1: {{base_url: '{fleet.url("slow1")}', max_inflight: 1}}
  slow2: {{base_url: '{fleet.url("slow2")}', max_inflight: 1}}
pools:
  main:
    members: [slow1, slow2]
    queue: {{max_wait_s: 0.2, max_depth: 2, retry_after_s: 2}}
models:
  chat: {{pool: main}}
{degradation}
"""


async def _burst(url: str, n: int, text: str) -> list[httpx.Response]:
    body = {"model": "chat", "messages": [{"role": "user", "content": text}], "max_tokens": 15}
    async with httpx.AsyncClient(timeout=15) as client:
        return list(
            await asyncio.gather(
                *(client.post(url + "/chat/completions", json=body) for _ in range(n))
            )
        )


@pytest.mark.parametrize("with_rules", [False, True])
def test_admission_queue_waits_then_sheds(
    fleet: Fleet,
    start_gateway,  # noqa: F811
    rules_dir: Path,
    with_rules: bool,
) -> None:
    gw = start_gateway(admission_policy(fleet, rules_dir if with_rules else None))
    responses = asyncio.run(_burst(gw.base_url, 6, f"burst {uuid.uuid4().hex}"))
    statuses = sorted(r.status_code for r in responses)
    served = [r for r in responses if "x-gateway-provider" in r.headers and r.status_code == 200]
    assert len(served) == 2, statuses  # one in flight per member; they take ~0.6 s each
    shed = [r for r in responses if r not in served]
    assert len(shed) == 4
    for r in shed:
        if with_rules:
            assert r.status_code == 200 and r.headers["x-gateway-degraded"] == "true"
            validate("CreateChatCompletionResponse", r.json())
        else:
            assert r.status_code == 429 and r.headers["retry-after"] == "2"
            assert r.json()["error"]["code"] == "gateway_overloaded"
    stats = gw.pipeline.dispatcher.admission.stats["main"]
    assert stats.shed == 4
    assert stats.wait_s_total >= 0.3  # two waited ~0.2 s each before giving up
    assert stats.depth == 0
