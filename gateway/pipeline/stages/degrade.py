"""Degrade: when no member can answer (every pool exhausted, or shed at capacity), a degradation
rule's answer, possibly queueing the request for replay (gateway.resilience.degradation). A replay
that fails is not degraded: it stays queued and is retried."""

from __future__ import annotations

from starlette.responses import Response

from gateway.observability.tracing import stage
from gateway.pipeline.call import Call
from gateway.pipeline.candidates import Shed
from gateway.pipeline.client_errors import Exhausted
from gateway.pipeline.stage import Next
from gateway.resilience.degradation import Degradation


class Degrade:
    name = "degrade"

    def __init__(self, degradation: Degradation) -> None:
        self.degradation = degradation

    async def __call__(self, call: Call, next: Next) -> Response:
        try:
            return await next(call)
        except (Exhausted, Shed) as e:
            ctx = call.ctx
            if ctx.replay:
                raise
            with stage(ctx, "fallback"):
                return await self.degradation.degrade(e, call.acc, call.raw, ctx)
