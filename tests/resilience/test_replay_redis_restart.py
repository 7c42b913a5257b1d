"""Redis restarted empty (no persistence): the deferred queue's consumer group is recreated and
queued requests are replayed; what the gateway assumes in Redis is rebuilt when Redis returns."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from loadtests.simulator.testing import Fleet
from tests.support import GatewayServer, RedisProcess, poll

FLEET = ["a"]
pytestmark = pytest.mark.usefixtures("healthy_fleet")  # faults are cleared after each test

RULES = """
default:
  name: queue-everything
  queue: true
  template: "Queued as {request_id}."
"""


def port_in_range(low: int = 7200, high: int = 7300) -> int:
    """A free port in this suite's own range (kept apart from shared services)."""
    for port in range(low, high):
        with socket.socket() as s, contextlib.suppress(OSError):
            s.bind(("127.0.0.1", port))
            return port
    pytest.skip("no free port in the range")


@pytest.fixture
def redis_server() -> Iterator[RedisProcess]:
    with RedisProcess(port_in_range()) as r:
        yield r


def ask(url: str, i: int) -> str:
    body = {"model": "chat", "messages": [{"role": "user", "content": f"q{i}"}], "max_tokens": 4}
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=10)
    assert r.status_code == 200 and r.headers.get("x-gateway-degraded") == "true", r.text
    rid = r.headers.get("x-gateway-deferred")
    assert rid, r.headers
    return rid


def status(url: str, rid: str) -> str:
    r = httpx.get(f"{url}/v1/gateway/deferred/{rid}", timeout=5)
    return r.json().get("status", "") if r.status_code == 200 else f"http {r.status_code}"


def test_queued_requests_replayed_after_redis_restarted_empty(
    fleet: Fleet,
    gateway: Callable[..., GatewayServer],
    redis_server: RedisProcess,
    tmp_path: Path,
) -> None:
    (tmp_path / "rules.yaml").write_text(RULES)
    policy = f"""
providers:
  a: {{base_url: '{fleet.url("a")}', breaker: {{cooldown_s: 0.2, max_cooldown_s: 0.4}}}}
pools:
  main: {{members: [a]}}
models:
  chat: {{pool: main}}
retry: {{base_backoff_ms: 0, max_backoff_ms: 0}}
degradation: {{rules: '{tmp_path / "rules.yaml"}'}}
"""
    gw = gateway(policy, redis_server.url)
    fleet.set_faults("a", error_rate=1.0, error_status=[503])
    before = [ask(gw.url, i) for i in range(3)]  # queued in Redis, held by the worker
    poll(lambda: all(status(gw.url, r) == "queued" for r in before))

    redis_server.kill()
    redis_server.start()  # same port, empty: no stream, no consumer group, no results
    after = [ask(gw.url, 10 + i) for i in range(4)]  # queued once Redis is back
    fleet.clear_faults("a")

    def all_done() -> bool:
        return all(status(gw.url, r) == "done" for r in before + after)

    poll(all_done, within_s=20, every_s=0.2)
    for rid in before + after:
        doc = httpx.get(f"{gw.url}/v1/gateway/deferred/{rid}", timeout=5).json()
        assert '"choices"' in doc["body"]
