"""Unknown managed keys and Redis: a key not in a process's mirror is looked up in Redis (it may
have been created a moment ago on another replica), at most once a second per key. A flood of
distinct made-up keys made one Redis call each (1,000 bad keys, 1,000 GETs); now only what has
the shape of a key the gateway makes is looked up, at most LOOKUPS_PER_S times a second.

Real gateways on loopback, a private real Redis (its command counts are this test's alone).
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable, Iterator

import httpx
import pytest
import redis

from gateway.governance.keys import LOOKUPS_PER_S
from loadtests.simulator.testing import Fleet
from tests.support import GatewayServer, RedisProcess

CHAT = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}


def _policy(fleet: Fleet) -> str:
    return f"""
providers:
  p: {{base_url: '{fleet.url("a")}', models: {{'*': sim}}}}
pools:
  main: {{members: [p]}}
models:
  chat: {{pool: main}}
"""


@pytest.fixture
def private_redis() -> Iterator[RedisProcess]:
    r = RedisProcess()
    r.start()
    try:
        yield r
    finally:
        r.kill()


def _gets(url: str) -> int:
    stats = redis.Redis.from_url(url).info("commandstats")
    return int(stats.get("cmdstat_get", {}).get("calls", 0))


async def _flood(gw: GatewayServer, keys: list[str]) -> set[int]:
    limits = httpx.Limits(max_connections=20)
    async with httpx.AsyncClient(timeout=30, limits=limits) as c:

        async def one(key: str) -> int:
            r = await c.post(
                gw.base_url + "/chat/completions",
                json=CHAT,
                headers={"authorization": f"Bearer {key}"},
            )
            return r.status_code

        return set(await asyncio.gather(*(one(k) for k in keys)))


def test_a_flood_of_made_up_keys_is_not_a_flood_of_redis_calls(
    fleet: Fleet, gateway: Callable[..., GatewayServer], private_redis: RedisProcess, monkeypatch
) -> None:
    monkeypatch.delenv("GATEWAY_API_KEYS", raising=False)
    gw = gateway(_policy(fleet), redis_url=private_redis.url)
    other = gateway(_policy(fleet), redis_url=private_redis.url, prefix=gw.prefix)

    # Not the shape of a key the gateway makes: never looked up.
    before = _gets(private_redis.url)
    odd = ["sk-gw-short", "sk-gw-" + "a" * 44, "sk-gw-" + "!" * 43]
    assert asyncio.run(_flood(gw, odd * 30)) == {401}
    assert _gets(private_redis.url) == before

    # Well-formed, each one different: at most LOOKUPS_PER_S a second.
    before = _gets(private_redis.url)
    start = time.monotonic()
    made_up = ["sk-gw-" + secrets.token_urlsafe(32) for _ in range(300)]
    assert asyncio.run(_flood(gw, made_up)) == {401}
    elapsed = time.monotonic() - start
    assert _gets(private_redis.url) - before <= LOOKUPS_PER_S * (elapsed + 1)

    # A real key created on another replica still works here (the channel, or a lookup). Made
    # only now: its change message makes this replica read it (a GET) whenever it arrives.
    good = httpx.post(other.url + "/admin/keys", json={"tenant": "t"}).json()["key"]
    time.sleep(1.1)
    r = httpx.post(
        gw.base_url + "/chat/completions",
        json=CHAT,
        headers={"authorization": f"Bearer {good}"},
        timeout=10,
    )
    assert r.status_code == 200, r.text
