"""Authenticate: who is calling (a managed key, a policy key, or the open gateway's tenant)."""

from __future__ import annotations

from starlette.responses import Response

from gateway.governance.service import GovernanceService
from gateway.pipeline.call import Call
from gateway.pipeline.stage import Next


class Authenticate:
    name = "authenticate"

    def __init__(self, governance: GovernanceService) -> None:
        self.governance = governance

    async def __call__(self, call: Call, next: Next) -> Response:
        headers = call.headers
        exchange = call.exchange
        authorization = (
            headers.get("authorization") if exchange is None else exchange.authorization(headers)
        )
        principal = await self.governance.authenticate(call.snap, authorization)
        call.principal = principal
        call.ctx.tenant, call.ctx.key_id = principal.tenant, principal.key_id
        return await next(call)
