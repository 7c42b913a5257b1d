"""Concurrent requests per scope, shared through Redis with leased slots.

Redis holds, per scope, a hash `process id -> slots held`. A process admits a request without
Redis while its local in-flight count is below what it holds; otherwise the lease script
(gateway/governance/lease.py) counts the slots held by live processes (those in the heartbeat
set; a dead process's slots are reclaimed) and grants one slot plus `lease_fraction` of the free
ones. Slots a process holds beyond its needs are handed back in the background after requests
end: one task per scope at a time, which looks again after each write (requests that ended
meanwhile) and tries again later when Redis did not take it, so every slot goes back. While Redis
is down each process admits up to its share (limit / N processes) on its own; those admissions
are not slots held in Redis and are never handed back to it.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass
from typing import Any

from gateway.governance.procs import Processes
from gateway.infra.shared_state import SharedState

RETRY_S = 1.0  # a return Redis did not take is tried again this often

# Hands back up to ARGV[2] slots of process ARGV[1], never below zero (Redis may have restarted
# empty, or hold anything): a negative count would let other processes over-admit.
_RETURN = """
local held = tonumber(redis.call('HGET', KEYS[1], ARGV[1]))
if held == nil or held ~= math.floor(held) or math.abs(held) == math.huge then held = 0 end
local left = held - tonumber(ARGV[2])
if left > 0 then
  redis.call('HSET', KEYS[1], ARGV[1], left)
else
  redis.call('HDEL', KEYS[1], ARGV[1])
end
return 1
"""


@dataclass(slots=True, eq=False)
class Slots:
    key: str
    limit: int
    inflight: int = 0
    held: int = 0  # slots leased from Redis (what Redis counts for this process)
    returning: bool = False


class Concurrency:
    def __init__(self, state: SharedState, procs: Processes) -> None:
        self.state, self.procs = state, procs
        self.scopes: dict[str, Slots] = {}
        self.lease_fraction = 0.05
        self.local_decisions = 0
        self.local_mode = False
        self._script: Any = None
        self._tasks: set[asyncio.Task[None]] = set()

    def slots(self, scope: str, limit: int) -> Slots:
        key = self.state.group_key("gov", "cc", scope)
        s = self.scopes.get(key)
        if s is None:
            s = self.scopes[key] = Slots(key, limit)
        s.limit = limit
        return s

    def release(self, held: list[Slots]) -> None:
        for s in held:
            s.inflight = max(0, s.inflight - 1)
            if not self.state.enabled:
                s.held = 0  # one process, nothing leased
            elif self._surplus(s) > 0 and not s.returning:
                # A return already running looks again after its write: nothing is skipped.
                s.returning = True
                task = asyncio.get_running_loop().create_task(self._return(s))
                self._tasks.add(task)  # held: a task only weakly referenced may be collected
                task.add_done_callback(self._tasks.discard)

    def _slack(self, s: Slots) -> int:
        return int(s.limit * self.lease_fraction / max(1, self.procs.count))

    def _surplus(self, s: Slots) -> int:
        return s.held - s.inflight - self._slack(s)

    async def _return(self, s: Slots) -> None:
        try:
            await asyncio.sleep(0)  # let requests that end together coalesce
            while (surplus := self._surplus(s)) > 0:
                s.held -= surplus  # not used by new requests while they are on their way back
                if not await self._hand_back(s, surplus):
                    s.held += surplus  # Redis did not take them: still ours, try again later
                    await asyncio.sleep(RETRY_S)
        finally:
            s.returning = False

    async def _hand_back(self, s: Slots, n: int) -> bool:
        async def run(r: Any) -> Any:
            if self._script is None:
                self._script = r.register_script(_RETURN)
            return await self._script(keys=[s.key], args=[self.procs.id, n], client=r)

        return await self.state.call(run, None) is not None

    def lease_locally(self, short: list[Slots]) -> bool:
        """Redis is down (or not configured): this process's share, counted locally."""
        self.local_mode = self.state.enabled
        if self.state.enabled:
            self.local_decisions += 1
        n = max(1, self.procs.count)
        return all(s.inflight < max(1, math.ceil(s.limit / n)) for s in short)
