"""Live gateway processes, counted through a Redis heartbeat set.

Each process writes its id with the current time every `beat_s`; the count of ids seen within
`stale_s` is the N by which limits are divided when Redis goes away, and the concurrency leases
of processes that stopped beating are reclaimed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from typing import Any

from gateway.infra.shared_state import SharedState


class Processes:
    def __init__(self, state: SharedState, beat_s: float = 2.0, stale_s: float = 10.0) -> None:
        self.state, self.beat_s, self.stale_s = state, beat_s, stale_s
        self.id = f"{os.getpid()}-{os.urandom(4).hex()}"
        self.count = 1
        self._task: asyncio.Task[None] | None = None

    @property
    def key(self) -> str:
        return self.state.group_key("gov", "procs")

    async def beat(self) -> None:
        async def run(r: Any) -> int:
            now = time.time()
            async with r.pipeline(transaction=False) as p:
                p.zadd(self.key, {self.id: now})
                p.zremrangebyscore(self.key, "-inf", now - self.stale_s)
                p.zcard(self.key)
                p.expire(self.key, 3600)
                res = await p.execute()
            return int(res[2])

        n = await self.state.call(run, None)
        if n is not None:
            self.count = max(1, n)

    async def start(self) -> None:
        if self.state.enabled:
            await self.beat()
            self._task = asyncio.create_task(self._loop(), name="governance-heartbeat")

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.beat_s)
            await self.beat()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None
        with contextlib.suppress(Exception):
            await self.state.call(lambda r: r.zrem(self.key, self.id), None)
