"""One request on its way down the stages: what each stage found, for the stages below it."""

from __future__ import annotations

from collections.abc import Mapping

from starlette.requests import Request

from gateway.apis.exchange import Exchange
from gateway.context import Context
from gateway.governance.service import Principal
from gateway.routing.decision import Decision
from gateway.runtime import Snapshot
from gateway.wire.request import Endpoint, ParsedRequest


class Call:
    """Set top to bottom: `principal` by Authenticate, `raw`/`acc`/`sent` by Accept, `decision`
    by Classify; `sent` (the request as sent upstream) may be rewritten by Limit."""

    __slots__ = (
        "acc",
        "ctx",
        "decision",
        "endpoint",
        "exchange",
        "headers",
        "principal",
        "raw",
        "request",
        "sent",
        "snap",
        "want_completion",
    )

    def __init__(
        self,
        ctx: Context,
        snap: Snapshot,
        endpoint: Endpoint,
        request: Request | None = None,
        exchange: Exchange | None = None,
    ) -> None:
        self.ctx, self.snap, self.endpoint = ctx, snap, endpoint
        self.request = request
        self.headers: Mapping[str, str] = (
            header_map(request.scope["headers"]) if request is not None else _NO_HEADERS
        )
        self.exchange = exchange
        self.raw = b""
        self.want_completion = False  # a stage keeps the streamed answer (the cache)
        self.principal: Principal
        self.acc: ParsedRequest
        self.sent: ParsedRequest
        self.decision: Decision


_NO_HEADERS: Mapping[str, str] = {}


def header_map(raw: list[tuple[bytes, bytes]]) -> dict[str, str]:
    """The request's headers by (lower-case) name, the first of repeated ones winning as in
    Starlette's `Headers.get`: built once, a third of the cost of the lookups the stages make."""
    out: dict[str, str] = {}
    for k, v in raw:
        key = k.decode("latin-1")
        if key not in out:
            out[key] = v.decode("latin-1")
    return out
