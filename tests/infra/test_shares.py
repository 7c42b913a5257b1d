"""Limits that add up: a member's max_inflight, a pool's queue depth and the retry budget floor
hold for all gateway processes together (each takes a share, learned through Redis)."""

from __future__ import annotations

import concurrent.futures
import time
import uuid

import httpx
import pytest

from gateway.infra.replicas import ReplicaSettings
from gateway.infra.shared_state import SharedState
from gateway.infra.shares import Membership, Shares
from tests.support import GatewayServer


@pytest.mark.parametrize("total", [0, 1, 2, 3, 7, 64, 65])
@pytest.mark.parametrize("count", [1, 2, 3, 6])
def test_shares_sum_to_the_total(total: int, count: int) -> None:
    for name in ("a", "member-b", "pool"):
        parts = [Shares(count, rank).of(total, name) for rank in range(count)]
        assert sum(parts) == total
        assert max(parts) - min(parts) <= 1
    # Ranks unknown (no shared state): an even split, never below one slot.
    assert Shares(count, None).of(total) == (total if count == 1 else max(1, total // count))


def policy(url: str, share: bool, max_inflight: int = 4) -> str:
    return f"""
replicas: {{share_limits: {str(share).lower()}, heartbeat_s: 0.2}}
retry: {{budget_min_per_s: 3.0}}
providers:
  slow: {{base_url: "{url}", max_inflight: {max_inflight}}}
pools:
  main: {{members: [slow], queue: {{max_wait_s: 20, max_depth: 20}}}}
models:
  chat: {{pool: main, cache: {{exact: {{enabled: false}}}}}}
"""


def burst(urls: list[str], n: int) -> list[int]:
    body = {"model": "chat", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}

    def one(i: int) -> int:
        url = urls[i % len(urls)]
        return httpx.post(f"{url}/chat/completions", json=body, timeout=60).status_code

    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        return list(pool.map(one, range(n)))


def wait_for(check, what: str, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


@pytest.mark.parametrize("share", [True, False])
def test_two_replicas_respect_one_max_inflight(fleet, redis_url, monkeypatch, share: bool) -> None:
    monkeypatch.setenv("GATEWAY_REDIS_PREFIX", f"gwshare:{uuid.uuid4().hex[:6]}:")
    text = policy(fleet.url("slow"), share)
    one = GatewayServer(text, redis_url=redis_url).__enter__()
    two = GatewayServer(text, redis_url=redis_url).__enter__()
    try:
        members = [gw.app.state.runtime.snapshot.providers["slow"].member for gw in (one, two)]
        if share:
            wait_for(lambda: all(m.max_inflight == 2 for m in members), "shares of 4 = 2 + 2")
            wait_for(
                lambda: all(httpx.get(f"{gw.url}/ready").status_code == 200 for gw in (one, two)),
                "both ready",
            )
            admission = one.app.state.pipeline.dispatcher.admission
            assert (
                admission.shares.of(20, "main")
                + two.app.state.pipeline.dispatcher.admission.shares.of(20, "main")
                == 20
            )
            budget = one.app.state.pipeline.dispatcher.budget
            one.app.state.pipeline.dispatcher.retrier(one.app.state.runtime.snapshot)
            assert budget.min_retries_per_s == pytest.approx(1.5)
        fleet.reset("slow")
        statuses = burst([one.base_url, two.base_url], 16)
        assert statuses == [200] * 16
        peak = fleet.stats("slow")["active_peak"]
        if share:
            assert peak <= 4, peak
        else:
            assert peak > 4, peak  # each replica alone allows 4: the problem this solves
    finally:
        two.__exit__(None, None, None)
    try:
        if share:
            # The other replica left: this one's share grows back to the whole limit.
            wait_for(lambda: members[0].max_inflight == 4, "share back to 4")
    finally:
        one.__exit__(None, None, None)


def test_a_joining_process_is_not_ready_until_the_others_made_room(
    fleet, redis_url, monkeypatch
) -> None:
    monkeypatch.setenv("GATEWAY_REDIS_PREFIX", f"gwshare:{uuid.uuid4().hex[:6]}:")
    text = policy(fleet.url("slow"), True).replace("heartbeat_s: 0.2", "heartbeat_s: 1.0")
    with GatewayServer(text, redis_url=redis_url) as gw:
        r = httpx.get(f"{gw.url}/ready")
        assert r.status_code == 503 and r.json()["status"] == "joining"
        wait_for(lambda: httpx.get(f"{gw.url}/ready").status_code == 200, "ready", 5)


async def test_a_smaller_count_counts_only_once_it_held_for_a_lifetime() -> None:
    """After a Redis failover every announcement expired: the first process back sees itself
    alone. It must not take the whole limit: the largest count of the last lifetime counts."""
    changes: list[int] = []
    shares = Shares(6, 2)
    state = SharedState("redis://127.0.0.1:1", retry_after_s=0.0)  # nothing listens there
    m = Membership(
        state, shares, lambda: ReplicaSettings(heartbeat_s=0.5), lambda: changes.append(1)
    )
    try:
        await m.beat()  # Redis unreachable: the count holds
        assert (shares.count, changes) == (6, [])
        ttl = 2.0
        m._seen.clear()  # the same rule on a synthetic clock
        assert m._remember(100.0, 6, 0.5) == 6
        assert m._remember(101.0, 1, 0.5) == 6  # first back after the outage: still 6
        assert m._remember(101.5, 4, 0.5) == 6
        assert m._remember(100.0 + ttl + 1.1, 4, 0.5) == 4  # 6 aged out: the others are gone
        assert m._remember(103.2, 5, 0.5) == 5  # more processes: at once
    finally:
        await state.aclose()
