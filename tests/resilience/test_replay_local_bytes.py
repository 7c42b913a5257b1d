"""The in-process deferred queue (no Redis, or Redis down) is bounded in bytes as well as in
entries: large requests queued during an outage are refused with a clear 503 in the client's
API shape once `max_local_bytes` of bodies are held, and stored answers are dropped oldest
first beyond the same bound; the process never grows without limit."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

import anthropic
import httpx
import pytest

from gateway.resilience.deferred import MemoryReplayQueue, QueueFull, ReplaySettings
from loadtests.simulator.testing import Fleet
from tests.support import GatewayServer

FLEET = ["down"]
pytestmark = pytest.mark.usefixtures("healthy_fleet")  # faults are cleared after each test


async def test_queued_bodies_are_bounded_in_bytes() -> None:
    queue = MemoryReplayQueue(ReplaySettings(max_local_bytes=1000))
    await queue.enqueue("a", "t", "m", b"x" * 600)
    with pytest.raises(QueueFull):
        await queue.enqueue("b", "t", "m", b"x" * 600)
    await queue.enqueue("c", "t", "m", b"x" * 400)  # what is left still fits
    assert queue.body_bytes == 1000
    taken = await queue.read("w", 10, 10)
    assert [e.request_id for e in taken] == ["a", "c"]
    with pytest.raises(QueueFull):  # in progress still counts
        await queue.enqueue("d", "t", "m", b"x" * 10)
    await queue.ack(taken[0].entry_id)
    await queue.ack(taken[0].entry_id)  # twice: counted once
    assert queue.body_bytes == 400
    await queue.enqueue("d", "t", "m", b"x" * 600)
    assert await queue.depth() == 2


async def test_stored_answers_are_bounded_in_bytes_oldest_dropped_first() -> None:
    queue = MemoryReplayQueue(ReplaySettings(max_local_bytes=4000))
    for i in range(20):
        await queue.set_result(f"r{i}", {"status": "done", "body": "y" * 1000})
    assert queue.result_bytes <= 4000
    assert await queue.get_result("r19") is not None  # the newest answers stay
    assert await queue.get_result("r0") is None
    await queue.set_result("r19", {"status": "done", "body": "z"})  # replaced, not added
    doc = await queue.get_result("r19")
    assert doc is not None and doc["body"] == "z"
    assert queue.result_bytes <= 4000


def test_a_full_local_queue_answers_503_in_the_api_shape(
    fleet: Fleet, gateway: Callable[..., GatewayServer]
) -> None:
    fleet.set_faults("down", error_rate=1.0, error_status=[503])
    rules = Path(tempfile.mkdtemp(prefix="rules-"))
    (rules / "rules.yaml").write_text(
        "rules:\n"
        "  - name: later\n"
        "    match: {keywords: [word]}\n"
        "    queue: true\n"
        "    template: queued as {request_id}\n"
        "default:\n"
        "  name: default\n"
        "  template: degraded\n"
    )
    gw = gateway(
        f"""
providers:
  down: {{base_url: '{fleet.url("down")}'}}
pools:
  main: {{members: [down]}}
models:
  chat: {{pool: main, cache: {{exact: {{enabled: false}}}}}}
retry: {{base_backoff_ms: 0, max_backoff_ms: 0}}
degradation: {{rules: '{rules}'}}
"""
    )
    queue = gw.pipeline.degradation.queue
    assert isinstance(queue, MemoryReplayQueue)
    queue.settings = ReplaySettings(max_local_bytes=30_000, base_backoff_ms=60_000)
    big = "word " * 4_000  # a 20 kB request
    r = gw.chat(messages=[{"role": "user", "content": big}])
    assert r.status_code == 200, r.text
    assert r.headers["x-gateway-deferred"].startswith("dfr_")
    r = gw.chat(messages=[{"role": "user", "content": big}])
    assert r.status_code == 503
    assert r.json()["error"]["code"] == "deferred_queue_full"
    assert "x-gateway-deferred" not in r.headers
    claude = anthropic.Anthropic(base_url=gw.url, api_key="unused", max_retries=0)
    with pytest.raises(anthropic.APIStatusError) as raised:
        claude.messages.create(
            model="chat", max_tokens=5, messages=[{"role": "user", "content": big}]
        )
    assert raised.value.status_code == 529
    assert raised.value.response.json()["type"] == "error"
    small = httpx.post(
        gw.base_url + "/chat/completions",
        json={"model": "chat", "max_tokens": 5, "messages": [{"role": "user", "content": "word"}]},
        timeout=10,
    )
    assert small.status_code == 200 and small.headers["x-gateway-deferred"].startswith("dfr_")
    assert queue.body_bytes <= 30_000
