"""Authenticate: who is calling (a managed key, a policy key, or the open gateway's tenant)."""

from __future__ import annotations

from starlette.responses import Response

from gateway.errors import unauthorized
from gateway.governance.service import GovernanceService
from gateway.pipeline.call import Call
from gateway.pipeline.stage import Next

# Credential headers that may appear once: of two, which one is the caller's is unknown (the
# first? the one a proxy added?), so a request carrying either twice is refused.
_CREDENTIALS = (b"authorization", b"x-api-key")


class Authenticate:
    name = "authenticate"

    def __init__(self, governance: GovernanceService) -> None:
        self.governance = governance

    async def __call__(self, call: Call, next: Next) -> Response:
        headers = call.headers
        exchange = call.exchange
        if call.request is not None:
            credentials_once(call.request.scope["headers"])
        authorization = (
            headers.get("authorization") if exchange is None else exchange.authorization(headers)
        )
        principal = await self.governance.authenticate(call.snap, authorization)
        call.principal = principal
        call.ctx.tenant, call.ctx.key_id = principal.tenant, principal.key_id
        return await next(call)


def credentials_once(raw: list[tuple[bytes, bytes]]) -> None:
    """Refuse (401) a request carrying a credential header twice."""
    seen: set[bytes] = set()
    for k, _ in raw:
        name = k.lower()
        if name in _CREDENTIALS:
            if name in seen:
                raise unauthorized(
                    f"The {name.decode()} header is given more than once; send one API key."
                )
            seen.add(name)
