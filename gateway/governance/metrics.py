"""Prometheus families of governance, read at scrape time (nothing per request here)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.governance.spend import NANO

if TYPE_CHECKING:
    from gateway.governance.service import GovernanceService


class GovernanceCollector(Collector):
    def __init__(self, gov: GovernanceService) -> None:
        self.gov = gov

    def collect(self) -> Iterable[Metric]:
        gov = self.gov
        labels = ["tenant", "key"]
        admitted = CounterMetricFamily(
            "gateway_tenant_requests_admitted", "Requests admitted by limits.", labels=labels
        )
        refused = CounterMetricFamily(
            "gateway_tenant_requests_refused",
            "Requests refused (429) by a limit or budget.",
            labels=[*labels, "reason"],
        )
        soft = CounterMetricFamily(
            "gateway_tenant_budget_soft_exceeded",
            "Requests admitted over a soft budget limit.",
            labels=labels,
        )
        cost = CounterMetricFamily(
            "gateway_tenant_spend_usd", "Cost of requests at the policy's prices.", labels=labels
        )
        tokens = CounterMetricFamily(
            "gateway_tenant_tokens", "Prompt plus completion tokens (usage).", labels=labels
        )
        for (tenant, key), c in gov.stats.series.items():
            v = [tenant, key]
            admitted.add_metric(v, c.admitted)
            refused.add_metric([*v, "rate_limit"], c.refused_rate_limit)
            refused.add_metric([*v, "concurrency"], c.refused_concurrency)
            refused.add_metric([*v, "budget"], c.refused_budget)
            soft.add_metric(v, c.soft_budget)
            cost.add_metric(v, c.cost_nano / NANO)
            tokens.add_metric(v, c.tokens)
        yield from (admitted, refused, soft, cost, tokens)
        local = gov.limiter.local_mode or gov.concurrency.local_mode or gov.ledger.local
        yield GaugeMetricFamily(
            "gateway_ratelimit_local_mode",
            "1 while Redis is unreachable and this process enforces its share of the limits "
            "and budgets alone.",
            value=1.0 if local else 0.0,
        )
        yield CounterMetricFamily(
            "gateway_ratelimit_local_decisions",
            "Limit and budget decisions this process took alone because Redis was unreachable.",
            value=gov.limiter.local_decisions
            + gov.concurrency.local_decisions
            + gov.ledger.local_decisions,
        )
        yield CounterMetricFamily(
            "gateway_ratelimit_redis_leases",
            "Round trips to Redis for limit leases (buckets and concurrency slots together).",
            value=gov.leases.redis_calls,
        )
        yield GaugeMetricFamily(
            "gateway_processes",
            "Gateway processes seen in the heartbeat set.",
            value=gov.procs.count,
        )
        yield CounterMetricFamily(
            "gateway_fair_share_held",
            "Requests held because their tenant was over its pool share while others waited.",
            value=gov.fair.held,
        )
        yield CounterMetricFamily(
            "gateway_fair_share_refused",
            "Requests refused (429) after waiting for their tenant's pool share.",
            value=gov.fair.refused,
        )
        yield CounterMetricFamily(
            "gateway_spend_flush_failures",
            "Spend writes to Redis that failed (kept and retried).",
            value=gov.ledger.flush_failures,
        )
        yield CounterMetricFamily(
            "gateway_spend_counters_repaired",
            "Spend or budget counters found in Redis that were not numbers, overwritten.",
            value=gov.ledger.repaired,
        )
        yield CounterMetricFamily(
            "gateway_managed_keys_malformed",
            "Managed key records read from Redis that did not validate (skipped), or that could "
            "not be shown by the admin API.",
            value=gov.keys.malformed,
        )
        yield CounterMetricFamily(
            "gateway_managed_keys_republished",
            "Managed key records written back to Redis after it lost them (restarted empty).",
            value=gov.keys.republished,
        )
