"""Concurrent requests per scope, shared through Redis with leased slots.

Redis holds, per scope, a hash `process id -> slots held`. A process admits a request without
Redis while its local in-flight count is below what it holds; otherwise the lease script
(gateway/governance/lease.py) counts the slots held by live processes (those in the heartbeat
set; a dead process's slots are reclaimed) and grants one slot plus `lease_fraction` of the free
ones. Slots a process holds beyond its
needs are handed back in the background after requests end. While Redis is down each process
admits up to its share (limit / N processes) on its own.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass

from gateway.governance.procs import Processes
from gateway.infra.shared_state import SharedState


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
        self.local_decisions = 0
        self.local_mode = False

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

    def lease_locally(self, short: list[Slots]) -> bool:
        """Redis is down (or not configured): this process's share, counted locally."""
        self.local_mode = self.state.enabled
        if self.state.enabled:
            self.local_decisions += 1
        n = max(1, self.procs.count)
        for s in short:
            if s.inflight >= max(1, math.ceil(s.limit / n)):
                return False
        for s in short:
            s.held = max(s.held, s.inflight + 1)
        return True
