"""Governance across a Redis outage and a Redis that comes back empty, with private redis-servers
(ports 18790-18799) that the tests kill and restart: budgets split between processes while Redis
is away, concurrency slots all handed back, managed keys written back (a revocation winning).
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from gateway.governance.concurrency import Concurrency
from gateway.governance.keys import KeyCreate, KeyStore
from gateway.governance.lease import Leases
from gateway.governance.limits import Limiter
from gateway.governance.procs import Processes
from gateway.infra.shared_state import SharedState
from loadtests.simulator.testing import Fleet
from tests.support import GatewayServer, RedisProcess, gateway_process, poll

CHAT = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
FLEET: list[Any] = [
    "a",
    {
        "name": "slow",
        "profile": "fast",
        "overrides": {"decode_tps_alone": 50, "decode_tps_full": 50},
    },
]


def _free_private_port() -> int:
    for port in range(18790, 18800):
        with socket.socket() as s:
            # As redis-server binds: a port whose last connections are in TIME_WAIT is free.
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    pytest.skip("no free port in 18790-18799 for a private redis-server")


@pytest.fixture
def private_redis() -> Iterator[RedisProcess]:
    r = RedisProcess(_free_private_port())
    r.start()
    yield r
    r.kill()


@pytest.fixture
def tenants(monkeypatch) -> None:
    monkeypatch.setenv("GATEWAY_API_KEYS", "team-a:key-a")
    monkeypatch.setenv("GATEWAY_REDIS_PREFIX", "gw:")


def _policy(url: str, governance: str, price: str = "{input_per_1m: 0, output_per_1m: 0}") -> str:
    return f"""
governance:
{governance}
providers:
  p: {{base_url: '{url}', models: {{'*': sim}}, price: {price}}}
pools:
  main: {{members: [p]}}
models:
  chat: {{pool: main}}
"""


def _post(gw: GatewayServer, key: str = "key-a", body: dict[str, Any] | None = None) -> int:
    r = httpx.post(
        gw.base_url + "/chat/completions",
        json=body or CHAT,
        headers={"authorization": f"Bearer {key}"},
        timeout=10,
    )
    return r.status_code


def _processes(gws: list[GatewayServer], n: int) -> None:
    """Wait until every gateway counts n live processes (heartbeats every 2 s)."""
    poll(lambda: all(g.pipeline.governance.procs.count == n for g in gws), within_s=8)


# -- budgets while Redis is away -----------------------------------------------------------------


def test_budget_is_split_between_processes_while_redis_is_down(
    capture_upstream, gateway: Callable[..., GatewayServer], private_redis: RedisProcess, tenants
) -> None:
    """$2 a day, $0.10 a request: $1 spent with Redis, then Redis dies. Each of the two
    processes may spend half of the $1 left (5 requests), not the whole of it each."""
    price = "{input_per_1m: 20000, output_per_1m: 0}"  # 5 prompt tokens: $0.10
    text = _policy(
        capture_upstream.url, "  tenants:\n    team-a: {budget: {daily_usd: 2.0}}", price
    )
    gws = [gateway(text, redis_url=private_redis.url) for _ in range(2)]
    _processes(gws, 2)
    assert [_post(gws[i % 2]) for i in range(10)] == [200] * 10
    ledgers = [g.pipeline.governance.ledger for g in gws]
    bk = ledgers[0].budget_key("t:team-a", "day", time.time())
    # Both processes know the shared total ($1) before Redis goes away.
    poll(lambda: all(led.spent(bk) == 1_000_000_000 for led in ledgers), within_s=3)

    private_redis.kill()
    admitted = [0, 0]
    for i, gw in enumerate(gws):
        for _ in range(15):
            status = _post(gw)
            if status != 200:
                assert status == 429
                break
            admitted[i] += 1
    assert admitted == [5, 5]
    metrics = httpx.get(gws[0].url + "/metrics").text
    assert "gateway_ratelimit_local_mode 1.0" in metrics

    # Back (empty): what was spent alone is written, and the processes leave local mode.
    private_redis.start()
    poll(lambda: all(not led.local for led in ledgers), within_s=6)
    client = redis.Redis.from_url(private_redis.url)
    assert poll(lambda: int(client.get(bk) or 0) == 1_000_000_000, within_s=3)


def test_key_budget_is_split_too_and_unknown_totals_start_from_the_share(
    capture_upstream, gateway: Callable[..., GatewayServer], private_redis: RedisProcess, tenants
) -> None:
    """A managed key's budget ($0.40) with nothing spent before the outage: 2 requests a process."""
    price = "{input_per_1m: 20000, output_per_1m: 0}"
    gws = [
        gateway(_policy(capture_upstream.url, "  tenants: {}", price), redis_url=private_redis.url)
        for _ in range(2)
    ]
    _processes(gws, 2)
    key = httpx.post(
        gws[0].url + "/admin/keys", json={"tenant": "team-k", "budget": {"daily_usd": 0.4}}
    ).json()
    poll(lambda: gws[1].pipeline.governance.keys.get(key["id"]) is not None)
    private_redis.kill()
    admitted = []
    for gw in gws:
        n = 0
        while n < 10 and _post(gw, key["key"]) == 200:
            n += 1
        admitted.append(n)
    assert admitted == [2, 2]


# -- concurrency slots ---------------------------------------------------------------------------


def test_slots_released_during_a_return_are_handed_back_too(private_redis: RedisProcess) -> None:
    """Five requests end while the first return is on its way to Redis: every slot goes back."""

    async def run() -> tuple[int, int]:
        state = SharedState(private_redis.url, prefix="t:")
        procs = Processes(state)
        await procs.beat()
        limiter, conc = Limiter(state, procs), Concurrency(state, procs)
        leases = Leases(state, limiter, conc)
        s = conc.slots("k:x", 5)
        for _ in range(5):
            assert await leases.take([], [s]) is None
        assert s.held == 5 and s.inflight == 5
        conc.release([s])
        await asyncio.sleep(0)  # the return task starts and waits for Redis
        await asyncio.sleep(0)
        for _ in range(4):
            conc.release([s])
            await asyncio.sleep(0)
        await asyncio.sleep(0.3)
        held_in_redis = await state.redis.hget(s.key, procs.id)  # type: ignore[union-attr]
        await state.aclose()
        return s.held, int(held_in_redis or 0)

    assert asyncio.run(run()) == (0, 0)


def test_a_return_that_fails_is_retried_and_never_goes_below_zero(
    private_redis: RedisProcess,
) -> None:
    async def run() -> tuple[int, int, int]:
        state = SharedState(private_redis.url, prefix="t:")
        procs = Processes(state)
        await procs.beat()
        conc = Concurrency(state, procs)
        leases = Leases(state, Limiter(state, procs), conc)
        s = conc.slots("k:y", 4)
        for _ in range(3):
            assert await leases.take([], [s]) is None
        private_redis.kill()
        conc.release([s])
        await asyncio.sleep(0.2)
        during = s.held  # not handed back: Redis did not take them
        private_redis.start()  # empty: the process's count there is gone
        for _ in range(2):
            conc.release([s])
        await asyncio.sleep(2.5)
        raw = await state.redis.hget(s.key, procs.id)  # type: ignore[union-attr]
        await state.aclose()
        return during, s.held, int(raw or 0)

    during, held, in_redis = asyncio.run(run())
    assert during == 3 and held == 0 and in_redis == 0


def test_no_slot_stranded_after_cut_streams_on_two_workers(
    fleet: Fleet, private_redis: RedisProcess, tmp_path: Path
) -> None:
    """The probe's case: `gateway serve --workers 2`, 5 streams at max_concurrent 5, cut by their
    clients, six times: no slot stays held in Redis, and every round is admitted whole."""
    gov = "  tenants:\n    team-a: {limits: {max_concurrent: 5}}"
    policy = tmp_path / "policy.yaml"
    policy.write_text(_policy(fleet.url("slow"), gov))
    env = {
        "REDIS_URL": private_redis.url,
        "GATEWAY_REDIS_PREFIX": "gw:",
        "GATEWAY_API_KEYS": "team-a:key-a",
        "GATEWAY_ACCESS_LOG": "0",
    }
    body = {**CHAT, "max_tokens": 400, "stream": True}
    client = redis.Redis.from_url(private_redis.url)
    key = "{gw:gov}:cc:t:team-a"

    def held() -> int:
        return sum(int(v) for v in client.hgetall(key).values())

    with gateway_process(policy, env=env, workers=2) as url:
        poll(lambda: client.zcard("{gw:gov}:procs") == 2, within_s=10)

        async def cut() -> int:
            # A new connection each: either worker may take it.
            async with (
                httpx.AsyncClient(timeout=30) as c,
                c.stream(
                    "POST",
                    url + "/chat/completions",
                    json=body,
                    headers={"authorization": "Bearer key-a"},
                ) as r,
            ):
                if r.status_code != 200:
                    await r.aread()
                    return r.status_code
                n = 0
                async for _ in r.aiter_lines():
                    n += 1
                    if n > 20:
                        break
                return 200

        async def rounds() -> list[list[int]]:
            out = []
            for _ in range(6):
                out.append(list(await asyncio.gather(*(cut() for _ in range(5)))))
                await asyncio.sleep(0.5)
            return out

        results = asyncio.run(rounds())
        poll(lambda: held() == 0, within_s=3)
    assert all(r == [200] * 5 for r in results), results


# -- managed keys after Redis restarted empty ----------------------------------------------------


def test_keys_are_written_back_when_redis_comes_back_empty(
    fleet: Fleet, gateway: Callable[..., GatewayServer], private_redis: RedisProcess, tenants
) -> None:
    text = _policy(fleet.url("a"), "  tenants: {}")
    gw = gateway(text, redis_url=private_redis.url)
    key = httpx.post(gw.url + "/admin/keys", json={"tenant": "team-m", "name": "m"}).json()
    assert _post(gw, key["key"]) == 200
    private_redis.kill()
    private_redis.start()  # no persistence: every key is gone
    client = redis.Redis.from_url(private_redis.url)
    poll(lambda: client.exists("{gw:gov}:key:" + key["id"]), within_s=6)
    # A process started after the restart knows the key.
    fresh = gateway(text, redis_url=private_redis.url)
    assert _post(fresh, key["key"]) == 200
    assert _post(gw, key["key"]) == 200
    listed = httpx.get(fresh.url + "/admin/keys").json()["keys"]
    assert [k["id"] for k in listed] == [key["id"]]
    metrics = httpx.get(gw.url + "/metrics").text
    assert "gateway_managed_keys_republished_total 1.0" in metrics


def test_a_revocation_wins_over_a_process_that_missed_it(private_redis: RedisProcess) -> None:
    """A revoked the key; B missed it (no events) and still holds it usable. Redis restarts empty:
    whichever writes back first, the key ends revoked everywhere and for new processes."""

    async def scenario(b_first: bool) -> tuple[bool, bool, bool]:
        states = [SharedState(private_redis.url, prefix=f"r{int(b_first)}:") for _ in range(3)]
        a, b, c = (KeyStore(s) for s in states)
        rec, secret = await a.create(KeyCreate(tenant="team-r"))
        await b._load_all()
        assert b.get(rec.id) is not None and not b.get(rec.id).revoked  # type: ignore[union-attr]
        await a.revoke(rec.id)
        await states[0].redis.flushall()  # type: ignore[union-attr]
        first, second = (b, a) if b_first else (a, b)
        await first._load_all()
        await second._load_all()
        await first._load_all()
        await c._load_all()
        found = await c.find(secret)
        out = (
            a.get(rec.id).revoked,  # type: ignore[union-attr]
            b.get(rec.id).revoked,  # type: ignore[union-attr]
            found is not None and found.revoked,
        )
        for s in states:
            await s.aclose()
        return out

    assert asyncio.run(scenario(b_first=True)) == (True, True, True)
    assert asyncio.run(scenario(b_first=False)) == (True, True, True)


def test_a_rotated_out_secret_is_not_written_back_over_the_new_one(
    private_redis: RedisProcess,
) -> None:
    """B missed a rotation; Redis restarts empty and B writes back the old secret first. The
    latest change wins: the new secret works everywhere, the old one nowhere."""

    async def run() -> list[tuple[bool, bool]]:
        states = [SharedState(private_redis.url, prefix="rot:") for _ in range(3)]
        a, b, c = (KeyStore(s) for s in states)
        rec, old = await a.create(KeyCreate(tenant="team-r"))
        await b._load_all()
        rotated = await a.rotate(rec.id)
        assert rotated is not None
        await states[0].redis.flushall()  # type: ignore[union-attr]
        await b._load_all()  # the stale version first
        await a._load_all()
        await b._load_all()
        await c._load_all()
        out = []
        for store in (a, b, c):
            store._misses.clear()
            store._synced_at = 0.0
            old_rec, new_rec = await store.find(old), await store.find(rotated[1])
            out.append((old_rec is None, new_rec is not None and new_rec.usable(time.time())))
        for s in states:
            await s.aclose()
        return out

    assert asyncio.run(run()) == [(True, True)] * 3
