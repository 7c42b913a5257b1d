"""Trace: the request's root span, from before Authenticate to the end of the answer (only in the
stack when tracing is on; gateway.observability.tracing)."""

from __future__ import annotations

from starlette.responses import Response

from gateway.observability.tracing import Tracing
from gateway.pipeline.call import Call
from gateway.pipeline.reply import on_finish
from gateway.pipeline.stage import Next
from gateway.pipeline.stages.answer import answer_for


class Trace:
    name = "trace"

    def __init__(self, tracing: Tracing) -> None:
        self.tracing = tracing

    async def __call__(self, call: Call, next: Next) -> Response:
        ctx = call.ctx
        if call.request is not None:
            self.tracing.begin(ctx, call.request)
        try:
            response = await next(call)
        except Exception as exc:
            response = answer_for(exc, ctx)
        except BaseException:
            ctx.status = ctx.status or 499
            self.tracing.finish(ctx)
            raise
        # Registered before Record's hook: the spans end closest to the answer.
        on_finish(response, lambda: self.tracing.finish(ctx))
        return response
