"""Dispatch and recover: send to members, pool after pool, until one answers.

A retry happens only while nothing has reached the client (for streams: until the first upstream
chunk arrived), only for retryable failures, within the retry budget, after a jittered backoff.
A stream that breaks after it started is resumed on another member when the alias enables it
(the partial answer is sent as a trailing assistant message and the continuation is spliced into
the same client stream); otherwise it ends with an OpenAI-shaped error event.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar
from urllib.parse import urlsplit

import orjson
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from gateway.context import Context
from gateway.errors import GatewayError
from gateway.observability.tracing import upstream_headers
from gateway.pipeline.candidates import (
    Candidates,
    settle_cancelled,
    settle_failure,
    settle_outrun,
    settle_success,
)
from gateway.pipeline.classify import Decision
from gateway.pipeline.router import Router
from gateway.providers.base import UnsupportedEndpoint
from gateway.providers.upstream import UpstreamFailure, UpstreamResponse, UpstreamStream
from gateway.redact import Redactor, sanitize_message
from gateway.resilience.admission import Admission
from gateway.resilience.budget import RetryBudget
from gateway.resilience.failures import failure_kind
from gateway.resilience.hedge import HedgeTracker
from gateway.resilience.retry import Retrier, RetrySettings
from gateway.routing.member import SignalKind, latency_signal
from gateway.runtime import ProviderState, Snapshot
from gateway.wire.answer_checks import InvalidAnswer, StreamCheck, check_unary, completion_tokens
from gateway.wire.chunks import StreamAssembler
from gateway.wire.request import PATHS, Accepted
from gateway.wire.response_model import ModelName, for_alias
from gateway.wire.sse import DONE, EventTooLarge, SSESplitter, encode_event, event_data

log = logging.getLogger("gateway")

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
    "upstream_auth": (502, "upstream_auth_failed"),
    "bad_response": (502, "upstream_bad_response"),
    "unsupported": (400, "unsupported_endpoint"),
}
# What the client reads when the last failure was of this kind (never an upstream's own words).
_EXHAUSTED_MESSAGE = {
    "upstream_auth": "The provider refused the gateway's credentials for this model or does not "
    "serve it. This is a gateway configuration problem, not a problem with your API key.",
    "bad_response": "The provider's answer was not a valid response for this endpoint.",
    "unsupported": "No provider of this model can serve this request (its endpoint or one of "
    "its features, e.g. n > 1 or logprobs, has no counterpart in the provider's API).",
}
# An upstream error field kept in the gateway's error: a short token, never free text.
_TOKEN = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
_PARAM = re.compile(r"^[A-Za-z0-9_.\[\]\-]{1,128}$")

T = TypeVar("T")
Call = Callable[[ProviderState], Awaitable[T]]

# Called with the complete answer (JSON bytes) of a successful request, e.g. to fill the cache.
OnComplete = Callable[[bytes], None]
# Called when a stream ends without a complete answer.
OnAbort = Callable[[], None]


def attempt_error(exc: Exception) -> UpstreamFailure:
    """An unexpected exception inside an attempt, as that attempt's failure (logged once)."""
    log.warning("attempt failed with an unexpected %s", type(exc).__name__, exc_info=exc)
    return UpstreamFailure("attempt_error", type(exc).__name__)


async def _attempt(call: Call[T], member: ProviderState) -> T:
    """One attempt, with any unexpected exception turned into that attempt's failure."""
    try:
        return await call(member)
    except UpstreamFailure:
        raise
    except Exception as e:
        raise attempt_error(e) from None


async def _discard(result: Any) -> None:
    """Free what a losing attempt holds (an open stream's connection)."""
    if isinstance(result, UpstreamStream):
        await result.aclose()


class PassThrough(Exception):
    """A non-retryable provider answer (4xx) for the client, re-wrapped in the gateway's shape."""

    def __init__(self, response: Response) -> None:
        self.response = response


class Exhausted(GatewayError):
    """Every candidate failed or none was available: the pipeline may degrade instead."""


class Dispatcher:
    def __init__(self, router: Router) -> None:
        self.router = router
        self.admission = Admission()
        self.budget = RetryBudget()
        self.hedges = HedgeTracker()
        self._retriers: dict[int, Retrier] = {}
        self._reapers: set[asyncio.Task[None]] = set()

    def retrier(self, snap: Snapshot) -> Retrier:
        r = self._retriers.get(id(snap))
        if r is None:
            # One budget for the process; settings follow the policy version.
            settings = snap.policy.retry
            self.budget.ratio = settings.budget_ratio
            self.budget.min_retries_per_s = settings.budget_min_per_s
            self._retriers = {id(snap): Retrier(settings, self.budget)}
            r = self._retriers[id(snap)]
            self.tune_budget(snap.policy.retry)
        return r

    def tune_budget(self, settings: RetrySettings) -> None:
        """The policy's budget, its floor shared among the gateway processes (the ratio is a
        ratio: each process's retries stay within it of its own requests, so the sum does)."""
        self.budget.ratio = settings.budget_ratio
        self.budget.min_retries_per_s = settings.budget_min_per_s / max(
            1, self.admission.shares.count
        )

    def candidates(self, snap: Snapshot, decision: Decision, ctx: Context) -> Candidates:
        return Candidates(self.router, self.admission, snap, decision, ctx)

    @staticmethod
    def upstream_body(body: dict[str, Any], alias: str, member: ProviderState) -> bytes:
        upstream_model = member.config.model_for(alias)
        if upstream_model != body["model"]:
            body = {**body, "model": upstream_model}
        return orjson.dumps(body)

    async def _next_attempt(self, retrier: Retrier, attempt: int, f: UpstreamFailure) -> bool:
        """After a failed attempt: may we try again? Sleeps the backoff when yes."""
        if f.kind == "unsupported":
            # Nothing was sent (the member's type cannot express the request): the next member
            # is no retry of a failed call, so no backoff and no retry budget.
            return attempt < retrier.settings.max_attempts
        if not retrier.should_retry(attempt, failure_kind(f.kind), bytes_sent_to_client=False):
            return False
        delay = retrier.delay_s(attempt)
        if delay:
            await asyncio.sleep(delay)
        return True

    async def _first_success(
        self, snap: Snapshot, candidates: Candidates, ctx: Context, call: Call[T]
    ) -> tuple[T, ProviderState, float]:
        """Try candidates in turn until `call(member)` succeeds; returns (result, member, start).

        Every failure is settled (breaker, latency estimate, admission); a non-retryable 4xx goes
        back to the client as it is; retries stop when the retrier says so. In a pool that
        hedges, the first attempt may race a second one (see `_race`).
        """
        retrier = self.retrier(snap)
        last: UpstreamFailure | None = None
        attempt = 0
        async for member in candidates:
            attempt += 1
            start = member.member.begin()
            member.requests += 1
            hedge = snap.pools[ctx.pool].config.hedge
            if hedge.enabled:
                if attempt == 1:
                    won, extra = await self._race(snap, candidates, ctx, call, member, start)
                    attempt += extra
                    if not isinstance(won, UpstreamFailure):
                        return won
                    last = won
                    if not await self._next_attempt(retrier, attempt, won):
                        break
                    continue
                pool = ctx.pool
            try:
                try:
                    result = await call(member)
                except UpstreamFailure:
                    raise
                except Exception as e:  # never a 500: a failure of this attempt like any other
                    raise attempt_error(e) from None
            except UpstreamFailure as f:
                last = f
                self._failed(snap, member, f, time.monotonic() - start, ctx)
                if not await self._next_attempt(retrier, attempt, f):
                    break
            except BaseException:
                settle_cancelled(member, self.admission)
                raise
            else:
                if hedge.enabled:
                    self.hedges.observe(pool, time.monotonic() - start)
                return result, member, start
        raise self.exhausted(last, candidates)

    def _failed(
        self,
        snap: Snapshot,
        member: ProviderState,
        f: UpstreamFailure,
        elapsed: float,
        ctx: Context,
    ) -> None:
        """Settle a failed attempt; a provider's 4xx goes back to the client (PassThrough)."""
        settle_failure(member, f, elapsed, ctx, self.admission)
        if f.kind in CLIENT_ERRORS:
            hosts = (urlsplit(member.config.base_url).hostname or "",)
            raise PassThrough(self.passthrough_error(f, ctx, snap.redactor, hosts)) from None

    async def _race(
        self,
        snap: Snapshot,
        candidates: Candidates,
        ctx: Context,
        call: Call[T],
        first: ProviderState,
        start: float,
    ) -> tuple[tuple[T, ProviderState, float] | UpstreamFailure, int]:
        """The first attempt of a request in a hedging pool, and at most one hedge.

        When the first attempt has not answered after the pool's hedge delay, the same request
        goes to a second member (if one is free now and the retry budget allows); the first
        success wins and the other attempt is cancelled. Returns the winner, or the last failure
        when both failed, and the number of hedges sent (0 or 1).
        """
        pool = ctx.pool
        settings = snap.pools[pool].config.hedge
        running: dict[asyncio.Task[T], tuple[ProviderState, float, str]] = {
            asyncio.ensure_future(_attempt(call, first)): (first, start, first.name)
        }
        deadline = start + self.hedges.delay_s(pool, settings)
        hedged = False
        last: UpstreamFailure | None = None
        try:
            while running:
                wait = None if hedged else max(0.0, deadline - time.monotonic())
                done, _ = await asyncio.wait(
                    running, timeout=wait, return_when=asyncio.FIRST_COMPLETED
                )
                if not done:
                    hedged = True
                    second = self._hedge(candidates, pool)
                    if second is not None:
                        ctx.hedged = True
                        task = asyncio.ensure_future(_attempt(call, second))
                        running[task] = (second, second.member.begin(), second.name)
                        second.requests += 1
                    continue
                for task in done:
                    member, began, name = running.pop(task)
                    try:
                        result = task.result()
                    except UpstreamFailure as f:
                        last = f
                        self._failed(snap, member, f, time.monotonic() - began, ctx)
                        continue
                    ctx.pool, ctx.provider = pool, name
                    now = time.monotonic()
                    # The attempts still running took at least this long: counting them keeps
                    # the observed percentile from drifting down to the hedges' quick answers.
                    for _, loser_began, _ in running.values():
                        self.hedges.observe(pool, now - loser_began)
                    self.hedges.observe(pool, now - began)
                    if ctx.hedged:
                        self.hedges.count(pool, won=member is not first)
                    return (result, member, began), int(ctx.hedged)
        finally:
            if running:  # losers and leftovers: cancelled and settled without delaying the winner
                reaper = asyncio.ensure_future(self._reap(snap, ctx, running))
                self._reapers.add(reaper)
                reaper.add_done_callback(self._reapers.discard)
        if ctx.hedged:
            self.hedges.count(pool, won=False)
        assert last is not None
        return last, int(ctx.hedged)

    def _hedge(self, candidates: Candidates, pool: str) -> ProviderState | None:
        """A member for the hedge, if one is free now and the retry budget has a token."""
        if not self.budget.try_spend():
            return None
        return candidates.hedge(pool)

    async def _reap(
        self,
        snap: Snapshot,
        ctx: Context,
        running: dict[asyncio.Task[Any], tuple[ProviderState, float, str]],
    ) -> None:
        """Cancel the attempts that lost a race and settle each exactly once."""
        cancelled_at = time.monotonic()
        # Time to an answer compares with a ttft or total estimate, not with time per token.
        timed = snap.pools[ctx.pool].config.latency_signal != "per_token"
        for task in running:
            task.cancel()
        for task, (member, began, _) in running.items():
            try:
                result = await task
            except UpstreamFailure as f:
                settle_failure(member, f, 0.0, ctx, self.admission)
                continue
            except BaseException:  # noqa: BLE001 - cancelled: the loser of the race
                # Slower than the winner: a slow primary must not keep drawing traffic because
                # its hedges hide its latency (only ever raises the estimate).
                settle_outrun(member, cancelled_at - began if timed else 0.0, self.admission)
                continue
            settle_cancelled(member, self.admission)  # answered too, but later than the winner
            await _discard(result)

    async def unary(
        self, snap: Snapshot, acc: Accepted, decision: Decision, ctx: Context
    ) -> tuple[bytes, dict[str, str]]:
        """The first successful answer's body and headers; raises GatewayError or PassThrough."""
        self.retrier(snap).record_request()
        path = PATHS[acc.endpoint]
        rename = answer_model(snap, acc)

        async def call(m: ProviderState) -> tuple[UpstreamResponse, dict[str, Any]]:
            # Headers per attempt: the trace context names this attempt's span.
            adapter = m.client.adapter
            if adapter.passthrough:
                body = self.upstream_body(acc.body, acc.model, m)
                resp = await m.client.send(
                    path, body, upstream_headers(ctx), m.config.timeouts, acc.max_tokens
                )
            else:
                resp = await self._send_mapped(m, acc, ctx)
            try:
                doc = check_unary(acc.endpoint, resp.body)  # the one parse of the answer
            except InvalidAnswer as e:
                raise UpstreamFailure("bad_response", str(e)) from None
            if snap.redactor:
                resp.body = snap.redactor.bytes(resp.body)
            if rename is not None:
                resp.body = rename(resp.body)
            return resp, doc

        candidates = self.candidates(snap, decision, ctx)
        (resp, doc), member, start = await self._first_success(snap, candidates, ctx, call)
        signal = snap.pools[ctx.pool].config.latency_signal
        total = time.monotonic() - start
        out = completion_tokens(doc) if signal == "per_token" else None
        settle_success(member, latency_signal(signal, None, total, out), self.admission)
        ctx.response_body = resp.body
        return resp.body, resp.headers

    @staticmethod
    async def _send_mapped(m: ProviderState, acc: Accepted, ctx: Context) -> UpstreamResponse:
        """A unary attempt through a mapping adapter: its request, its answer as OpenAI JSON."""
        adapter = m.client.adapter
        if not adapter.supports(acc.endpoint):
            raise UnsupportedEndpoint(m.config.type, acc.endpoint)
        model = m.config.model_for(acc.model)
        req = adapter.request(acc.endpoint, acc.body, model, False)
        headers = upstream_headers(ctx)
        if req.headers:
            headers = {**headers, **req.headers} if headers else req.headers
        resp = await m.client.send(req.path, req.body, headers, m.config.timeouts, acc.max_tokens)
        try:
            resp.body = adapter.response(acc.endpoint, resp.body, model)
        except InvalidAnswer as e:
            raise UpstreamFailure("bad_response", str(e)) from None
        return resp

    async def open_stream(
        self,
        snap: Snapshot,
        body: dict[str, Any],
        alias: str,
        path: str,
        candidates: Candidates,
        ctx: Context,
        endpoint: str = "chat",
    ) -> tuple[UpstreamStream, ProviderState, float]:
        """Open a stream on the first member that delivers a first chunk."""

        def call(m: ProviderState) -> Awaitable[UpstreamStream]:
            adapter = m.client.adapter
            if adapter.passthrough:
                upstream = self.upstream_body(body, alias, m)
                return m.client.open_stream(
                    path, upstream, upstream_headers(ctx), m.config.timeouts
                )
            if not adapter.supports(endpoint):
                raise UnsupportedEndpoint(m.config.type, endpoint)
            model = m.config.model_for(alias)
            req = adapter.request(endpoint, body, model, True)
            headers = upstream_headers(ctx)
            if req.headers:
                headers = {**headers, **req.headers} if headers else req.headers
            translate = adapter.stream(endpoint, body, model)
            return m.client.open_stream(req.path, req.body, headers, m.config.timeouts, translate)

        return await self._first_success(snap, candidates, ctx, call)

    async def stream(
        self,
        snap: Snapshot,
        acc: Accepted,
        decision: Decision,
        ctx: Context,
        on_complete: OnComplete | None = None,
        on_abort: OnAbort | None = None,
    ) -> StreamingResponse:
        self.retrier(snap).record_request()
        candidates = self.candidates(snap, decision, ctx)
        path = PATHS[acc.endpoint]
        stream, member, start = await self.open_stream(
            snap, acc.body, acc.model, path, candidates, ctx, acc.endpoint
        )
        headers = {**stream.headers, **ctx.headers()}
        headers.pop("content-type", None)
        relay = StreamRelay(self, snap, acc, decision, ctx, candidates, on_complete, on_abort)
        return RelayResponse(relay, stream, member, start, headers)

    @staticmethod
    def passthrough_error(
        f: UpstreamFailure,
        ctx: Context,
        redactor: Redactor | None = None,
        hosts: tuple[str, ...] = (),
    ) -> Response:
        """The provider's 4xx for the client, always in the gateway's own error shape.

        The message is sanitised (no secret, token, key, URL or internal host); type, param and
        code are kept only when they are short tokens. A context overflow the token estimate
        missed (the provider counts with its own tokenizer) is rewritten to OpenAI's
        `context_length_exceeded`, whatever shape the provider used (llama.cpp: type
        `exceed_context_size_error` with `n_ctx`; vLLM: a message naming the maximum context
        length), so clients can handle it the same way everywhere.
        """
        headers = {**f.headers, **ctx.headers()}
        headers.pop("content-type", None)
        err = _error_fields(f.body)
        status = f.status or 400
        if err is not None:
            said = " ".join(str(err.get(k) or "") for k in ("type", "code", "message")).lower()
            if "exceed_context_size" in said or re.search(r"context[ _](length|size|window)", said):
                limit = err.get("n_ctx")
                if not isinstance(limit, int):
                    m = re.search(r"context[ _](?:length|size|window)\D{0,24}(\d+)", said)
                    limit = int(m.group(1)) if m else None
                n = err.get("n_prompt_tokens")
                message = (
                    f"This model's maximum context length is {limit} tokens."
                    if limit
                    else "The request exceeds this model's maximum context length."
                )
                if isinstance(n, int):
                    message += f" However, your messages resulted in {n} tokens."
                message += " Please reduce the length of the messages or completion."
                body = GatewayError(
                    400, message, param="messages", code="context_length_exceeded"
                ).to_bytes()
                return Response(body, 400, headers=headers, media_type="application/json")
        message = ""
        if err is not None and isinstance(err.get("message"), str):
            message = sanitize_message(err["message"], redactor, hosts)
        body = GatewayError(
            status,
            message or "The provider rejected the request.",
            type=_token(err, "type") or "invalid_request_error",
            param=_token(err, "param", _PARAM),
            code=_token(err, "code") if err is not None else "upstream_rejected",
        ).to_bytes()
        return Response(body, status_code=status, headers=headers, media_type="application/json")

    @staticmethod
    def exhausted(last: UpstreamFailure | None, candidates: Candidates) -> Exhausted:
        if last is None:
            # Nothing was sent: every member is cooling down, open or drained.
            wait = candidates.retry_after_s()
            if wait is None:
                return Exhausted(
                    503,
                    "No provider is available for this model right now.",
                    type="upstream_error",
                    code="no_provider_available",
                )
            seconds = max(1, math.ceil(wait))
            return Exhausted(
                503,
                "Every provider for this model is cooling down (rate limited) or has its "
                f"circuit open; retry in about {seconds} s.",
                type="upstream_error",
                code="no_provider_available",
                headers={"retry-after": str(seconds)},
            )
        status, code = _EXHAUSTED_STATUS.get(last.kind, (502, "upstream_error"))
        why = _EXHAUSTED_MESSAGE.get(last.kind, "")
        if last.kind == "unsupported":  # no member's type can express this request
            return Exhausted(status, why, type="invalid_request_error", code=code)
        err = Exhausted(
            status,
            f"All providers failed for this request (last failure: {last.kind}). {why}".strip(),
            type="upstream_error",
            code=code,
        )
        if last.retry_after is not None:
            err.headers["retry-after"] = str(int(last.retry_after + 0.999))
        return err


class RelayResponse(StreamingResponse):
    """The client's stream. However sending ends (finished, client gone before or during the
    stream, server stopping), `abandon` settles the attempt and records the request once."""

    def __init__(
        self,
        relay: StreamRelay,
        stream: UpstreamStream,
        member: ProviderState,
        start: float,
        headers: dict[str, str],
    ) -> None:
        super().__init__(
            relay.run(stream, member, start), media_type="text/event-stream", headers=headers
        )
        self.relay = relay
        self._first = (stream, member)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.abandon()

    async def abandon(self) -> None:
        """Idempotent clean-up once sending has ended, whichever way."""
        gen = self.body_iterator
        aclose = getattr(gen, "aclose", None)
        if aclose is not None:
            await aclose()  # suspended mid-stream: runs the relay's own clean-up
        if not self.relay.started:
            stream, member = self._first
            await self.relay.never_started(stream, member)


class StreamRelay:
    """Forwards one client stream: whole SSE events as they arrive, resuming on breaks."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        snap: Snapshot,
        acc: Accepted,
        decision: Decision,
        ctx: Context,
        candidates: Candidates,
        on_complete: OnComplete | None,
        on_abort: OnAbort | None,
    ) -> None:
        self.d, self.snap, self.acc, self.decision, self.ctx = dispatcher, snap, acc, decision, ctx
        self.candidates = candidates
        self.on_complete, self.on_abort = on_complete, on_abort
        self.resume = decision.alias.resume and acc.endpoint == "chat"
        self.rename = answer_model(snap, acc)
        self.assembler = StreamAssembler() if (on_complete is not None or self.resume) else None
        self.resumed_from: str | None = None
        self._partial_tokens = 0  # output already sent when the stream was last resumed
        self._broken: UpstreamFailure | None = None
        self.started = False
        self._settled_unstarted = False
        self._fwd: AsyncGenerator[bytes, None] | None = None

    async def never_started(self, stream: UpstreamStream, member: ProviderState) -> None:
        """The client went away before the first byte was sent: free the attempt, record."""
        if self.started or self._settled_unstarted:
            return
        self._settled_unstarted = True
        settle_cancelled(member, self.d.admission)
        await stream.aclose()
        if self.on_abort is not None:
            self.on_abort()
        if self.ctx.status == 200:
            self.ctx.status = 499
        self.ctx.done()

    async def run(
        self, stream: UpstreamStream, member: ProviderState, start: float
    ) -> AsyncIterator[bytes]:
        self.started = True
        completed = False
        try:
            while True:
                fwd = self._fwd = self._forward(stream, member, start)
                async for ev in fwd:
                    yield ev
                if self._broken is None:
                    completed = True
                    break
                broke = self._broken
                reopened = await self._reopen(broke) if self.resume else None
                if reopened is None:
                    err = GatewayError(
                        502,
                        "The upstream stream was invalid and was cut."
                        if broke.kind == "bad_response"
                        else "The upstream stream broke before it finished.",
                        type="upstream_error",
                        code=broke.kind,
                    )
                    yield encode_event(err.to_bytes())
                    break
                stream, member, start = reopened
        except Exception as e:  # resuming failed unexpectedly: end the stream in shape
            log.warning("stream relay failed: %s", type(e).__name__, exc_info=e)
            err = GatewayError(502, "The upstream stream broke.", code="attempt_error")
            yield encode_event(err.to_bytes())
        finally:
            if self._fwd is not None:
                await self._fwd.aclose()  # settles the attempt now, not when collected
            asm = self.assembler
            if completed and asm is not None and self.on_complete is not None and asm.complete():
                self.on_complete(orjson.dumps(asm.to_completion()))
            elif self.on_abort is not None:
                self.on_abort()
            if not completed and self.ctx.status == 200:
                self.ctx.status = 502 if self._broken is not None else 499
            self.ctx.done()

    async def _forward(
        self, stream: UpstreamStream, member: ProviderState, start: float
    ) -> AsyncGenerator[bytes, None]:
        """Relay one upstream stream; sets self._broken when it fails mid-way."""
        self._broken: UpstreamFailure | None = None
        limits = member.config.limits
        splitter = SSESplitter(limits.max_event_bytes)
        check = StreamCheck(limits, self.snap.redactor or None)
        signal: SignalKind = self.snap.pools[self.ctx.pool].config.latency_signal
        events = 0
        settled = False
        continuation = self.resumed_from is not None
        gov = self.ctx.governance
        watch = gov if gov is not None and gov.watch_stream else None
        rename = self.rename
        try:
            chunks = _prepend(stream.first, stream.chunks())
            async for chunk in chunks:
                check.count(len(chunk))
                out: list[bytes] = []
                for ev in splitter.feed(chunk):
                    if check.done:
                        continue  # nothing after the end marker
                    ev = check.event(ev)
                    if rename is not None:
                        ev = rename(ev)
                    if continuation:
                        ev = self._splice(ev)
                        if ev is None:
                            continue
                    if self.assembler is not None:
                        self.assembler.feed_event(ev)
                    if watch is not None:
                        ev = watch.stream_event(ev)  # usage for limits and spend
                        if ev is None:
                            continue
                    out.append(ev)
                if not out:
                    continue
                events += len(out)
                if self.ctx.ttft_s is None:
                    self.ctx.ttft_s = time.perf_counter() - self.ctx.start
                # Events that arrived together leave together: one write instead of one each.
                yield out[0] if len(out) == 1 else b"".join(out)
            if not check.done:
                if not check.finished or splitter.tail().strip():
                    raise InvalidAnswer("the stream ended without [DONE]")
                # The provider's own final chunk but no `[DONE]`: clients still get their end.
                if self.assembler is not None:
                    self.assembler.feed_event(DONE)
                yield DONE
            settled = True
            total = time.monotonic() - start
            settle_success(
                member, latency_signal(signal, stream.ttft_s, total, events), self.d.admission
            )
        except (InvalidAnswer, EventTooLarge) as e:
            settled = True
            f = UpstreamFailure("bad_response", str(e))
            settle_failure(member, f, time.monotonic() - start, self.ctx, self.d.admission)
            self._broken = f
        except Exception as e:
            # An unexpected exception while relaying is this attempt's failure too: resumed on
            # another member or ended with an error event, never a cut connection.
            f = e if isinstance(e, UpstreamFailure) else attempt_error(e)
            settled = True
            settle_failure(member, f, time.monotonic() - start, self.ctx, self.d.admission)
            self._broken = f
        finally:
            if not settled:
                settle_cancelled(member, self.d.admission)  # the client went away
            self.ctx.output_chunks += events
            await stream.aclose()

    async def _reopen(
        self, broke: UpstreamFailure
    ) -> tuple[UpstreamStream, ProviderState, float] | None:
        """Ask another member to continue the partial answer; None when nothing can."""
        asm = self.assembler
        if asm is None or len(asm.choices) > 1:
            return None
        retrier = self.d.retrier(self.snap)
        if not retrier.should_retry(
            self.ctx.attempts, failure_kind(broke.kind), bytes_sent_to_client=False
        ):
            return None
        partial = asm.content(0)
        # Words emitted so far approximate the tokens already spent.
        self._partial_tokens = len(partial.split())
        body = dict(self.acc.body)
        body["messages"] = [*body["messages"], {"role": "assistant", "content": partial}]
        if self.acc.max_tokens:
            remaining = max(1, self.acc.max_tokens - self._partial_tokens)
            body.pop("max_completion_tokens", None)
            body["max_tokens"] = remaining
        self.resumed_from = self.ctx.provider
        self.ctx.resumed = True
        try:
            return await self.d.open_stream(
                self.snap, body, self.acc.model, PATHS["chat"], self.candidates, self.ctx
            )
        except (GatewayError, PassThrough):
            return None

    def _splice(self, ev: bytes) -> bytes | None:
        """Rewrite a continuation event so the client sees one stream.

        Same id/created/model as the first part, no second role chunk, usage counting the whole
        answer, and a `gateway_resumed` marker on the finishing chunk and the usage chunk.
        """
        data = event_data(ev)
        if data is None or data == b"[DONE]":
            return ev
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError:
            return ev
        meta = self.assembler.meta if self.assembler is not None else {}
        for k in ("id", "created", "model"):
            if meta.get(k) is not None:
                chunk[k] = meta[k]
        choices = chunk.get("choices") or []
        for c in choices:
            delta = c.get("delta") or {}
            delta.pop("role", None)
            if delta.get("content") == "" and len(delta) == 1:
                del delta["content"]
            if not delta and not c.get("finish_reason"):
                return None  # the continuation's own role chunk
        usage = chunk.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            # The part sent before the break counts as output, not as the continuation's prompt.
            usage["completion_tokens"] += self._partial_tokens
            usage["prompt_tokens"] = max(0, usage.get("prompt_tokens", 0) - self._partial_tokens)
        if usage or any(c.get("finish_reason") for c in choices):
            chunk["gateway_resumed"] = {"from": self.resumed_from, "on": self.ctx.provider}
        return encode_event(orjson.dumps(chunk))


def answer_model(snap: Snapshot, acc: Accepted) -> ModelName | None:
    """The `model` rewrite of the client's alias (its `response_model` setting)."""
    alias = snap.policy.models.get(acc.model)
    return for_alias(alias.response_model, acc.model) if alias is not None else None


def _error_fields(body: bytes) -> dict[str, Any] | None:
    """The error object of an upstream error body in any common shape, else None.

    OpenAI `{"error": {...}}`, vLLM `{"object": "error", "message": ...}`, `{"error": "text"}`,
    FastAPI `{"detail": "text"}`.
    """
    try:
        parsed: Any = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(parsed, dict):
        return None
    err = parsed.get("error")
    if isinstance(err, dict):
        return err
    if isinstance(err, str):
        return {"message": err}
    if isinstance(parsed.get("message"), str):
        return parsed
    if isinstance(parsed.get("detail"), str):
        return {"message": parsed["detail"]}
    return None


def _token(err: dict[str, Any] | None, key: str, pattern: re.Pattern[str] = _TOKEN) -> str | None:
    value = err.get(key) if err is not None else None
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    return value if isinstance(value, str) and pattern.match(value) else None


async def _prepend(first: bytes, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    yield first
    async for chunk in rest:
        yield chunk
