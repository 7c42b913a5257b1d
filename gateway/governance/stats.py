"""Per-tenant and per-key counters for metrics, with bounded label cardinality.

The first `MAX_TENANTS` tenants and `MAX_KEYS` keys a process sees get their own label values;
later ones are counted under `other`, so a flood of keys cannot blow up the metrics.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_TENANTS = 200
MAX_KEYS = 500
OTHER = "other"


@dataclass(slots=True)
class ScopeCounters:
    admitted: int = 0
    refused_rate_limit: int = 0
    refused_concurrency: int = 0
    refused_budget: int = 0
    soft_budget: int = 0
    cost_nano: int = 0
    tokens: int = 0


class GovStats:
    def __init__(self) -> None:
        self.series: dict[tuple[str, str], ScopeCounters] = {}
        self._tenants: set[str] = set()
        self._keys: set[str] = set()

    def _labels(self, tenant: str, key: str) -> tuple[str, str]:
        if tenant not in self._tenants:
            if len(self._tenants) >= MAX_TENANTS:
                tenant = OTHER
            else:
                self._tenants.add(tenant)
        if key and key not in self._keys:
            if len(self._keys) >= MAX_KEYS:
                key = OTHER
            else:
                self._keys.add(key)
        return tenant, key

    def _get(self, tenant: str, key: str) -> ScopeCounters:
        labels = self._labels(tenant, key)
        s = self.series.get(labels)
        if s is None:
            s = self.series[labels] = ScopeCounters()
        return s

    def admitted(self, tenant: str, key: str) -> None:
        self._get(tenant, key).admitted += 1

    def refused(self, tenant: str, key: str, why: str) -> None:
        s = self._get(tenant, key)
        if why == "rate_limit":
            s.refused_rate_limit += 1
        elif why == "concurrency":
            s.refused_concurrency += 1
        else:
            s.refused_budget += 1

    def soft(self, tenant: str, key: str) -> None:
        self._get(tenant, key).soft_budget += 1

    def spent(self, tenant: str, key: str, cost_nano: int, tokens: int) -> None:
        s = self._get(tenant, key)
        s.cost_nano += cost_nano
        s.tokens += tokens
