"""One request, end to end: accept -> classify -> cache -> route -> dispatch -> recover -> record.

Each step lives in its own module; this file only composes them, top to bottom.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import orjson
from starlette.background import BackgroundTask
from starlette.datastructures import Headers
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse

from gateway import errors
from gateway.apis.exchange import Exchange, InboundAPI, safe_respond
from gateway.cache.exact import MemoryLRU, RedisStore, Store, cacheable, exact_key
from gateway.cache.semantic_layer import SemanticLayer, SemanticPlan
from gateway.cache.semantic_settings import SemanticSettings
from gateway.cache.singleflight import LeaderGone, SingleFlight, wait
from gateway.context import Context
from gateway.errors import GatewayError
from gateway.governance.service import GovernanceService, Principal
from gateway.http.protocol import READ_TIMEOUT_KEY
from gateway.infra.shared_state import SharedState
from gateway.observability.tracing import Tracing, stage
from gateway.pipeline.candidates import Shed
from gateway.pipeline.classify import PRIORITY_HEADER, Decision, decide
from gateway.pipeline.failover import Dispatcher, Exhausted, PassThrough
from gateway.pipeline.router import Router
from gateway.policy.schema import Alias
from gateway.resilience.deferred import ReplayEntry
from gateway.resilience.degradation import Fallbacks
from gateway.runtime import Runtime, Snapshot
from gateway.wire.chunks import completion_to_events
from gateway.wire.request import Accepted, Endpoint, accept

log = logging.getLogger("gateway.request")
JSON = "application/json"


def new_request_id() -> str:
    """32 random hex digits, like uuid4().hex at a quarter of its cost."""
    return os.urandom(16).hex()


_ID_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.:")
MAX_REQUEST_ID = 128


def client_request_id(value: str | None) -> str:
    """The client's `x-request-id` when short and plain (it is echoed and logged), else a new one.

    It is correlation only: nothing (deferred results, cache keys) is looked up by it.
    """
    if value and len(value) <= MAX_REQUEST_ID and _ID_CHARS.issuperset(value):
        return value
    return new_request_id()


def clamp_ttl(header: str | None, policy_ttl_s: int) -> int:
    """A client's `x-gateway-cache-ttl` may shorten the policy's TTL, never extend it."""
    if header and header.isdigit() and len(header) <= 12:
        return max(1, min(int(header), policy_ttl_s))
    return policy_ttl_s


@dataclass(slots=True)
class CachePlan:
    key: str
    read: bool
    write: bool
    ttl_s: int
    semantic: SemanticPlan | None = None
    leader: bool = False


async def read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise errors.too_large(limit)
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise errors.too_large(limit)
            chunks.append(chunk)
    except ClientDisconnect:
        # The connection closed before the whole body came: the body timeout (a 408 was sent)
        # or the client going away.
        if request.scope.get(READ_TIMEOUT_KEY):
            raise GatewayError(
                408, "The request was not received in time.", code="request_timeout"
            ) from None
        raise GatewayError(499, "The client closed the connection.", code="client_closed") from None
    return b"".join(chunks)


class Pipeline:
    def __init__(
        self,
        runtime: Runtime,
        state: SharedState | None = None,
        fallbacks: Fallbacks | None = None,
        semantic: SemanticLayer | None = None,
    ) -> None:
        self.runtime = runtime
        self.state = state or SharedState(None)
        self.fallbacks = fallbacks or Fallbacks(None, None)
        self.semantic = semantic or SemanticLayer(SemanticSettings(), None, "gw:")
        self.dispatcher = Dispatcher(Router())
        self.exact: Store = RedisStore(self.state) if self.state.enabled else MemoryLRU()
        self.flights = SingleFlight()
        self.observers: list[Callable[[Context], None]] = []
        self.tracing = Tracing()  # off; see gateway.observability.tracing
        self.governance = GovernanceService(self.state, runtime)
        self.governance.fair.waiting = self._pool_waiting
        self.observers.append(self.governance.record)  # first: sets the cost others log

    def _pool_waiting(self, pool: str) -> bool:
        stats = self.dispatcher.admission.stats.get(pool)
        return stats is not None and stats.depth > 0

    def observe(self, observer: Callable[[Context], None] | None) -> None:
        """Register a record-step observer (metrics, logs, traces); None is skipped."""
        if observer is not None and observer not in self.observers:
            self.observers.append(observer)

    async def handle(
        self, request: Request, endpoint: Endpoint, inbound: InboundAPI | None = None
    ) -> Response:
        """One request of `endpoint`; with `inbound` (gateway.apis), another API's request
        translated to chat on the way in and its answer translated back on the way out."""
        ctx = Context(client_request_id(request.headers.get("x-request-id")), time.perf_counter())
        ctx.endpoint = endpoint if inbound is None else inbound.name
        exchange = inbound.begin() if inbound is not None else None
        self.tracing.begin(ctx, request)  # root span, only when tracing is on
        try:
            response = await self._handle(request, ctx, endpoint, exchange)
        except Exception as exc:  # a bug: still an answer in the API's shape, and recorded
            log.exception("unexpected error", exc_info=exc)
            response = errors.internal_error().to_response(ctx.headers())
        except BaseException:  # cancelled before any answer (server stopping): still recorded
            ctx.status = ctx.status or 499
            self.record(ctx)
            raise
        if exchange is not None:
            response = await safe_respond(exchange, response, ctx)
        ctx.status = response.status_code
        if isinstance(response, StreamingResponse):
            ctx.on_done = self.record  # 7. Record, once the stream has ended
        else:
            # 7. Record, right after the body is sent: metrics and logs stay off the latency path.
            response.background = BackgroundTask(self._record_after_send, ctx)
        return response

    async def _record_after_send(self, ctx: Context) -> None:
        self.record(ctx)

    def record(self, ctx: Context) -> None:
        """7. Record: every observer (metrics, logs, traces) sees each finished request once."""
        ctx.end = time.perf_counter()
        for observe in self.observers:
            observe(ctx)

    async def _handle(
        self, request: Request, ctx: Context, endpoint: Endpoint, exchange: Exchange | None
    ) -> Response:
        snap = self.runtime.snapshot
        try:
            # 1. Accept
            authorization = (
                request.headers.get("authorization")
                if exchange is None
                else exchange.authorization(request.headers)
            )
            principal = await self.governance.authenticate(snap, authorization)
            ctx.tenant, ctx.key_id = principal.tenant, principal.key_id
            server = snap.policy.server
            raw = await read_body(request, server.max_body_bytes)
            ctx.request_body = raw
            if exchange is not None:
                raw = await exchange.request(raw, ctx)  # the client's API -> a chat body
            acc = accept(raw, endpoint, max_n=server.max_n, max_depth=server.max_json_depth)
            return await self._serve(snap, acc, raw, ctx, request.headers, principal)
        except PassThrough as p:
            return p.response
        except GatewayError as e:
            return e.to_response(ctx.headers())

    async def _serve(
        self,
        snap: Snapshot,
        acc: Accepted,
        raw: bytes,
        ctx: Context,
        headers: Headers,
        principal: Principal,
    ) -> Response:
        """Steps 2-6 for an accepted request (live, or replayed from the deferred queue)."""
        if acc.model not in snap.policy.models:
            raise errors.model_not_found(acc.model)
        ctx.alias, ctx.stream = acc.model, acc.stream
        # 2. Classify
        with stage(ctx, "classify"):
            priority = headers.get(PRIORITY_HEADER)
            decision = decide(snap.policy, acc, ctx.tenant, priority)
            ctx.prompt_tokens = decision.prompt_tokens
            ctx.request_class = decision.request_class
        # Limits and budgets (429 when refused; may route to a cheaper pool)
        await self.governance.admit(snap, principal, acc, decision, ctx)
        # 3. Cache
        plan = self._cache_plan(acc, decision.alias, ctx, headers)
        if plan is not None:
            with stage(ctx, "cache"):
                cached = await self._cache_lookup(plan, ctx)
            if cached is not None:
                hit = self._from_cache(cached, acc, ctx)
                if hit is not None:
                    return hit
        pending = plan.semantic.pending if plan is not None and plan.semantic else None
        if pending is not None and not acc.stream and plan is not None:
            return await self._race(snap, acc, raw, ctx, decision, plan)
        return await self._upstream(snap, acc, raw, ctx, decision, plan)

    async def _upstream(
        self,
        snap: Snapshot,
        acc: Accepted,
        raw: bytes,
        ctx: Context,
        decision: Decision,
        plan: CachePlan | None,
    ) -> Response:
        # 4-6. Route, dispatch, recover; when nothing can answer, degrade (live requests only:
        # a replay that fails stays queued and is retried)
        try:
            with stage(ctx, "route"):
                upstream = self.governance.upstream(acc, ctx)
                return await self._dispatch(snap, upstream, decision, ctx, plan)
        except (Exhausted, Shed) as e:
            if ctx.replay:
                raise
            with stage(ctx, "fallback"):
                return await self.fallbacks.degrade(e, acc, raw, ctx)

    async def _race(
        self,
        snap: Snapshot,
        acc: Accepted,
        raw: bytes,
        ctx: Context,
        decision: Decision,
        plan: CachePlan,
    ) -> Response:
        """The semantic lookup outlasted its budget: the upstream call starts now, and if the
        lookup then finds an answer first, that answer is served and the call cancelled (one
        upstream call spent on a hit: counted in the `raced` lookups)."""
        assert plan.semantic is not None and plan.semantic.pending is not None
        lookup = plan.semantic.pending
        call = asyncio.ensure_future(self._upstream(snap, acc, raw, ctx, decision, plan))
        await asyncio.wait({call, lookup}, return_when=asyncio.FIRST_COMPLETED)
        if not call.done():
            found = self.semantic.late_result(plan.semantic)
            if found is not None:
                call.cancel()
                with contextlib.suppress(BaseException):
                    await call
                self.semantic.raced += 1
                ctx.cache, ctx.similarity = "hit-semantic", found[1]
                if plan.leader:
                    self.flights.resolve(plan.key, found[0])
                hit = self._from_cache(found[0], acc, ctx)
                if hit is not None:
                    return hit
        return await call

    async def replay_send(self, entry: ReplayEntry) -> tuple[int, bytes]:
        """Re-send a deferred request for the replay worker: (status, body).

        It runs as the tenant that sent it, through the same steps as a live request (class
        rules, cache lookup and store, dispatch), and is recorded like one (access log, metrics)
        under its deferred id.
        """
        snap = self.runtime.snapshot
        ctx = Context(entry.request_id or new_request_id(), time.perf_counter())
        ctx.tenant, ctx.endpoint, ctx.replay = entry.tenant or "default", "chat", True
        ctx.request_body = entry.body
        server = snap.policy.server
        try:
            acc = accept(entry.body, "chat", max_n=server.max_n, max_depth=server.max_json_depth)
            acc.stream = False  # the answer is stored, not streamed
            principal = self._replay_principal(entry, ctx)
            response = await self._serve(snap, acc, entry.body, ctx, Headers(), principal)
        except PassThrough as p:
            response = p.response
        except GatewayError as e:
            response = e.to_response(ctx.headers())
        except Exception as exc:  # noqa: BLE001 - recorded as a 500, retried by the worker
            log.exception("unexpected error in a replay", exc_info=exc)
            response = errors.internal_error().to_response(ctx.headers())
        ctx.status = response.status_code
        self.record(ctx)
        return response.status_code, bytes(response.body)

    def _replay_principal(self, entry: ReplayEntry, ctx: Context) -> Principal:
        """Who a replay runs as: the tenant and key that sent the request, so that their limits,
        budgets and allowed aliases apply (a refusal is retried later by the worker). A managed
        key revoked or expired since then fails the replay."""
        ctx.key_id = entry.key_id
        record = self.governance.keys.get(entry.key_id) if entry.key_id else None
        if record is not None and (record.revoked or not record.usable(time.time())):
            raise errors.unauthorized("The API key that sent this request is no longer valid.")
        return Principal(ctx.tenant, entry.key_id, record)

    # -- cache ----------------------------------------------------------------------------------

    def _cache_plan(
        self, acc: Accepted, alias: Alias, ctx: Context, headers: Headers
    ) -> CachePlan | None:
        cc = headers.get("cache-control", "").lower()
        if "no-store" in cc:
            return None
        exact = alias.cache.exact
        use_exact = exact.enabled and (acc.endpoint == "embeddings" or cacheable(acc.body, exact))
        namespace = headers.get("x-gateway-cache-namespace", "")
        semantic = None
        if acc.endpoint == "chat":
            semantic = self.semantic.plan(
                ctx.tenant, acc.model, acc.body, alias.cache.semantic, namespace
            )
        if not use_exact and semantic is None:
            return None
        ttl_header = headers.get("x-gateway-cache-ttl")
        ttl = clamp_ttl(ttl_header, exact.ttl_s)
        if ttl_header and semantic is not None:
            limit = semantic.ttl_s if semantic.ttl_s is not None else self.semantic.settings.ttl_s
            semantic.ttl_s = clamp_ttl(ttl_header, int(limit))
        key = exact_key(ctx.tenant, acc.model, acc.endpoint, acc.body, namespace)
        ctx.cache = "miss"
        if semantic is not None and "no-cache" in cc:
            semantic.refresh = True
        return CachePlan(
            key, read="no-cache" not in cc, write=use_exact, ttl_s=ttl, semantic=semantic
        )

    async def _cache_lookup(self, plan: CachePlan, ctx: Context) -> bytes | None:
        if plan.read and plan.write:
            hit = await self.exact.get(plan.key)
            if hit is not None:
                ctx.cache = "hit-exact"
                return hit
        if plan.read and plan.semantic is not None:
            found = await self.semantic.lookup(plan.semantic)
            if found is not None:
                ctx.cache, ctx.similarity = "hit-semantic", found[1]
                return found[0]
        fut = self.flights.join(plan.key)
        if fut is None:
            plan.leader = True
            return None
        shared = await wait(fut, 60.0)  # bounded: nothing waits forever
        if shared is not None:
            ctx.cache = "hit-exact" if plan.read else "miss"
        return shared

    def _from_cache(self, body: bytes, acc: Accepted, ctx: Context) -> Response | None:
        """The cached answer for the client; None (a miss) for an entry that is not a completion."""
        if not acc.stream:
            return Response(body, headers=ctx.headers(), media_type=JSON)
        include_usage = bool((acc.body.get("stream_options") or {}).get("include_usage"))
        try:
            completion = orjson.loads(body)
        except orjson.JSONDecodeError:
            completion = None
        if not isinstance(completion, dict):
            # Written by an older gateway that cached unchecked answers: never a 500.
            ctx.cache = "miss"
            return None
        events = completion_to_events(completion, include_usage)
        return Response(b"".join(events), headers=ctx.headers(), media_type="text/event-stream")

    def _store(self, plan: CachePlan, body: bytes) -> asyncio.Task[bool] | None:
        """Store the answer; returns the semantic store task of a refresh (to wait on)."""
        if plan.leader:
            self.flights.resolve(plan.key, body)
        if plan.write:
            asyncio.get_running_loop().create_task(self.exact.set(plan.key, body, plan.ttl_s))
        if plan.semantic is not None:
            task = self.semantic.store(plan.semantic, body)
            return task if plan.semantic.refresh else None
        return None

    def _store_streamed(self, plan: CachePlan, body: bytes) -> None:
        """A stream's body is complete only after its response: nothing left to wait on."""
        self._store(plan, body)

    # -- dispatch -------------------------------------------------------------------------------

    async def _dispatch(
        self,
        snap: Snapshot,
        acc: Accepted,
        decision: Decision,
        ctx: Context,
        plan: CachePlan | None,
    ) -> Response:
        try:
            if acc.stream:
                if plan is None:
                    return await self.dispatcher.stream(snap, acc, decision, ctx)
                resp: StreamingResponse = await self.dispatcher.stream(
                    snap,
                    acc,
                    decision,
                    ctx,
                    on_complete=lambda body: self._store_streamed(plan, body),
                    on_abort=lambda: self._abort(plan, LeaderGone()),
                )
                return resp
            body, headers = await self.dispatcher.unary(snap, acc, decision, ctx)
        except GatewayError as e:
            if plan is not None:
                self._abort(plan, e)
            raise
        except PassThrough:
            if plan is not None:
                self._abort(plan, LeaderGone())
            raise
        if plan is not None:
            refresh = self._store(plan, body)
            if refresh is not None:
                # Back-pressure: a burst of refreshes is slowed to the embedder's pace instead of
                # losing stores. The store never raises; the wait is bounded by refresh_wait_s.
                await asyncio.wait({refresh})
        return Response(body, headers={**headers, **ctx.headers()}, media_type=JSON)

    def _abort(self, plan: CachePlan, exc: BaseException) -> None:
        if plan.leader:
            self.flights.fail(plan.key, exc)
