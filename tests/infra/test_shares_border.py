"""The process set in Redis is data written by others: entries that no process writes (never
expiring, expiring far ahead, not shaped like a process id) never count as processes and never
shrink a member's share of its limit, and a heartbeat reads a bounded number of entries however
large the set grew."""

from __future__ import annotations

import time
import uuid

import httpx
import pytest
import redis

from gateway.infra.replicas import ReplicaSettings
from gateway.infra.shared_state import SharedState
from gateway.infra.shares import MAX_AHEAD_S, MAX_PROCESSES, Membership, Shares
from tests.support import GatewayServer, poll


def stray_entries(now: float) -> dict[str, float]:
    """What a stray or hostile writer may leave in the set."""
    out: dict[str, float] = {f"host-{i}:{i}:abcdef": float("inf") for i in range(300)}
    out.update({f"far-{i}:{i}:abcdef": now + 1e9 for i in range(300)})
    out.update({f"ahead-{i}:{i}:abcdef": now + MAX_AHEAD_S + 60 for i in range(10)})
    out.update(
        {
            "junk": now + 30,
            "a b:1:abcdef": now + 30,
            "host:1:ABCDEF": now + 30,
            "host:pid:abcdef": now + 30,
            "x" * 300 + ":1:abcdef": now + 30,
            "host:1:abcdef\n": now + 30,
        }
    )
    return out


@pytest.fixture
def prefix() -> str:
    return f"gwshareb:{uuid.uuid4().hex[:8]}:"


async def test_stray_entries_neither_count_nor_stay(redis_url: str, prefix: str) -> None:
    state = SharedState(redis_url, prefix=prefix)
    shares = Shares(1, 0)
    m = Membership(state, shares, lambda: ReplicaSettings(heartbeat_s=0.5), lambda: None)
    raw = redis.Redis.from_url(redis_url)
    try:
        raw.zadd(m.key, stray_entries(time.time()))
        await m.beat()
        assert (shares.count, shares.rank) == (1, 0)
        assert shares.of(4, "member") == 4
        left = {k.decode() for k in raw.zrange(m.key, 0, -1)}
        # Entries expiring beyond what any process writes are removed; the malformed ones
        # expire by themselves within their (plausible) lifetime.
        assert not any(k.startswith(("host-", "far-", "ahead-")) for k in left), left
        assert m.id in left
        # A real second process still counts, whatever else is in the set.
        raw.zadd(m.key, {"other-host:42:0a1b2c": time.time() + 2})
        await m.beat()
        assert shares.count == 2 and shares.rank in (0, 1)
    finally:
        raw.delete(m.key)
        raw.close()
        await state.aclose()


async def test_a_heartbeat_reads_a_bounded_number_of_entries(redis_url: str, prefix: str) -> None:
    state = SharedState(redis_url, prefix=prefix)
    shares = Shares(1, 0)
    m = Membership(state, shares, lambda: ReplicaSettings(heartbeat_s=0.5), lambda: None)
    raw = redis.Redis.from_url(redis_url)
    try:
        now = time.time()
        raw.zadd(m.key, {f"h{i}:{i}:abcdef": now + 30 for i in range(3 * MAX_PROCESSES)})
        await m.beat()
        assert shares.count <= MAX_PROCESSES + 1
        assert shares.rank is not None and 0 <= shares.rank < shares.count
    finally:
        raw.delete(m.key)
        raw.close()
        await state.aclose()


def test_a_gateway_keeps_its_whole_limit_despite_stray_entries(
    fleet, redis_url: str, prefix: str, monkeypatch
) -> None:
    monkeypatch.setenv("GATEWAY_REDIS_PREFIX", prefix)
    text = f"""
replicas: {{share_limits: true, heartbeat_s: 0.2}}
providers:
  a: {{base_url: "{fleet.url("a")}", max_inflight: 4}}
pools:
  main: {{members: [a], queue: {{max_wait_s: 2, max_depth: 8}}}}
models:
  chat: {{pool: main}}
"""
    raw = redis.Redis.from_url(redis_url)
    try:
        raw.zadd(prefix + "procs", stray_entries(time.time()))
        with GatewayServer(text, redis_url=redis_url) as gw:
            member = gw.runtime.snapshot.providers["a"].member
            poll(lambda: httpx.get(f"{gw.url}/ready").status_code == 200, within_s=10)
            raw.zadd(prefix + "procs", stray_entries(time.time()))  # written again, live
            time.sleep(1.0)  # several heartbeats
            assert member.max_inflight == 4
            assert gw.chat().status_code == 200
    finally:
        raw.delete(prefix + "procs")
        raw.close()
