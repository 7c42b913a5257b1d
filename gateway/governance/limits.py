"""Requests and tokens per minute: token buckets shared through Redis, leased in batches.

Each bucket (one scope: a tenant or a key; one dimension: requests or tokens) lives in Redis as
`{t: tokens left, ts: last refill}` and refills continuously at limit/60 per second up to the
limit. A process does not ask Redis for every request: it leases units in batches and spends them
locally. One Lua script refills every bucket a request needs, checks that all can serve it, and
grants each `need + lease_fraction x (what is left after it)` — all or nothing, one round trip.
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
from typing import Any

from gateway.governance.procs import Processes
from gateway.state import SharedState

_LEASE = """
local t0 = redis.call('TIME')
local now = tonumber(t0[1]) + tonumber(t0[2]) / 1000000
local frac = tonumber(ARGV[1])
local ttl = tonumber(ARGV[2])
local have = {}
local wait = 0
for i = 1, #KEYS do
  local j = 3 + (i - 1) * 4
  local cap, rate, need = tonumber(ARGV[j]), tonumber(ARGV[j + 1]), tonumber(ARGV[j + 2])
  local v = redis.call('HMGET', KEYS[i], 't', 'ts')
  local t, ts = tonumber(v[1]), tonumber(v[2])
  if t == nil or ts == nil then t = cap; ts = now end
  if now > ts then t = math.min(cap, t + (now - ts) * rate) end
  t = t - tonumber(ARGV[j + 3])  -- spent while Redis was away: charged now
  have[i] = t
  if t < need then
    local w = (need - t) / rate
    if w > wait then wait = w end
  end
end
local out = {tostring(wait)}
for i = 1, #KEYS do
  local need = tonumber(ARGV[3 + (i - 1) * 4 + 2])
  local grant = 0
  if wait == 0 then grant = need + math.floor(math.max(have[i] - need, 0) * frac) end
  local left = have[i] - grant
  redis.call('HSET', KEYS[i], 't', tostring(left), 'ts', tostring(now))
  redis.call('EXPIRE', KEYS[i], ttl)
  out[#out + 1] = tostring(grant)
  out[#out + 1] = tostring(left)
end
return out
"""


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
        self._script: Any = None
        self.lease_fraction = 0.05
        self.redis_calls = 0
        self.local_decisions = 0
        self.local_mode = False

    def bucket(self, scope: str, dim: str, per_minute: int) -> Bucket:
        key = self.state.key("gov", "rl", scope, dim)
        b = self.buckets.get(key)
        if b is None:
            if len(self.buckets) > 50_000:
                self.buckets.clear()  # bounded: a flood of scopes only costs fresh leases
            b = self.buckets[key] = Bucket(key, float(per_minute), per_minute / 60.0)
        elif b.capacity != per_minute:  # the policy changed the limit
            b.capacity, b.rate = float(per_minute), per_minute / 60.0
        return b

    async def take(self, wants: list[tuple[Bucket, float]]) -> float | None:
        """Spend `units` from every bucket, or none: None when admitted, else seconds to wait."""
        short = [(b, n - b.balance) for b, n in wants if b.balance < n]
        if short:
            wait = await self._lease(short)
            if wait is not None:
                return wait
        for b, n in wants:
            b.balance -= n
        return None

    def give_back(self, bucket: Bucket, units: float) -> None:
        """Reconcile: positive = reserved but not used (kept for the next requests)."""
        bucket.balance += units

    async def _lease(self, short: list[tuple[Bucket, float]]) -> float | None:
        if self.state.available:
            debts = [b.debt for b, _ in short]
            res = await self.state.call(lambda r: self._run(r, short, debts), None)
            if res is not None:
                self.local_mode = False
                self.redis_calls += 1
                now = time.monotonic()
                wait = float(res[0])
                for (b, _), d in zip(short, debts, strict=True):
                    b.debt -= d
                for i, (b, _) in enumerate(short):
                    b.balance += float(res[1 + 2 * i])
                    b.shared_left, b.synced = float(res[2 + 2 * i]), now
                    b.local_tokens = None
                return wait if wait > 0 else None
        return self._lease_locally(short)

    async def _run(
        self, redis: Any, short: list[tuple[Bucket, float]], debts: list[float]
    ) -> list[Any]:
        if self._script is None:
            self._script = redis.register_script(_LEASE)
        args: list[Any] = [self.lease_fraction, 300]
        for (b, need), debt in zip(short, debts, strict=True):
            args += [b.capacity, b.rate, need, debt]
        return await self._script(keys=[b.key for b, _ in short], args=args, client=redis)

    def _lease_locally(self, short: list[tuple[Bucket, float]]) -> float | None:
        """Redis is down: this process's share of each bucket, refilled locally."""
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
