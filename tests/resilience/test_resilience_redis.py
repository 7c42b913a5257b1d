"""Redis-backed resilience: breakers shared by two gateway processes, and Redis dying mid-traffic."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest
import redis

from loadtests.simulator.testing import Fleet
from tests.support import (
    RedisProcess,
    gateway_processes,
    poll,
    requests_at,
    validate,
    validate_sse,
)

FLEET = ["dead", "good"]
pytestmark = pytest.mark.usefixtures("healthy_fleet")  # faults are cleared after each test


def policy(fleet: Fleet, breaker: str) -> str:
    return f"""
providers:
  dead: {{base_url: '{fleet.url("dead")}', breaker: {breaker}}}
  good: {{base_url: '{fleet.url("good")}', breaker: {breaker}}}
pools:
  main: {{members: [dead, good], balancer: {{strategy: round_robin}}}}
models:
  chat: {{pool: main}}
retry: {{base_backoff_ms: 0, max_backoff_ms: 0}}
"""


def breakers(base_url: str) -> dict:
    return httpx.get(base_url.removesuffix("/v1") + "/admin/breakers", timeout=5).json()


def chat(base_url: str) -> httpx.Response:
    body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    return httpx.post(base_url + "/chat/completions", json=body, timeout=10)


def test_breaker_opened_by_one_replica_stops_the_other_within_a_second(
    fleet: Fleet, tmp_path: Path, redis_url: str
) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(policy(fleet, "{consecutive_failures: 3, cooldown_s: 30, max_cooldown_s: 30}"))
    prefix = f"gwres:{uuid.uuid4().hex[:8]}:"
    env = {"REDIS_URL": redis_url, "GATEWAY_REDIS_PREFIX": prefix}
    watcher = redis.Redis.from_url(redis_url)
    with gateway_processes(path, 2, env=env) as (one, two):
        # Both replicas listen for breaker events before the outage starts.
        poll(lambda: watcher.pubsub_numsub(prefix + "breakers")[0][1] >= 2, within_s=10)
        assert chat(one).status_code == 200 and chat(two).status_code == 200  # warm
        fleet.set_faults("dead", error_rate=1.0, error_status=[500])
        while breakers(one).get("dead", {}).get("state") != "open":
            assert chat(one).status_code == 200
        opened = time.monotonic()
        dead_before = requests_at(fleet, "dead")

        # A request stream to replica 2 (round robin: every other request would go to `dead`).
        hits: list[float] = []
        seen_open: float | None = None
        while time.monotonic() - opened < 1.5:
            r = chat(two)
            assert r.status_code == 200
            now = time.monotonic()
            if requests_at(fleet, "dead") > dead_before + len(hits):
                hits.append(now - opened)
            if seen_open is None and breakers(two).get("dead", {}).get("state") == "open":
                seen_open = now - opened
        assert seen_open is not None and seen_open < 1.0, seen_open
        assert not hits or hits[-1] < 1.0, hits  # nothing reached `dead` after the first second
        assert chat(two).headers["x-gateway-provider"] == "good"
    watcher.close()


def test_redis_killed_mid_traffic(
    fleet: Fleet,
    gateway,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    with RedisProcess() as rp:
        prefix = f"gwres:{uuid.uuid4().hex[:8]}:"
        gw = gateway(
            policy(fleet, "{consecutive_failures: 3, cooldown_s: 0.5}"), rp.url, prefix=prefix
        )
        client = redis.Redis.from_url(rp.url)
        failures: list[str] = []
        served = [0]
        stop = threading.Event()

        def traffic() -> None:
            asyncio.run(_traffic(gw.base_url, stop, failures, served))

        worker = threading.Thread(target=traffic, daemon=True)
        worker.start()
        poll(lambda: served[0] >= 20 and client.keys(prefix + "exact:*"), within_s=10)
        client.close()
        rp.kill()
        killed_at = served[0]
        poll(lambda: served[0] >= killed_at + 40, within_s=15)  # traffic goes on without Redis
        redis_lines = [r for r in caplog.records if "redis" in r.getMessage().lower()]

        rp.start()  # same port
        client = redis.Redis.from_url(rp.url)
        assert not client.keys(prefix + "exact:*")  # a fresh, empty Redis
        poll(lambda: client.keys(prefix + "exact:*"), within_s=10)  # used again
        stop.set()
        worker.join(15)
        client.close()
    assert not failures, failures[:5]
    assert served[0] >= killed_at + 40
    # Logged once per component (shared state, breaker sharing, ...), not once per request.
    assert 1 <= len(redis_lines) <= 4, [r.getMessage() for r in redis_lines]


async def _traffic(url: str, stop: threading.Event, failures: list[str], served: list[int]) -> None:
    """Four concurrent senders: cacheable unary and streamed requests, new and repeated prompts."""

    async def sender(k: int, client: httpx.AsyncClient) -> None:
        i = 0
        while not stop.is_set():
            i += 1
            stream = i % 2 == 0
            text = f"sender {k} prompt {i % 7 if i % 3 else uuid.uuid4().hex}"
            body = {
                "model": "chat",
                "messages": [{"role": "user", "content": text}],
                "max_tokens": 4,
                "temperature": 0,
                "stream": stream,
            }
            try:
                r = await client.post(url + "/chat/completions", json=body)
                if r.status_code != 200:
                    failures.append(f"{r.status_code} {r.text[:200]}")
                elif i % 5 == 0:  # schema checks are slow: a sample is enough here
                    validate_sse(r.content) if stream else validate(
                        "CreateChatCompletionResponse", r.json()
                    )
                elif not (r.content.endswith(b"data: [DONE]\n\n") if stream else r.json()):
                    failures.append(f"bad body {r.content[-200:]!r}")
            except Exception as e:  # noqa: BLE001 - every failure is reported by the test
                failures.append(repr(e))
            served[0] += 1

    async with httpx.AsyncClient(timeout=10) as client:
        await asyncio.gather(*(sender(k, client) for k in range(4)))
