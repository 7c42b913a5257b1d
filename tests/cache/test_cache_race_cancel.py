"""A request cancelled while its late semantic lookup races the upstream call (its client left)
cancels that call too: `asyncio.wait` does not pass a cancellation on to what it waits on, so
the upstream call went on with no one to answer. Unit test of the stage, `next` a fake."""

from __future__ import annotations

import asyncio

from starlette.responses import Response

from gateway.cache.exact import MemoryLRU
from gateway.cache.semantic_layer import SemanticLayer, SemanticPlan
from gateway.cache.semantic_settings import SemanticSettings
from gateway.cache.singleflight import SingleFlight
from gateway.pipeline.call import Call
from gateway.pipeline.stages.cache import Cache, CachePlan
from tests.pipeline.conftest import chat_body, http_request, make_call, snapshot


async def test_a_cancelled_race_cancels_the_upstream_call() -> None:
    stage = Cache(MemoryLRU(), SemanticLayer(SemanticSettings(), None, "gw:"), SingleFlight())
    call = make_call(snapshot(), chat_body(temperature=0), http_request())
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def upstream(c: Call) -> Response:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        raise AssertionError("unreachable")

    lookup: asyncio.Future[object] = asyncio.get_running_loop().create_future()  # still running
    plan = CachePlan("key", read=True, write=False, ttl_s=60,
                     semantic=SemanticPlan("ns", "question?", None, None, pending=lookup))  # fmt: skip
    request = asyncio.ensure_future(stage._race(call, upstream, plan, lookup))
    await asyncio.wait_for(started.wait(), 2)
    request.cancel()
    await asyncio.wait_for(cancelled.wait(), 2)
    assert request.cancelled() or request.done()
    lookup.cancel()
