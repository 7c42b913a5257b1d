"""Member selection inside a pool: latency estimates, balancers, prefix affinity."""

from gateway.routing.affinity import (
    AffinitySettings,
    affinity_order,
    block_hashes,
    leading_text,
    pick_affine,
    prefix_key,
)
from gateway.routing.balancer import (
    Balancer,
    BalancerSettings,
    LeastBusy,
    P2CPeakEwma,
    RoundRobin,
    SmoothWeighted,
    StrategyName,
    always_eligible,
    candidates,
    make_balancer,
)
from gateway.routing.member import Member, SignalKind, latency_signal
from gateway.routing.peak_ewma import PeakEwma

__all__ = [
    "AffinitySettings",
    "Balancer",
    "BalancerSettings",
    "LeastBusy",
    "Member",
    "P2CPeakEwma",
    "PeakEwma",
    "RoundRobin",
    "SignalKind",
    "SmoothWeighted",
    "StrategyName",
    "affinity_order",
    "always_eligible",
    "block_hashes",
    "candidates",
    "latency_signal",
    "leading_text",
    "make_balancer",
    "pick_affine",
    "prefix_key",
]
