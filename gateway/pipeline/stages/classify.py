"""Classify: estimate tokens, pick the request class and the chain of pools (gateway.routing)."""

from __future__ import annotations

from starlette.responses import Response

from gateway.observability.tracing import stage
from gateway.pipeline.call import Call
from gateway.pipeline.stage import Next
from gateway.routing.decision import PRIORITY_HEADER, decide


class Classify:
    name = "classify"

    async def __call__(self, call: Call, next: Next) -> Response:
        ctx = call.ctx
        with stage(ctx, "classify"):
            decision = decide(
                call.snap.policy, call.acc, ctx.tenant, call.headers.get(PRIORITY_HEADER)
            )
            ctx.prompt_tokens = decision.prompt_tokens
            ctx.request_class = decision.request_class
        call.decision = decision
        return await next(call)
