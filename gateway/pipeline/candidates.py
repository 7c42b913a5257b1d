"""The members a request tries, in order; each one tried is an `Attempt` (gateway.pipeline.attempt).

Pools in the decision's chain are walked in order; inside a pool, up to `max_attempts` members are
picked by the router, each at most once. A member is only used after its breaker admits the
request. A member whose breaker waits for a half-open probe is tried first: its latency estimate
still carries the outage's penalty, so the balancer alone would leave it unprobed (and half-open)
for a long time. When every untried member is merely full, the request waits in the first pool's
bounded queue (admission control) and is shed when the wait runs out.

With a deadline (gateway.pipeline.deadline) no member is handed out, and no queue wait lasts,
when less than `MIN_ATTEMPT_S` of it is left: the iteration ends with `expired` set, and the
caller answers 504 (DeadlineExceeded) instead of the usual exhausted or shed error.
"""

from __future__ import annotations

import time

from gateway.context import Context
from gateway.errors import GatewayError
from gateway.pipeline.attempt import Attempt
from gateway.pipeline.deadline import Deadline
from gateway.pipeline.router import Router
from gateway.resilience.admission import Admission
from gateway.resilience.retry import MIN_ATTEMPT_S
from gateway.routing.decision import Decision
from gateway.runtime import ProviderState, Snapshot


class Shed(GatewayError):
    """No capacity within the queue's wait: 429 with Retry-After (or a degradation rule)."""

    def __init__(self, pool: str, retry_after_s: int) -> None:
        super().__init__(
            429,
            f"The gateway is at capacity for this model (pool '{pool}'); retry shortly.",
            type="rate_limit_error",
            code="gateway_overloaded",
            headers={"retry-after": str(retry_after_s)},
        )


class Candidates:
    """Async iterator of members to try for one request."""

    def __init__(
        self,
        router: Router,
        admission: Admission,
        snap: Snapshot,
        decision: Decision,
        ctx: Context,
        deadline: Deadline | None = None,
    ) -> None:
        self.router, self.admission, self.snap, self.ctx = router, admission, snap, ctx
        self.chain, self.key = decision.chain, decision.prefix_key
        self.tried: set[str] = set()
        self.per_pool: dict[str, int] = {}
        # Cleared once a stream committed: a resume after that is not bound by it.
        self.deadline = deadline
        self.expired = False  # the iteration ended because the deadline ran out

    def attempt(self, member: ProviderState) -> Attempt:
        """The scoped attempt on a member this iterator returned."""
        return Attempt(member, self.ctx, self.admission)

    def __aiter__(self) -> Candidates:
        return self

    async def __anext__(self) -> ProviderState:
        if self.deadline is not None and self.deadline.left_s() < MIN_ATTEMPT_S:
            self.expired = True
            raise StopAsyncIteration
        member = self._pick_now() or self._early_probe()
        if member is not None:
            return member
        if not self._full_members_left():
            raise StopAsyncIteration
        return await self._queue()

    def _early_probe(self) -> ProviderState | None:
        """Nothing else can serve: test the open member closest to the end of its cool-down."""
        if self.ctx.attempts:
            return None  # only a request that has not failed anywhere yet
        best: tuple[float, ProviderState, str] | None = None
        for pool in self.chain:
            for name in self.snap.policy.pools[pool].members:
                p = self.snap.providers[name]
                wait = p.breaker.blocked_for_s()
                if name in self.tried or p.drained or wait is None or not p.member.has_capacity():
                    continue
                if best is None or wait < best[0]:
                    best = (wait, p, pool)
        if best is None or not best[1].breaker.early_probe():
            return None
        _, member, pool = best
        self.tried.add(member.name)
        return self._take(pool, member)

    def _take(self, pool: str, member: ProviderState) -> ProviderState:
        """Count an attempt on `member` (already admitted by its breaker)."""
        self.per_pool[pool] = self.per_pool.get(pool, 0) + 1
        self.ctx.pool, self.ctx.provider = pool, member.name
        self.ctx.attempts += 1
        return member

    def _pick_now(self) -> ProviderState | None:
        pools = self.snap.policy.pools
        for name in self.chain:
            while self.per_pool.get(name, 0) < pools[name].max_attempts:
                member = self._probe(name) or self.router.pick(
                    self.snap, name, self.tried, self.key
                )
                if member is None:
                    break
                self.tried.add(member.name)
                if not member.breaker.acquire():
                    continue  # half-open with its probes taken: try another
                return self._take(name, member)
        return None

    def unsent(self) -> None:
        """The member last taken could not express the request (`unsupported`: nothing was
        sent), so it does not count against its pool's attempts: a pool of vendors that cannot
        serve it must not use up the attempts before the member that can."""
        pool = self.ctx.pool
        if pool and self.per_pool.get(pool, 0) > 0:
            self.per_pool[pool] -= 1

    def hedge(self, pool: str) -> ProviderState | None:
        """A second member of ``pool`` for a hedged attempt: available now or not at all (no
        queueing, no probing of open breakers), within the pool's attempt limit."""
        if self.per_pool.get(pool, 0) >= self.snap.policy.pools[pool].max_attempts:
            return None
        member = self.router.pick(self.snap, pool, self.tried, self.key)
        if member is None:
            return None
        self.tried.add(member.name)
        if not member.breaker.acquire():
            return None
        return self._take(pool, member)

    def _probe(self, pool: str) -> ProviderState | None:
        """An untried member of ``pool`` whose half-open breaker has a probe slot free."""
        for name in self.snap.policy.pools[pool].members:
            p = self.snap.providers[name]
            if (
                p.breaker.probe_wanted()
                and name not in self.tried
                and not p.drained
                and p.member.has_capacity()
            ):
                return p
        return None

    def retry_after_s(self) -> float | None:
        """When a member of the chain can be tried again (cool-down or open breaker), if known."""
        soonest: float | None = None
        for pool in self.chain:
            for name in self.snap.policy.pools[pool].members:
                p = self.snap.providers[name]
                wait = p.breaker.blocked_for_s()
                if wait is not None and not p.drained and (soonest is None or wait < soonest):
                    soonest = wait
        return soonest

    def _full_members_left(self) -> bool:
        """Is some untried, available member of a pool with attempts left only at its limit?"""
        pools = self.snap.policy.pools
        for name in self.chain:
            if self.per_pool.get(name, 0) >= pools[name].max_attempts:
                continue
            for m in pools[name].members:
                p = self.snap.providers[m]
                if m not in self.tried and p.available() and not p.member.has_capacity():
                    return True
        return False

    async def _queue(self) -> ProviderState:
        pool = self.chain[0]
        settings = self.snap.policy.pools[pool].queue
        start = time.monotonic()
        deadline = start + settings.max_wait_s
        if self.deadline is not None:  # the request's ends the wait when it comes first
            deadline = min(deadline, self.deadline.at - MIN_ATTEMPT_S)
        while await self.admission.wait(pool, settings, deadline):
            member = self._pick_now()
            if member is not None:
                self.admission.record(pool, time.monotonic() - start, admitted=True)
                return member
            if not self._full_members_left():
                raise StopAsyncIteration
        now = time.monotonic()
        self.admission.record(pool, now - start, admitted=False)
        if self.deadline is not None and now >= self.deadline.at - MIN_ATTEMPT_S:
            self.expired = True
            raise StopAsyncIteration
        raise Shed(pool, settings.retry_after_s)
