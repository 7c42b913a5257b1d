"""Translate (inbound APIs only, gateway.apis): the client's API in, the same API out, whatever
the stages below answered (an error, a completion, a cached or degraded answer, a stream)."""

from __future__ import annotations

from starlette.responses import Response

from gateway.apis.exchange import safe_respond
from gateway.pipeline.call import Call
from gateway.pipeline.stage import Next
from gateway.pipeline.stages.answer import answer_for


class Translate:
    name = "translate"

    async def __call__(self, call: Call, next: Next) -> Response:
        exchange = call.exchange
        assert exchange is not None
        try:
            response = await next(call)
        except Exception as exc:
            response = answer_for(exc, call.ctx)
        return await safe_respond(exchange, response, call.ctx)
