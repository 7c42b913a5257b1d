"""/metrics after a known sequence of requests; the access log line; readiness."""

from __future__ import annotations

import logging
import time

import httpx
import orjson
from prometheus_client.parser import text_string_to_metric_families

from gateway.context import Context
from gateway.observability.logs import AccessLog, access_record
from gateway.observability.metrics import usage_tokens

CHAT = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}


def policy(fleet, members=("a", "b"), extra: str = "") -> str:
    providers = "\n".join(
        f"  {m}: {{base_url: '{fleet.url(m)}', models: {{'*': sim}},"
        " price: {input_per_1m: 1.0, output_per_1m: 2.0}}"
        for m in members
    )
    return f"""
providers:
{providers}
pools:
  main: {{members: [{", ".join(members)}], balancer: {{strategy: round_robin}}}}
models:
  chat: {{pool: main}}
{extra}
"""


def scrape(gw) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    r = httpx.get(gw.url + "/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    out = {}
    for fam in text_string_to_metric_families(r.text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def total(samples, name: str, **labels: str) -> float:
    want = set(labels.items())
    return sum(v for (n, lab), v in samples.items() if n == name and want <= set(lab))


def test_metrics_move_with_traffic(fleet, gateway) -> None:
    gw = gateway(policy(fleet))
    before = scrape(gw)
    assert total(before, "gateway_requests_total") == 0
    assert total(before, "gateway_breaker_state", provider="a", state="closed") == 1
    with httpx.Client(base_url=gw.base_url) as c:
        for _ in range(3):
            assert c.post("/chat/completions", json=CHAT).status_code == 200
        for _ in range(2):
            assert c.post("/chat/completions", json={**CHAT, "stream": True}).status_code == 200
        cached = {**CHAT, "temperature": 0}
        assert c.post("/chat/completions", json=cached).headers["x-gateway-cache"] == "miss"
        assert c.post("/chat/completions", json=cached).headers["x-gateway-cache"] == "hit-exact"
        assert c.post("/chat/completions", json={"model": "nope", "messages": []}).status_code
    deadline = time.monotonic() + 5
    while True:  # the streams are recorded when they end
        m = scrape(gw)
        if total(m, "gateway_requests_total", status="200") == 7 or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    assert total(m, "gateway_requests_total", status="200") == 7
    assert total(m, "gateway_requests_total", alias="chat", pool="main", provider="a") >= 2
    assert total(m, "gateway_request_duration_seconds_count", status="200") == 7
    assert total(m, "gateway_request_duration_seconds_bucket", le="+Inf") == 8
    assert total(m, "gateway_time_to_first_token_seconds_count") == 2
    assert total(m, "gateway_time_per_output_token_seconds_count") == 2
    # Six answers came from providers (the cache hit did not): 8 tokens each.
    assert total(m, "gateway_output_tokens_total", alias="chat") == 6 * 8
    assert total(m, "gateway_input_tokens_total", tenant="default") > 0
    assert total(m, "gateway_cost_usd_total") > 0
    assert total(m, "gateway_cache_requests_total", result="hit-exact") == 1
    assert total(m, "gateway_cache_requests_total", result="miss") == 1
    assert total(m, "gateway_cache_requests_total", result="bypass") >= 5
    assert total(m, "gateway_member_attempts_total") == 6
    assert total(m, "gateway_member_inflight") == 0
    assert total(m, "gateway_member_latency_ewma_seconds", provider="a") > 0
    assert total(m, "gateway_admission_queue_depth", pool="main") == 0
    assert total(m, "gateway_policy_info") == 1
    assert ("gateway_policy_reloads_total", ()) in m
    assert ("gateway_deferred_queue_length", ()) in m
    assert total(m, "process_cpu_seconds_total") > 0


def test_failures_breakers_and_drain_in_metrics(fleet, gateway) -> None:
    gw = gateway(policy(fleet, members=("c",)))
    fleet.set_faults("c", error_rate=1.0, error_status=[500])
    try:
        for _ in range(2):
            httpx.post(gw.base_url + "/chat/completions", json=CHAT)
    finally:
        fleet.set_faults("c")
    httpx.post(gw.url + "/admin/members/c/drain")
    httpx.post(gw.url + "/admin/members/c/breaker", json={"state": "open"})
    m = scrape(gw)
    assert total(m, "gateway_upstream_failures_total", provider="c", kind="upstream_5xx") >= 2
    assert total(m, "gateway_member_failures_total", provider="c") >= 2
    assert total(m, "gateway_requests_total", status="502") == 2
    assert total(m, "gateway_breaker_state", provider="c", state="open") == 1
    assert total(m, "gateway_member_drained", provider="c") == 1


def test_access_log_line(fleet, gateway) -> None:
    gw = gateway(policy(fleet))
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    handler = Keep()
    logging.getLogger("gateway.access").addHandler(handler)
    try:
        r = httpx.post(
            gw.base_url + "/chat/completions", json=CHAT, headers={"x-request-id": "req-42"}
        )
        # The line is written just after the response's last byte: give the server a moment.
        deadline = time.monotonic() + 2.0
        while not any("req-42" in x for x in lines) and time.monotonic() < deadline:
            time.sleep(0.005)
    finally:
        logging.getLogger("gateway.access").removeHandler(handler)
    assert r.headers["x-request-id"] == "req-42"
    (line,) = [orjson.loads(x) for x in lines if "req-42" in x]
    assert line["request_id"] == "req-42" and line["status"] == 200
    assert line["alias"] == "chat" and line["pool"] == "main" and line["provider"] in ("a", "b")
    assert line["attempts"] == 1 and line["cache"] == "bypass" and line["degraded"] is False
    assert line["total_ms"] > 0 and line["class"] == "default" and line["tenant"] == "default"
    assert "request_body" not in line and "hi" not in orjson.dumps(line).decode()


def test_access_log_switches() -> None:
    assert AccessLog.from_env({"GATEWAY_ACCESS_LOG": "0"}) is None
    log = AccessLog.from_env({"GATEWAY_LOG_BODIES": "1"})
    assert log is not None and log.bodies
    ctx = Context("r1", 0.0, request_body=b'{"messages":"secret"}', response_body=b"{}")
    assert access_record(ctx, bodies=True)["request_body"] == '{"messages":"secret"}'
    assert "request_body" not in access_record(ctx)
    disabled = logging.getLogger("gateway.access.test-disabled")
    disabled.setLevel(logging.ERROR)
    AccessLog(disabled)(ctx)  # disabled logger: returns before building anything


def test_usage_tokens_from_tail() -> None:
    body = b'{"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":34,"total_tokens":46}}'
    assert usage_tokens(body) == (12, 34)
    assert usage_tokens(b"{}") == (None, None)
    assert usage_tokens(None) == (None, None)


def test_ready_needs_a_reachable_provider(fleet, gateway, capture_upstream) -> None:
    gw = gateway(policy(fleet, members=("a",)))
    deadline = time.monotonic() + 5
    while (r := httpx.get(gw.url + "/ready")).status_code != 200 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert r.status_code == 200 and r.json()["providers"] == {"a": "reachable"}
    httpx.post(gw.url + "/admin/members/a/breaker", json={"state": "open"})
    r = httpx.get(gw.url + "/ready")
    assert r.status_code == 503 and r.json()["providers"] == {"a": "breaker_open"}
    # A provider nobody listens on is never ready.
    dead = gateway(
        """
providers:
  gone: {base_url: 'http://127.0.0.1:9/v1'}
pools:
  main: {members: [gone]}
models:
  chat: {pool: main}
"""
    )
    deadline = time.monotonic() + 5
    while (r := httpx.get(dead.url + "/ready")).json()["providers"]["gone"] == "not_probed_yet":
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert r.status_code == 503 and r.json()["providers"] == {"gone": "unreachable"}
    assert httpx.get(dead.url + "/health").status_code == 200
