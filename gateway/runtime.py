"""The running state: the current policy snapshot and the per-provider state that outlives reloads.

A request takes `Runtime.snapshot` once at its start and uses only that object, so a reload (which
replaces the snapshot atomically) never changes a request half-way. Per-provider state (latency
estimates, in-flight counts, breakers, the pooled HTTP client) is keyed by provider name and carried
over to the new snapshot for providers that remain.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

from gateway.governance.static_keys import KeyRing
from gateway.infra.shares import Shares
from gateway.policy.loader import policy_fingerprint
from gateway.policy.schema import Policy, Pool, Provider
from gateway.providers.registry import make_adapter
from gateway.providers.upstream import UpstreamClient
from gateway.redact import Redactor, provider_secrets
from gateway.resilience.breaker import BreakerRegistry, CircuitBreaker
from gateway.resilience.slots import limit_member
from gateway.routing.balancer import Balancer, BalancerSettings, make_balancer
from gateway.routing.member import Member
from gateway.wire.response_model import ModelName, for_alias

log = logging.getLogger("gateway")


@dataclass(slots=True, eq=False)
class ProviderState:
    """One provider: config, pooled client and its routing member (load and latency estimate)."""

    name: str
    config: Provider
    client: UpstreamClient
    member: Member
    breaker: CircuitBreaker
    requests: int = 0
    drained: bool = False
    # When the provider last refused the member's credentials or model (upstream_auth); cleared
    # by the next success. Shown in /ready, the dashboard and the metrics.
    auth_failed_at: float | None = None

    def available(self) -> bool:
        """May a new request be sent here now (breaker closed or probing, not drained)?"""
        return not self.drained and self.breaker.allow()


@dataclass(slots=True, eq=False)
class PoolState:
    """A pool as routing sees it: members in policy order and the pool's own balancer."""

    name: str
    config: Pool
    members: list[Member]
    balancer: Balancer


@dataclass(slots=True, eq=False)
class Snapshot:
    policy: Policy
    version: str
    providers: dict[str, ProviderState]
    pools: dict[str, PoolState]
    keys: KeyRing
    by_member: dict[int, ProviderState] = field(default_factory=dict)
    # The providers' secrets, masked wherever they appear in what the gateway relays.
    redactor: Redactor = field(default_factory=Redactor)
    # Each alias's `model` rewrite of answers, made on first use (it learns the providers' names).
    answer_models: dict[str, ModelName | None] = field(default_factory=dict)

    def provider_of(self, member: Member) -> ProviderState:
        return self.by_member[id(member)]

    def answer_model(self, alias: str) -> ModelName | None:
        """The `model` rewrite of answers to `alias` (its `response_model` setting)."""
        try:
            return self.answer_models[alias]
        except KeyError:
            config = self.policy.models.get(alias)
            rename = for_alias(config.response_model, alias) if config is not None else None
            self.answer_models[alias] = rename
            return rename


def _client(name: str, cfg: Provider) -> UpstreamClient:
    key = _api_key(cfg)
    return UpstreamClient(name, cfg, key, make_adapter(cfg, key))


def _api_key(cfg: Provider) -> str | None:
    return os.environ.get(cfg.api_key_env) if cfg.api_key_env else None


def _member_settings(policy: Policy, provider: str) -> BalancerSettings:
    """Latency-estimate parameters of the first pool holding the provider."""
    for pool in policy.pools.values():
        if provider in pool.members:
            return pool.balancer
    return BalancerSettings()


def _retune(member: Member, settings: BalancerSettings) -> None:
    """A remaining member's estimate keeps what it measured and follows the new parameters (a
    reload changing `decay_s`, `penalty_ms` or `failure_decay_s` applied only to new members)."""
    member.failure_decay_s = settings.failure_decay_s
    member.ewma.penalty_s = settings.penalty_ms / 1000.0
    member.ewma._tau = settings.decay_s  # the time constant; the estimate itself is kept


class Runtime:
    """Owns the current snapshot and applies new policies."""

    def __init__(self, policy: Policy, shares: Shares | None = None) -> None:
        # This process's share of each member's max_inflight (gateway.infra.shares); 1 of 1 by default.
        self.shares = shares if shares is not None else Shares()
        self._providers: dict[str, ProviderState] = {}
        self._retired: list[UpstreamClient] = []
        self.breakers = BreakerRegistry()
        # Members an operator drained (gateway.resilience.drains): kept across reloads, and
        # for a member a reload removes and a later one brings back.
        self.drained: frozenset[str] = frozenset()
        self.snapshot = self._build(policy)

    def _build(self, policy: Policy) -> Snapshot:
        providers: dict[str, ProviderState] = {}
        retired: list[UpstreamClient] = []
        for name, cfg in policy.providers.items():
            old = self._providers.get(name)
            if old is not None:
                # A member that remains keeps its latency estimate, in-flight count and breaker,
                # and takes the new version's settings for them.
                old.member.weight = cfg.weight
                limit_member(old.member, self.shares, cfg.max_inflight, name)
                _retune(old.member, _member_settings(policy, name))
                old.breaker.settings = cfg.breaker
                if old.config != cfg:
                    retired.append(old.client)
                    old.client = _client(name, cfg)
                    old.config = cfg
                providers[name] = old
            else:
                settings = _member_settings(policy, name)
                member = settings.make_member(name, cfg.weight, cfg.max_inflight)
                limit_member(member, self.shares, cfg.max_inflight, name)  # may be 0
                breaker = self.breakers.get(name, cfg.breaker)
                providers[name] = ProviderState(name, cfg, _client(name, cfg), member, breaker)
        for name, old in self._providers.items():
            if name not in providers:
                retired.append(old.client)
        pools = {
            name: PoolState(
                name,
                pool,
                [providers[m].member for m in pool.members],
                make_balancer(pool.balancer),
            )
            for name, pool in policy.pools.items()
        }
        self._retired.extend(retired)
        for name, state in providers.items():
            state.drained = name in self.drained
        self._providers = providers
        by_member = {id(p.member): p for p in providers.values()}
        secrets = [
            s
            for p in providers.values()
            for s in provider_secrets(p.config.base_url, p.config.headers, _api_key(p.config))
        ]
        secrets += [s for p in providers.values() for s in p.client.adapter.secrets()]
        return Snapshot(
            policy,
            policy_fingerprint(policy),
            providers,
            pools,
            KeyRing(policy.auth),
            by_member,
            Redactor(secrets),
        )

    def apply(self, policy: Policy) -> Snapshot:
        """Swap in a validated policy; in-flight requests finish on the snapshot they hold.

        Replaced clients close their pools when their last request is done (see
        `UpstreamClient.retire`), so reloads in quick succession never close a pool in use.
        """
        self.snapshot = self._build(policy)
        for c in self._retired:
            c.retire()
        self._retired = [c for c in self._retired if c.users > 0 or c.open]
        return self.snapshot

    def apply_shares(self) -> None:
        """The number of gateway processes changed: resize this process's member limits."""
        for name, p in self.snapshot.providers.items():
            limit_member(p.member, self.shares, p.config.max_inflight, name)

    def member_names(self) -> list[str]:
        return list(self.snapshot.providers)

    def set_drained(self, names: frozenset[str]) -> None:
        """The members drained now (any name; those not in the policy wait for it)."""
        self.drained = names
        for name, state in self._providers.items():
            state.drained = name in names

    def apply_version(self, policy: Policy) -> str:
        return self.apply(policy).version

    async def close_retired(self) -> None:
        """Close clients of removed/changed providers now (at shutdown)."""
        retired, self._retired = self._retired, []
        for c in retired:
            await c.aclose()

    async def aclose(self) -> None:
        for p in self._providers.values():
            await p.client.aclose()
        await self.close_retired()
