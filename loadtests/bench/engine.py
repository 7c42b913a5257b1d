"""The two load shapes every mode is built from.

* Closed loop: ``concurrency`` clients, each sends its next request when the previous one ends.
  Simple and right for throughput, but a slow response also delays the requests behind it, so its
  latency figures omit the waiting (coordinated omission).
* Open loop: requests leave at scheduled times whatever the responses do; each sample's latency runs
  from its *scheduled* time, so when the generator or a connection cap makes a send late, the
  lateness is part of the latency, and is itself reported (so a saturated generator shows).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from .client import Sample

SampleSink = Callable[[Sample], None]


@dataclass(slots=True)
class LoopStats:
    """What the generator itself did during one loop."""

    started: float  # perf_counter at start
    wall_s: float  # until the last response (or the drain gave up)
    sent: int
    unfinished: int  # still in flight when the drain deadline passed (cancelled, no sample)


async def closed_loop(
    send: Callable[[], Awaitable[Sample]],
    sink: SampleSink,
    concurrency: int,
    duration_s: float,
    max_requests: int,
) -> LoopStats:
    """Run ``concurrency`` back-to-back clients until ``duration_s`` or ``max_requests``."""
    start = time.perf_counter()
    deadline = start + duration_s
    budget = [max_requests]

    async def worker() -> None:
        while budget[0] > 0 and time.perf_counter() < deadline:
            budget[0] -= 1
            sink(await send())

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return LoopStats(start, time.perf_counter() - start, max_requests - budget[0], 0)


async def open_loop(
    fire: Callable[[int, float], Awaitable[Sample]],
    sink: SampleSink,
    offsets: Sequence[float],
    max_inflight: int = 4096,
    drain_s: float = 60.0,
    start: float | None = None,
) -> LoopStats:
    """Start request ``i`` at ``start + offsets[i]`` (``fire(i, scheduled_time)``).

    At most ``max_inflight`` requests are outstanding; past that, sends wait, and that wait shows
    as lateness and latency. After the last send, in-flight requests get ``drain_s`` to finish.
    """
    start = time.perf_counter() if start is None else start
    sem = asyncio.Semaphore(max_inflight)
    tasks: set[asyncio.Task[None]] = set()

    async def one(i: int, scheduled: float) -> None:
        try:
            sample = await fire(i, scheduled)
        finally:
            sem.release()
        sink(sample)

    loop = asyncio.get_running_loop()
    for i, offset in enumerate(offsets):
        scheduled = start + offset
        delay = scheduled - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        await sem.acquire()
        task = loop.create_task(one(i, scheduled))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    unfinished = 0
    if tasks:
        _, pending = await asyncio.wait(set(tasks), timeout=drain_s)
        unfinished = len(pending)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    return LoopStats(start, time.perf_counter() - start, len(offsets), unfinished)
