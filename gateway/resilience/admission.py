"""Admission control: when every member of a request's pools is at its concurrency limit, wait in
a bounded queue for a free slot (up to `max_wait_s`), else shed.

Queue depth and time spent waiting per pool are the autoscaling signal; they are kept here and
exported as metrics.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from gateway.infra.shares import Shares


class QueueSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    max_wait_s: float = Field(
        0.0, ge=0, description="Longest wait for a free member; 0 = shed at once."
    )
    max_depth: int = Field(
        1000, ge=0, description="Requests allowed to wait at once; beyond, shed."
    )
    retry_after_s: int = Field(1, ge=0, description="Retry-After sent with a shed 429.")


@dataclass(slots=True)
class QueueStats:
    depth: int = 0
    admitted_after_wait: int = 0
    shed: int = 0
    wait_s_total: float = 0.0
    last_wait_s: float = 0.0


class Admission:
    """One condition for the whole process: any finished attempt may free a slot for a waiter."""

    def __init__(self) -> None:
        self._cond: asyncio.Condition | None = None
        self.stats: dict[str, QueueStats] = {}
        self.shares = Shares()  # this process's share of each queue's max_depth

    def _condition(self) -> asyncio.Condition:
        if self._cond is None:
            self._cond = asyncio.Condition()
        return self._cond

    def released(self) -> None:
        """Call after an attempt ends (a slot may be free)."""
        cond = self._cond
        if cond is not None and self._waiting():
            asyncio.get_running_loop().create_task(self._notify(cond))

    def _waiting(self) -> bool:
        return any(s.depth for s in self.stats.values())

    @staticmethod
    async def _notify(cond: asyncio.Condition) -> None:
        async with cond:
            cond.notify_all()

    async def wait(self, pool: str, settings: QueueSettings, deadline: float) -> bool:
        """Wait until notified (True) or the deadline passes / the queue is full (False)."""
        stats = self.stats.setdefault(pool, QueueStats())
        if settings.max_wait_s <= 0 or stats.depth >= self.shares.of(settings.max_depth, pool):
            return False
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        cond = self._condition()
        stats.depth += 1
        try:
            async with cond:
                await asyncio.wait_for(cond.wait(), min(remaining, 0.25))
        except TimeoutError:
            pass  # re-check capacity periodically even without a notification
        finally:
            stats.depth -= 1
        return True

    def record(self, pool: str, waited_s: float, admitted: bool) -> None:
        stats = self.stats.setdefault(pool, QueueStats())
        stats.last_wait_s = waited_s
        stats.wait_s_total += waited_s
        if admitted:
            stats.admitted_after_wait += 1
        else:
            stats.shed += 1
