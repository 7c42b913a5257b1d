"""Live gateway processes, counted through a Redis heartbeat set.

Each process writes its id with the current time every `beat_s`; the count of ids seen within
`stale_s` is the N by which limits are divided when Redis goes away, and the concurrency leases
of processes that stopped beating are reclaimed.

The set is data written by others (as `gateway.infra.shares`' process set): every beat trims
entries older than `stale_s` and entries dated further ahead than `MAX_AHEAD_S` (no process
writes them: a far-future or infinite score would count as a live process for ever), reads at
most `MAX_PROCESSES` live entries, newest first, counts only those shaped like a process id and
removes the others it read; the key expires a few staleness periods after the last beat, so a
fleet that stopped leaves nothing behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import time
from typing import Any

from gateway.infra.shared_state import SharedState
from gateway.infra.tasks import stop_task

PROCESS_ID = re.compile(r"^[0-9]{1,10}-[0-9a-f]{8}$")  # as Processes writes it: pid-hex
MAX_AHEAD_S = 60.0  # clocks of processes differ a little, never by a minute
MAX_PROCESSES = 1024


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
                p.zremrangebyscore(self.key, "-inf", f"({now - self.stale_s}")
                p.zremrangebyscore(self.key, f"({now + MAX_AHEAD_S}", "+inf")
                # Newest first: live processes beat every `beat_s`, so a flood written once
                # cannot hide them from the bounded read.
                p.zrevrangebyscore(
                    self.key, now + MAX_AHEAD_S, now - self.stale_s, start=0, num=MAX_PROCESSES
                )
                p.expire(self.key, max(30, int(3 * self.stale_s)))
                res = await p.execute()
            ids, junk = {self.id}, []
            for m in res[3]:
                text = m.decode("utf-8", "replace") if isinstance(m, bytes) else str(m)
                if PROCESS_ID.fullmatch(text):
                    ids.add(text)
                else:
                    junk.append(m)
            if junk:  # no process writes these: removed as they are seen
                await r.zrem(self.key, *junk)
            return min(len(ids), MAX_PROCESSES)

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
            await stop_task(self._task)
            self._task = None
        with contextlib.suppress(Exception):
            await self.state.call(lambda r: r.zrem(self.key, self.id), None)
