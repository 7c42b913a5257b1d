"""A spend query (GET /admin/spend) flushes what this process recorded before it reads: also what
the background flush had taken and was still writing when the query came (it read Redis before
that write landed, and a request just recorded was missing from the answer). A private real
Redis whose writes are paused for a moment (CLIENT PAUSE WRITE) holds the background write in
flight.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest

from gateway.governance.spend import SpendLedger, Usage
from gateway.infra.shared_state import SharedState
from tests.support import RedisProcess


@pytest.fixture
def private_redis() -> Iterator[RedisProcess]:
    with RedisProcess() as r:
        yield r


@pytest.mark.parametrize("queries", [1, 3])
def test_a_query_sees_what_a_flush_in_flight_is_writing(
    private_redis: RedisProcess, queries: int
) -> None:
    async def run() -> list[dict[str, Any]]:
        state = SharedState(private_redis.url, prefix="t:")
        try:
            ledger = SpendLedger(state)
            now = time.time()
            day = ledger.day(now)
            ledger.record(now, "team", "mk_1", "chat", "p", Usage(5_000, 1, 3, 2), [])
            assert state.redis is not None
            await state.redis.execute_command("CLIENT", "PAUSE", "300", "WRITE")
            background = asyncio.create_task(ledger.flush())  # takes the pending counters
            await asyncio.sleep(0.05)  # ... and waits on the paused write
            docs = await asyncio.gather(
                *(ledger.query([day], None, None, None, "tenant") for _ in range(queries))
            )
            assert await background
            return list(docs)
        finally:
            await state.aclose()

    for doc in asyncio.run(run()):
        assert doc["total"]["requests"] == 1, doc
        assert (doc["total"]["input_tokens"], doc["total"]["output_tokens"]) == (3, 2)
