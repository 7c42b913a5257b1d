"""Deferred-request replay on a real Redis stream and on the in-memory fallback."""

from __future__ import annotations

import asyncio
import logging
import socket
import time
import uuid
from collections.abc import AsyncIterator

import orjson
import pytest
import redis.asyncio as aioredis

from gateway.resilience.deferred import (
    MemoryReplayQueue,
    QueueFull,
    RedisReplayQueue,
    ReplayEntry,
    ReplaySettings,
    ReplayWorker,
    make_replay_queue,
)

FAST = dict(base_backoff_ms=20, max_backoff_ms=40, block_ms=50, claim_idle_ms=300)


@pytest.fixture
async def client() -> AsyncIterator[aioredis.Redis]:
    r = aioredis.Redis.from_url("redis://127.0.0.1:6379/4")
    yield r
    await r.aclose()


@pytest.fixture
def prefix() -> str:
    return f"test-replay-{uuid.uuid4().hex[:10]}"


@pytest.fixture(autouse=True)
async def cleanup(client: aioredis.Redis, prefix: str) -> AsyncIterator[None]:
    yield
    keys = [k async for k in client.scan_iter(match=f"{prefix}:*")]
    if keys:
        await client.delete(*keys)


class Upstream:
    """A send function that fails ``failures`` times, then answers."""

    def __init__(self, failures: int, final: int = 200) -> None:
        self.failures, self.final, self.calls = failures, final, 0

    async def __call__(self, entry: ReplayEntry) -> tuple[int, bytes]:
        body = entry.body
        self.calls += 1
        if self.calls <= self.failures:
            if self.calls % 2:
                raise ConnectionError("provider down")
            return 503, b'{"error": "overloaded"}'
        return self.final, orjson.dumps({"echo": orjson.loads(body)})


async def until_result(queue, request_id: str, status: str, within: float = 5.0):  # type: ignore[no-untyped-def]
    end = time.monotonic() + within
    while True:
        doc = await queue.get_result(request_id)
        if doc is not None and doc["status"] == status:
            return doc
        assert time.monotonic() < end, f"no {status} result in time: {doc}"
        await asyncio.sleep(0.02)


async def run_worker(worker: ReplayWorker, request_id: str, status: str, within: float = 5.0):  # type: ignore[no-untyped-def]
    await worker.start()
    try:
        return await until_result(worker.queue, request_id, status, within)
    finally:
        await worker.stop()


@pytest.mark.parametrize("backend", ["redis", "redis-resp3", "memory"])
async def test_failing_then_succeeding_send_stores_result(
    backend: str, client: aioredis.Redis, prefix: str
) -> None:
    settings = ReplaySettings(prefix=prefix, **FAST)
    if backend == "redis-resp3":
        client = aioredis.Redis.from_url("redis://127.0.0.1:6379/4", protocol=3)
    queue = make_replay_queue(None if backend == "memory" else client, settings)
    await queue.enqueue("req-1", "tenant-a", "gpt-x", {"model": "gpt-x", "messages": []})
    queued = await queue.get_result("req-1")
    assert queued is not None and queued["status"] == "queued" and queued["tenant"] == "tenant-a"
    upstream = Upstream(failures=3)
    doc = await run_worker(ReplayWorker(queue, upstream, "w1", settings), "req-1", "done")
    assert doc["http_status"] == 200 and doc["attempts"] == 4 and upstream.calls == 4
    assert orjson.loads(doc["body"]) == {"echo": {"model": "gpt-x", "messages": []}}
    assert await queue.depth() == 0
    if backend != "memory":
        assert await client.ttl(f"{prefix}:result:req-1") > 0
        pending = await client.xpending(f"{prefix}:replay", "workers")
        assert pending["pending"] == 0
    if backend == "redis-resp3":
        await client.aclose()


async def test_non_retryable_answer_and_attempt_limit_fail(prefix: str) -> None:
    settings = ReplaySettings(prefix=prefix, max_attempts=3, **FAST)
    queue = MemoryReplayQueue(settings)
    await queue.enqueue("bad", "t", "m", b"{}")
    doc = await run_worker(
        ReplayWorker(queue, Upstream(0, final=400), settings=settings), "bad", "failed"
    )
    assert doc["http_status"] == 400 and doc["attempts"] == 1
    await queue.enqueue("dead", "t", "m", b"{}")
    doc = await run_worker(ReplayWorker(queue, Upstream(99), settings=settings), "dead", "failed")
    assert doc["attempts"] == 3 and doc["last_error"]


async def test_dead_consumer_entries_are_claimed(client: aioredis.Redis, prefix: str) -> None:
    settings = ReplaySettings(prefix=prefix, **FAST)
    queue = RedisReplayQueue(client, settings)
    await queue.enqueue("orphan", "t", "m", b'{"q": 1}')
    taken = await queue.read("crashed-worker", 10, 10)  # read, then the process "dies"
    assert [e.request_id for e in taken] == ["orphan"]
    start = time.monotonic()
    doc = await run_worker(ReplayWorker(queue, Upstream(0), "survivor", settings), "orphan", "done")
    elapsed = time.monotonic() - start
    assert doc["status"] == "done"
    assert elapsed >= settings.claim_idle_ms / 1000.0 - 0.05  # only once it went idle
    print(f"\norphaned entry claimed and answered after {elapsed * 1000:.0f} ms")
    assert await queue.depth() == 0


async def test_live_worker_keeps_its_retrying_entries(client: aioredis.Redis, prefix: str) -> None:
    slow_retry = ReplaySettings(
        prefix=prefix, **{**FAST, "base_backoff_ms": 1500, "max_backoff_ms": 1500}
    )
    queue = RedisReplayQueue(client, slow_retry)
    await queue.enqueue("held", "t", "m", b"{}")
    holder = ReplayWorker(queue, Upstream(99), "holder", slow_retry)
    other = ReplayWorker(queue, Upstream(0), "other", slow_retry)
    await holder.start()
    await asyncio.sleep(0.2)
    await other.start()
    try:
        await asyncio.sleep(1.0)  # > claim_idle_ms: still not stolen, the holder refreshes it
        assert other.completed == 0
        doc = await queue.get_result("held")
        assert doc is not None and doc["status"] == "queued" and doc["attempts"] >= 1
    finally:
        await holder.stop()  # the holder dies: now the other worker adopts the entry
    try:
        await until_result(queue, "held", "done", within=3.0)
    finally:
        await other.stop()


@pytest.mark.parametrize("backend", ["redis", "memory"])
async def test_queue_is_bounded(backend: str, client: aioredis.Redis, prefix: str) -> None:
    settings = ReplaySettings(prefix=prefix, max_len=3)
    queue = make_replay_queue(client if backend == "redis" else None, settings)
    for i in range(3):
        await queue.enqueue(f"r{i}", "t", "m", b"{}")
    with pytest.raises(QueueFull):
        await queue.enqueue("r3", "t", "m", b"{}")
    assert await queue.get_result("r3") is None


async def test_worker_survives_redis_down(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="gateway.resilience.deferred")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dead = aioredis.Redis.from_url(f"redis://127.0.0.1:{port}/4", socket_connect_timeout=0.2)
    worker = ReplayWorker(RedisReplayQueue(dead), Upstream(0), "w")
    await worker.start()
    await asyncio.sleep(0.6)
    assert worker._task is not None and not worker._task.done()
    await worker.stop()
    await dead.aclose()
    assert len([r for r in caplog.records if "unreachable" in r.getMessage()]) == 1


@pytest.mark.parametrize("claimed", [False, True])
async def test_a_malformed_entry_never_holds_back_the_good_ones(
    client: aioredis.Redis, prefix: str, claimed: bool
) -> None:
    """Entries not written by a gateway (undecodable, missing, oversized or odd ids) are dropped
    and counted, whether read fresh or claimed from a dead worker; the ones beside them replay."""
    settings = ReplaySettings(prefix=prefix, **FAST)
    queue = RedisReplayQueue(client, settings)
    await queue.enqueue("first", "t", "m", b'{"q": 0}')  # creates the stream and its group
    stream = f"{prefix}:replay"
    bad = [
        {"request_id": b"\xff\xfe", "tenant": "t", "alias": "m", "body": b"{}"},
        {"tenant": "t", "alias": "m", "body": b"{}"},
        {"request_id": "x" * 500, "tenant": "t", "alias": "m", "body": b"{}"},
        {"request_id": "a b\r\n", "tenant": "t", "alias": "m", "body": b"{}"},
        {"request_id": "r", "tenant": b"\xc3", "alias": "m", "body": b"{}"},
    ]
    async with client.pipeline(transaction=True) as pipe:
        for fields in bad:
            pipe.xadd(stream, fields)
        pipe.xadd(stream, {"request_id": "victim", "tenant": "t", "alias": "m", "body": b"{}"})
        await pipe.execute()
    if claimed:  # a worker read them all, then died
        assert await queue.read("crashed-worker", 50, 10) is not None
    worker = ReplayWorker(queue, Upstream(0), "survivor", settings)
    doc = await run_worker(worker, "victim", "done", within=5.0)
    assert doc["status"] == "done"
    assert queue.dropped == len(bad)
    assert await queue.depth() == 0  # dropped entries are acked and deleted, not left pending


async def test_a_reload_naming_a_rules_folder_swaps_it_in(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """`degradation.rules` changed by a reload takes effect (it was read once, at start)."""
    from pathlib import Path

    from gateway.resilience.degradation import Degradation

    folder = tmp_path / "rules"
    folder.mkdir()
    (folder / "a.yaml").write_text(
        "rules:\n  - name: sorry\n    match: {keywords: [hello]}\n    template: sorry\n"
    )
    deg = Degradation(None, None)
    await deg.start(Upstream(0))
    try:
        assert deg.rules is None
        deg.use_rules(Path(folder))
        deadline = time.monotonic() + 5
        while deg.rules is None:
            assert time.monotonic() < deadline, "the rules folder was never swapped in"
            await asyncio.sleep(0.01)
        assert deg.rules.match("m", "c", "t", "hello there").name == "sorry"
        assert deg.workers  # the replay workers run once there are rules
        deg.use_rules(tmp_path / "missing")  # a folder that cannot load: the rules stay
        await asyncio.sleep(0.2)
        assert deg.rules is not None and deg.rules.path == folder
    finally:
        await deg.stop()
