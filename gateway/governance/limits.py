"""Requests and tokens per minute: token buckets shared through Redis, leased in batches.

Each bucket (one scope: a tenant or a key; one dimension: requests or tokens) lives in Redis as
`{t: tokens left, ts: last refill}` and refills continuously at limit/60 per second up to the
limit. A process does not ask Redis for every request: it leases units in batches and spends them
locally. One Lua script (gateway/governance/lease.py) refills every bucket a request needs,
checks that all can serve it, and grants each `need + lease_fraction x (what is left after it)`
— all or nothing, one round trip.
Far from the limit a lease covers many requests; near it the batch shrinks to what the request
needs, so every request asks Redis and the limit holds to the unit.

When Redis is unreachable each process enforces its share (1/N of capacity and rate, N = live
gateway processes seen in the heartbeat set) in a local bucket, and counts the decisions it took
alone (metric `gateway_ratelimit_local_decisions`). What it admitted alone is charged to the
shared bucket at its next lease, so a short outage (or a timeout on an overloaded host) does not
let a scope exceed its limit over the minute.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from gateway.governance.procs import Processes
from gateway.infra.shared_state import SharedState


@dataclass(slots=True, eq=False)
class Bucket:
    """This process's view of one shared bucket."""

    key: str
    capacity: float
    rate: float  # units per second
    balance: float = 0.0  # leased units not spent yet (negative: usage above the reservation)
    shared_left: float | None = None  # units left in the shared bucket at the last lease
    synced: float = 0.0
    local_tokens: float | None = None  # the local share while Redis is down
    debt: float = 0.0  # units admitted alone while Redis was down, charged at the next lease
    local_ts: float = 0.0

    def remaining(self, now: float) -> float:
        """Estimate of what the scope may still spend now (shared left + refill + own lease)."""
        if self.shared_left is None:
            left = self.capacity if self.local_tokens is None else self.local_tokens
        else:
            left = min(self.capacity, self.shared_left + (now - self.synced) * self.rate)
        return max(0.0, left + self.balance)

    def reset_s(self, now: float) -> float:
        """Seconds until the bucket is full again."""
        return max(0.0, self.capacity - self.remaining(now)) / self.rate


class Limiter:
    """All buckets of this process."""

    def __init__(self, state: SharedState, procs: Processes) -> None:
        self.state, self.procs = state, procs
        self.buckets: dict[str, Bucket] = {}
        self.lease_fraction = 0.05
        self.local_decisions = 0
        self.local_mode = False

    def bucket(self, scope: str, dim: str, per_minute: int) -> Bucket:
        key = self.state.group_key("gov", "rl", scope, dim)
        b = self.buckets.get(key)
        if b is None:
            if len(self.buckets) > 50_000:
                self.buckets.clear()  # bounded: a flood of scopes only costs fresh leases
            b = self.buckets[key] = Bucket(key, float(per_minute), per_minute / 60.0)
        elif b.capacity != per_minute:  # the policy changed the limit
            b.capacity, b.rate = float(per_minute), per_minute / 60.0
        return b

    def give_back(self, bucket: Bucket, units: float) -> None:
        """Reconcile: positive = reserved but not used (kept for the next requests)."""
        bucket.balance += units

    def lease_locally(self, short: list[tuple[Bucket, float]]) -> float | None:
        """Redis is down: this process's share of each bucket, refilled locally (None: granted,
        else seconds to wait)."""
        if not short:
            return None
        self.local_mode = self.state.enabled
        if self.state.enabled:
            self.local_decisions += 1
        share = 1.0 / max(1, self.procs.count)
        now = time.monotonic()
        wait = 0.0
        for b, need in short:
            cap, rate = b.capacity * share, b.rate * share
            if b.local_tokens is None:
                # Start from the share of what was left at the last lease (full when unknown).
                left = b.capacity if b.shared_left is None else b.remaining(now) - b.balance
                b.local_tokens, b.local_ts = min(cap, max(0.0, left) * share), now
                b.shared_left = None
            b.local_tokens = min(cap, b.local_tokens + (now - b.local_ts) * rate)
            b.local_ts = now
            if b.local_tokens < need:
                wait = max(wait, (need - b.local_tokens) / rate)
        if wait > 0:
            return wait
        for b, need in short:
            assert b.local_tokens is not None
            b.local_tokens -= need
            b.balance += need
            b.debt += need
        return None
