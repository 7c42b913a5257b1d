"""Accept: read the body within its limit, translate it (inbound APIs), parse and check it."""

from __future__ import annotations

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from gateway import errors
from gateway.context import READ_TIMEOUT_KEY
from gateway.errors import GatewayError
from gateway.governance.service import GovernanceService
from gateway.pipeline.call import Call
from gateway.pipeline.stage import Next
from gateway.wire.request import parse_request
from gateway.wire.request_checks import MAX_STOP, clip


async def read_body(request: Request, limit: int, declared: str | None = None) -> bytes:
    if declared is None:
        declared = request.headers.get("content-length")
    if declared is not None and declared.isascii() and declared.isdigit():
        # More digits than the limit has is larger than it (and int() of a huge string raises).
        digits = declared.lstrip("0")
        if len(digits) > len(str(limit)) or int(digits or "0") > limit:
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


class Accept:
    name = "accept"

    async def __call__(self, call: Call, next: Next) -> Response:
        ctx, server = call.ctx, call.snap.policy.server
        if call.request is not None:  # a replay brings its body
            declared = call.headers.get("content-length")
            call.raw = await read_body(call.request, server.max_body_bytes, declared)
            ctx.request_body = call.raw
        raw = call.raw
        if call.exchange is not None:
            raw = await call.exchange.request(raw, ctx)  # the client's API -> a chat body
        acc = parse_request(
            raw,
            call.endpoint,
            max_n=server.max_n,
            max_depth=server.max_json_depth,
            # A translated request keeps its own API's limit (Anthropic takes more than 4 stops).
            max_stop=getattr(call.exchange, "max_stop", MAX_STOP),
        )
        if ctx.replay:
            acc.stream = False  # a replay's answer is stored, not streamed
        if acc.model not in call.snap.policy.models:
            raise errors.model_not_found(clip(acc.model))
        # An alias the key may not use is refused here, as one that does not exist: before
        # Classify, whose refusals (a context window too small...) would tell the two apart.
        GovernanceService.check_alias(call.principal, acc.model)
        call.raw, call.acc = raw, acc
        call.sent = acc
        ctx.alias, ctx.stream = acc.model, acc.stream
        return await next(call)
