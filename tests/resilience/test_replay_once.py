"""A deferred request is sent upstream once, whatever happens around its replay: a replay that
outlasts `claim_idle_ms`, a Redis error while its outcome is stored or acknowledged, a worker that
died after storing it, an error in another entry's replay of the same cycle (real Redis)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError

from gateway.resilience.deferred import (
    MemoryReplayQueue,
    RedisReplayQueue,
    ReplayEntry,
    ReplayQueue,
    ReplaySettings,
    ReplayWorker,
)

FAST = dict(base_backoff_ms=20, max_backoff_ms=40, block_ms=50, claim_idle_ms=300)


@pytest.fixture
async def client() -> AsyncIterator[aioredis.Redis]:
    r = aioredis.Redis.from_url("redis://127.0.0.1:6379/4")
    yield r
    await r.aclose()


@pytest.fixture
async def prefix(client: aioredis.Redis) -> AsyncIterator[str]:
    name = f"test-replay-once-{uuid.uuid4().hex[:10]}"
    yield name
    keys = [k async for k in client.scan_iter(match=f"{name}:*")]
    if keys:
        await client.delete(*keys)


class Upstream:
    """Counts the sends of each request; answers 200 after `delay_s`."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.delay_s = delay_s
        self.sends: list[str] = []

    async def __call__(self, entry: ReplayEntry) -> tuple[int, bytes]:
        self.sends.append(entry.request_id)
        await asyncio.sleep(self.delay_s)
        return 200, b'{"answer": "' + entry.request_id.encode() + b'"}'


def flaky(base: type, fail: dict[str, int]) -> Any:
    """A queue of class `base` whose methods named in `fail` raise a Redis error that many times."""

    class Flaky(base):  # type: ignore[misc, valid-type]
        async def set_result(self, request_id: str, doc: dict[str, Any]) -> None:
            if doc.get("status") != "queued" and fail.get("set_result", 0) > 0:
                fail["set_result"] -= 1
                raise RedisConnectionError("connection reset while storing")
            await super().set_result(request_id, doc)

        async def ack(self, entry_id: str) -> None:
            if fail.get("ack", 0) > 0:
                fail["ack"] -= 1
                raise RedisConnectionError("connection reset while acknowledging")
            await super().ack(entry_id)

    return Flaky


def make_queue(backend: str, client: aioredis.Redis, settings: ReplaySettings, **fail: int) -> Any:
    if backend == "memory":
        return flaky(MemoryReplayQueue, fail)(settings)
    return flaky(RedisReplayQueue, fail)(client, settings)


async def until_done(queue: ReplayQueue, request_id: str, within: float = 5.0) -> dict[str, Any]:
    end = time.monotonic() + within
    while True:
        doc = await queue.get_result(request_id)
        if doc is not None and doc["status"] == "done" and await queue.depth() == 0:
            return doc
        assert time.monotonic() < end, f"not done in time: {doc}"
        await asyncio.sleep(0.02)


async def test_a_replay_longer_than_claim_idle_is_not_taken_by_another_worker(
    client: aioredis.Redis, prefix: str
) -> None:
    """Two workers (two gateway processes) share the stream; the replay of a long generation
    outlasts `claim_idle_ms`: its worker keeps it, the other never replays it a second time."""
    # claim_idle_ms 900 rather than FAST's 300: a test process loaded by the rest of the suite
    # (servers in threads) can stall its event loop past 300 ms, and the refresh then comes late.
    settings = ReplaySettings(prefix=prefix, **{**FAST, "claim_idle_ms": 900})
    queue = RedisReplayQueue(client, settings)
    upstream = Upstream(delay_s=3.0)  # over 3x claim_idle_ms
    await queue.enqueue("long", "t", "m", b"{}")
    first = ReplayWorker(queue, upstream, "first", settings)
    second = ReplayWorker(queue, upstream, "second", settings)
    await first.start()
    await asyncio.sleep(0.1)
    await second.start()
    try:
        doc = await until_done(queue, "long", within=10.0)
        await asyncio.sleep(0.5)  # a second replay, if any, would have started by now
    finally:
        await first.stop()
        await second.stop()
    assert upstream.sends == ["long"]
    assert doc["attempts"] == 1 and doc["http_status"] == 200
    assert (first.completed, second.completed) == (1, 0)
    pending = await client.xpending(f"{prefix}:replay", "workers")
    assert pending["pending"] == 0


@pytest.mark.parametrize("backend", ["redis", "memory"])
@pytest.mark.parametrize("step", ["set_result", "ack"])
async def test_an_answer_whose_outcome_cannot_be_stored_or_acknowledged_is_not_sent_again(
    backend: str, step: str, client: aioredis.Redis, prefix: str
) -> None:
    """Redis fails twice while the outcome of an answered replay is stored (or acknowledged):
    those steps are retried, the request is not sent upstream again."""
    settings = ReplaySettings(prefix=prefix, **FAST)
    queue = make_queue(backend, client, settings, **{step: 2})
    upstream = Upstream()
    await queue.enqueue("once", "t", "m", b"{}")
    worker = ReplayWorker(queue, upstream, "w", settings)
    await worker.start()
    try:
        doc = await until_done(queue, "once")
    finally:
        await worker.stop()
    assert upstream.sends == ["once"]
    assert doc["body"] == '{"answer": "once"}' and doc["attempts"] == 1
    assert worker.completed == 1


@pytest.mark.parametrize("outcome", ["done", "failed"])
async def test_an_entry_finished_by_a_worker_that_died_before_acknowledging_is_not_replayed(
    outcome: str, client: aioredis.Redis, prefix: str
) -> None:
    """A worker stored the outcome, then died before its acknowledgement: the worker that claims
    the orphan acknowledges it and keeps the stored answer."""
    settings = ReplaySettings(prefix=prefix, **FAST)
    queue = RedisReplayQueue(client, settings)
    await queue.enqueue("stored", "t", "m", b"{}")
    taken = await queue.read("dead-worker", 10, 10)
    assert [e.request_id for e in taken] == ["stored"]
    answer = {"status": outcome, "request_id": "stored", "tenant": "t", "alias": "m"}
    stored = {**answer, "http_status": 200, "body": "first answer", "attempts": 1}
    await queue.set_result("stored", stored)
    upstream = Upstream()
    survivor = ReplayWorker(queue, upstream, "survivor", settings)
    await survivor.start()
    try:
        end = time.monotonic() + 3.0
        while time.monotonic() < end:
            if not await queue.depth():
                break
            await asyncio.sleep(0.02)
    finally:
        await survivor.stop()
    assert await queue.depth() == 0
    assert upstream.sends == []
    assert await queue.get_result("stored") == stored


async def test_an_error_in_one_replay_never_leaves_another_to_be_sent_twice(
    client: aioredis.Redis, prefix: str
) -> None:
    """Two entries replayed in one cycle: the first fails at once and Redis fails while its
    retry is recorded; the second, still running, must not be started again by the next cycle."""
    settings = ReplaySettings(prefix=prefix, **FAST)
    fails = {"n": 1}

    class Queue(RedisReplayQueue):
        async def set_result(self, request_id: str, doc: dict[str, Any]) -> None:
            if doc.get("last_error") and fails["n"] > 0:
                fails["n"] -= 1
                raise RedisConnectionError("connection reset while recording a retry")
            await super().set_result(request_id, doc)

    queue = Queue(client, settings)
    sends: list[str] = []

    async def send(entry: ReplayEntry) -> tuple[int, bytes]:
        sends.append(entry.request_id)
        if entry.request_id == "quick" and sends.count("quick") == 1:
            return 503, b"{}"
        await asyncio.sleep(0.6 if entry.request_id == "slow" else 0.0)
        return 200, b"{}"

    await queue.enqueue("quick", "t", "m", b"{}")
    await queue.enqueue("slow", "t", "m", b"{}")
    worker = ReplayWorker(queue, send, "w", settings)
    await worker.start()
    try:
        await until_done(queue, "slow")
        await until_done(queue, "quick")
    finally:
        await worker.stop()
    assert sends.count("slow") == 1
    assert sends.count("quick") == 2


async def test_stop_returns_when_the_queue_swallows_the_cancellation() -> None:
    """A queue client may swallow a cancellation: in one that races a blocking read's own
    timeout, the cancellation comes out as that timeout and the read returns nothing (seen with
    redis-py's XREADGROUP, and `asyncio.wait_for` in the in-process queue). The worker's loop
    went on reading, and stop() never returned (a suite hung in a test's teardown)."""
    swallowed = []

    class Swallowing(MemoryReplayQueue):
        async def read(self, consumer: str, count: int, block_ms: int) -> list[ReplayEntry]:
            try:
                return await super().read(consumer, count, block_ms)
            except asyncio.CancelledError:
                if swallowed:
                    raise  # only the first: a worker that ignores it fails this test, not hangs
                swallowed.append(True)
                return []

    settings = ReplaySettings(prefix="swallow", **FAST)
    worker = ReplayWorker(Swallowing(settings), Upstream(), "w", settings)
    await worker.start()
    await asyncio.sleep(0.2)  # in its blocking read
    started = time.monotonic()
    await asyncio.wait_for(worker.stop(), 3.0)
    assert swallowed and time.monotonic() - started < 1.0
