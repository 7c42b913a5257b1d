"""The governance heartbeat set in Redis is bounded: entries dated far ahead (or never expiring),
entries not shaped like a process id and a flood of them neither count as processes (which would
divide every limit among phantoms when Redis goes away) nor stay for ever; the key itself expires
once no process beats. Real gateways on loopback, real Redis.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import httpx
import redis

from gateway.governance.procs import MAX_PROCESSES, Processes
from gateway.infra.shared_state import SharedState
from loadtests.simulator.testing import Fleet
from tests.support import GatewayServer, poll


def _policy(url: str) -> str:
    return f"""
providers:
  p: {{base_url: '{url}', models: {{'*': sim}}}}
pools:
  main: {{members: [p]}}
models:
  chat: {{pool: main}}
"""


def _processes(gw: GatewayServer) -> int:
    return int(httpx.get(gw.url + "/admin/usage").json()["processes"])


def test_stray_entries_neither_count_nor_stay(
    fleet: Fleet, gateway: Callable[..., GatewayServer], redis_url, redis_prefix, monkeypatch
) -> None:
    monkeypatch.setenv("GATEWAY_REDIS_PREFIX", redis_prefix)
    monkeypatch.delenv("GATEWAY_API_KEYS", raising=False)
    gws = [gateway(_policy(fleet.url("a")), redis_url=redis_url) for _ in range(2)]
    key = gws[0].pipeline.governance.procs.key
    client = redis.Redis.from_url(redis_url)
    now = time.time()
    stray: dict[str, float] = {
        "123-deadbeef": float("inf"),  # a process id that never goes stale
        "124-deadbeef": now + 10 * 365 * 86400,  # ... or only in ten years
        "not a process": now,  # live, but no process writes this shape
        "125-DEADBEEF\n": now,
    }
    # A flood of live-looking junk, dated a little ahead: newer than every real beat for a while.
    stray |= {f"x{i}": now + 20 for i in range(5000)}
    client.zadd(key, stray)
    assert client.zcard(key) > 5000
    # Within a few heartbeats: the junk is gone (removed as read, 1,024 a beat), the two real
    # processes count, and the set holds them alone.
    poll(lambda: client.zcard(key) == 2, within_s=15)
    poll(lambda: all(_processes(g) == 2 for g in gws), within_s=5)
    ttl = client.ttl(key)
    assert 0 < ttl <= 60, ttl  # gone soon after the last process stops beating


def test_a_beat_reads_a_bounded_set(redis_url: str, redis_prefix: str) -> None:
    """However many entries the set holds, a beat reads at most MAX_PROCESSES (ids of live-looking
    processes beyond are not counted) and removes stale ones."""

    async def run() -> tuple[int, int]:
        state = SharedState(redis_url, prefix=redis_prefix)
        try:
            me = Processes(state)
            assert state.redis is not None
            now = time.time()
            await state.redis.zadd(me.key, {f"{i}-0000000a": now for i in range(3000)})
            await state.redis.zadd(me.key, {f"junk{i}": now for i in range(3000)})
            await me.beat()
            stale_ok = me.count
            # Entries whose beat is older than the staleness period are gone after a beat.
            await state.redis.zadd(me.key, {"99-0000000b": now - 10 * me.stale_s})
            await me.beat()
            assert await state.redis.zscore(me.key, "99-0000000b") is None
            return stale_ok, me.count
        finally:
            await state.aclose()

    first, second = asyncio.run(run())
    # The 3,000 forged ids are shaped like ids and live: at most MAX_PROCESSES of the set is read.
    assert first <= MAX_PROCESSES and second <= MAX_PROCESSES
