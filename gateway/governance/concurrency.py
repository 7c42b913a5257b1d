"""Concurrent requests per scope, shared through Redis with leased slots.

Redis holds, per scope, a hash `process id -> slots held`. A process admits a request without
Redis while its local in-flight count is below what it holds; otherwise one Lua script counts the
slots held by live processes (those in the heartbeat set; a dead process's slots are reclaimed)
and grants one slot plus `lease_fraction` of the free ones. Slots a process holds beyond its
needs are handed back in the background after requests end. While Redis is down each process
admits up to its share (limit / N processes) on its own.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass
from typing import Any

from gateway.governance.procs import Processes
from gateway.state import SharedState

_ACQUIRE = """
local t0 = redis.call('TIME')
local now = tonumber(t0[1])
local procs, me, stale, frac = KEYS[1], ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local totals = {}
for i = 2, #KEYS do
  local all = redis.call('HGETALL', KEYS[i])
  local total = 0
  for j = 1, #all, 2 do
    local seen = tonumber(redis.call('ZSCORE', procs, all[j]))
    if all[j] ~= me and (seen == nil or seen < now - stale) then
      redis.call('HDEL', KEYS[i], all[j])
    else
      total = total + math.max(0, tonumber(all[j + 1]))
    end
  end
  local limit = tonumber(ARGV[2 + i])
  if total + 1 > limit then return {0, i - 1} end
  totals[i] = total
end
local out = {1, 0}
for i = 2, #KEYS do
  local free = tonumber(ARGV[2 + i]) - totals[i] - 1
  local grant = 1 + math.floor(free * frac)
  redis.call('HINCRBY', KEYS[i], me, grant)
  redis.call('EXPIRE', KEYS[i], 3600)
  out[#out + 1] = grant
end
return out
"""


@dataclass(slots=True, eq=False)
class Slots:
    key: str
    limit: int
    inflight: int = 0
    held: int = 0  # slots leased from Redis
    returning: bool = False


class Concurrency:
    def __init__(self, state: SharedState, procs: Processes) -> None:
        self.state, self.procs = state, procs
        self.scopes: dict[str, Slots] = {}
        self.lease_fraction = 0.05
        self._script: Any = None
        self.local_decisions = 0
        self.local_mode = False

    def slots(self, scope: str, limit: int) -> Slots:
        key = self.state.key("gov", "cc", scope)
        s = self.scopes.get(key)
        if s is None:
            s = self.scopes[key] = Slots(key, limit)
        s.limit = limit
        return s

    async def acquire(self, wanted: list[Slots]) -> bool:
        short = [s for s in wanted if s.inflight >= s.held]
        if short:
            granted = await self._lease(short)
            if not granted:
                return False
        for s in wanted:
            s.inflight += 1
        return True

    def release(self, held: list[Slots]) -> None:
        for s in held:
            s.inflight = max(0, s.inflight - 1)
            if not self.state.enabled:
                s.held = s.inflight  # one process, nothing leased
            elif s.held - s.inflight > self._slack(s) and not s.returning and self.state.enabled:
                s.returning = True
                asyncio.get_running_loop().create_task(self._return(s))

    def _slack(self, s: Slots) -> int:
        return int(s.limit * self.lease_fraction / max(1, self.procs.count))

    async def _return(self, s: Slots) -> None:
        try:
            await asyncio.sleep(0)  # let requests that end together coalesce
            surplus = s.held - s.inflight - self._slack(s)
            if surplus > 0:
                s.held -= surplus
                pid = self.procs.id
                await self.state.call(lambda r: r.hincrby(s.key, pid, -surplus), None)
        finally:
            s.returning = False

    async def _lease(self, short: list[Slots]) -> bool:
        if self.state.available:
            res = await self.state.call(lambda r: self._run(r, short), None)
            if res is not None:
                self.local_mode = False
                if int(res[0]) != 1:
                    return False
                for s, grant in zip(short, res[2:], strict=True):
                    s.held += int(grant)
                return True
        # Redis is down (or not configured): this process's share, counted locally.
        self.local_mode = self.state.enabled
        if self.state.enabled:
            self.local_decisions += 1
        n = max(1, self.procs.count)
        for s in short:
            if s.inflight >= max(1, math.ceil(s.limit / n)) and s.inflight >= s.held:
                return False
        for s in short:
            s.held = max(s.held, s.inflight + 1)
        return True

    async def _run(self, redis: Any, short: list[Slots]) -> list[Any]:
        if self._script is None:
            self._script = redis.register_script(_ACQUIRE)
        args: list[Any] = [self.procs.id, self.procs.stale_s, self.lease_fraction]
        args += [s.limit for s in short]
        keys = [self.procs.key, *(s.key for s in short)]
        return await self._script(keys=keys, args=args, client=redis)
