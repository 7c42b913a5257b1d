"""An operator's drain reaches every worker of `serve --workers N` and every replica sharing
Redis: it had reached only the process that took the admin call, so the other workers and
replicas went on sending to the drained member. Real `gateway serve` processes on loopback, the
project's simulators, a real Redis."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from gateway.infra.shared_state import SharedState
from gateway.policy.loader import parse_policy
from gateway.resilience.drains import SharedDrains
from gateway.runtime import Runtime
from loadtests.simulator.testing import Fleet
from tests.support import gateway_process, gateway_processes, poll

FLEET: list[Any] = [{"name": "a", "profile": "fast"}, {"name": "b", "profile": "fast"}]
BODY = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def _policy(fleet: Fleet, path: Path) -> Path:
    path.write_text(
        f"providers:\n  a: {{base_url: '{fleet.url('a')}'}}\n  b: {{base_url: '{fleet.url('b')}'}}\n"
        "pools:\n  main: {members: [a, b], balancer: {strategy: round_robin}}\n"
        "models:\n  chat: {pool: main, cache: {exact: {enabled: false}}}\n"
    )
    return path


def providers_used(base: str, n: int = 10) -> set[str]:
    """The members that answered `n` requests, each on a new connection (any worker may take
    it)."""
    used = set()
    for _ in range(n):
        r = httpx.post(base + "/chat/completions", json=BODY, timeout=10)
        assert r.status_code == 200, r.text
        used.add(r.headers["x-gateway-provider"])
    return used


def admin(base: str, action: str) -> dict[str, Any]:
    r = httpx.post(base.removesuffix("/v1") + f"/admin/members/a/{action}", timeout=10)
    assert r.status_code == 200, r.text
    return r.json()


def test_a_drain_reaches_every_worker_without_redis(fleet: Fleet, tmp_path: Path) -> None:
    env = {"REDIS_URL": "", "GATEWAY_ACCESS_LOG": "0"}
    with gateway_process(_policy(fleet, tmp_path / "p.yaml"), env=env, workers=2) as base:
        assert providers_used(base) == {"a", "b"}
        assert admin(base, "drain")["scope"] == "workers"
        # Twenty new connections in a row all drained: one sample could land on one worker only.
        poll(lambda: providers_used(base, 10) == providers_used(base, 10) == {"b"}, within_s=8)
        assert providers_used(base) == {"b"}  # whichever worker takes the connection
        assert admin(base, "undrain")["drained"] is False
        poll(lambda: "a" in providers_used(base, 6), within_s=5)


@pytest.fixture
def prefix() -> str:
    return f"gwdrain:{uuid.uuid4().hex[:8]}:"  # the test database is flushed after the run


def test_a_drain_reaches_every_replica_and_a_later_one(
    fleet: Fleet, tmp_path: Path, redis_url: str, prefix: str
) -> None:
    env = {"REDIS_URL": redis_url, "GATEWAY_REDIS_PREFIX": prefix, "GATEWAY_ACCESS_LOG": "0"}
    path = _policy(fleet, tmp_path / "p.yaml")
    with gateway_processes(path, 2, env=env) as (one, two):
        assert providers_used(two) == {"a", "b"}
        assert admin(one, "drain")["scope"] == "replicas"
        poll(lambda: providers_used(two, 6) == {"b"}, within_s=3)
        with gateway_process(path, env=env) as three:  # started after the drain
            assert providers_used(three) == {"b"}
        admin(two, "undrain")
        poll(lambda: "a" in providers_used(one, 6), within_s=3)


def test_what_redis_holds_drains_members_of_the_policy_only(redis_url: str, prefix: str) -> None:
    """The hash is read back for the policy's members only; a message is only a reason to
    re-read, whatever it says."""
    policy = parse_policy(
        "providers:\n  a: {base_url: 'http://127.0.0.1:9'}\n  b: {base_url: 'http://127.0.0.1:9'}\n"
        "pools:\n  main: {members: [a, b]}\nmodels:\n  chat: {pool: main}\n"
    )

    async def run() -> tuple[frozenset[str], bool, bool]:
        runtime = Runtime(policy)
        state = SharedState(redis_url, prefix=prefix)
        drains = SharedDrains(runtime, state)
        client = redis.Redis.from_url(redis_url)
        client.hset(prefix + "drained", mapping={"b": "anything", "zzz": "1", "a" * 5000: "1"})
        await drains.start()
        client.publish(prefix + "drains", b'{"providers": {"evil": {"base_url": "x"}}}')
        await asyncio.sleep(0.3)
        seen = runtime.drained
        b_out = runtime.snapshot.providers["b"].drained
        # A reload keeps the operator's drain.
        runtime.apply(policy)
        b_after_reload = runtime.snapshot.providers["b"].drained
        await drains.stop()
        await state.aclose()
        client.close()
        return seen, b_out, b_after_reload

    seen, b_out, b_after_reload = asyncio.run(run())
    assert seen == {"b"}
    assert b_out and b_after_reload
