"""A request queued for replay is replayed once even when Redis carried out the enqueue but its
answer was lost (a timeout): the gateway sees it landed and does not keep a second copy in the
process, and when it cannot tell (Redis unreachable at that moment) the copy kept in the process
is dropped by its worker once the shared queue is seen to hold the request (real Redis, a real
upstream on loopback)."""

from __future__ import annotations

import asyncio
import json
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from redis.exceptions import TimeoutError as RedisTimeoutError

from tests.support import GatewayServer, JsonRawServer, completion_body, poll


class Switchable(JsonRawServer):
    """An upstream that answers 503 while `down`, else a completion; records what it answered."""

    def __init__(self) -> None:
        super().__init__()
        self.down = True
        self.answered: list[str] = []

    async def answer(self, request: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if self.down:
            return 503, {"error": {"message": "down", "type": "server_error"}}
        self.answered.append(request["messages"][-1]["content"])
        return 200, completion_body("replayed")


@pytest.fixture
def upstream() -> Iterator[Switchable]:
    with Switchable() as s:
        yield s


RULES = """
rules:
  - name: later
    match: {keywords: [report]}
    queue: true
    template: "queued as {request_id}"
default:
  name: default
  template: "degraded"
"""


def start(
    gateway: Callable[..., GatewayServer], upstream: Switchable, redis_url: str, prefix: str
) -> GatewayServer:
    rules = Path(tempfile.mkdtemp(prefix="rules-"))
    (rules / "rules.yaml").write_text(RULES)
    return gateway(
        f"""
providers:
  p: {{base_url: '{upstream.url}', breaker: {{consecutive_failures: 0, min_requests: 1000}}}}
pools:
  main: {{members: [p]}}
models:
  chat: {{pool: main, cache: {{exact: {{enabled: false}}}}}}
retry: {{max_attempts: 1}}
degradation: {{rules: '{rules}'}}
""",
        redis_url,
        prefix=prefix,
    )


def lose_the_answer(gw: GatewayServer) -> None:
    """Redis carries out the enqueue, then its answer is lost."""
    queue = gw.pipeline.degradation.queue
    enqueue = queue.enqueue

    async def carried_out_then_timed_out(*args: Any, **kw: Any) -> None:
        await enqueue(*args, **kw)
        raise RedisTimeoutError("Timeout reading from socket")

    queue.enqueue = carried_out_then_timed_out


def replayed_once(gw: GatewayServer, upstream: Switchable, deferred_id: str) -> None:
    upstream.down = False

    def fetch() -> dict[str, Any]:
        r = httpx.get(f"{gw.base_url}/gateway/deferred/{deferred_id}", timeout=5)
        return r.json() if r.status_code == 200 else {}

    doc = poll(lambda: (d := fetch()).get("status") == "done" and d, within_s=20)
    assert json.loads(doc["body"])["choices"][0]["message"]["content"] == "replayed"
    # Both workers had time to take their copy, if there were two.
    deg = gw.pipeline.degradation
    poll(lambda: all(not w._held for w in deg.workers), within_s=5)
    assert upstream.answered == ["write the report"]


def ask(gw: GatewayServer) -> str:
    r = gw.chat(messages=[{"role": "user", "content": "write the report"}])
    assert r.status_code == 200, r.text
    assert r.headers["x-gateway-rule"] == "later"
    return r.headers["x-gateway-deferred"]


def test_an_enqueue_redis_carried_out_is_not_kept_twice(
    gateway: Callable[..., GatewayServer],
    upstream: Switchable,
    redis_url: str,
    redis_prefix: str,
) -> None:
    gw = start(gateway, upstream, redis_url, redis_prefix)
    lose_the_answer(gw)
    deferred_id = ask(gw)
    deg = gw.pipeline.degradation
    assert asyncio.run(deg.local_queue.depth()) == 0  # not kept a second time here
    assert deg.queued == 1
    replayed_once(gw, upstream, deferred_id)


def test_a_copy_kept_here_is_dropped_once_redis_is_seen_to_hold_it(
    gateway: Callable[..., GatewayServer],
    upstream: Switchable,
    redis_url: str,
    redis_prefix: str,
) -> None:
    gw = start(gateway, upstream, redis_url, redis_prefix)
    lose_the_answer(gw)
    deg = gw.pipeline.degradation

    async def cannot_tell(deferred_id: str, tenant: str) -> bool:
        return False  # Redis unreachable at that moment: the gateway keeps a copy here

    deg._landed = cannot_tell
    deferred_id = ask(gw)
    replayed_once(gw, upstream, deferred_id)
    assert asyncio.run(deg.local_queue.depth()) == 0
