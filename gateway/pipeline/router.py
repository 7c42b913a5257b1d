"""Route: from a request's class to a chain of pools, and inside a pool to one member.

Inside a pool: prefix affinity first (rendezvous hashing with a bounded-load cap) when the pool
enables it, else the pool's balancer (power of two choices on PeakEWMA cost by default). Members
already tried, without capacity, or refused by `available` (breakers) are skipped.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Collection
from dataclasses import dataclass

from gateway.routing.affinity import pick_affine
from gateway.routing.member import Member
from gateway.runtime import ProviderState, Snapshot

Available = Callable[[ProviderState], bool]


@dataclass(slots=True, frozen=True)
class Pick:
    """A routing choice: the pool, its member, and what chose it ("affinity" or "balancer")."""

    pool: str
    provider: ProviderState
    via: str


def _available(p: ProviderState) -> bool:
    return p.available()


class Router:
    """Picks a member of a pool. `available` is where breakers and drains plug in."""

    def __init__(self, available: Available = _available) -> None:
        self.available = available

    def pick(
        self,
        snap: Snapshot,
        pool_name: str,
        tried: Collection[str],
        prefix_key: bytes | None = None,
    ) -> ProviderState | None:
        chosen = self._choose(snap, pool_name, tried, prefix_key, dry_run=False)
        return None if chosen is None else chosen.provider

    def preview(self, snap: Snapshot, chain: list[str], prefix_key: bytes | None) -> Pick | None:
        """The member a request would get now, without changing anything (no begin(), and
        rotating balancers pick on a copy of their state)."""
        for pool_name in chain:
            chosen = self._choose(snap, pool_name, (), prefix_key, dry_run=True)
            if chosen is not None:
                return chosen
        return None

    def _choose(
        self,
        snap: Snapshot,
        pool_name: str,
        tried: Collection[str],
        prefix_key: bytes | None,
        dry_run: bool,
    ) -> Pick | None:
        pool = snap.pools[pool_name]
        by_member = snap.by_member
        available = self.available

        def eligible(m: Member) -> bool:
            return m.name not in tried and available(by_member[id(m)])

        if prefix_key is not None and pool.config.affinity.enabled:
            chosen = pick_affine(prefix_key, pool.members, eligible, pool.config.affinity)
            if chosen is not None:
                return Pick(pool_name, by_member[id(chosen)], "affinity")
        balancer = copy.deepcopy(pool.balancer) if dry_run else pool.balancer
        chosen = balancer.pick(pool.members, eligible)
        return None if chosen is None else Pick(pool_name, by_member[id(chosen)], "balancer")
