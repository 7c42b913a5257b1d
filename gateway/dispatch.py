"""Dispatch and recover: send to members pool after pool until one answers.

A retry happens only while nothing has reached the client: for streams, until the first upstream
chunk arrived. After that, a broken stream ends with an OpenAI-shaped error event.
"""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson
from starlette.responses import Response, StreamingResponse

from gateway import errors
from gateway.accept import PATHS, Accepted
from gateway.chunks import StreamAssembler
from gateway.context import Context
from gateway.decide import Decision
from gateway.errors import GatewayError
from gateway.router import Router
from gateway.routing.member import SignalKind, latency_signal
from gateway.runtime import ProviderState, Snapshot
from gateway.sse import SSESplitter, encode_event
from gateway.upstream import UpstreamFailure, UpstreamStream

# Failure kinds that are the provider's answer to *this* request: returned to the client as-is.
CLIENT_ERRORS = frozenset({"upstream_4xx"})
_EXHAUSTED_STATUS = {
    "connect_timeout": (504, "upstream_timeout"),
    "first_byte_timeout": (504, "upstream_timeout"),
    "total_timeout": (504, "upstream_timeout"),
    "idle_timeout": (504, "upstream_timeout"),
    "rate_limited": (503, "upstream_rate_limited"),
    "connect_error": (502, "upstream_unavailable"),
    "upstream_5xx": (502, "upstream_error"),
    "stream_broken": (502, "upstream_error"),
}

_COMPLETION_TOKENS = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')


def completion_tokens(body: bytes) -> int | None:
    """Output tokens from a response's usage, without parsing the whole body."""
    m = _COMPLETION_TOKENS.search(body)
    return int(m.group(1)) if m else None


# Called with the complete answer (JSON bytes) of a successful request, e.g. to fill the cache.
OnComplete = Callable[[bytes], None]
# Called when a stream ends without a complete answer.
OnAbort = Callable[[], None]


class PassThrough(Exception):
    """A non-retryable provider answer (4xx) that goes back to the client unchanged."""

    def __init__(self, response: Response) -> None:
        self.response = response


class Dispatcher:
    def __init__(self, router: Router) -> None:
        self.router = router

    def candidates(self, snap: Snapshot, decision: Decision, ctx: Context) -> _Candidates:
        return _Candidates(self.router, snap, decision, ctx)

    @staticmethod
    def upstream_body(acc: Accepted, member: ProviderState) -> bytes:
        body = acc.body
        upstream_model = member.config.model_for(acc.model)
        if upstream_model != body["model"]:
            body = {**body, "model": upstream_model}
        return orjson.dumps(body)

    async def unary(
        self, snap: Snapshot, acc: Accepted, decision: Decision, ctx: Context
    ) -> tuple[bytes, dict[str, str]]:
        """The first successful answer's body and headers; raises GatewayError or PassThrough."""
        last: UpstreamFailure | None = None
        path = PATHS[acc.endpoint]
        for member in self.candidates(snap, decision, ctx):
            start = member.member.begin()
            member.requests += 1
            try:
                resp = await member.client.send(
                    path, self.upstream_body(acc, member), None, member.config.timeouts
                )
            except UpstreamFailure as f:
                last = self.record_failure(member, f, ctx, time.monotonic() - start)
                if f.kind in CLIENT_ERRORS:
                    raise PassThrough(self.passthrough_error(f, ctx)) from None
                continue
            except BaseException:
                member.member.release()
                raise
            signal = snap.pools[ctx.pool].config.latency_signal
            total = time.monotonic() - start
            out = completion_tokens(resp.body) if signal == "per_token" else None
            member.member.end(latency_signal(signal, None, total, out))
            return resp.body, resp.headers
        raise self.exhausted(last)

    async def stream(
        self,
        snap: Snapshot,
        acc: Accepted,
        decision: Decision,
        ctx: Context,
        on_complete: OnComplete | None = None,
        on_abort: OnAbort | None = None,
    ) -> StreamingResponse:
        last: UpstreamFailure | None = None
        path = PATHS[acc.endpoint]
        for member in self.candidates(snap, decision, ctx):
            start = member.member.begin()
            member.requests += 1
            try:
                stream = await member.client.open_stream(
                    path, self.upstream_body(acc, member), None, member.config.timeouts
                )
            except UpstreamFailure as f:
                last = self.record_failure(member, f, ctx, time.monotonic() - start)
                if f.kind in CLIENT_ERRORS:
                    raise PassThrough(self.passthrough_error(f, ctx)) from None
                continue
            except BaseException:
                member.member.release()
                raise
            headers = {**stream.headers, **ctx.headers()}
            headers.pop("content-type", None)
            signal = snap.pools[ctx.pool].config.latency_signal
            relay = self.relay(stream, member, ctx, start, signal, on_complete, on_abort)
            return StreamingResponse(relay, media_type="text/event-stream", headers=headers)
        raise self.exhausted(last)

    async def relay(
        self,
        stream: UpstreamStream,
        member: ProviderState,
        ctx: Context,
        start: float,
        signal: SignalKind,
        on_complete: OnComplete | None,
        on_abort: OnAbort | None,
    ) -> AsyncIterator[bytes]:
        """Forward whole SSE events as they arrive; a break mid-stream ends with an error event."""
        splitter = SSESplitter()
        assembler = StreamAssembler() if on_complete is not None else None
        settled = False
        events = 0
        try:
            for ev in splitter.feed(stream.first):
                if assembler is not None:
                    assembler.feed_event(ev)
                events += 1
                yield ev
            async for chunk in stream.chunks():
                for ev in splitter.feed(chunk):
                    if assembler is not None:
                        assembler.feed_event(ev)
                    events += 1
                    yield ev
            settled = True
            total = time.monotonic() - start
            member.member.end(latency_signal(signal, stream.ttft_s, total, events))
        except UpstreamFailure as f:
            settled = True
            self.record_failure(member, f, ctx, time.monotonic() - start)
            err = GatewayError(
                502,
                "The upstream stream broke before it finished.",
                type="upstream_error",
                code=f.kind,
            )
            yield encode_event(err.to_bytes())
        finally:
            if not settled:
                member.member.release()  # the client went away: no verdict on the member
            await stream.aclose()
            if assembler is not None and on_complete is not None and assembler.complete():
                on_complete(orjson.dumps(assembler.to_completion()))
            elif on_abort is not None:
                on_abort()

    # -- recover --------------------------------------------------------------------------------

    @staticmethod
    def record_failure(
        member: ProviderState, f: UpstreamFailure, ctx: Context, elapsed_s: float
    ) -> UpstreamFailure:
        ctx.failures.append(f"{member.name}:{f.kind}")
        if f.kind in CLIENT_ERRORS:
            member.member.release()  # the request's fault, not the member's
        else:
            member.member.end(elapsed_s, ok=False, error_kind=f.kind)
        return f

    @staticmethod
    def passthrough_error(f: UpstreamFailure, ctx: Context) -> Response:
        headers = {**f.headers, **ctx.headers()}
        headers.pop("content-type", None)
        body = f.body
        try:
            parsed: Any = orjson.loads(body)
            ok = isinstance(parsed, dict) and isinstance(parsed.get("error"), dict)
        except orjson.JSONDecodeError:
            ok = False
        if not ok:
            body = GatewayError(
                f.status or 400, "The provider rejected the request.", code="upstream_rejected"
            ).to_bytes()
        return Response(
            body, status_code=f.status or 400, headers=headers, media_type="application/json"
        )

    @staticmethod
    def exhausted(last: UpstreamFailure | None) -> GatewayError:
        if last is None:
            return errors.upstream_error(
                503, "No provider is available for this model right now.", "no_provider_available"
            )
        status, code = _EXHAUSTED_STATUS.get(last.kind, (502, "upstream_error"))
        err = errors.upstream_error(
            status, f"All providers failed for this request (last failure: {last.kind}).", code
        )
        if last.retry_after is not None:
            err.headers["retry-after"] = str(int(last.retry_after + 0.999))
        return err


class _Candidates:
    """Members to try: pool after pool, each member at most once, `max_attempts` per pool."""

    def __init__(self, router: Router, snap: Snapshot, decision: Decision, ctx: Context) -> None:
        self.router, self.snap, self.ctx = router, snap, ctx
        self.chain, self.key = decision.chain, decision.prefix_key
        self.tried: set[str] = set()
        self.pool_i = 0
        self.in_pool = 0

    def __iter__(self) -> _Candidates:
        return self

    def __next__(self) -> ProviderState:
        while self.pool_i < len(self.chain):
            name = self.chain[self.pool_i]
            if self.in_pool < self.snap.policy.pools[name].max_attempts:
                member = self.router.pick(self.snap, name, self.tried, self.key)
                if member is not None:
                    self.in_pool += 1
                    self.tried.add(member.name)
                    self.ctx.pool, self.ctx.provider = name, member.name
                    self.ctx.attempts += 1
                    return member
            self.pool_i += 1
            self.in_pool = 0
        raise StopIteration
