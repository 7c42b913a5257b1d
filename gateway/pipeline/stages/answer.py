"""Any outcome as a response in the OpenAI shape: what the outer stages do with an exception."""

from __future__ import annotations

import logging

from starlette.responses import Response

from gateway import errors
from gateway.context import Context
from gateway.errors import GatewayError
from gateway.pipeline.client_errors import PassThrough

log = logging.getLogger("gateway.request")


def answer_for(exc: Exception, ctx: Context) -> Response:
    """A refusal or failure as the client's answer; anything else is a bug, answered 500."""
    if isinstance(exc, PassThrough):
        return exc.response
    if isinstance(exc, GatewayError):
        return exc.to_response(ctx.headers())
    log.exception("unexpected error", exc_info=exc)
    return errors.internal_error().to_response(ctx.headers())
