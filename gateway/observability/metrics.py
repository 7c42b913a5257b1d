"""Prometheus metrics at `/metrics`.

Per-request figures are kept by a record-step observer in plain counters (one dict lookup and a
few additions per request, no locks: everything runs on the event loop's thread). Everything
that already lives in the runtime (breakers, latency estimates, in-flight counts, admission
queues, the deferred queue, policy reloads) is read at scrape time by a collector, so it costs
nothing per request. Each app has its own registry (several apps may share a process in tests).

With several worker processes, one scrape reports all of them (`gateway.observability.metrics_workers`).
"""

from __future__ import annotations

import re
from bisect import bisect_left
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, NamedTuple, Protocol

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from gateway.governance.stats import MAX_TENANTS, OTHER

if TYPE_CHECKING:
    from gateway.cache.semantic_layer import SemanticLayer
    from gateway.context import Context
    from gateway.policy.watcher import PolicyReloader
    from gateway.resilience.admission import Admission
    from gateway.resilience.budget import RetryBudget
    from gateway.resilience.degradation import Degradation
    from gateway.resilience.hedge import HedgeTracker
    from gateway.runtime import Runtime

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1)
REQUEST_LABELS = ("alias", "class", "pool", "provider", "status")
USAGE_LABELS = ("tenant", "alias", "provider")
_USAGE = re.compile(rb'"(prompt|completion)_tokens"\s*:\s*(\d{1,10})(?![\d.eE])')  # counts, bounded
_USAGE_TAIL = 512  # usage sits at the end of a completion: never scan a long body
# A stream's events besides content: the role chunk, the finish chunk and `[DONE]`.
_FRAMING_EVENTS = 3


def content_events(ctx: Context) -> int:
    """Content events of a stream, which servers send one token (or a few) at a time."""
    return max(ctx.output_chunks - _FRAMING_EVENTS, 0)


def billable(ctx: Context) -> bool:
    """Did a provider produce (part of) this answer, so that its tokens count? A 200 not served
    by a cache, or a stream cut after the provider's events reached the client (the client went
    away: 499; the upstream broke: 502), what was produced and relayed is paid for either way. Also a 499 while an attempt was still answering (a unary answer, or a
    stream before its first event): the provider did, and bills, that work. Not when every
    attempt had already failed (the client left during a retry's backoff)."""
    if not ctx.provider or ctx.cache.startswith("hit"):
        return False
    if ctx.status == 499 and ctx.attempts > len(ctx.failures):
        return True
    return ctx.status == 200 or (ctx.stream and ctx.output_chunks > 0)


class Billed(NamedTuple):
    """What a billable request is charged, the same for spend (governance) and usage metrics."""

    prompt: int
    completion: int
    # False: a unary answer whose client left before it arrived; what the provider produced is
    # unknown (the prompt is charged; governance keeps the whole token reservation counted).
    answered: bool


def billed(ctx: Context) -> Billed | None:
    """The one rule for what a request is charged; None when it is not billable. Tokens from the
    provider's usage when it is at hand (a unary answer's, or a stream's usage chunk that
    governance read into `ctx.usage`), else the prompt estimate and the content events relayed."""
    if not billable(ctx):
        return None
    if ctx.stream:
        u = ctx.usage
        if u is not None and u[0] is not None and u[1] is not None:
            return Billed(u[0], u[1], True)
        return Billed(ctx.prompt_tokens, stream_completion_tokens(ctx), True)
    p, c = response_usage(ctx)
    return Billed(
        p if p is not None else ctx.prompt_tokens, c or 0, c is not None or ctx.status != 499
    )


def stream_completion_tokens(ctx: Context) -> int:
    """A stream's completion tokens from its relayed events (when the provider's usage is not at
    hand): a finished stream also has a role chunk, a finishing chunk and `[DONE]`; a cut one
    only its role chunk."""
    framing = _FRAMING_EVENTS if ctx.status == 200 else 1
    return max(ctx.output_chunks - framing, 0)


class Histogram:
    """Bucket counts and a sum; the exposition makes them cumulative."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value

    def buckets(self) -> list[tuple[str, float]]:
        out: list[tuple[str, float]] = []
        running = 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += n
            out.append(("+Inf" if bound == float("inf") else repr(float(bound)), running))
        return out


class RequestSeries:
    """Everything counted for one label set of finished requests."""

    __slots__ = ("count", "duration", "tpot", "ttft")

    def __init__(self) -> None:
        self.count = 0
        self.duration = Histogram(LATENCY_BUCKETS)
        self.ttft = Histogram(TTFT_BUCKETS)
        self.tpot = Histogram(TPOT_BUCKETS)


def usage_tokens(body: bytes | None) -> tuple[int | None, int | None]:
    """(prompt, completion) tokens from a response's usage, looking only at its tail."""
    if not body:
        return None, None
    prompt = completion = None
    for m in _USAGE.finditer(body, max(0, len(body) - _USAGE_TAIL)):
        if m.group(1) == b"prompt":
            prompt = int(m.group(2))
        else:
            completion = int(m.group(2))
    return prompt, completion


def response_usage(ctx: Context) -> tuple[int | None, int | None]:
    """A unary answer's (prompt, completion) tokens, read once per request."""
    usage = ctx.usage
    if usage is None:
        usage = ctx.usage = usage_tokens(ctx.response_body)
    return usage


class RequestMetrics:
    """Record-step observer: counts, latency histograms, tokens, cost, cache results, failures."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.requests: dict[tuple[str, ...], RequestSeries] = {}
        self.usage: dict[tuple[str, ...], list[float]] = {}  # [input, output, cost_usd]
        # Tenants with their own usage series: the first MAX_TENANTS seen, then OTHER (as the
        # gateway_tenant_* families), so a flood of tenants cannot grow /metrics without bound.
        self._usage_tenants: set[str] = set()
        self.cache: dict[tuple[str, str], int] = {}
        self.failures: dict[tuple[str, str], int] = {}
        self.degraded: dict[str, int] = {}

    def __call__(self, ctx: Context) -> None:
        key = (ctx.alias, ctx.request_class, ctx.pool, ctx.provider, str(ctx.status))
        series = self.requests.get(key)
        if series is None:
            series = self.requests[key] = RequestSeries()
        series.count += 1
        total = ctx.end - ctx.start
        series.duration.observe(total)
        ttft = ctx.ttft_s
        if ttft is not None:
            series.ttft.observe(ttft)
            n = content_events(ctx)
            if n:
                series.tpot.observe((total - ttft) / n)
        ckey = (ctx.alias, ctx.cache)
        self.cache[ckey] = self.cache.get(ckey, 0) + 1
        if ctx.failures:
            for f in ctx.failures:
                provider, _, kind = f.rpartition(":")
                fkey = (provider, kind)
                self.failures[fkey] = self.failures.get(fkey, 0) + 1
        if ctx.degraded:
            self.degraded[ctx.alias] = self.degraded.get(ctx.alias, 0) + 1
        charged = billed(ctx)
        if charged is not None:
            self._usage(ctx, charged)

    def _usage(self, ctx: Context, charged: Billed) -> None:
        """Tokens and cost as governance charged them (`billed`, the one rule for both)."""
        inp, out = charged.prompt, charged.completion
        ukey = (self._tenant_label(ctx.tenant), ctx.alias, ctx.provider)
        acc = self.usage.get(ukey)
        if acc is None:
            acc = self.usage[ukey] = [0.0, 0.0, 0.0]
        acc[0] += inp
        acc[1] += out
        if ctx.cost_usd is not None:  # costed by governance (which runs first) from the same rule
            acc[2] += ctx.cost_usd
            return
        provider = self.runtime.snapshot.providers.get(ctx.provider)
        if provider is not None:
            price = provider.config.price
            acc[2] += (inp * price.input_per_1m + out * price.output_per_1m) / 1e6

    def _tenant_label(self, tenant: str) -> str:
        seen = self._usage_tenants
        if tenant in seen:
            return tenant
        if len(seen) >= MAX_TENANTS:
            return OTHER
        seen.add(tenant)
        return tenant


class FailoverState(Protocol):
    """What the failover stage keeps that a scrape reads (gateway.pipeline.stages.failover)."""

    admission: Admission
    budget: RetryBudget
    hedges: HedgeTracker


class GatewayCollector(Collector):
    """Reads request counters and the runtime's live state at scrape time."""

    def __init__(
        self,
        requests: RequestMetrics | None,
        runtime: Runtime,
        failover: FailoverState,
        semantic: SemanticLayer,
        degradation: Degradation,
        reloader: PolicyReloader,
    ) -> None:
        self.req, self.runtime = requests, runtime
        self.failover, self.semantic = failover, semantic
        self.degradation, self.reloader = degradation, reloader
        self.deferred_length = 0  # refreshed (async) before each scrape

    def collect(self) -> Iterable[Metric]:
        if self.req is not None:
            yield from _request_families(self.req)
        yield from self._members()
        yield from self._pools()
        yield from self._policy()

    def _members(self) -> Iterator[Metric]:
        snap = self.runtime.snapshot
        state = GaugeMetricFamily(
            "gateway_breaker_state",
            "1 for the breaker's current state.",
            labels=["provider", "state"],
        )
        ewma = GaugeMetricFamily(
            "gateway_member_latency_ewma_seconds",
            "PeakEWMA latency estimate of a member (the pool's latency signal).",
            labels=["provider"],
        )
        inflight = GaugeMetricFamily(
            "gateway_member_inflight", "Requests in flight to a member.", labels=["provider"]
        )
        drained = GaugeMetricFamily(
            "gateway_member_drained", "1 when drained by an operator.", labels=["provider"]
        )
        auth_failed = GaugeMetricFamily(
            "gateway_member_auth_failed",
            "1 while the provider refuses the member's credentials or mapped model "
            "(its last attempt failed with upstream_auth).",
            labels=["provider"],
        )
        attempts = CounterMetricFamily(
            "gateway_member_attempts", "Upstream attempts sent to a member.", labels=["provider"]
        )
        failures = CounterMetricFamily(
            "gateway_member_failures", "Failed upstream attempts of a member.", labels=["provider"]
        )
        for name, p in snap.providers.items():
            current = p.breaker.state.value
            for s in ("closed", "open", "half_open"):
                state.add_metric([name, s], 1.0 if s == current else 0.0)
            ewma.add_metric([name], p.member.ewma.estimate())
            inflight.add_metric([name], p.member.inflight)
            drained.add_metric([name], 1.0 if p.drained else 0.0)
            auth_failed.add_metric([name], 0.0 if p.auth_failed_at is None else 1.0)
            attempts.add_metric([name], p.requests)
            failures.add_metric([name], p.member.failures)
        yield from (state, ewma, inflight, drained, auth_failed, attempts, failures)

    def _pools(self) -> Iterator[Metric]:
        stats = self.failover.admission.stats
        depth = GaugeMetricFamily(
            "gateway_admission_queue_depth", "Requests waiting for a free member.", labels=["pool"]
        )
        wait = CounterMetricFamily(
            "gateway_admission_wait_seconds", "Time spent waiting in the queue.", labels=["pool"]
        )
        admitted = CounterMetricFamily(
            "gateway_admission_admitted_after_wait",
            "Requests that got a member after waiting.",
            labels=["pool"],
        )
        shed = CounterMetricFamily(
            "gateway_admission_shed", "Requests shed (no capacity in time).", labels=["pool"]
        )
        for pool in self.runtime.snapshot.pools:
            s = stats.get(pool)
            depth.add_metric([pool], s.depth if s else 0)
            wait.add_metric([pool], s.wait_s_total if s else 0.0)
            admitted.add_metric([pool], s.admitted_after_wait if s else 0)
            shed.add_metric([pool], s.shed if s else 0)
        yield from (depth, wait, admitted, shed)
        requests, retries = self.failover.budget.counts()
        budget = GaugeMetricFamily(
            "gateway_retry_budget_window",
            "Requests and retries in the retry budget's window.",
            labels=["kind"],
        )
        budget.add_metric(["requests"], requests)
        budget.add_metric(["retries"], retries)
        yield budget
        tracker = self.failover.hedges
        hedges = CounterMetricFamily(
            "gateway_hedges",
            "Hedged attempts sent (a second member asked while the first was slow), and those "
            "that answered first.",
            labels=["pool", "outcome"],
        )
        for pool, sent in tracker.sent.items():
            hedges.add_metric([pool, "sent"], sent)
            hedges.add_metric([pool, "won"], tracker.won.get(pool, 0))
        yield hedges
        yield CounterMetricFamily(
            "gateway_deferred_enqueued",
            "Requests queued for replay.",
            value=self.degradation.queued,
        )
        yield CounterMetricFamily(
            "gateway_deferred_dropped",
            "Malformed deferred-queue entries (not written by a gateway, or damaged) dropped "
            "instead of replayed.",
            value=getattr(self.degradation.queue, "dropped", 0),
        )
        yield GaugeMetricFamily(
            "gateway_deferred_queue_length",
            "Requests waiting in the deferred (replay) queue.",
            value=self.deferred_length,
        )
        semantic = self.semantic
        lookups = CounterMetricFamily(
            "gateway_semantic_lookups",
            "Semantic cache lookups by outcome; a rejection names what refused the most similar "
            "candidate (verifier, or a guard); late: past lookup_budget_ms, upstream call started; "
            "early: raced from the start (race_all, a question sharing no word with its context, "
            "or a new question where new questions rarely hit: race_rare_hits); early_rare_hits: "
            "those of the early ones raced for race_rare_hits; "
            "late_hit_raced: a late or early lookup that still answered first, or after its "
            "upstream call failed (the call cancelled or its error dropped).",
            labels=["outcome", "guard"],
        )
        lookups.add_metric(["hit", ""], semantic.hits)
        lookups.add_metric(["miss", ""], semantic.misses)
        for guard, n in semantic.rejected.items():
            lookups.add_metric(["rejected", guard], n)
        lookups.add_metric(["late", ""], semantic.late)
        lookups.add_metric(["early", ""], semantic.early)
        lookups.add_metric(["early_rare_hits", ""], semantic.early_rare)
        lookups.add_metric(["late_hit_raced", ""], semantic.raced)
        yield lookups
        stored, refused = semantic.store_stats()
        stores = CounterMetricFamily(
            "gateway_semantic_stores",
            "Semantic cache stores: done, or refused with the reason (busy: embedding queue "
            "full; too_long; too_big; error).",
            labels=["outcome", "reason"],
        )
        stores.add_metric(["stored", ""], stored)
        for reason, n in refused.items():
            stores.add_metric(["refused", reason], n)
        yield stores
        if semantic.cache is not None:
            size = GaugeMetricFamily(
                "gateway_semantic_cache_size",
                "Semantic cache size: entries, namespaces, bytes (counted against max_bytes).",
                labels=["what"],
            )
            st = semantic.cache.stats()
            for what in ("entries", "namespaces", "bytes"):
                size.add_metric([what], st[what])
            size.add_metric(["max_bytes"], semantic.cache.settings.max_bytes)
            yield size
            removed = CounterMetricFamily(
                "gateway_semantic_removed",
                "Semantic cache entries removed before anyone asked: evicted (least recently "
                "used, to stay within max_bytes or max_entries) or expired (past their TTL).",
                labels=["reason"],
            )
            removed.add_metric(["evicted"], st["evicted"])
            removed.add_metric(["expired"], st["expired"])
            yield removed
            texts = CounterMetricFamily(
                "gateway_semantic_embedding_texts",
                "Texts the semantic cache asked vectors for: embedded by the model, or found in "
                "the vector memo; warmed: embedded ahead on an idle thread (a question's "
                "clauses), counted in model too; solo: embedded on several cores while alone on "
                "the machine, counted in model too.",
                labels=["how"],
            )
            texts.add_metric(["model"], st["embedded"])
            texts.add_metric(["memo"], st["memo_hits"])
            texts.add_metric(["warmed"], st["warmed"])
            texts.add_metric(["solo"], st["solo"])
            yield texts
            yield CounterMetricFamily(
                "gateway_semantic_context_hits",
                "Semantic hits judged by the question's own clause, found by the context it "
                "shares word for word with a cached one, without embedding the whole question.",
                value=st["context_hits"],
            )

    def _policy(self) -> Iterator[Metric]:
        r = self.reloader
        yield CounterMetricFamily(
            "gateway_policy_reloads", "Policy versions applied by reload.", value=r.reloads
        )
        yield CounterMetricFamily(
            "gateway_policy_reload_failures", "Refused policy reloads.", value=r.failures
        )
        info = GaugeMetricFamily(
            "gateway_policy_info", "The running policy version.", labels=["version"]
        )
        info.add_metric([self.runtime.snapshot.version], 1.0)
        yield info


def _request_families(req: RequestMetrics) -> Iterator[Metric]:
    labels = list(REQUEST_LABELS)
    total = CounterMetricFamily("gateway_requests", "Finished requests.", labels=labels)
    hists = [
        HistogramMetricFamily(
            "gateway_request_duration_seconds", "Total request time.", labels=labels
        ),
        HistogramMetricFamily(
            "gateway_time_to_first_token_seconds",
            "Time to the first streamed event.",
            labels=labels,
        ),
        HistogramMetricFamily(
            "gateway_time_per_output_token_seconds",
            "Stream time after the first event per further content event.",
            labels=labels,
        ),
    ]
    for key, s in req.requests.items():
        values = list(key)
        total.add_metric(values, s.count)
        for fam, h in zip(hists, (s.duration, s.ttft, s.tpot), strict=True):
            if h is s.duration or any(h.counts):
                fam.add_metric(values, h.buckets(), h.total)
    yield total
    yield from hists
    ulabels = list(USAGE_LABELS)
    fams: list[CounterMetricFamily] = [
        CounterMetricFamily(
            "gateway_input_tokens", "Prompt tokens (usage, else estimate).", labels=ulabels
        ),
        CounterMetricFamily(
            "gateway_output_tokens",
            "Completion tokens (usage; streams: content events).",
            labels=ulabels,
        ),
        CounterMetricFamily("gateway_cost_usd", "Cost at the policy's prices.", labels=ulabels),
    ]
    for key, acc in req.usage.items():
        for counter, v in zip(fams, acc, strict=True):
            counter.add_metric(list(key), v)
    yield from fams
    cache = CounterMetricFamily(
        "gateway_cache_requests", "Requests by cache result.", labels=["alias", "result"]
    )
    for (alias, result), n in req.cache.items():
        cache.add_metric([alias, result], n)
    yield cache
    failures = CounterMetricFamily(
        "gateway_upstream_failures",
        "Failed upstream attempts by kind.",
        labels=["provider", "kind"],
    )
    for (provider, kind), n in req.failures.items():
        failures.add_metric([provider, kind], n)
    yield failures
    degraded = CounterMetricFamily(
        "gateway_degraded_responses", "Responses answered by a degradation rule.", labels=["alias"]
    )
    for alias, n in req.degraded.items():
        degraded.add_metric([alias], n)
    yield degraded


def make_registry(collector: GatewayCollector) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    ProcessCollector(registry=registry)
    return registry


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
