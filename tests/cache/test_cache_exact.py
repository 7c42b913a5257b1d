"""Exact cache and single-flight through the gateway, with the simulator and a real Redis."""

from __future__ import annotations

import concurrent.futures as cf
import time

import httpx
import openai
import pytest

from tests.support import TWO_TENANTS, policy, validate, validate_sse

MSG = [{"role": "user", "content": "What is the capital of France?"}]


def post(gw, body: dict, key: str = "key-1", **headers: str) -> httpx.Response:
    return httpx.post(
        gw.base_url + "/chat/completions",
        json=body,
        headers={"authorization": f"Bearer {key}", **headers},
        timeout=30,
    )


def body(**kw) -> dict:
    return {"model": "chat", "messages": MSG, "temperature": 0, "max_tokens": 8, **kw}


def upstream_requests(fleet, name: str = "a") -> int:
    return fleet.stats(name)["by_endpoint"].get("chat", 0)


@pytest.fixture
def gw(fleet, gateway, redis_url, redis_prefix, monkeypatch):
    monkeypatch.setenv("GATEWAY_REDIS_PREFIX", redis_prefix)
    fleet.reset("a")
    return gateway(policy({"p": fleet.url("a")}, auth=TWO_TENANTS), redis_url=redis_url)


def test_hit_as_json_and_as_stream(gw, fleet) -> None:
    first = post(gw, body())
    assert first.headers["x-gateway-cache"] == "miss"
    second = post(gw, body())
    assert second.headers["x-gateway-cache"] == "hit-exact"
    assert second.json() == first.json()
    validate("CreateChatCompletionResponse", second.json())
    streamed = post(gw, body(stream=True, stream_options={"include_usage": True}))
    assert streamed.headers["x-gateway-cache"] == "hit-exact"
    chunks = validate_sse(streamed.content)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == first.json()["choices"][0]["message"]["content"]
    assert chunks[-1]["usage"] == first.json()["usage"]
    assert upstream_requests(fleet) == 1


def test_streamed_answer_is_cached_once_complete(gw, fleet) -> None:
    s = post(gw, body(stream=True, max_tokens=6))
    assert s.headers["x-gateway-cache"] == "miss"
    validate_sse(s.content)
    plain = post(gw, body(max_tokens=6))
    assert plain.headers["x-gateway-cache"] == "hit-exact"
    validate("CreateChatCompletionResponse", plain.json())
    assert upstream_requests(fleet) == 1


def test_canonical_key(gw, fleet) -> None:
    post(gw, {"temperature": 0, "max_tokens": 8, "messages": MSG, "model": "chat", "user": "u1"})
    # Key order, `stream`, `user` and `metadata` do not change the key...
    assert (
        post(gw, body(user="someone-else", metadata={"a": 1})).headers["x-gateway-cache"]
        == "hit-exact"
    )
    # ...fields that change the answer do.
    assert post(gw, body(max_tokens=9)).headers["x-gateway-cache"] == "miss"
    assert post(gw, body(seed=3)).headers["x-gateway-cache"] == "miss"
    # Sampled requests are not cached by default.
    assert post(gw, body(temperature=0.7)).headers["x-gateway-cache"] == "bypass"
    assert post(gw, body(temperature=0.7)).headers["x-gateway-cache"] == "bypass"


def test_cache_control(gw, fleet) -> None:
    post(gw, body())
    assert post(gw, body(), **{"cache-control": "no-store"}).headers["x-gateway-cache"] == "bypass"
    refreshed = post(gw, body(), **{"cache-control": "no-cache"})
    assert refreshed.headers["x-gateway-cache"] == "miss"
    assert upstream_requests(fleet) == 3
    assert post(gw, body()).headers["x-gateway-cache"] == "hit-exact"
    ns = post(gw, body(), **{"x-gateway-cache-namespace": "experiment-7"})
    assert ns.headers["x-gateway-cache"] == "miss"


def test_tenant_isolation(gw, fleet) -> None:
    assert post(gw, body(), key="key-1").headers["x-gateway-cache"] == "miss"
    assert post(gw, body(), key="key-2").headers["x-gateway-cache"] == "miss"
    assert post(gw, body(), key="key-2").headers["x-gateway-cache"] == "hit-exact"


def test_single_flight(fleet, gateway, redis_url, redis_prefix, monkeypatch) -> None:
    """N concurrent identical misses make one upstream call; every waiter gets the answer."""
    monkeypatch.setenv("GATEWAY_REDIS_PREFIX", redis_prefix)
    fleet.reset("slow")
    gw = gateway(policy({"p": fleet.url("slow")}, auth=TWO_TENANTS), redis_url=redis_url)
    req = body(max_tokens=20)
    with cf.ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(post, gw, dict(req, stream=i % 2 == 1)) for i in range(8)]
        results = [f.result() for f in futures]
    assert all(r.status_code == 200 for r in results)
    assert upstream_requests(fleet, "slow") == 1
    texts = set()
    for i, r in enumerate(results):
        if i % 2:
            chunks = validate_sse(r.content)
            texts.add(
                "".join(
                    c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]
                )
            )
        else:
            texts.add(r.json()["choices"][0]["message"]["content"])
    assert len(texts) == 1


def test_single_flight_failure_reaches_every_waiter(fleet, gateway) -> None:
    fleet.set_faults("c", error_rate=1.0, error_status=[500], slow_first_token_ms=300)
    try:
        gw = gateway(policy({"p": fleet.url("c")}, auth=TWO_TENANTS))
        with cf.ThreadPoolExecutor(4) as pool:
            results = list(pool.map(lambda _: post(gw, body(max_tokens=3)), range(4)))
    finally:
        fleet.clear_faults("c")
    assert [r.status_code for r in results] == [502] * 4


def test_persists_across_restart_and_shared_between_gateways(
    fleet, gateway, redis_url, redis_prefix, monkeypatch
) -> None:
    monkeypatch.setenv("GATEWAY_REDIS_PREFIX", redis_prefix)
    fleet.reset("a")
    one = gateway(policy({"p": fleet.url("a")}, auth=TWO_TENANTS), redis_url=redis_url)
    two = gateway(policy({"p": fleet.url("a")}, auth=TWO_TENANTS), redis_url=redis_url)
    assert post(one, body(max_tokens=4)).headers["x-gateway-cache"] == "miss"
    assert post(two, body(max_tokens=4)).headers["x-gateway-cache"] == "hit-exact"
    one.__exit__(None, None, None)
    again = gateway(policy({"p": fleet.url("a")}, auth=TWO_TENANTS), redis_url=redis_url)
    assert post(again, body(max_tokens=4)).headers["x-gateway-cache"] == "hit-exact"
    assert upstream_requests(fleet) == 1


def test_redis_down_means_misses_not_errors(fleet, gateway) -> None:
    gw = gateway(policy({"p": fleet.url("a")}, auth=TWO_TENANTS), redis_url="redis://127.0.0.1:1/0")
    for _ in range(3):
        r = post(gw, body(max_tokens=4))
        assert r.status_code == 200
        assert r.headers["x-gateway-cache"] == "miss"
    client = openai.OpenAI(base_url=gw.base_url, api_key="key-1", max_retries=0)
    assert client.chat.completions.create(**body(max_tokens=4)).choices[0].message.content


def test_memory_cache_real_footprint_stays_near_its_bound() -> None:
    """Values from orjson.dumps carry an over-allocated buffer; the cache must not keep it."""
    import asyncio
    import tracemalloc

    import orjson

    from gateway.cache.exact import MemoryLRU

    cache = MemoryLRU(max_bytes=2**20)
    completion = {"choices": [{"message": {"content": "word " * 100}}], "usage": {}}

    async def fill() -> None:
        for i in range(5000):
            await cache.set(f"k{i:060d}", orjson.dumps({**completion, "id": i}), 60)

    tracemalloc.start()
    try:
        asyncio.run(fill())
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert cache.bytes <= 2**20
    assert held < 1.5 * 2**20, f"{held / 2**20:.1f} MB held for a 1 MB cache"


@pytest.mark.parametrize(
    "poison",
    [
        b"<html>pwned</html>",
        b'{"error": {"message": "planted"}}',
        b'{"choices": "notalist"}',
        b'{"choices": [{"message": {"content": 5}}]}',
        b"\x80\x04\x95pickle",
    ],
)
def test_an_entry_written_into_redis_is_checked_before_it_is_served(
    gw, fleet, redis_url, redis_prefix, poison: bytes
) -> None:
    """Redis is written by other processes: an entry that is not a valid answer is a miss (and
    replaced by the fresh answer), never a 200 of it or a 500, unary or streamed."""
    import redis

    first = post(gw, body(max_tokens=5))
    assert first.headers["x-gateway-cache"] == "miss"
    r = redis.Redis.from_url(redis_url)
    from gateway.cache.exact import unpack_entry

    deadline = time.monotonic() + 5
    while True:  # the store may land just after the reply (seen on a loaded machine)
        keys = [
            k
            for k in r.scan_iter(match=f"*{redis_prefix}*exact*")
            if unpack_entry(r.get(k))[1] == first.content  # an entry: its time, then the answer
        ]
        if keys or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    assert keys, "the answer was not stored in Redis"
    for stream in (False, True):
        for k in keys:
            r.set(k, poison)
        again = post(gw, body(max_tokens=5, stream=stream))
        assert again.status_code == 200 and again.headers["x-gateway-cache"] == "miss"
        if stream:
            validate_sse(again.content)
        else:
            validate("CreateChatCompletionResponse", again.json())
        deadline = time.monotonic() + 5
        while any(r.get(k) == poison for k in keys):  # the fresh answer replaces it
            assert time.monotonic() < deadline, "the invalid entry was never replaced"
            time.sleep(0.01)
    r.close()
