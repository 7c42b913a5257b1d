"""The inbound APIs' routes outside the pipeline (`POST /v1/messages/count_tokens`,
`GET`/`DELETE /v1/responses/{id}`) are recorded like inference requests: one access log line and
one observation (metrics, recent requests) per request, answered or refused."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from loadtests.simulator.testing import Fleet
from tests.support import AccessLines, GatewayServer

FLEET: list[Any] = ["a"]


@pytest.fixture(scope="module")
def gw(fleet: Fleet) -> Iterator[GatewayServer]:
    policy = f"""
providers:
  a: {{base_url: '{fleet.url("a")}', models: {{'*': sim-a}}, simulated: true}}
pools:
  main: {{members: [a]}}
models:
  chat: {{pool: main}}
"""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GATEWAY_API_KEYS", "team-a:key-a,team-b:key-b")
        with GatewayServer(policy) as server:
            yield server


def _requests_total(gw: GatewayServer) -> float:
    total = 0.0
    for line in httpx.get(gw.url + "/metrics").text.splitlines():
        if line.startswith("gateway_requests_total{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_count_tokens_and_stored_responses_are_logged_once(
    gw: GatewayServer, access_log: AccessLines
) -> None:
    created = httpx.post(
        gw.base_url + "/responses",
        json={"model": "chat", "input": "hello", "max_output_tokens": 8},
        headers={"authorization": "Bearer key-a"},
    )
    assert created.status_code == 200
    rid = created.json()["id"]
    time.sleep(0.05)  # the creation's own record
    before_metrics, before_seen = _requests_total(gw), len(gw.seen)

    a, b = {"authorization": "Bearer key-a"}, {"authorization": "Bearer key-b"}
    count = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}
    calls: list[tuple[str, str, str, dict[str, str], Any, int, str]] = [
        ("GET", f"/responses/{rid}", "get-ok", a, None, 200, "team-a"),
        ("GET", f"/responses/{rid}", "get-other", b, None, 404, "team-b"),
        ("GET", f"/responses/{rid}", "get-nokey", {}, None, 401, "default"),
        ("DELETE", f"/responses/{rid}", "del-ok", a, None, 200, "team-a"),
        ("DELETE", f"/responses/{rid}", "del-again", a, None, 404, "team-a"),
        (
            "POST",
            "/messages/count_tokens",
            "count-ok",
            {"x-api-key": "key-a"},
            count,
            200,
            "team-a",
        ),
        (
            "POST",
            "/messages/count_tokens",
            "count-nomodel",
            {"x-api-key": "key-b"},
            {**count, "model": "nope"},
            404,
            "team-b",
        ),
        ("POST", "/messages/count_tokens", "count-nokey", {}, count, 401, "default"),
    ]
    for method, path, request_id, headers, body, status, _ in calls:
        r = httpx.request(
            method,
            gw.base_url + path,
            json=body,
            headers={**headers, "x-request-id": request_id},
        )
        assert r.status_code == status, (request_id, r.text)
        assert r.headers["x-request-id"] == request_id
    counted = httpx.post(gw.base_url + "/messages/count_tokens", json=count, headers=a)
    assert counted.json()["input_tokens"] > 0
    assert counted.headers["x-gateway-token-count"].startswith("estimate")

    # Each is recorded once, after its answer was sent.
    deadline = time.monotonic() + 3.0
    while len(gw.seen) < before_seen + len(calls) + 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.05)
    assert len(gw.seen) == before_seen + len(calls) + 1
    assert _requests_total(gw) == before_metrics + len(calls) + 1
    for method, _, request_id, _, _, status, tenant in calls:
        (line,) = [x for x in access_log.lines if x["request_id"] == request_id]
        assert line["status"] == status and line["tenant"] == tenant
        assert line["total_ms"] >= 0
        endpoint = {
            "GET": "responses.retrieve",
            "DELETE": "responses.delete",
            "POST": "messages.count_tokens",
        }[method]
        assert line["endpoint"] == endpoint
        assert [c.request_id for c in gw.seen].count(request_id) == 1
