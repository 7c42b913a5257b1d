"""Governance settings in the policy: limits and budgets per tenant and per key.

Resolution for one request (first value set wins, field by field):
key limits = the managed key's own limits > `governance.keys[<key id>]` > the tenant's `key_limits`;
tenant limits = `governance.tenants[<tenant>]` > `governance.default_tenant`.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

Name = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.:/@+-]+$")]

# Upper bounds of every number an operator sets: far above any real limit, low enough that a
# figure (times 10^9 for nano-USD, in Lua doubles, through orjson's 64-bit integers) never
# overflows. Infinity and NaN are refused everywhere (a budget of inf would be no budget).
MAX_PER_MINUTE = 10**9
MAX_TOKENS_PER_MINUTE = 10**12
MAX_CONCURRENT = 10**6
MAX_USD = 10.0**9
# Lower bounds of the same numbers: a budget under a millionth of a dollar, a share or a fraction
# under these (a subnormal such as 5e-324 among them) is a mistake, never a setting.
MIN_USD = 1e-6
MIN_FRACTION = 0.001


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bools_as_numbers(cls, v: Any, info: Any) -> Any:
        # `true` is an int to Python: a limit or a budget written as a boolean is a mistake.
        if isinstance(v, bool) and cls.model_fields[info.field_name].annotation is not bool:
            raise ValueError("a number is expected, not a boolean")
        return v


class Limits(_Strict):
    """Rate limits of one scope (a tenant or a key). None = no limit."""

    requests_per_minute: int | None = Field(
        default=None,
        ge=1,
        le=MAX_PER_MINUTE,
        description="Token bucket: this many requests a minute, bursts up to it.",
    )
    tokens_per_minute: int | None = Field(
        default=None,
        ge=1,
        le=MAX_TOKENS_PER_MINUTE,
        description="Prompt estimate plus max_tokens reserved before the call, reconciled with "
        "the provider's usage after it.",
    )
    max_concurrent: int | None = Field(
        default=None, ge=1, le=MAX_CONCURRENT, description="Requests in flight at once."
    )

    def merged(self, fallback: Limits) -> Limits:
        """Field by field: this value when set, else the fallback's."""
        return Limits(
            requests_per_minute=self.requests_per_minute or fallback.requests_per_minute,
            tokens_per_minute=self.tokens_per_minute or fallback.tokens_per_minute,
            max_concurrent=self.max_concurrent or fallback.max_concurrent,
        )

    @property
    def any(self) -> bool:
        return bool(self.requests_per_minute or self.tokens_per_minute or self.max_concurrent)


class Budget(_Strict):
    """USD per calendar period (UTC), from the providers' prices and the real usage."""

    daily_usd: float | None = Field(default=None, ge=MIN_USD, le=MAX_USD)
    weekly_usd: float | None = Field(
        default=None, ge=MIN_USD, le=MAX_USD, description="ISO week, Monday to Sunday."
    )
    monthly_usd: float | None = Field(default=None, ge=MIN_USD, le=MAX_USD)
    soft_fraction: float = Field(
        default=0.8,
        ge=MIN_FRACTION,
        le=1,
        description="Soft limit = this share of each hard limit: header, metric, log line and "
        "(for tenants with soft_budget_pool) cheaper routing.",
    )

    def merged(self, fallback: Budget) -> Budget:
        return Budget(
            daily_usd=self.daily_usd or fallback.daily_usd,
            weekly_usd=self.weekly_usd or fallback.weekly_usd,
            monthly_usd=self.monthly_usd or fallback.monthly_usd,
            soft_fraction=self.soft_fraction,
        )

    def periods(self) -> list[tuple[str, float]]:
        out = []
        for period, usd in (
            ("day", self.daily_usd),
            ("week", self.weekly_usd),
            ("month", self.monthly_usd),
        ):
            if usd:
                out.append((period, usd))
        return out


class TenantPolicy(_Strict):
    limits: Limits = Limits()
    key_limits: Limits = Field(
        default=Limits(), description="Default limits of each key of the tenant."
    )
    budget: Budget = Budget()
    key_budget: Budget = Field(
        default=Budget(), description="Default budget of each key of the tenant."
    )
    soft_budget_pool: Name | None = Field(
        default=None,
        description="Over the soft budget, the tenant's requests go to this (cheaper) pool.",
    )
    max_pool_share: float | None = Field(
        default=None,
        ge=MIN_FRACTION,
        le=1,
        description="At most this share of a pool's max_inflight while other tenants' requests "
        "wait for that pool (fair queueing); the whole pool when nobody else waits.",
    )


class KeyPolicy(_Strict):
    limits: Limits = Limits()
    budget: Budget = Budget()


class Sync(_Strict):
    """How limits are shared between processes (see gateway/governance/limits.py)."""

    lease_fraction: float = Field(
        default=0.05,
        ge=1e-9,
        le=0.5,
        description="A process takes this share of what is left in a shared bucket per Redis "
        "round trip: far from the limit most requests need no Redis call, near it each does.",
    )
    key_refresh_s: float = Field(
        default=30.0,
        ge=0.1,
        le=86400,
        description="Full resync of managed keys while the pub/sub channel is live.",
    )
    spend_flush_s: float = Field(
        default=0.25,
        ge=0.01,
        le=10,
        description="Spend counters are written to Redis in batches this often.",
    )


class Governance(_Strict):
    require_key: bool = Field(
        default=False,
        description="Refuse requests without a valid key even when no static key is configured "
        "(managed keys only).",
    )
    stream_usage: bool = Field(
        default=True,
        description="Ask providers for stream usage (stream_options.include_usage) so streams "
        "are costed and counted; the usage chunk is hidden from clients that did not ask.",
    )
    default_tenant: TenantPolicy = Field(
        default=TenantPolicy(), description="Tenants without their own entry."
    )
    tenants: dict[Name, TenantPolicy] = Field(default_factory=dict)
    keys: dict[Name, KeyPolicy] = Field(
        default_factory=dict,
        description="Per-key overrides by key id (managed: mk_..., static: sk_ + the first 12 hex "
        "digits of the key's SHA-256, as in the access log).",
    )
    sync: Sync = Sync()

    def tenant(self, name: str) -> TenantPolicy:
        return self.tenants.get(name, self.default_tenant)

    def reference_errors(self, pools: set[str]) -> list[str]:
        errors = []
        for name, t in [("default_tenant", self.default_tenant), *self.tenants.items()]:
            if t.soft_budget_pool and t.soft_budget_pool not in pools:
                path = "default_tenant" if name == "default_tenant" else f"tenants.{name}"
                errors.append(
                    f"governance.{path}.soft_budget_pool: unknown pool '{t.soft_budget_pool}'"
                )
        return errors
