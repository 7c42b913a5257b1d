"""Limits that add up across processes: each gateway process takes a share of every limit.

The policy's `max_inflight` (per member), admission `max_depth` (per pool) and retry budget floor
(`budget_min_per_s`) describe the whole deployment. Every process (each worker of each replica)
announces itself in one Redis sorted set, `{prefix}procs` (member = process id, score = when its
announcement expires: 3 heartbeats ahead, at least 2 s), every `replicas.heartbeat_s`; from the live entries it
learns how many processes there are (N) and its rank among them (r), and takes
`floor(total / N)`, plus one for `total mod N` of the processes (which ones depends on the limit's
name, so remainders spread over processes). The shares of one limit sum to exactly the total.

Nothing of this is on the request path: a request compares its member's in-flight count with an
integer that the heartbeat task updates (measured cost at one client: BENCHMARKS.md).

Error bound, documented in README "Limits across processes":
- shares grow (fewer processes) only once the smaller count has held for one announcement
  lifetime (3 heartbeats, at least 2 s), so that the re-announcing after a Redis failover, when
  every announcement expired at once, never looks like one process alone; a process that
  leaves cleanly removes itself and the others grow their shares after that lifetime; one killed
  keeps its entry until it expires, so its share is unused for up to two lifetimes (under-use,
  never overshoot);
- a process that joins is not ready (`/ready` 503 "joining") until 1.5 heartbeats after its first
  announcement, so every other process has shrunk its share before traffic arrives; requests the
  others already had in flight above their new share still finish: while members are saturated,
  concurrency can exceed the total by at most the joining processes' shares, until those requests
  end;
- with Redis unreachable, every process keeps the last count it learned (without Redis at all:
  the local worker count, `floor(total / workers)`, at least 1).
The set is data written by others: only entries shaped like a process id and expiring within
`MAX_AHEAD_S` count (one written further ahead, or never expiring, is removed: no process writes
it), and at most `MAX_PROCESSES` of them, so a stray or hostile write can neither pin a phantom
process forever nor make a heartbeat read an unbounded set.
A total smaller than the number of processes leaves some processes without a slot for that
member (they use other members or queue): the sum still never exceeds the total.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
import uuid
import zlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from gateway.infra.replicas import ReplicaSettings
from gateway.infra.shared_state import SharedState
from gateway.infra.tasks import stop_task

log = logging.getLogger("gateway.shares")

# Entries of the process set that count: an id as `Membership` writes it (host:pid:hex), expiring
# at most two lifetimes of the slowest heartbeat ahead (leeway for clocks that differ a little).
PROCESS_ID = re.compile(r"^[^\s:]{1,255}:[0-9]{1,10}:[0-9a-f]{6}$")
MAX_AHEAD_S = 180.0
MAX_PROCESSES = 1024


@dataclass(slots=True)
class Shares:
    """This process's place among the gateway processes: N and its rank (None = unknown)."""

    count: int = 1
    rank: int | None = 0

    def of(self, total: int, name: str = "") -> int:
        """This process's share of `total` (shares of all processes sum to `total`)."""
        n = max(1, self.count)
        if n == 1:
            return total
        base, extra = divmod(total, n)
        if self.rank is None:  # ranks unknown (no shared state): never below one slot
            return max(1, base)
        salt = zlib.crc32(name.encode())
        return base + (1 if (self.rank + salt) % n < extra else 0)

    def limit(self, total: int | None, name: str) -> int | None:
        return None if total is None else self.of(total, name)

    @classmethod
    def local(cls) -> Shares:
        """Before (or without) shared state: the worker processes of this replica."""
        workers = int(os.environ.get("GATEWAY_WORKERS", "1") or 1)
        return cls(workers, 0 if workers == 1 else None)


def ttl_s(heartbeat_s: float) -> float:
    """How long an announcement lives: 3 heartbeats, and at least 2 s, so that a process slowed
    down by a busy CPU is not taken for gone (which would grow the others' shares)."""
    return max(3 * heartbeat_s, 2.0)


class Membership:
    """Announces this process and keeps `shares` up to date; calls `on_change` when they move."""

    def __init__(
        self,
        state: SharedState,
        shares: Shares,
        settings: Callable[[], ReplicaSettings],
        on_change: Callable[[], None],
    ) -> None:
        self.state = state
        self.shares = shares
        self._settings = settings
        self._on_change = on_change
        self.id = f"{os.uname().nodename}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.key = state.key("procs")
        self.joined_at: float | None = None
        # Process counts seen (or, while Redis is unreachable, held) in the last announcement
        # lifetime: the largest one counts, so shares grow only once a smaller count has held.
        self._seen: deque[tuple[float, int]] = deque([(time.monotonic(), shares.count)])
        self._task: asyncio.Task[None] | None = None

    @property
    def settled(self) -> bool:
        """Every other process has seen this one (or there is no shared state to wait for)."""
        if not self.state.available:
            return True
        if self.joined_at is None:
            return False
        return time.monotonic() - self.joined_at >= 1.5 * self._settings().heartbeat_s

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            await stop_task(self._task)
        # Leave at once so that the others take over this share now, not in 3 heartbeats.
        await self.state.call(lambda r: r.zrem(self.key, self.id), 0)

    async def beat(self) -> None:
        hb = self._settings().heartbeat_s
        now = time.time()

        async def announce(r):  # type: ignore[no-untyped-def]
            async with r.pipeline(transaction=False) as p:
                p.zadd(self.key, {self.id: now + ttl_s(hb)})
                p.zremrangebyscore(self.key, "-inf", now)
                p.zremrangebyscore(self.key, f"({now + MAX_AHEAD_S}", "+inf")
                p.zrangebyscore(self.key, now, now + MAX_AHEAD_S, start=0, num=MAX_PROCESSES)
                p.expire(self.key, max(10, int(30 * hb)))
                return (await p.execute())[3]

        members = await self.state.call(announce, None)
        mono = time.monotonic()
        if members is None:
            # Redis unreachable: hold the last count. After the outage every announcement has
            # expired and the processes re-announce one by one: the first one back must not
            # take itself for alone (and the whole limit) meanwhile.
            self._remember(mono, self.shares.count, hb)
            return
        if self.joined_at is None:
            self.joined_at = mono
        texts = (m.decode("utf-8", "replace") if isinstance(m, bytes) else str(m) for m in members)
        ids = sorted({t for t in texts if PROCESS_ID.fullmatch(t)} | {self.id})
        rank = ids.index(self.id) if self.id in ids else 0
        # Fewer processes (a larger share) counts only once it has held for a whole lifetime.
        count = self._remember(mono, max(1, len(ids)), hb)
        if (count, rank) != (self.shares.count, self.shares.rank):
            log.info("gateway processes: %d (this one is #%d)", count, rank)
            self.shares.count, self.shares.rank = count, rank
            self._on_change()

    def _remember(self, now: float, count: int, hb: float) -> int:
        """Record `count`; the largest count of the last lifetime."""
        self._seen.append((now, count))
        while self._seen and self._seen[0][0] < now - ttl_s(hb):
            self._seen.popleft()
        return max(c for _, c in self._seen)

    async def _run(self) -> None:
        while True:
            try:
                await self.beat()
            except Exception as e:  # noqa: BLE001 - never let the heartbeat die
                log.warning("process heartbeat failed: %s", e)
            await asyncio.sleep(self._settings().heartbeat_s)
