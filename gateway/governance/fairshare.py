"""Fair share of a pool between tenants.

A tenant with `max_pool_share: X` may hold at most X of a pool's `max_inflight` (this process's
share of it) while requests of others wait in that pool's admission queue. Over its share, the
tenant's next requests wait here — before they reach the admission queue — so freed slots go to
the others first; when nobody else waits, the tenant may use the whole pool (work-conserving).
A request held longer than the pool's `queue.max_wait_s` is refused with 429 and Retry-After.
Counted per process (each process's pool capacity is its own share of `max_inflight`).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from gateway.governance.answers import rate_limited

if TYPE_CHECKING:
    from gateway.runtime import Snapshot

POLL_S = 0.01


class FairShare:
    def __init__(self) -> None:
        self.inflight: dict[tuple[str, str], int] = {}
        self.held = 0  # requests that waited for their tenant's share
        self.refused = 0
        # Are requests waiting in the pool's admission queue? Set by the pipeline.
        self.waiting: Callable[[str], bool] = lambda pool: False

    @staticmethod
    def capacity(snap: Snapshot, pool: str) -> int | None:
        total = 0
        for m in snap.pools[pool].members:
            if m.max_inflight is None:
                return None  # an unbounded member: nothing to share
            total += m.max_inflight
        return total

    async def enter(self, snap: Snapshot, pool: str, tenant: str, share: float) -> bool:
        """Wait while the tenant is over its share and others wait; False: not counted."""
        cap = self.capacity(snap, pool)
        if cap is None:
            return False
        limit = max(1, math.floor(share * cap))
        key = (pool, tenant)
        if self.inflight.get(key, 0) >= limit and self.waiting(pool):
            self.held += 1
            settings = snap.policy.pools[pool].queue
            deadline = time.monotonic() + settings.max_wait_s
            while self.inflight.get(key, 0) >= limit and self.waiting(pool):
                if time.monotonic() >= deadline:
                    self.refused += 1
                    raise rate_limited(
                        f"Tenant {tenant} is using its share ({share:.0%}) of pool '{pool}' "
                        "while others wait; retry shortly.",
                        float(max(1, settings.retry_after_s)),
                        {},
                    )
                await asyncio.sleep(POLL_S)
        self.inflight[key] = self.inflight.get(key, 0) + 1
        return True

    def leave(self, pool: str, tenant: str) -> None:
        key = (pool, tenant)
        n = self.inflight.get(key, 0) - 1
        if n > 0:
            self.inflight[key] = n
        else:
            self.inflight.pop(key, None)
