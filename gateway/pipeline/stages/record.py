"""Record (outermost): every request, however it ends, is seen once by every observer (governance
spend, metrics, access log, recent requests) after its answer was sent or its stream ended."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from starlette.responses import Response

from gateway.context import Context
from gateway.pipeline.call import Call
from gateway.pipeline.reply import on_finish
from gateway.pipeline.stage import Next
from gateway.pipeline.stages.answer import answer_for

Observer = Callable[[Context], None]
log = logging.getLogger("gateway.record")


class Record:
    name = "record"

    def __init__(self, observers: list[Observer]) -> None:
        self.observers = observers  # shared with the pipeline: observers added later count

    async def __call__(self, call: Call, next: Next) -> Response:
        ctx = call.ctx
        try:
            response = await next(call)
        except Exception as exc:
            response = answer_for(exc, ctx)
        except BaseException:  # cancelled before any answer (server stopping): still recorded
            ctx.status = ctx.status or 499
            self.record(ctx)
            raise
        ctx.status = response.status_code
        # After the body is sent (or the stream ended): metrics and logs stay off the latency path.
        on_finish(response, lambda: self.record(ctx))
        return response

    def record(self, ctx: Context) -> None:
        ctx.end = time.perf_counter()
        for observe in self.observers:
            # Each on its own: one failing observer (spend, metrics) must not cost the request
            # its access-log line or the other observations.
            try:
                observe(ctx)
            except Exception:
                log.exception(
                    "observer %s failed for request %s",
                    getattr(observe, "__qualname__", type(observe).__name__),
                    ctx.request_id,
                )
