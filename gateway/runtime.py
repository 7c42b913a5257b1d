"""The running state: the current policy snapshot and the per-provider state that outlives reloads.

A request takes `Runtime.snapshot` once at its start and uses only that object, so a reload (which
replaces the snapshot atomically) never changes a request half-way. Per-provider state (latency
estimates, in-flight counts, breakers, the pooled HTTP client) is keyed by provider name and carried
over to the new snapshot for providers that remain.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from dataclasses import dataclass, field

from gateway.auth import KeyRing
from gateway.policy.loader import policy_fingerprint
from gateway.policy.schema import Policy, Provider
from gateway.upstream import UpstreamClient

log = logging.getLogger("gateway")


@dataclass(slots=True, eq=False)
class ProviderState:
    """One provider as a routing member: config, pooled client and live counters."""

    name: str
    config: Provider
    client: UpstreamClient
    inflight: int = 0
    requests: int = 0
    failures: int = 0
    last_failure: str | None = None
    extra: dict[str, object] = field(default_factory=dict)

    @property
    def max_inflight(self) -> int | None:
        return self.config.max_inflight

    def has_capacity(self) -> bool:
        m = self.config.max_inflight
        return m is None or self.inflight < m


@dataclass(slots=True, eq=False)
class Snapshot:
    policy: Policy
    version: str
    providers: dict[str, ProviderState]
    keys: KeyRing


class Runtime:
    """Owns the current snapshot and applies new policies."""

    def __init__(self, policy: Policy) -> None:
        self._providers: dict[str, ProviderState] = {}
        self.snapshot = self._build(policy)

    def _build(self, policy: Policy) -> Snapshot:
        providers: dict[str, ProviderState] = {}
        retired: list[UpstreamClient] = []
        for name, cfg in policy.providers.items():
            old = self._providers.get(name)
            if old is not None and old.config == cfg:
                providers[name] = old
                continue
            key = os.environ.get(cfg.api_key_env) if cfg.api_key_env else None
            client = UpstreamClient(name, cfg, key)
            if old is not None:
                # Same member, new settings: keep its live counters, swap the client.
                retired.append(old.client)
                old.config, old.client = cfg, client
                providers[name] = old
            else:
                providers[name] = ProviderState(name, cfg, client)
        for name, old in self._providers.items():
            if name not in providers:
                retired.append(old.client)
        self._retired = retired
        self._providers = providers
        return Snapshot(policy, policy_fingerprint(policy), providers, KeyRing(policy.auth))

    def apply(self, policy: Policy) -> Snapshot:
        """Swap in a validated policy; in-flight requests finish on the snapshot they hold."""
        self.snapshot = self._build(policy)
        if self._retired:
            # Give requests still using the old clients time to finish before closing them.
            with contextlib.suppress(RuntimeError):
                asyncio.get_running_loop().call_later(
                    max(p.timeouts.total_s for p in policy.providers.values()),
                    lambda: asyncio.ensure_future(self.close_retired()),
                )
        return self.snapshot

    def apply_version(self, policy: Policy) -> str:
        return self.apply(policy).version

    async def close_retired(self) -> None:
        """Close clients of removed/changed providers (after in-flight requests had time to end)."""
        retired, self._retired = self._retired, []
        for c in retired:
            await c.aclose()

    async def aclose(self) -> None:
        for p in self._providers.values():
            await p.client.aclose()
        await self.close_retired()
