"""A replay worker stops when asked, whatever it is doing: a stop that arrives while a cycle ends
(its replays done, their keep-alive being wound down) is never swallowed, so stopping a gateway
never hangs on its replay workers."""

from __future__ import annotations

import asyncio
import random
import time

from gateway.resilience.deferred import MemoryReplayQueue, ReplayEntry, ReplaySettings, ReplayWorker


async def test_stop_never_hangs_whenever_it_arrives() -> None:
    settings = ReplaySettings(base_backoff_ms=0, max_backoff_ms=0, block_ms=5, max_attempts=50)
    rng = random.Random(7)
    for round_ in range(150):
        queue = MemoryReplayQueue(settings)
        for i in range(3):
            await queue.enqueue(f"r{round_}-{i}", "t", "m", b"{}")

        async def send(entry: ReplayEntry) -> tuple[int, bytes]:
            return 503, b"{}"  # retried at once: the worker cycles continuously

        worker = ReplayWorker(queue, send, "w", settings)
        await worker.start()
        task = worker._task
        assert task is not None
        for _ in range(rng.randrange(1, 40)):
            await asyncio.sleep(0)
        start = time.monotonic()
        await asyncio.wait_for(worker.stop(), 2.0)
        assert task.done(), f"round {round_}: the worker swallowed its stop and runs on"
        assert time.monotonic() - start < 1.0
