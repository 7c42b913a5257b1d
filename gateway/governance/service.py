"""The governance step of the pipeline: who is calling, may they, and what did it cost.

`authenticate` finds the tenant and key of a request (managed keys first, then the policy's
static keys); `admit` checks the key's allowed aliases, the budgets and the rate limits (429 when
refused) and routes over-soft-budget tenants to their cheaper pool; `record` (a record-step
observer) releases the concurrency slots, reconciles reserved tokens with the real usage, costs
the request and adds it to the spend counters. Every response carries OpenAI's x-ratelimit-*
headers for the limits that apply.

What a provider produced is charged however the request ended: a stream cut after some of it was
relayed (the client went away, the upstream broke, after a resume or not) is costed and counted
against tokens per minute from the provider's usage when it arrived, else from the prompt
estimate and the content events relayed. Otherwise cutting streams would be free and would give
back their whole token reservation. So is a request whose client left while the provider was
answering (a non-streamed answer, a stream before its first event): from the provider's usage when
the answer had arrived, else the prompt estimate; a non-streamed answer that never arrived keeps
its whole token reservation counted (what the provider produced is unknown).

A stream whose managed key is revoked or expires while it runs, or whose budget an operator
lowers under what is spent, is stopped between events (`guard_stream`, at least every second and
at the next event after a key change): it ends with an error event (401 invalid_api_key, 429
insufficient_quota), is recorded with that status and is charged what was relayed.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

import orjson

from gateway.errors import GatewayError, model_not_found, unauthorized
from gateway.governance.answers import duration, over_budget, rate_limited, retry_wait
from gateway.governance.concurrency import Concurrency, Slots
from gateway.governance.fairshare import FairShare
from gateway.governance.keys import KEY_PREFIX, KeyRecord, KeyStore
from gateway.governance.lease import Leases
from gateway.governance.limits import Bucket, Limiter
from gateway.governance.procs import Processes
from gateway.governance.settings import Budget, Governance, Limits
from gateway.governance.spend import NANO, SpendLedger, Usage, cost_nano, period_end
from gateway.governance.static_keys import bearer_key, hash_key
from gateway.governance.stats import GovStats
from gateway.infra.shared_state import SharedState
from gateway.observability.metrics import billed
from gateway.wire.answer_checks import usage_counts
from gateway.wire.sse import encode_event, event_data

if TYPE_CHECKING:
    from gateway.context import Context
    from gateway.routing.decision import Decision
    from gateway.runtime import Runtime, Snapshot
    from gateway.wire.request import ParsedRequest

log = logging.getLogger("gateway.governance")
_PERIODS = ("day", "week", "month")
# A running stream looks at its key again at least this often (between events), and at the next
# event after any key change this process learns of (within milliseconds of an admin's change).
STOP_CHECK_S = 1.0


class Resolved(NamedTuple):
    """A tenant's and key's merged settings; `unlimited`: nothing to enforce, spend only."""

    tenant_limits: Limits
    key_limits: Limits
    tenant_budget: Budget
    key_budget: Budget
    unlimited: bool


@dataclass(slots=True)
class Principal:
    tenant: str
    key_id: str  # "" on an open gateway
    record: KeyRecord | None = None


@dataclass(slots=True, eq=False)
class Ticket:
    """What an admitted request holds until it is recorded."""

    principal: Principal
    reserved_tokens: float = 0.0
    token_buckets: list[Bucket] = field(default_factory=list)
    slots: list[Slots] = field(default_factory=list)
    budget_keys: list[str] = field(default_factory=list)
    hide_usage: bool = False
    watch_stream: bool = False
    usage: tuple[int, int] | None = None  # (prompt, completion) seen in a stream
    fair_pool: str | None = None  # counted in this pool's fair share
    near_budget: bool = False  # budgeted: its spend is written at once, not at the next interval
    held_keys: list[str] = field(default_factory=list)  # budgets its estimated cost is held on
    held_cost: int = 0  # nano-USD: the estimate (prompt + expected output at the chain's price)
    resolved: Resolved | None = None  # the limits and budgets it was admitted under

    def take_usage(self, usage: object) -> None:
        """The usage member of a stream's chunk (or of its assembled answer)."""
        p, c = usage_counts(usage)  # counts only: a negative one would refund a budget
        if p is not None and c is not None:
            self.usage = (p, c)

    def stream_event(self, ev: bytes) -> bytes | None:
        """Take the usage from a stream; hide it when the client did not ask for it."""
        if b'"usage"' not in ev:
            return ev
        if self.hide_usage:
            ev = ev.replace(b',"usage":null', b"")
            if b'"usage"' not in ev:
                return ev
        elif b'"usage":null' in ev and ev.count(b'"usage"') == 1:
            return ev  # every chunk of a stream that asked for usage: nothing to read, no parse
        data = event_data(ev)
        if data is None or data == b"[DONE]":
            return ev
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError:
            return ev
        self.take_usage(chunk.get("usage") if isinstance(chunk, dict) else None)
        if not self.hide_usage:
            return ev
        if not chunk.get("choices"):
            return None  # the usage-only chunk the client did not ask for
        chunk.pop("usage", None)
        return encode_event(orjson.dumps(chunk))


class GovernanceService:
    def __init__(self, state: SharedState, runtime: Runtime | None = None) -> None:
        self.state, self.runtime = state, runtime
        self.procs = Processes(state)
        self.keys = KeyStore(state)
        self.limiter = Limiter(state, self.procs)
        self.concurrency = Concurrency(state, self.procs)
        self.leases = Leases(state, self.limiter, self.concurrency)
        self.fair = FairShare()
        self.ledger = SpendLedger(state, self.procs)
        self.stats = GovStats()
        self._soft_logged: set[str] = set()
        self._configured: Governance | None = None
        self._resolved: dict[tuple[str, str, float], Resolved] = {}
        self._bkeys: dict[tuple[str, str, int], list[str]] = {}
        # Budget key -> estimated cost (nano-USD) of this process's admitted requests not yet
        # recorded: a budget admits while its spend plus these is under it, so concurrent
        # requests overshoot it by about one request's cost, not by all of them.
        self.in_flight_cost: dict[str, int] = {}

    async def start(self, settings: Governance) -> None:
        self.configure(settings)
        await self.procs.start()
        await self.keys.start()
        await self.ledger.start()

    async def stop(self) -> None:
        await self.ledger.stop()
        await self.keys.stop()
        await self.procs.stop()

    def configure(self, g: Governance) -> None:
        self._configured = g
        self._resolved = {}
        self.limiter.lease_fraction = self.concurrency.lease_fraction = g.sync.lease_fraction
        self.keys.refresh_s = g.sync.key_refresh_s
        self.ledger.flush_s = g.sync.spend_flush_s

    # -- 1. who -------------------------------------------------------------------------------

    async def authenticate(self, snap: Snapshot, authorization: str | None) -> Principal:
        token = bearer_key(authorization)
        if token is not None and token.startswith(KEY_PREFIX):
            rec = await self.keys.find(token)
            if rec is None or rec.revoked:
                raise unauthorized("Incorrect API key provided.")
            if not rec.usable(time.time()):
                raise unauthorized("This API key has expired.")
            return Principal(rec.tenant, rec.id, rec)
        if snap.keys.open and snap.policy.governance.require_key:
            raise unauthorized("Missing API key. Send it as 'Authorization: Bearer <key>'.")
        tenant = snap.keys.tenant_for(authorization)
        key_id = "" if snap.keys.open or token is None else "sk_" + hash_key(token)[:12]
        return Principal(tenant, key_id)

    # -- 2. may they --------------------------------------------------------------------------

    def _policies(self, g: Governance, p: Principal) -> Resolved:
        """The limits and budgets of the tenant and the key (merged once per policy and key)."""
        # A managed key's record changes `updated` on every change.
        ck = (p.tenant, p.key_id, p.record.updated if p.record is not None else 0.0)
        hit = self._resolved.get(ck)
        if hit is not None:
            return hit
        if len(self._resolved) > 10_000:
            self._resolved.clear()
        out = self._resolved[ck] = self._resolve(g, p)
        return out

    def _resolve(self, g: Governance, p: Principal) -> Resolved:
        t = g.tenant(p.tenant)
        key_limits, key_budget = t.key_limits, t.key_budget
        override = g.keys.get(p.key_id)
        if override is not None:
            key_limits = override.limits.merged(key_limits)
            key_budget = override.budget.merged(key_budget)
        if p.record is not None:
            key_limits = p.record.limits.merged(key_limits)
            key_budget = p.record.budget.merged(key_budget)
        enforced = bool(
            t.limits.any
            or t.budget.periods()
            or t.max_pool_share is not None
            or (p.key_id and (key_limits.any or key_budget.periods()))
        )
        return Resolved(t.limits, key_limits, t.budget, key_budget, not enforced)

    async def admit(
        self, snap: Snapshot, p: Principal, acc: ParsedRequest, decision: Decision, ctx: Context
    ) -> None:
        """Raise a 429 (or 404 for an alias the key may not use); else attach a Ticket to ctx."""
        g = snap.policy.governance
        if g is not self._configured:
            self.configure(g)  # a reloaded policy
        self.check_alias(p, acc.model)
        resolved = self._policies(g, p)
        t_limits, k_limits, t_budget, k_budget, unlimited = resolved
        now = time.time()
        ticket = Ticket(p, resolved=resolved)
        ticket.budget_keys = self._budget_keys(p, now)
        if unlimited:
            # Nothing to enforce for this tenant and key (the common case): only spend is kept.
            self._watch(g, acc, ticket)
            ctx.governance = ticket
            self.stats.admitted(p.tenant, p.key_id)
            return
        scopes = [("t:" + p.tenant, t_limits, t_budget)]
        if p.key_id:
            scopes.append(("k:" + p.key_id, k_limits, k_budget))
        await self._check_budgets(snap, scopes, ticket, decision, ctx, now)
        ticket.reserved_tokens = float(decision.prompt_tokens + (acc.max_tokens or 0))
        requests: list[Bucket] = []
        for scope, lim, _ in scopes:
            if lim.requests_per_minute:
                requests.append(self.limiter.bucket(scope, "r", lim.requests_per_minute))
            if lim.tokens_per_minute:
                b = self.limiter.bucket(scope, "t", lim.tokens_per_minute)
                if ticket.reserved_tokens > b.capacity:
                    raise rate_limited(
                        f"Request too large for {scope}: about {int(ticket.reserved_tokens)} "
                        f"tokens (prompt plus max_tokens); the limit is {int(b.capacity)} "
                        "tokens per minute.",
                        60.0,
                        # It never fits, however long the client waits: the SDKs are told not
                        # to retry (they waited a minute, twice, for the same refusal).
                        {"x-should-retry": "false"},
                    )
                ticket.token_buckets.append(b)
            if lim.max_concurrent:
                ticket.slots.append(self.concurrency.slots(scope, lim.max_concurrent))
        wants = [(b, 1.0) for b in requests]
        wants += [(b, ticket.reserved_tokens) for b in ticket.token_buckets]
        if wants or ticket.slots:
            refused = await self.leases.take(wants, ticket.slots)
            if wants:
                headers = self._headers(requests, ticket.token_buckets)
                ctx.extra_headers = {**(ctx.extra_headers or {}), **headers}
            if refused is not None:
                why, wait = refused
                wait = retry_wait(wait)
                self.stats.refused(p.tenant, p.key_id, why)
                message = (
                    f"Rate limit reached for {p.tenant}: retry in {duration(wait)}."
                    if why == "rate_limit"
                    else f"Too many concurrent requests for {p.tenant}."
                )
                raise rate_limited(message, wait, ctx.extra_headers or {})
        share = g.tenant(p.tenant).max_pool_share
        if share is not None and decision.chain:
            try:
                if await self.fair.enter(snap, decision.chain[0], p.tenant, share):
                    ticket.fair_pool = decision.chain[0]
            except BaseException:
                self._undo(wants, ticket.slots)
                raise
        self._watch(g, acc, ticket)
        self._hold(snap, decision, ticket)
        ctx.governance = ticket
        self.stats.admitted(p.tenant, p.key_id)

    def _hold(self, snap: Snapshot, decision: Decision, ticket: Ticket) -> None:
        """Hold the request's estimated cost on its budgets until it is recorded."""
        if not ticket.held_keys:
            return
        hi_in = hi_out = 0.0
        for pool in decision.chain:
            for name in snap.policy.pools[pool].members:
                provider = snap.providers.get(name)
                if provider is not None:
                    price = provider.config.price
                    hi_in = max(hi_in, price.input_per_1m)
                    hi_out = max(hi_out, price.output_per_1m)
        est = cost_nano(decision.prompt_tokens, decision.expected_output_tokens, hi_in, hi_out)
        if est <= 0:
            ticket.held_keys = []
            return
        ticket.held_cost = est
        held = self.in_flight_cost
        for bk in ticket.held_keys:
            held[bk] = held.get(bk, 0) + est

    def _release(self, ticket: Ticket) -> None:
        held = self.in_flight_cost
        for bk in ticket.held_keys:
            left = held.get(bk, 0) - ticket.held_cost
            if left > 0:
                held[bk] = left
            else:
                held.pop(bk, None)
        ticket.held_keys = []

    @staticmethod
    def _watch(g: Governance, acc: ParsedRequest, ticket: Ticket) -> None:
        """Streams are costed from the provider's usage chunk (asked for when the client did not)."""
        if acc.stream and g.stream_usage and acc.endpoint != "embeddings":
            ticket.watch_stream = True
            opts = acc.body.get("stream_options") or {}
            ticket.hide_usage = not opts.get("include_usage")

    def _budget_keys(self, p: Principal, now: float) -> list[str]:
        """Budget counters a request's cost goes to (the same for a second: computed once)."""
        ck = (p.tenant, p.key_id, int(now))
        hit = self._bkeys.get(ck)
        if hit is None:
            if len(self._bkeys) > 10_000:
                self._bkeys.clear()
            scopes = ["t:" + p.tenant] + (["k:" + p.key_id] if p.key_id else [])
            hit = [self.ledger.budget_key(sc, per, now) for sc in scopes for per in _PERIODS]
            self._bkeys[ck] = hit
        return hit

    def _undo(self, wants: list[tuple[Bucket, float]], slots: list[Slots]) -> None:
        """A request refused after its limits were taken: give them back."""
        for b, n in wants:
            self.limiter.give_back(b, n)
        if slots:
            self.concurrency.release(slots)

    def upstream(self, acc: ParsedRequest, ctx: Context) -> ParsedRequest:
        """The request as sent upstream: asks for stream usage when the client did not."""
        t: Ticket | None = ctx.governance
        if t is None or not t.hide_usage:
            return acc
        opts = acc.body.get("stream_options") or {}
        body = {**acc.body, "stream_options": {**opts, "include_usage": True}}
        return dataclasses.replace(acc, body=body)

    async def _check_budgets(
        self,
        snap: Snapshot,
        scopes: list[tuple[str, Limits, Budget]],
        ticket: Ticket,
        decision: Decision,
        ctx: Context,
        now: float,
    ) -> None:
        checks = []
        for scope, _, budget in scopes:
            for period, usd in budget.periods():
                bk = self.ledger.budget_key(scope, period, now)
                checks.append((scope, period, usd, budget.soft_fraction, bk))
        if not checks:
            return
        # A scope with a budget has its spend written at once (not at the next interval), and past
        # half a budget the shared totals are read fresh before deciding: other replicas' spend
        # counts within milliseconds.
        ticket.near_budget = True
        near = [bk for _, _, usd, _, bk in checks if self.ledger.counted(bk) >= usd * NANO / 2]
        if near:
            await self.ledger.refresh(near)
        if self.ledger.local:
            self.ledger.local_decisions += 1
        soft_hit = None
        for scope, period, usd, soft, bk in checks:
            # With Redis away, counted on this process's share of what was left (spend.py).
            spent = self.ledger.counted(bk)
            if spent >= usd * NANO:
                self.stats.refused(ticket.principal.tenant, ticket.principal.key_id, "budget")
                raise over_budget(
                    f"You exceeded your current quota: {scope} has spent its budget of "
                    f"${usd:g} per {period}.",
                    period_end(period, now) - now,
                    {"x-gateway-budget": "exceeded"},
                )
            if spent + self.in_flight_cost.get(bk, 0) >= usd * NANO:
                # Not spent yet, but the requests in flight may spend the rest: a retry in a
                # moment is judged on what they cost (the SDKs retry this one, unlike the above).
                self.stats.refused(ticket.principal.tenant, ticket.principal.key_id, "budget")
                raise rate_limited(
                    f"Requests in flight may spend what is left of {scope}'s budget of "
                    f"${usd:g} per {period}: retry in 1s.",
                    1.0,
                    {"x-gateway-budget": "in-flight"},
                )
            if spent >= usd * soft * NANO:
                soft_hit = (scope, period, usd)
        ticket.held_keys = [bk for *_, bk in checks]
        if soft_hit is None:
            return
        scope, period, usd = soft_hit
        ctx.extra_headers = {"x-gateway-budget": "soft"}
        self.stats.soft(ticket.principal.tenant, ticket.principal.key_id)
        mark = f"{scope}:{period}:{self.ledger.budget_key(scope, period, now)}"
        if mark not in self._soft_logged and len(self._soft_logged) < 10_000:
            self._soft_logged.add(mark)
            log.warning("%s is over the soft limit of its %s budget ($%g)", scope, period, usd)
        pool = snap.policy.governance.tenant(ticket.principal.tenant).soft_budget_pool
        if pool is not None:
            decision.chain = _chain(snap, pool)

    def _headers(self, requests: list[Bucket], tokens: list[Bucket]) -> dict[str, str]:
        now = time.monotonic()
        h: dict[str, str] = {}
        for dim, buckets in (("requests", requests), ("tokens", tokens)):
            if not buckets:
                continue
            b = min(buckets, key=lambda x: x.remaining(now))
            h[f"x-ratelimit-limit-{dim}"] = str(int(b.capacity))
            h[f"x-ratelimit-remaining-{dim}"] = str(int(b.remaining(now)))
            h[f"x-ratelimit-reset-{dim}"] = duration(b.reset_s(now))
        return h

    @staticmethod
    def check_alias(p: Principal, model: str) -> None:
        """Refuse an alias the caller's key may not use, as an alias that does not exist is
        refused: which aliases exist for others is not told (requests, explain)."""
        if p.record is not None and p.record.aliases and model not in p.record.aliases:
            raise model_not_found(model)

    @staticmethod
    def visible_models(p: Principal, names: Iterable[str]) -> list[str]:
        """The aliases a caller may use (what /v1/models should list): a managed key's allowed
        aliases, else all."""
        allowed = p.record.aliases if p.record is not None else None
        return [n for n in names if not allowed or n in allowed]

    # -- running streams ------------------------------------------------------------------------

    def guard_stream(self, response: Any, ctx: Context) -> None:
        """Stop `response` (a streamed answer) when its key stops while it runs: revoked,
        expired, or given (by an operator) limits under which its budget is spent. Checked
        between events, at least every STOP_CHECK_S and at once after a key change; the stream
        then ends with an error event in the API's shape and is recorded with that status,
        charged what was relayed up to then (gateway.observability.metrics.billed)."""
        t: Ticket | None = ctx.governance
        if t is None or (t.principal.record is None and not t.near_budget):
            return  # nothing that can stop it: an open gateway, a static key without budgets
        response.body_iterator = self._guarded(response.body_iterator, t, ctx)

    async def _guarded(
        self, inner: AsyncIterator[bytes], t: Ticket, ctx: Context
    ) -> AsyncIterator[bytes]:
        keys = self.keys
        next_at, seen = time.monotonic() + STOP_CHECK_S, keys.version
        stop: GatewayError | None = None
        try:
            async for block in inner:
                yield block
                now = time.monotonic()
                if now >= next_at or keys.version != seen:
                    next_at, seen = now + STOP_CHECK_S, keys.version
                    stop = self._stop_reason(t)
                    if stop is not None:
                        break
        finally:
            aclose = getattr(inner, "aclose", None)
            if aclose is not None:
                await aclose()  # the relay settles its attempt and counts what it sent
        if stop is not None:
            ctx.status = stop.status
            log.info("stream of key %s stopped: %s", t.principal.key_id, stop.code)
            yield encode_event(stop.to_bytes())

    def _stop_reason(self, t: Ticket) -> GatewayError | None:
        """Why a running stream of this ticket's key must stop now, or None."""
        p = t.principal
        if p.record is not None:
            rec = self.keys.get(p.key_id)
            if rec is None or rec.revoked:
                return unauthorized("The API key was revoked while this stream ran.")
            if not rec.usable(time.time()):
                return unauthorized("The API key expired while this stream ran.")
            p = Principal(p.tenant, p.key_id, rec)
        g = self._configured
        if g is None:
            return None
        resolved = self._policies(g, p)
        if resolved is t.resolved:
            return None  # the limits it was admitted under: spending them is what holds are for
        now = time.time()
        scopes = [("t:" + p.tenant, resolved.tenant_budget)]
        if p.key_id:
            scopes.append(("k:" + p.key_id, resolved.key_budget))
        for scope, budget in scopes:
            for period, usd in budget.periods():
                if self.ledger.counted(self.ledger.budget_key(scope, period, now)) >= usd * NANO:
                    return over_budget(
                        f"You exceeded your current quota: {scope} has spent its budget of "
                        f"${usd:g} per {period} (lowered while this stream ran).",
                        period_end(period, now) - now,
                        {"x-gateway-budget": "exceeded"},
                    )
        t.resolved = resolved  # changed, but not spent: judged on these from now on
        return None

    # -- 3. what did it cost (record step) ----------------------------------------------------

    def record(self, ctx: Context) -> None:
        t: Ticket | None = ctx.governance
        if t is None:
            return
        ctx.governance = None  # once
        if t.held_keys:
            self._release(t)
        if t.fair_pool is not None:
            self.fair.leave(t.fair_pool, t.principal.tenant)
        if t.slots:
            self.concurrency.release(t.slots)
        prompt = completion = 0
        cost = 0
        counted: float | None = None  # tokens held against tokens per minute (None: the usage)
        if ctx.stream and t.usage is not None:
            ctx.usage = t.usage  # the stream's usage chunk: read by `billed` (spend and metrics)
        charged = billed(ctx)
        if charged is not None:
            prompt, completion = charged.prompt, charged.completion
            if not charged.answered:
                # The provider's answer never came: what it produced is unknown, so the whole
                # reservation stays counted (the prompt estimate is what is charged).
                counted = max(t.reserved_tokens, float(prompt))
            provider = self.runtime.snapshot.providers.get(ctx.provider) if self.runtime else None
            if provider is not None:
                price = provider.config.price
                cost = cost_nano(prompt, completion, price.input_per_1m, price.output_per_1m)
        if counted is None:
            counted = float(prompt + completion)
        for b in t.token_buckets:
            self.limiter.give_back(b, t.reserved_tokens - counted)
        ctx.cost_usd = cost / NANO
        p_ = t.principal
        usage = Usage(cost, 1, prompt, completion)
        self.ledger.record(
            time.time(), p_.tenant, p_.key_id, ctx.alias, ctx.provider, usage, t.budget_keys
        )
        self.stats.spent(p_.tenant, p_.key_id, cost, prompt + completion)
        if t.near_budget and cost:
            self.ledger.flush_soon()


def _chain(snap: Snapshot, first: str) -> list[str]:
    chain = [first]
    i = 0
    while i < len(chain):
        for fb in snap.policy.pools[chain[i]].fallback:
            if fb not in chain:
                chain.append(fb)
        i += 1
    return chain
