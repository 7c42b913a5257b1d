"""The ASGI app: routes and error handlers only. Behaviour lives in the pipeline and its steps."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import orjson
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import Response

from gateway import errors
from gateway.apis import messages as messages_api
from gateway.apis import responses as responses_api
from gateway.apis.exchange import InboundAPI
from gateway.apis.response_store import ResponseStore
from gateway.cache.semantic_layer import SemanticLayer
from gateway.context import Context
from gateway.errors import GatewayError
from gateway.governance.metrics import GovernanceCollector
from gateway.http.admin import (
    AdminViews,
    admin_router,
    dashboard_router,
    is_admin,
    require_admin,
)
from gateway.http.drain import Drain
from gateway.http.governance_admin import governance_router
from gateway.http.protocol import RECORD_KEY, configure_connections
from gateway.infra.shared_state import SharedState
from gateway.infra.shares import Membership, Shares
from gateway.observability import metrics
from gateway.observability.health import Reachability
from gateway.observability.logs import AccessLog
from gateway.observability.metrics_workers import WorkerMetrics
from gateway.observability.recent import RecentRequests
from gateway.observability.tracing import Tracing
from gateway.pipeline.explain import explain_http
from gateway.pipeline.reply import on_finish
from gateway.pipeline.stack import Pipeline, client_request_id, new_request_id
from gateway.pipeline.stages.accept import read_body
from gateway.pipeline.stages.authenticate import credentials_once
from gateway.policy.rules import rules_path
from gateway.policy.schema import Policy
from gateway.policy.watcher import PolicyReloader, replica_id
from gateway.resilience.degradation import Degradation
from gateway.resilience.drains import SharedDrains
from gateway.resilience.shared_breakers import SharedBreakers
from gateway.runtime import Runtime
from gateway.wire.request_checks import clip

log = logging.getLogger("gateway")
_CREATED = int(time.time())
# Net new container objects between two young-generation collections (Python's default: 700).
GC_GEN0_THRESHOLD = 10_000


def _json(data: object, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json")


# The access log's `endpoint` of a request no route answered (404, 405, refused by the protocol).
_ENDPOINTS = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/embeddings": "embeddings",
    "/v1/messages": "messages",
    "/v1/messages/count_tokens": "messages.count_tokens",
    "/v1/responses": "responses",
    "/v1/models": "models.list",
    "/v1/gateway/explain": "explain",
}
_ENDPOINT_PREFIXES = (
    ("/v1/responses/", "responses"),
    ("/v1/models/", "models.retrieve"),
    ("/v1/gateway/deferred/", "deferred"),
)


def endpoint_of(path: str) -> str:
    name = _ENDPOINTS.get(path)
    if name is not None:
        return name
    for prefix, name in _ENDPOINT_PREFIXES:
        if path.startswith(prefix):
            return name
    return "unknown"


def shaped(err: GatewayError, path: str, headers: dict[str, str]) -> Response:
    """`err` as the path's API writes errors (Anthropic's shape under /v1/messages)."""
    if messages_api.owns_path(path):
        status, body = messages_api.anthropic_error(err.status, err.message)
        return Response(body, status_code=status, media_type="application/json", headers=headers)
    return err.to_response(headers)


def metrics_enabled() -> bool:
    """GATEWAY_METRICS=0 turns off per-request metrics and the dashboard's traffic figures."""
    return os.environ.get("GATEWAY_METRICS", "1").lower() not in ("0", "false", "no", "off")


async def _deferred_length(degradation: Degradation) -> int:
    """Requests waiting for replay (bounded wait: a scrape must not hang on Redis)."""
    total = 0
    for q in (degradation.queue, degradation.local_queue):
        with contextlib.suppress(Exception):
            async with asyncio.timeout(0.25):
                total += await q.depth()
    return total


def create_app(
    policy: Policy, state: SharedState | None = None, policy_path: str | None = None
) -> FastAPI:
    # The one owner of Redis connections and subscriptions (`state.hub`), passed to every user.
    state = state if state is not None else SharedState.from_env()
    # Each process's share of the policy's limits (gateway.infra.shares): learned through Redis.
    shares = Shares.local() if policy.replicas.share_limits else Shares()
    runtime = Runtime(policy, shares)
    degradation = Degradation(
        rules_path(policy, policy_path), state.hub, prefix=state.tagged_key("deferred")
    )
    semantic = SemanticLayer(policy.semantic_cache, state.hub, state.prefix)
    pipeline = Pipeline(runtime, state, degradation, semantic)
    pipeline.dispatcher.admission.shares = shares

    def shares_changed() -> None:
        runtime.apply_shares()
        pipeline.dispatcher.tune_budget(runtime.snapshot.policy.retry)

    membership = (
        Membership(state, shares, lambda: runtime.snapshot.policy.replicas, shares_changed)
        if state.enabled and policy.replicas.share_limits
        else None
    )
    shared_breakers = (
        SharedBreakers(
            runtime.breakers, state.hub, channel=state.key("breakers"), replica_id=replica_id()
        )
        if state.url
        else None
    )
    configure_connections(policy.server)

    def apply(new: Policy) -> str:
        version = runtime.apply_version(new)
        configure_connections(new.server)
        degradation.use_rules(rules_path(new, policy_path))
        return version

    reloader = PolicyReloader(policy_path, apply, state, replica_id())
    # 7. Record: traces, metrics, the dashboard's last minute, the access log.
    tracing = Tracing.from_env()
    pipeline.set_tracing(tracing)
    request_metrics = metrics.RequestMetrics(runtime) if metrics_enabled() else None
    recent = RecentRequests() if metrics_enabled() else None
    for observer in (request_metrics, recent, AccessLog.from_env()):
        pipeline.observe(observer)
    collector = metrics.GatewayCollector(
        request_metrics, runtime, pipeline.dispatcher, pipeline.semantic, degradation, reloader
    )
    registry = metrics.make_registry(collector)
    governance = pipeline.governance
    registry.register(GovernanceCollector(governance))
    workers_metrics = WorkerMetrics.from_env(registry)  # several workers: one scrape for all
    reachability = Reachability(runtime)
    drain = Drain()
    drains = SharedDrains(runtime, state)  # an operator's drain reaches every worker/replica
    views = AdminViews(runtime, pipeline, reloader, recent, policy_path or "embedded", drains)

    def record_refused(status: int, path: str) -> str:
        """A request the HTTP protocol answered itself (head too large or too slow, unparsable):
        recorded like any other. Returns its request id (sent in its x-request-id)."""
        ctx = Context(new_request_id(), time.perf_counter())
        ctx.endpoint, ctx.status = endpoint_of(path), status
        pipeline.record(ctx)
        return ctx.request_id

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[dict[str, Any]]:
        if runtime.snapshot.keys.open:
            log.warning(
                "NO API KEYS CONFIGURED: the gateway is open to anyone who can reach it. "
                "Add auth.keys to the policy or set GATEWAY_API_KEYS."
            )
        if state.enabled:
            log.info("shared state: Redis enabled")
            # Connect now: a Redis Cluster client learns the slot map on its first command, and
            # a subscription made before that cannot find the channel's node.
            await state.call(lambda r: r.ping(), None)
        drain.install()
        if membership is not None:
            membership.start()
        reloader.start()
        reachability.start()
        if workers_metrics is not None:
            workers_metrics.start()
        await governance.start(runtime.snapshot.policy.governance)
        await degradation.start(pipeline.replay_send)
        if any(m.cache.semantic.enabled for m in policy.models.values()):
            await semantic.start()
        if shared_breakers is not None:
            await shared_breakers.start()
        await drains.start()
        # What start-up built (policy, tokenizer tables, models, clients) lives as long as the
        # process: out of the collector's sight, a collection walks only per-request objects.
        gc.collect()
        gc.freeze()
        # A request leaves no reference cycle (tests/http/test_no_cycles.py), so the collector
        # only finds garbage by accident; at the default threshold (700) the objects of a few
        # requests in flight set it off every ~12 requests, ~20 us of CPU per request. Measured:
        # loadtests.cpu_ab, BENCHMARKS.md.
        gc.set_threshold(GC_GEN0_THRESHOLD, 10, 10)
        # Lifespan state: the HTTP protocol finds its hook there (gateway.http.protocol).
        yield {RECORD_KEY: record_refused}
        drain.uninstall()
        if workers_metrics is not None:
            await workers_metrics.stop()
        await governance.stop()
        if shared_breakers is not None:
            await shared_breakers.stop()
        await drains.stop()
        await degradation.stop()
        await semantic.aclose()
        await reloader.stop()
        await reachability.stop()
        if membership is not None:
            await membership.stop()
        await runtime.aclose()
        await state.aclose()
        pipeline.tracing.shutdown()

    app = FastAPI(
        title="LLM gateway", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None
    )
    # A trailing-slash redirect would build its Location from the client's Host header.
    app.router.redirect_slashes = False
    app.state.runtime = runtime
    app.state.pipeline = pipeline
    app.state.reloader = reloader
    app.state.views = views
    app.state.drain = drain
    app.state.membership = membership
    app.include_router(admin_router(views))
    app.include_router(governance_router(governance, runtime))
    app.include_router(dashboard_router())

    @app.exception_handler(GatewayError)
    async def _gateway_error(_: Request, exc: GatewayError) -> Response:
        return exc.to_response()

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> Response:
        return errors.bad_request(str(exc.errors()[:1])).to_response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        """The router's own answers (unknown URL, wrong method): in the path's API shape, and
        recorded like every request (one access-log line, one metrics count)."""
        if exc.status_code == 404:
            err = errors.not_found("Unknown URL.", code="unknown_url")
        elif exc.status_code == 405:
            err = GatewayError(405, "Method not allowed.", code="method_not_allowed")
        else:
            err = GatewayError(exc.status_code, str(exc.detail))
        path: str = request.scope.get("path", "")
        ctx = Context(client_request_id(request.headers.get("x-request-id")), time.perf_counter())
        ctx.endpoint, ctx.status = endpoint_of(path), err.status
        response = shaped(err, path, {**(exc.headers or {}), "x-request-id": ctx.request_id})
        on_finish(response, lambda: pipeline.record(ctx))
        return response

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> Response:
        log.exception("unexpected error", exc_info=exc)
        return errors.internal_error().to_response()

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await pipeline.handle(request, "chat")

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await pipeline.handle(request, "completions")

    @app.post("/v1/embeddings")
    async def embeddings(request: Request) -> Response:
        return await pipeline.handle(request, "embeddings")

    # Other inbound APIs: translated to chat, the same pipeline (gateway.apis).
    stored = ResponseStore(state, lambda: runtime.snapshot.policy.responses)

    def max_depth() -> int:
        return runtime.snapshot.policy.server.max_json_depth

    inbound: dict[str, InboundAPI] = {
        "/v1/messages": messages_api.MessagesAPI(max_depth),
        "/v1/responses": responses_api.ResponsesAPI(stored, max_depth),
    }
    app.state.inbound = inbound

    @app.post("/v1/responses")
    async def responses(request: Request) -> Response:
        return await pipeline.handle(request, "chat", inbound["/v1/responses"])

    async def recorded(
        request: Request, endpoint: str, handle: Callable[[Context], Awaitable[Response]]
    ) -> Response:
        """A route outside the pipeline, recorded like a request through it: one access log
        line and one metrics observation once the answer was sent, however it ended."""
        ctx = Context(client_request_id(request.headers.get("x-request-id")), time.perf_counter())
        ctx.endpoint = endpoint
        try:
            response = await handle(ctx)
        except GatewayError as e:
            response = e.to_response({"x-request-id": ctx.request_id})
        except Exception as exc:
            log.exception("unexpected error", exc_info=exc)
            response = errors.internal_error().to_response({"x-request-id": ctx.request_id})
        except BaseException:  # cancelled before any answer: still recorded
            ctx.status = 499
            pipeline.record(ctx)
            raise
        ctx.status = response.status_code
        response.headers.setdefault("x-request-id", ctx.request_id)
        on_finish(response, lambda: pipeline.record(ctx))
        return response

    async def authenticate(ctx: Context, request: Request, authorization: str | None) -> str:
        credentials_once(request.scope["headers"])
        principal = await governance.authenticate(runtime.snapshot, authorization)
        ctx.tenant, ctx.key_id = principal.tenant, principal.key_id
        return principal.tenant

    @app.get("/v1/responses/{response_id}")
    async def get_response(response_id: str, request: Request) -> Response:
        async def handle(ctx: Context) -> Response:
            tenant = await authenticate(ctx, request, request.headers.get("authorization"))
            return _json(await responses_api.retrieve(stored, tenant, response_id))

        return await recorded(request, "responses.retrieve", handle)

    @app.delete("/v1/responses/{response_id}")
    async def delete_response(response_id: str, request: Request) -> Response:
        async def handle(ctx: Context) -> Response:
            tenant = await authenticate(ctx, request, request.headers.get("authorization"))
            return _json(await responses_api.delete(stored, tenant, response_id))

        return await recorded(request, "responses.delete", handle)

    @app.post("/v1/messages")
    async def messages(request: Request) -> Response:
        return await pipeline.handle(request, "chat", inbound["/v1/messages"])

    @app.post("/v1/messages/count_tokens")
    async def count_tokens(request: Request) -> Response:
        exchange = messages_api.MessagesExchange()

        async def handle(ctx: Context) -> Response:
            headers = {
                "x-gateway-token-count": "estimate (tiktoken)",
                "x-request-id": ctx.request_id,
            }
            try:
                auth = exchange.authorization(request.headers)
                await authenticate(ctx, request, auth)
                raw = await read_body(request, runtime.snapshot.policy.server.max_body_bytes)
                policy = runtime.snapshot.policy
                # Only the aliases the key may use: another's is refused as an unknown one.
                principal = await governance.authenticate(runtime.snapshot, auth)
                allowed = governance.visible_models(principal, policy.models)
                models = {name: policy.models[name] for name in allowed}
                doc = await messages_api.count_tokens(raw, models, policy.server.max_json_depth)
                return Response(orjson.dumps(doc), media_type="application/json", headers=headers)
            except GatewayError as e:
                return await exchange.respond(e.to_response(headers), ctx)

        return await recorded(request, "messages.count_tokens", handle)

    @app.post("/v1/gateway/explain")
    async def explain(request: Request) -> Response:
        """The routing decision for a request body, without sending it anywhere."""

        async def handle(ctx: Context) -> Response:
            # Authenticated here too: the log line names the tenant (explain_http checks again).
            await authenticate(ctx, request, request.headers.get("authorization"))
            return await explain_http(request, pipeline)

        return await recorded(request, "explain", handle)

    def _model_entry(name: str) -> dict[str, object]:
        snap = runtime.snapshot
        alias = snap.policy.models[name]
        pools = {alias.pool, *alias.routes.values()}
        members = {m for p in pools for m in snap.policy.pools[p].members}
        simulated = bool(members) and all(snap.policy.providers[m].simulated for m in members)
        entry: dict[str, object] = {
            "id": name,
            "object": "model",
            "created": _CREATED,
            "owned_by": alias.owned_by,
        }
        if simulated:
            entry["owned_by"] = "llm-gateway (simulated providers)"
        return entry

    async def visible_models(ctx: Context, request: Request) -> list[str]:
        """The aliases this caller may use: a managed key limited to some sees only those."""
        credentials_once(request.scope["headers"])
        principal = await governance.authenticate(
            runtime.snapshot, request.headers.get("authorization")
        )
        ctx.tenant, ctx.key_id = principal.tenant, principal.key_id
        return governance.visible_models(principal, runtime.snapshot.policy.models)

    @app.get("/v1/models")
    async def list_models(request: Request) -> Response:
        async def handle(ctx: Context) -> Response:
            names = await visible_models(ctx, request)
            return _json({"object": "list", "data": [_model_entry(n) for n in names]})

        return await recorded(request, "models.list", handle)

    @app.get("/v1/models/{model_id:path}")
    async def get_model(model_id: str, request: Request) -> Response:
        async def handle(ctx: Context) -> Response:
            if model_id not in await visible_models(ctx, request):
                raise errors.model_not_found(clip(model_id))
            return _json(_model_entry(model_id))

        return await recorded(request, "models.retrieve", handle)

    @app.get("/health")
    async def health() -> Response:
        return _json({"status": "ok"})

    def operator(request: Request) -> bool:
        """May this caller see per-provider and per-tenant detail (metrics, detailed /ready)?"""
        return runtime.snapshot.policy.metrics.public or is_admin(request)

    @app.get("/ready")
    async def ready(request: Request) -> Response:
        """Policy loaded and a provider reachable (cached probes and breakers: no network);
        never while draining. The provider list only for the admin key, loopback or
        `metrics.public`."""
        ok, detail = reachability.report()
        if drain.draining:
            status = "draining"
        elif membership is not None and not membership.settled:
            # The other processes have not yet shrunk their shares of the limits for this one.
            status = "joining"
        else:
            status = "ready" if ok else "not_ready"
        body: dict[str, object] = {"status": status}
        if operator(request):
            body.update(detail)
        return _json(body, 200 if status == "ready" else 503)

    @app.get("/metrics")
    async def prometheus_metrics(request: Request) -> Response:
        if not operator(request):
            require_admin(request)  # raises the admin API's 401/403
        collector.deferred_length = await _deferred_length(degradation)
        if workers_metrics is not None:
            return Response(workers_metrics.render(), media_type=metrics.CONTENT_TYPE)
        return Response(metrics.render(registry), media_type=metrics.CONTENT_TYPE)

    @app.get("/v1/gateway/deferred/{request_id}")
    async def deferred_result(request_id: str, request: Request) -> Response:
        """The replayed answer of a request that a degradation rule queued."""

        async def handle(ctx: Context) -> Response:
            tenant = await authenticate(ctx, request, request.headers.get("authorization"))
            doc = await degradation.result(request_id, tenant)
            if doc is None:
                raise errors.not_found(
                    "No deferred request with this id.", code="deferred_not_found"
                )
            return _json(doc)

        return await recorded(request, "deferred", handle)

    @app.post("/admin/reload")
    async def admin_reload(request: Request) -> Response:
        require_admin(request)
        version = await reloader.reload()
        if version is None:
            return _json(
                {
                    "reloaded": False,
                    "errors": reloader.last_error,
                    "version": runtime.snapshot.version,
                },
                400,
            )
        return _json({"reloaded": True, "version": version})

    # HEAD wherever GET is served (HTTP requires both of a general-purpose server: a load
    # balancer's `HEAD /health` got a 405): the same handler, uvicorn sends no body.
    _head_with_get(app.router.routes)
    return app


def _head_with_get(routes: list[Any]) -> None:
    for route in routes:
        methods = getattr(route, "methods", None)
        if isinstance(methods, set) and "GET" in methods:
            methods.add("HEAD")
        included = getattr(route, "original_router", None)  # a router included (FastAPI 0.16x)
        _head_with_get(list(getattr(route, "routes", None) or getattr(included, "routes", [])))
