"""The Responses API's stored responses: per tenant, bounded, and kept locally when Redis is down."""

from __future__ import annotations

import asyncio

from gateway.apis.response_store import (
    ResponseStore,
    StoredResponses,
    new_response_id,
    valid_response_id,
)
from gateway.infra.shared_state import SharedState


def _record(tenant: str, size: int = 10) -> dict[str, object]:
    return {"tenant": tenant, "response": {"id": "x"}, "messages": ["y" * size]}


def test_ids_are_generated_and_checked() -> None:
    rid = new_response_id()
    assert valid_response_id(rid) and rid != new_response_id()
    for bad in ("resp_xyz", "resp_" + "g" * 48, rid + "0", None, 5, "../" + rid):
        assert not valid_response_id(bad)


def test_tenant_binding_and_delete_in_memory() -> None:
    async def run() -> None:
        store = ResponseStore(SharedState(None))
        rid = new_response_id()
        assert await store.put("a", rid, _record("a"))
        assert (await store.get("a", rid))["tenant"] == "a"
        assert await store.get("b", rid) is None
        assert not await store.delete("b", rid)
        assert await store.delete("a", rid)
        assert await store.get("a", rid) is None

    asyncio.run(run())


def test_memory_bounds_evict_oldest_and_refuse_oversized() -> None:
    async def run() -> None:
        settings = StoredResponses(max_local=3, max_local_bytes=2000, max_record_bytes=1500)
        store = ResponseStore(SharedState(None), lambda: settings)
        ids = [new_response_id() for _ in range(4)]
        for rid in ids:
            await store.put("t", rid, _record("t"))
        assert await store.get("t", ids[0]) is None  # evicted: at most 3 records
        assert all([await store.get("t", rid) for rid in ids[1:]])
        big = new_response_id()
        assert not await store.put("t", big, _record("t", 1600))  # over max_record_bytes
        await store.put("t", big, _record("t", 1200))  # fits, but pushes the byte total over
        assert await store.get("t", big) is not None
        assert store._local_bytes <= 2000  # older records evicted to make room

    asyncio.run(run())


def test_redis_down_keeps_records_in_this_process() -> None:
    async def run() -> None:
        state = SharedState("redis://127.0.0.1:7899/13")  # nothing listens there
        store = ResponseStore(state)
        rid = new_response_id()
        assert await store.put("a", rid, _record("a"))
        assert (await store.get("a", rid))["tenant"] == "a"
        assert await store.get("b", rid) is None
        await state.aclose()

    asyncio.run(run())
