"""Explain a routing decision without sending anything.

`explain_offline` shows what the policy alone decides for a request body (tokens, class, alias,
pools, prefix key, cacheability); `explain_live` adds what the running gateway would do now: the
member it would pick (a dry-run pick: nothing is counted as in flight) and the live state of every
member of the request's pools. Used by `POST /v1/gateway/explain` and `gateway explain`.
"""

from __future__ import annotations

import math
import time
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from gateway import errors
from gateway.context import Context
from gateway.pipeline.call import Call
from gateway.pipeline.router import Router
from gateway.pipeline.stack import Pipeline, new_request_id
from gateway.pipeline.stages.accept import read_body
from gateway.pipeline.stages.cache import describe
from gateway.policy.schema import Policy
from gateway.routing.decision import Decision, decide
from gateway.runtime import ProviderState, Snapshot
from gateway.wire.request import Endpoint, ParsedRequest, parse_request
from gateway.wire.request_checks import clip


def infer_endpoint(body: object) -> str:
    """Which API a body belongs to: chat (`messages`), completions (`prompt`) or embeddings."""
    if isinstance(body, dict):
        if "messages" in body:
            return "chat"
        if "prompt" in body:
            return "completions"
        if "input" in body:
            return "embeddings"
    return "chat"


def _static(
    policy: Policy, acc: ParsedRequest, decision: Decision, cache_control: str | None
) -> dict[str, Any]:
    return {
        "endpoint": acc.endpoint,
        "alias": acc.model,
        "routed_alias": decision.alias_name,
        "rerouted": decision.rerouted_from is not None,
        "prompt_tokens": decision.prompt_tokens,
        "expected_output_tokens": decision.expected_output_tokens,
        "context_window": decision.alias.context_window,
        "class": decision.request_class,
        "pools": decision.chain,
        "prefix_key": decision.prefix_key.hex() if decision.prefix_key is not None else None,
        "affinity": decision.prefix_key is not None,
        "stream": acc.stream,
        "cache": describe(acc, decision.alias, cache_control),
    }


def explain_offline(
    policy: Policy,
    acc: ParsedRequest,
    tenant: str = "default",
    priority: str | None = None,
    cache_control: str | None = None,
) -> dict[str, Any]:
    """The policy's decision for a request, with each pool's configured members (no live state)."""
    decision = decide(policy, acc, tenant, priority)
    out = _static(policy, acc, decision, cache_control)
    out["tenant"] = tenant
    out["members"] = {
        name: [
            {
                "name": m,
                "weight": policy.providers[m].weight,
                "max_inflight": policy.providers[m].max_inflight,
            }
            for m in policy.pools[name].members
        ]
        for name in decision.chain
    }
    out["strategies"] = {name: policy.pools[name].balancer.strategy for name in decision.chain}
    return out


def member_state(p: ProviderState, now: float) -> dict[str, Any]:
    """What routing sees of one provider now."""
    m = p.member
    cost = m.cost(now)
    return {
        "name": p.name,
        "available": p.available(),
        "drained": p.drained,
        "inflight": m.inflight,
        "max_inflight": m.max_inflight,
        "has_capacity": m.has_capacity(),
        "weight": m.weight,
        "ewma_ms": round(m.ewma.estimate(now) * 1000.0, 3),
        "cost": None if math.isinf(cost) else round(cost, 6),
        "observations": m.ewma.observations,
        "failures": m.failures,
        "last_error": m.last_error_kind,
        "requests": p.requests,
        "breaker": p.breaker.snapshot(),
    }


def explain_live(
    snap: Snapshot,
    router: Router,
    acc: ParsedRequest,
    decision: Decision,
    tenant: str,
    cache_control: str | None = None,
) -> dict[str, Any]:
    """The decision plus the member the router would pick now and every pool member's state."""
    out = _static(snap.policy, acc, decision, cache_control)
    out["tenant"] = tenant
    out["policy_version"] = snap.version
    pick = router.preview(snap, decision.chain, decision.prefix_key)
    out["pick"] = (
        None
        if pick is None
        else {"pool": pick.pool, "provider": pick.provider.name, "via": pick.via}
    )
    now = time.monotonic()
    out["members"] = {
        name: [member_state(snap.provider_of(m), now) for m in snap.pools[name].members]
        for name in decision.chain
    }
    out["strategies"] = {name: snap.pools[name].config.balancer.strategy for name in decision.chain}
    return out


def resolve_endpoint(raw: bytes, endpoint: str | None) -> Endpoint:
    """The endpoint asked for, or the one the body's fields say (chat when it is not JSON:
    parsing then answers with the proper invalid-JSON error)."""
    if endpoint is None:
        try:
            endpoint = infer_endpoint(orjson.loads(raw))
        except orjson.JSONDecodeError:
            endpoint = "chat"
    if endpoint not in ("chat", "completions", "embeddings"):
        raise errors.bad_request(f"Unknown endpoint '{clip(endpoint)}'.", param="endpoint")
    return endpoint  # type: ignore[return-value]


def accept_any(raw: bytes, endpoint: str | None = None, **limits: int) -> ParsedRequest:
    """Parse a chat, completions or embeddings body (endpoint inferred unless given)."""
    return parse_request(raw, resolve_endpoint(raw, endpoint), **limits)


async def explain_http(request: Request, pipeline: Pipeline) -> Response:
    """`POST /v1/gateway/explain`: the same stages as a request (authenticated as usual), ending
    in a dry run: what the router would pick now, nothing sent, nothing counted."""
    snap = pipeline.runtime.snapshot
    raw = await read_body(request, snap.policy.server.max_body_bytes)
    endpoint = resolve_endpoint(raw, request.query_params.get("endpoint"))
    ctx = Context(new_request_id(), time.perf_counter())
    call = Call(ctx, snap, endpoint)
    call.headers, call.raw = request.headers, raw
    router = pipeline.dispatcher.router

    async def dry_run(call: Call) -> Response:
        # What the request itself would be told for an alias its key may not use (the Limit
        # stage's refusal): never another team's routes.
        pipeline.governance.check_alias(call.principal, call.acc.model)
        out = explain_live(
            call.snap,
            router,
            call.acc,
            call.decision,
            ctx.tenant,
            call.headers.get("cache-control"),
        )
        # The stages a request to this alias runs after Accept (the policy chooses them).
        stages = pipeline.alias_stages(call.snap, call.acc.model)
        out["stages"] = [s.name for s in stages] + [pipeline.dispatcher.name]
        return Response(orjson.dumps(out), media_type="application/json")

    return await pipeline.explain_stack(dry_run)(call)
