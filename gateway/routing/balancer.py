"""Member selection strategies behind one small interface.

Every strategy only considers members that are `eligible` (the caller's
filter: breaker closed, model served, ...) and have capacity (their
concurrency limit is not reached). `pick` returns None when no member
qualifies; it does not change any member: the caller calls `begin()` on the
chosen one.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from gateway.routing.member import Member
from gateway.routing.peak_ewma import Clock, PeakEwma

StrategyName = Literal["p2c_peak_ewma", "round_robin", "weighted", "least_busy"]
Eligible = Callable[[Member], bool]

_default_rng = random.Random()


def always_eligible(_: Member) -> bool:
    """The default filter: every member qualifies."""
    return True


class BalancerSettings(BaseModel):
    """How a pool picks a member, and the parameters of its latency estimate."""

    model_config = ConfigDict(extra="forbid")

    strategy: StrategyName = "p2c_peak_ewma"
    decay_s: float = Field(default=10.0, gt=0, description="PeakEWMA time constant")
    penalty_ms: float = Field(
        default=60_000.0, ge=0, description="cost of an unmeasured member with requests in flight"
    )
    failure_decay_s: float = Field(
        default=2.0,
        gt=0,
        le=60,
        description="time constant with which a member's failure share fades once failures "
        "stop (a failing member costs up to 20x more; failures never enter the latency estimate)",
    )

    def make_ewma(self, clock: Clock = time.monotonic) -> PeakEwma:
        """A fresh latency estimate configured by these settings."""
        return PeakEwma(decay_s=self.decay_s, penalty_s=self.penalty_ms / 1000.0, clock=clock)

    def make_member(
        self,
        name: str,
        weight: float = 1.0,
        max_inflight: int | None = None,
        clock: Clock = time.monotonic,
    ) -> Member:
        """A member whose estimate uses these settings."""
        return Member(
            name,
            weight,
            max_inflight,
            ewma=self.make_ewma(clock),
            clock=clock,
            failure_decay_s=self.failure_decay_s,
        )


class Balancer(Protocol):
    """Chooses one member for a request."""

    def pick(
        self,
        members: Sequence[Member],
        eligible: Eligible = always_eligible,
        rng: random.Random | None = None,
    ) -> Member | None: ...


def candidates(members: Sequence[Member], eligible: Eligible = always_eligible) -> list[Member]:
    """Members that pass `eligible`, have capacity and a positive weight."""
    # Capacity last: with slots shared by workers, checking it takes a slot for a moment.
    return [m for m in members if m.weight > 0 and eligible(m) and m.has_capacity()]


class P2CPeakEwma:
    """Power of two choices: two random candidates, the lower PeakEWMA cost wins."""

    def pick(
        self,
        members: Sequence[Member],
        eligible: Eligible = always_eligible,
        rng: random.Random | None = None,
    ) -> Member | None:
        pool = candidates(members, eligible)
        n = len(pool)
        if n <= 1:
            return pool[0] if pool else None
        r = rng or _default_rng
        i = r.randrange(n)
        j = r.randrange(n - 1)
        if j >= i:
            j += 1
        a, b = pool[i], pool[j]
        return b if b.cost() < a.cost() else a


class RoundRobin:
    """Candidates in turn; the rotation skips members that do not qualify."""

    def __init__(self) -> None:
        self._next = 0

    def pick(
        self,
        members: Sequence[Member],
        eligible: Eligible = always_eligible,
        rng: random.Random | None = None,
    ) -> Member | None:
        pool = candidates(members, eligible)
        if not pool:
            return None
        chosen = pool[self._next % len(pool)]
        self._next += 1
        return chosen


class SmoothWeighted:
    """Smooth weighted round robin (as nginx): spreads heavy members' turns evenly."""

    def __init__(self) -> None:
        self._current: dict[str, float] = {}

    def pick(
        self,
        members: Sequence[Member],
        eligible: Eligible = always_eligible,
        rng: random.Random | None = None,
    ) -> Member | None:
        pool = candidates(members, eligible)
        if not pool:
            return None
        current = self._current
        total = 0.0
        best: Member | None = None
        best_value = 0.0
        for m in pool:
            value = current.get(m.name, 0.0) + m.weight
            current[m.name] = value
            total += m.weight
            if best is None or value > best_value:
                best, best_value = m, value
        assert best is not None
        current[best.name] = best_value - total
        if len(current) > 2 * len(members) + 8:
            # Forget members that left the pool.
            keep = {m.name for m in members}
            self._current = {k: v for k, v in current.items() if k in keep}
        return best


class LeastBusy:
    """Fewest requests in flight; ties broken at random."""

    def pick(
        self,
        members: Sequence[Member],
        eligible: Eligible = always_eligible,
        rng: random.Random | None = None,
    ) -> Member | None:
        pool = candidates(members, eligible)
        if not pool:
            return None
        low = min(m.inflight for m in pool)
        tied = [m for m in pool if m.inflight == low]
        return tied[0] if len(tied) == 1 else (rng or _default_rng).choice(tied)


def make_balancer(strategy: StrategyName | BalancerSettings) -> Balancer:
    """A new balancer (with its own rotation state) for a strategy name or settings."""
    name = strategy.strategy if isinstance(strategy, BalancerSettings) else strategy
    if name == "p2c_peak_ewma":
        return P2CPeakEwma()
    if name == "round_robin":
        return RoundRobin()
    if name == "weighted":
        return SmoothWeighted()
    if name == "least_busy":
        return LeastBusy()
    raise ValueError(f"unknown balancer strategy {name!r}")
