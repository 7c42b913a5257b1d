"""Limit: the caller's rate limits, concurrency, fair share and budgets (429 when refused; the
request's cost is settled by governance's record observer once it has ended)."""

from __future__ import annotations

from starlette.responses import Response, StreamingResponse

from gateway.governance.service import GovernanceService
from gateway.pipeline.call import Call
from gateway.pipeline.stage import Next


class Limit:
    name = "limit"

    def __init__(self, governance: GovernanceService) -> None:
        self.governance = governance

    async def __call__(self, call: Call, next: Next) -> Response:
        await self.governance.admit(call.snap, call.principal, call.acc, call.decision, call.ctx)
        # Streams ask the provider for usage (to cost them) even when the client did not.
        call.sent = self.governance.upstream(call.acc, call.ctx)
        response = await next(call)
        if isinstance(response, StreamingResponse):
            # A key revoked (expired, out of budget) while its stream runs stops the stream.
            self.governance.guard_stream(response, call.ctx)
        return response
