"""Spend: durable counters of cost and tokens, and the running totals budgets are checked against.

Each finished request adds its cost (integer nano-USD, so sums are exact) and tokens to
in-process pending counters; a background task writes them to Redis every `spend_flush_s` in one
transaction, which also returns the new shared totals of the budget periods touched and refreshes
the totals of the budgets this process checks. Redis layout (all under the gateway prefix):

- `gov:spend:<YYYY-MM-DD>`: hash `tenant<TAB>key<TAB>alias<TAB>provider<TAB>c|r|i|o` -> cost
  (nano-USD), requests, input and output tokens. Kept 400 days; read by `/admin/spend`.
- `gov:budget:<scope>:<period id>`: nano-USD spent by a scope (`t:<tenant>` / `k:<key id>`) in a
  day (`d2026-12-01`), ISO week (`w2026-W49`) or month (`m2026-12`).

While Redis is down the pending counters are kept and written once it is back; without Redis
everything stays in memory (one process, not durable). Budgets hold through an outage as the rate
limits do: each process may spend its share (1/N, N = live gateway processes) of what was left of
a budget when Redis went away, so its own unwritten spend counts N times in budget checks until
it is written.

Counters read from Redis are numbers only when they parse as such (anything else counts as 0 and
is overwritten at the next write), so a stray value never fails a request or a write.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gateway.governance.procs import Processes
from gateway.infra.shared_state import SharedState
from gateway.infra.tasks import stop_task

log = logging.getLogger("gateway.governance")
NANO = 1_000_000_000
_SEP = "\t"
_DAY_TTL_S = 400 * 86400
_BUDGET_TTL_S = 40 * 86400
GROUPS = ("day", "model", "provider", "tenant", "key")


def period_id(period: str, when: float) -> str:
    d = dt.datetime.fromtimestamp(when, dt.UTC)
    if period == "day":
        return d.strftime("d%Y-%m-%d")
    if period == "week":
        y, w, _ = d.isocalendar()
        return f"w{y}-W{w:02d}"
    return d.strftime("m%Y-%m")


def period_end(period: str, when: float) -> float:
    """Unix time at which the period containing `when` ends (for Retry-After and TTLs)."""
    d = dt.datetime.fromtimestamp(when, dt.UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "day":
        end = d + dt.timedelta(days=1)
    elif period == "week":
        end = d + dt.timedelta(days=7 - d.weekday())
    else:
        end = (d.replace(day=1) + dt.timedelta(days=32)).replace(day=1)
    return end.timestamp()


# One request's cost at most (1M USD): Redis counters are 64-bit, and round() of inf raises.
MAX_REQUEST_COST_NANO = 1_000_000 * NANO


def cost_nano(prompt: int, completion: int, input_per_1m: float, output_per_1m: float) -> int:
    # USD per 1M tokens x tokens = micro-USD; x1000 = nano-USD.
    cost = (prompt * input_per_1m + completion * output_per_1m) * 1000
    if cost != cost or cost <= 0:  # nan, or nothing to charge
        return 0
    # A price the policy check should have refused (inf, absurdly large): charge the cap, so
    # budgets still stop the spending rather than never seeing it.
    return MAX_REQUEST_COST_NANO if cost >= MAX_REQUEST_COST_NANO else round(cost)


@dataclass(slots=True)
class Usage:
    cost: int = 0  # nano-USD
    requests: int = 0
    input: int = 0
    output: int = 0

    def add(self, other: Usage) -> None:
        self.cost += other.cost
        self.requests += other.requests
        self.input += other.input
        self.output += other.output


class SpendLedger:
    def __init__(self, state: SharedState, procs: Processes | None = None) -> None:
        self.state, self.procs = state, procs
        self.flush_s = 0.25
        self._pending: dict[tuple[str, str], Usage] = {}  # (day, combo) -> usage
        self._budget_pending: dict[str, int] = {}  # budget key -> nano-USD not written yet
        self._budget_flushing: dict[str, int] = {}  # being written now
        self._totals: dict[str, int] = {}  # budget key -> shared total at the last sync
        self._watched: dict[str, float] = {}  # budget keys checked recently -> when
        self._memory: dict[str, dict[str, Usage]] = {}  # no Redis: day -> combo -> usage
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        # One flush at a time: a flush returns once everything recorded before it is written,
        # also what another flush (the background one) had taken and was still writing.
        self._flushing = asyncio.Lock()
        self.flush_failures = 0
        self.repaired = 0  # counters Redis held that were not numbers, overwritten
        self.local_mode = False  # the last write or read failed because Redis was away
        self.local_decisions = 0  # budget checks taken on this process's share alone
        self._repair_logged = 0.0
        self._periods: tuple[int, dict[str, str], str] = (-1, {}, "")

    def budget_key(self, scope: str, period: str, when: float) -> str:
        second = int(when)
        cached = self._periods
        if cached[0] != second:  # period ids change at most once a second: compute them once
            day = dt.datetime.fromtimestamp(second, dt.UTC).strftime("%Y-%m-%d")
            ids = {p: period_id(p, second) for p in ("day", "week", "month")}
            cached = self._periods = (second, ids, day)
        return self.state.group_key("gov", "budget:") + scope + ":" + cached[1][period]

    def day(self, when: float) -> str:
        self.budget_key("", "day", when)  # refreshes the cache
        return self._periods[2]

    # -- hot path ------------------------------------------------------------------------------

    def spent(self, budget_key: str) -> int:
        """nano-USD spent: the shared total at the last sync plus what this process added since."""
        self._watched[budget_key] = time.monotonic()
        return (
            self._totals.get(budget_key, 0)
            + self._budget_pending.get(budget_key, 0)
            + self._budget_flushing.get(budget_key, 0)
        )

    @property
    def local(self) -> bool:
        """Redis away: budgets are checked on this process's share."""
        return self.state.enabled and (self.local_mode or not self.state.available)

    def counted(self, budget_key: str) -> int:
        """What a budget check counts: `spent`, except that while Redis is away this process's
        unwritten spend counts N times, i.e. it may spend only 1/N of what was left."""
        spent = self.spent(budget_key)
        if not self.local:
            return spent
        n = max(1, self.procs.count) if self.procs is not None else 1
        unwritten = self._budget_pending.get(budget_key, 0) + self._budget_flushing.get(
            budget_key, 0
        )
        return spent + (n - 1) * unwritten

    def record(
        self,
        when: float,
        tenant: str,
        key: str,
        alias: str,
        provider: str,
        usage: Usage,
        budget_keys: Iterable[str],
    ) -> None:
        day = self.day(when)
        combo = _SEP.join((tenant, key, alias, provider))
        if not self.state.enabled:
            self._memory.setdefault(day, {}).setdefault(combo, Usage()).add(usage)
        else:
            self._pending.setdefault((day, combo), Usage()).add(usage)
        if usage.cost:
            for bk in budget_keys:
                if self.state.enabled:
                    self._budget_pending[bk] = self._budget_pending.get(bk, 0) + usage.cost
                else:
                    self._totals[bk] = self._totals.get(bk, 0) + usage.cost

    # -- background ----------------------------------------------------------------------------

    async def start(self) -> None:
        if self.state.enabled:
            self._task = asyncio.create_task(self._loop(), name="spend-flush")

    async def stop(self) -> None:
        if self._task is not None:
            await stop_task(self._task)
            self._task = None
        with contextlib.suppress(Exception):
            await self.flush()

    def flush_soon(self) -> None:
        """Write now rather than at the next interval (spend close to a budget: other processes
        must see it before they admit the next request)."""
        self._wake.set()

    async def _loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.flush_s)
            self._wake.clear()
            with contextlib.suppress(Exception):
                await self.flush()

    async def flush(self) -> bool:
        """Write pending counters and refresh watched totals (one transaction). False on failure."""
        if not self.state.enabled:
            return True
        async with self._flushing:
            return await self._flush()

    async def _flush(self) -> bool:
        pending, self._pending = self._pending, {}
        budgets, self._budget_pending = self._budget_pending, {}
        self._budget_flushing = budgets
        now = time.monotonic()
        watched = [k for k, t in self._watched.items() if now - t < 120 and k not in budgets]
        for k in [k for k, t in self._watched.items() if now - t >= 120]:
            del self._watched[k]
        if not pending and not budgets and not watched:
            return True
        # (key, hash field or "" for a budget counter, value) of each increment: their replies
        # come first, in this order.
        incrs: list[tuple[str, str, int]] = []
        for (day, combo), u in pending.items():
            h = self.state.group_key("gov", "spend", day)
            for suffix, v in (("c", u.cost), ("r", u.requests), ("i", u.input), ("o", u.output)):
                if v:
                    incrs.append((h, combo + _SEP + suffix, v))
        incrs += [(bk, "", v) for bk, v in budgets.items()]

        async def run(r: Any) -> list[Any]:
            async with r.pipeline(transaction=True) as p:
                for key, fld, v in incrs:
                    if fld:
                        p.hincrby(key, fld, v)
                    else:
                        p.incrby(key, v)
                for key in {key for key, fld, _ in incrs if fld}:
                    p.expire(key, _DAY_TTL_S)
                for bk in budgets:
                    p.expire(bk, _BUDGET_TTL_S)
                if watched:
                    p.mget(watched)
                # A counter that is not a number fails its own increment only: repaired below.
                return await p.execute(raise_on_error=False)

        try:
            res = await self.state.call(run, None)
        finally:
            self._budget_flushing = {}
        if res is None:
            # Keep everything for the next try (merged with what arrived meanwhile).
            self.flush_failures += 1
            self.local_mode = not self.state.available
            for combo_key, u in pending.items():
                self._pending.setdefault(combo_key, Usage()).add(u)
            for bk, v in budgets.items():
                self._budget_pending[bk] = self._budget_pending.get(bk, 0) + v
            return False
        self.local_mode = False
        broken: list[tuple[str, str, int]] = []
        for (key, fld, v), reply in zip(incrs, res, strict=False):
            if isinstance(reply, Exception):
                broken.append((key, fld, v))
            elif not fld:
                self._totals[key] = _count(reply)
        if watched:
            totals = res[-1]
            if isinstance(totals, list):
                for bk, val in zip(watched, totals, strict=False):
                    self._totals[bk] = _count(val)
        if broken:
            await self._repair(broken)
        return True

    async def _repair(self, broken: list[tuple[str, str, int]]) -> None:
        """Counters Redis held that were not integers: overwritten with what this process adds
        (the value they held was lost anyway; a counter that fails every write would be worse)."""

        async def run(r: Any) -> list[Any]:
            async with r.pipeline(transaction=True) as p:
                for key, fld, v in broken:
                    if fld:
                        p.hset(key, fld, v)
                    else:
                        p.set(key, v, ex=_BUDGET_TTL_S)
                return await p.execute(raise_on_error=False)

        if await self.state.call(run, None) is None:
            return
        self.repaired += len(broken)
        for key, fld, v in broken:
            if not fld:
                self._totals[key] = v
        now = time.monotonic()
        if now - self._repair_logged >= 60:  # bounded: a log line a minute at most
            self._repair_logged = now
            log.warning("spend counters in Redis were not numbers: %d overwritten", len(broken))

    async def refresh(self, keys: list[str]) -> None:
        """Read the shared totals of budgets close to their limit (one round trip)."""
        if not self.state.enabled or not keys:
            return
        vals = await self.state.call(lambda r: r.mget(keys), None)
        if not isinstance(vals, list):
            self.local_mode = not self.state.available
            return
        self.local_mode = False
        for k, v in zip(keys, vals, strict=False):
            self._totals[k] = _count(v)

    # -- reading -------------------------------------------------------------------------------

    async def query(
        self,
        days: list[str],
        tenant: str | None,
        key: str | None,
        alias: str | None,
        group_by: str,
    ) -> dict[str, Any]:
        await self.flush()
        per_day: dict[str, dict[str, Usage]] = {}
        if self.state.enabled:

            async def read(r: Any) -> list[Any]:
                async with r.pipeline(transaction=False) as p:
                    for d in days:
                        p.hgetall(self.state.group_key("gov", "spend", d))
                    return await p.execute()

            redis = self.state.redis
            assert redis is not None
            for d, raw_day in zip(days, await read(redis), strict=True):
                per_day[d] = _decode_day(raw_day)
        else:
            per_day = {d: self._memory.get(d, {}) for d in days}
        groups: dict[str, Usage] = {}
        total = Usage()
        for d, combos in per_day.items():
            for combo, u in combos.items():
                t, k, a, prov = combo.split(_SEP)
                if (tenant and t != tenant) or (key and k != key) or (alias and a != alias):
                    continue
                g = {"day": d, "model": a, "provider": prov, "tenant": t, "key": k}[group_by]
                groups.setdefault(g, Usage()).add(u)
                total.add(u)
        return {
            "group_by": group_by,
            "total": _usage_doc(total),
            "groups": [{group_by: g, **_usage_doc(u)} for g, u in sorted(groups.items())],
        }


def _count(value: Any) -> int:
    """A counter read from Redis: a non-negative 64-bit integer, else 0 (never an exception)."""
    try:
        n = int(value)
    except (TypeError, ValueError):
        return 0
    return n if 0 <= n < 2**63 else 0


def _decode_day(raw: dict[bytes, bytes]) -> dict[str, Usage]:
    out: dict[str, Usage] = {}
    for f, v in raw.items():
        text = f.decode("utf-8", "replace") if isinstance(f, bytes) else str(f)
        combo, _, kind = text.rpartition(_SEP)
        if combo.count(_SEP) != 3:
            continue
        u = out.setdefault(combo, Usage())
        n = _count(v)
        if kind == "c":
            u.cost += n
        elif kind == "r":
            u.requests += n
        elif kind == "i":
            u.input += n
        elif kind == "o":
            u.output += n
    return out


def _usage_doc(u: Usage) -> dict[str, Any]:
    return {
        "cost_usd": u.cost / NANO,
        "requests": u.requests,
        "input_tokens": u.input,
        "output_tokens": u.output,
    }
