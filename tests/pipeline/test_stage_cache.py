"""Cache: exact store in memory, semantic cache off, single-flight; `next` is a fake."""

from __future__ import annotations

import asyncio

import orjson
import pytest
from starlette.responses import Response

from gateway.cache.exact import MemoryLRU
from gateway.cache.semantic_layer import SemanticLayer
from gateway.cache.semantic_settings import SemanticSettings
from gateway.cache.singleflight import SingleFlight
from gateway.errors import GatewayError
from gateway.pipeline.call import Call
from gateway.pipeline.stages.cache import Cache
from tests.pipeline.conftest import (
    COMPLETION,
    FakeNext,
    chat_body,
    drain,
    http_request,
    make_call,
    snapshot,
    stream_reply,
)

ANSWER = orjson.dumps(COMPLETION)


def cache() -> Cache:
    return Cache(MemoryLRU(), SemanticLayer(SemanticSettings(), None, "gw:"), SingleFlight())


def call(stream: bool = False, headers: dict[str, str] | None = None) -> Call:
    body = chat_body(temperature=0, **({"stream": True} if stream else {}))
    return make_call(snapshot(), body, http_request(headers=headers))


async def stored(stage: Cache) -> int:
    await asyncio.sleep(0)  # the exact store's write is a task
    return len(stage.exact._d)  # type: ignore[attr-defined]


async def test_miss_stores_then_hit_exact_without_next() -> None:
    stage, fake = cache(), FakeNext(Response(ANSWER, media_type="application/json"))
    first = call()
    assert (await stage(first, fake)).body == ANSWER
    assert first.ctx.cache == "miss" and first.want_completion and len(fake.calls) == 1
    assert await stored(stage) == 1
    second = call()
    hit = await stage(second, fake)
    assert second.ctx.cache == "hit-exact" and len(fake.calls) == 1
    assert hit.body == ANSWER and hit.headers["x-gateway-cache"] == "hit-exact"


async def test_no_store_bypasses() -> None:
    stage, fake = cache(), FakeNext(Response(ANSWER))
    for _ in range(2):
        c = call(headers={"cache-control": "no-store"})
        await stage(c, fake)
        assert c.ctx.cache == "bypass" and not c.want_completion
    assert len(fake.calls) == 2 and await stored(stage) == 0


async def test_a_gateway_error_releases_followers() -> None:
    stage, gate = cache(), asyncio.Event()
    err = GatewayError(503, "nobody", code="no_provider_available")

    async def leader_next(c: Call) -> Response:
        await gate.wait()
        raise err

    leader = asyncio.ensure_future(stage(call(), leader_next))
    await asyncio.sleep(0)
    follower_next = FakeNext()
    follower = asyncio.ensure_future(stage(call(), follower_next))
    await asyncio.sleep(0)
    assert len(stage.flights) == 1
    gate.set()
    for task in (leader, follower):
        with pytest.raises(GatewayError) as raised:
            await asyncio.wait_for(task, 2.0)
        assert raised.value is err
    assert follower_next.calls == [] and len(stage.flights) == 0
    assert await stored(stage) == 0


async def test_followers_go_on_their_own_when_the_leader_is_cancelled() -> None:
    stage = cache()

    async def hang(c: Call) -> Response:
        await asyncio.sleep(10)
        raise AssertionError("cancelled before")

    leader = asyncio.ensure_future(stage(call(), hang))
    await asyncio.sleep(0)
    follower_next = FakeNext(Response(ANSWER))
    follower = asyncio.ensure_future(stage(call(), follower_next))
    await asyncio.sleep(0)
    leader.cancel()
    assert (await asyncio.wait_for(follower, 2.0)).body == ANSWER
    assert len(follower_next.calls) == 1 and leader.cancelled()


async def test_a_non_200_is_not_stored_and_releases_the_flight() -> None:
    stage = cache()
    response = await stage(call(), FakeNext(Response(b"{}", status_code=502)))
    assert response.status_code == 502 and len(stage.flights) == 0
    assert await stored(stage) == 0


@pytest.mark.parametrize("complete", [True, False])
async def test_a_stream_is_stored_at_its_end_only_when_complete(complete: bool) -> None:
    stage, reply = cache(), stream_reply([b"data: x\n\n"])
    response = await stage(call(stream=True), FakeNext(reply))
    assert response is reply and len(stage.flights) == 1
    if complete:
        reply.completion = ANSWER  # type: ignore[attr-defined]
    assert await stored(stage) == 0
    await drain(reply)
    assert await stored(stage) == (1 if complete else 0)
    assert len(stage.flights) == 0


async def test_a_hit_for_a_stream_request_is_served_as_sse() -> None:
    stage = cache()
    await stage(call(), FakeNext(Response(ANSWER)))
    await stored(stage)
    streamed = call(stream=True)
    fake = FakeNext()
    hit = await stage(streamed, fake)
    assert fake.calls == [] and streamed.ctx.cache == "hit-exact"
    assert hit.media_type == "text/event-stream"
    events = [e for e in bytes(hit.body).split(b"\n\n") if e]
    assert events[-1] == b"data: [DONE]"
    chunks = [orjson.loads(e.removeprefix(b"data: ")) for e in events[:-1]]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == "hey" and chunks[-1]["choices"][0]["finish_reason"] == "stop"
