"""Route: from a request's class to a chain of pools, and inside a pool to one member."""

from __future__ import annotations

import itertools
from collections.abc import Collection

from gateway.policy.schema import Alias, Policy
from gateway.runtime import ProviderState, Snapshot


def pool_chain(policy: Policy, alias: Alias, request_class: str) -> list[str]:
    """The class's pool first, then each pool's fallbacks breadth-first, without repeats."""
    first = alias.routes.get(request_class, alias.pool)
    chain = [first]
    i = 0
    while i < len(chain):
        for fb in policy.pools[chain[i]].fallback:
            if fb not in chain:
                chain.append(fb)
        i += 1
    return chain


class Router:
    """Picks a member of a pool. This is the replaceable piece balancing strategies plug into."""

    def __init__(self) -> None:
        self._rr = itertools.count()

    def pick(
        self, snap: Snapshot, pool_name: str, tried: Collection[str], prefix_key: int | None = None
    ) -> ProviderState | None:
        members = [snap.providers[m] for m in snap.policy.pools[pool_name].members]
        eligible = [m for m in members if m.name not in tried and m.has_capacity()]
        if not eligible:
            return None
        least = min(m.inflight for m in eligible)
        best = [m for m in eligible if m.inflight == least]
        return best[next(self._rr) % len(best)]
