"""One Redis round trip for everything a request needs from the shared limits.

A request may need units from token buckets (requests and tokens per minute, gateway/governance/
limits.py) and a slot from concurrency scopes (gateway/governance/concurrency.py). Only what its
process does not hold already goes to Redis, in one Lua script that grants all or nothing: bucket
leases when every bucket can serve, slots when every scope has one free. Far from the limits the
leases cover many requests and nothing is sent at all; near them each request makes this one
round trip. When Redis is unreachable both fall back to this process's share, counted locally.
"""

from __future__ import annotations

import time
from typing import Any

from gateway.governance.concurrency import Concurrency, Slots
from gateway.governance.limits import Bucket, Limiter
from gateway.infra.shared_state import SharedState

# KEYS: the buckets, then (when slots are asked for) the heartbeat set and the slot hashes.
# ARGV: bucket lease fraction, bucket TTL, number of buckets, process id, stale seconds, slot lease
# fraction; then capacity, rate, need, debt per bucket; then the limit per slot scope.
_SCRIPT = """
local t0 = redis.call('TIME')
local now = tonumber(t0[1]) + tonumber(t0[2]) / 1000000
local frac, ttl, nb = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local me, stale, sfrac = ARGV[4], tonumber(ARGV[5]), tonumber(ARGV[6])
local have, wait = {}, 0
for i = 1, nb do
  local j = 7 + (i - 1) * 4
  local cap, rate, need = tonumber(ARGV[j]), tonumber(ARGV[j + 1]), tonumber(ARGV[j + 2])
  local v = redis.call('HMGET', KEYS[i], 't', 'ts')
  local t, ts = tonumber(v[1]), tonumber(v[2])
  -- Redis contents are not trusted: no number, NaN or infinity is a full bucket, never a
  -- bucket that grants everything (NaN compares false) or refuses for ever.
  if t == nil or ts == nil or t ~= t or ts ~= ts or t == math.huge or t == -math.huge then
    t = cap; ts = now
  end
  if t > cap then t = cap end
  -- Never below a minute's refill in debt (-1e308 would refuse the scope for ever).
  if t < -cap then t = -cap end
  if ts > now then ts = now end
  if now > ts then t = math.min(cap, t + (now - ts) * rate) end
  t = t - tonumber(ARGV[j + 3])  -- admitted alone while Redis was away: charged now
  have[i] = t
  if t < need then
    local w = (need - t) / rate
    if w > wait then wait = w end
  end
end
local slot_fail, free = 0, {}
if wait == 0 and #KEYS > nb then
  local procs = KEYS[nb + 1]
  for i = nb + 2, #KEYS do
    local all = redis.call('HGETALL', KEYS[i])
    local lim = tonumber(ARGV[7 + nb * 4 + (i - nb - 2)])
    local total = 0
    for j = 1, #all, 2 do
      local seen = tonumber(redis.call('ZSCORE', procs, all[j]))
      local held = tonumber(all[j + 1])
      if held == nil or held ~= math.floor(held) or math.abs(held) == math.huge then
        redis.call('HDEL', KEYS[i], all[j])  -- not a whole count (NaN too): not ours
      elseif all[j] ~= me and (seen == nil or seen < now - stale) then
        redis.call('HDEL', KEYS[i], all[j])  -- a process that stopped: its slots come back
      else
        total = total + math.min(math.max(0, held), lim)
      end
    end
    local f = lim - total
    if f < 1 then slot_fail = i - nb - 1; break end
    free[#free + 1] = f
  end
end
local ok = wait == 0 and slot_fail == 0
local out = {tostring(wait), tostring(slot_fail)}
for i = 1, nb do
  local need = tonumber(ARGV[7 + (i - 1) * 4 + 2])
  local grant = 0
  if ok then grant = need + math.floor(math.max(have[i] - need, 0) * frac) end
  local left = have[i] - grant
  redis.call('HSET', KEYS[i], 't', tostring(left), 'ts', tostring(now))
  redis.call('EXPIRE', KEYS[i], ttl)
  out[#out + 1] = tostring(grant)
  out[#out + 1] = tostring(left)
end
if ok then
  for i = nb + 2, #KEYS do
    local grant = 1 + math.floor((free[i - nb - 1] - 1) * sfrac)
    redis.call('HINCRBY', KEYS[i], me, grant)
    redis.call('EXPIRE', KEYS[i], 3600)
    out[#out + 1] = tostring(grant)
  end
end
return out
"""


class Leases:
    def __init__(self, state: SharedState, limiter: Limiter, concurrency: Concurrency) -> None:
        self.state, self.limiter, self.concurrency = state, limiter, concurrency
        self.procs = limiter.procs
        self._script: Any = None
        self.redis_calls = 0

    async def take(
        self, wants: list[tuple[Bucket, float]], slots: list[Slots]
    ) -> tuple[str, float] | None:
        """Spend from every bucket and take a slot in every scope, or nothing.

        None when admitted; else ("rate_limit", seconds to wait) or ("concurrency", seconds)."""
        short_b = [(b, n - b.balance) for b, n in wants if b.balance < n]
        short_s = [s for s in slots if s.inflight >= s.held]
        if short_b or short_s:
            refused = await self._lease(short_b, short_s)
            if refused is not None:
                return refused
        for b, n in wants:
            b.balance -= n
        for s in slots:
            s.inflight += 1
        return None

    async def _lease(
        self, short_b: list[tuple[Bucket, float]], short_s: list[Slots]
    ) -> tuple[str, float] | None:
        if self.state.available:
            debts = [b.debt for b, _ in short_b]
            res = await self.state.call(lambda r: self._run(r, short_b, debts, short_s), None)
            if res is not None:
                self.redis_calls += 1
                self.limiter.local_mode = self.concurrency.local_mode = False
                return self._apply(res, short_b, debts, short_s)
        wait = self.limiter.lease_locally(short_b)
        if wait is not None:
            return ("rate_limit", wait)
        if short_s and not self.concurrency.lease_locally(short_s):
            return ("concurrency", 1.0)
        return None

    def _apply(
        self,
        res: list[Any],
        short_b: list[tuple[Bucket, float]],
        debts: list[float],
        short_s: list[Slots],
    ) -> tuple[str, float] | None:
        now = time.monotonic()
        wait, slot_fail = float(res[0]), int(res[1])
        for i, ((b, _), debt) in enumerate(zip(short_b, debts, strict=True)):
            b.debt -= debt
            b.balance += float(res[2 + 2 * i])
            b.shared_left, b.synced = float(res[3 + 2 * i]), now
            b.local_tokens = None
        if wait > 0:
            return ("rate_limit", wait)
        if slot_fail:
            return ("concurrency", 1.0)
        for s, grant in zip(short_s, res[2 + 2 * len(short_b) :], strict=True):
            s.held += int(grant)
        return None

    async def _run(
        self,
        redis: Any,
        short_b: list[tuple[Bucket, float]],
        debts: list[float],
        short_s: list[Slots],
    ) -> list[Any]:
        if self._script is None:
            self._script = redis.register_script(_SCRIPT)
        args: list[Any] = [self.limiter.lease_fraction, 300, len(short_b), self.procs.id]
        args += [self.procs.stale_s, self.concurrency.lease_fraction]
        for (b, need), debt in zip(short_b, debts, strict=True):
            args += [b.capacity, b.rate, need, debt]
        keys = [b.key for b, _ in short_b]
        if short_s:
            keys.append(self.procs.key)
            keys += [s.key for s in short_s]
            args += [s.limit for s in short_s]
        return await self._script(keys=keys, args=args, client=redis)
