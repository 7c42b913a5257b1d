"""Failover (innermost): pools in order, members within a pool, retries within the budget, hedges.

A retry happens only while nothing has reached the client (for streams: until the first upstream
chunk arrived), only for retryable failures, within the retry budget, after a jittered backoff.
Each member tried is a scoped `Attempt`; the provider's adapter does the talking (`send`,
`open_stream`), whatever the provider's wire format.

The request's deadline (gateway.pipeline.deadline), when it has one, bounds all of it until the
answer starts: each attempt runs under what is left of it (one cut short is settled as outrun,
like a hedge's loser, and the request answers 504 DeadlineExceeded), a backoff wait that would
not leave time for another attempt is not started (the request ends with the last failure, as
when its retries are used up), and queue waits and hedges stop at it. A stream is bound only
until it opened (its first chunk): from then on its own idle_s/total_s apply, resumes included.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar
from urllib.parse import urlsplit

from starlette.responses import Response

from gateway.context import Context
from gateway.observability.tracing import stage, upstream_headers
from gateway.pipeline.attempt import Attempt
from gateway.pipeline.call import Call
from gateway.pipeline.candidates import Candidates
from gateway.pipeline.client_errors import (
    CLIENT_ERRORS,
    PassThrough,
    exhausted,
    passthrough_error,
)
from gateway.pipeline.deadline import Deadline, request_deadline
from gateway.pipeline.deadline_exceeded import DeadlineExceeded
from gateway.pipeline.relay import RelayResponse, StreamRelay
from gateway.pipeline.router import Router
from gateway.pipeline.stage import Next
from gateway.providers.upstream import UpstreamFailure, UpstreamResponse, UpstreamStream
from gateway.resilience.admission import Admission
from gateway.resilience.budget import RetryBudget
from gateway.resilience.failures import failure_kind
from gateway.resilience.hedge import HedgeTracker
from gateway.resilience.retry import MIN_ATTEMPT_S, Retrier, RetrySettings
from gateway.routing.decision import Decision
from gateway.routing.member import latency_signal
from gateway.runtime import ProviderState, Snapshot
from gateway.wire.answer_checks import (
    InvalidAnswer,
    check_unary,
    completion_tokens,
    usage_counts,
)
from gateway.wire.request import ParsedRequest

JSON = "application/json"
T = TypeVar("T")
Send = Callable[[ProviderState], Awaitable[T]]


async def _try(send: Send[T], attempt: Attempt, limit: asyncio.Timeout | None = None) -> T:
    """One attempt in its scope: a failure settles it; an answer leaves it open for the winner.

    (`async with attempt` spelled out: two coroutines fewer on the hot path.) Cut short by the
    request's deadline (`limit`), it is settled as outrun: slower than the request could wait,
    which raises the member's latency estimate without counting as the member's failure.
    """
    try:
        result = await send(attempt.member)
    except BaseException as e:
        if limit is not None and isinstance(e, asyncio.CancelledError) and limit.expired():
            attempt.outrun(attempt.elapsed_s)
        out = attempt.exit(e)
        if out is e:
            raise
        raise out from None  # type: ignore[misc]
    attempt.keep()
    return result


def _telling(last: UpstreamFailure | None, f: UpstreamFailure) -> UpstreamFailure:
    """The failure the client is told about: the latest, except that a member that could not
    express the request (`unsupported`, nothing sent) never hides a member that could and failed
    (a 503 must not become a 400 "no provider can serve this" because of the order tried)."""
    if f.kind == "unsupported" and last is not None and last.kind != "unsupported":
        return last
    return f.with_traceback(None)  # kept: its frames would hold the attempt


async def _discard(result: Any) -> None:
    """Free what a losing attempt holds (an open stream's connection)."""
    if isinstance(result, UpstreamStream):
        await result.aclose()


class Failover:
    name = "failover"

    def __init__(self, router: Router) -> None:
        self.router = router
        self.admission = Admission()
        self.budget = RetryBudget()
        self.hedges = HedgeTracker()
        self._retriers: dict[int, Retrier] = {}
        self._reapers: set[asyncio.Task[None]] = set()

    async def __call__(self, call: Call, next: Next | None = None) -> Response:
        ctx, acc, snap, decision = call.ctx, call.sent, call.snap, call.decision
        # The serving alias's own deadline (after a long prompt's hop to its longer-context
        # alias: that alias's, as it is the one whose members answer).
        model = (decision.alias_name, decision.alias.deadline_s)
        deadline = request_deadline(snap.policy.retry.deadline_s, call.headers, ctx, model)
        with stage(ctx, "route"):
            if acc.stream:
                return await self.stream(snap, acc, decision, ctx, call.want_completion, deadline)
            body, headers = await self.unary(snap, acc, decision, ctx, deadline)
        return Response(body, headers={**headers, **ctx.headers()}, media_type=JSON)

    def retrier(self, snap: Snapshot) -> Retrier:
        r = self._retriers.get(id(snap))
        if r is None:
            # One budget for the process; settings follow the policy version.
            self._retriers = {id(snap): Retrier(snap.policy.retry, self.budget)}
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

    def candidates(
        self, snap: Snapshot, decision: Decision, ctx: Context, deadline: Deadline | None = None
    ) -> Candidates:
        return Candidates(self.router, self.admission, snap, decision, ctx, deadline)

    # -- unary ----------------------------------------------------------------------------------

    async def unary(
        self,
        snap: Snapshot,
        acc: ParsedRequest,
        decision: Decision,
        ctx: Context,
        deadline: Deadline | None = None,
    ) -> tuple[bytes, dict[str, str]]:
        """The first successful answer's body and headers; raises GatewayError or PassThrough."""
        self.retrier(snap).record_request()
        rename = snap.answer_model(acc.model)
        endpoint = acc.endpoint
        # The alias the request is routed as (a longer-context alias when the prompt did not
        # fit the one asked for): its model id is the one each member is sent.
        routed = decision.alias_name

        async def send(m: ProviderState) -> tuple[UpstreamResponse, dict[str, Any]]:
            # Headers per attempt: the trace context names this attempt's span.
            resp = await m.client.adapter.send(
                m.client,
                endpoint,
                acc.body,
                m.config.model_for(routed),
                upstream_headers(ctx),
                m.config.timeouts,
                acc.max_tokens,
            )
            try:
                doc = check_unary(endpoint, resp.body)  # the one parse of the answer
            except InvalidAnswer as e:
                raise UpstreamFailure("bad_response", str(e)) from None
            if snap.redactor:
                resp.body = snap.redactor.json(resp.body, doc)
            if rename is not None:
                resp.body = rename(resp.body)
            return resp, doc

        candidates = self.candidates(snap, decision, ctx, deadline)
        (resp, doc), attempt = await self._first_success(snap, candidates, ctx, send)
        signal = snap.pools[ctx.pool].config.latency_signal
        out = completion_tokens(doc) if signal == "per_token" else None
        attempt.succeed(latency_signal(signal, None, attempt.elapsed_s, out))
        ctx.response_body = resp.body
        if isinstance(doc.get("usage"), dict):  # read here, where the answer is parsed anyway
            ctx.usage = usage_counts(doc["usage"])
        return resp.body, resp.headers

    # -- streams --------------------------------------------------------------------------------

    async def stream(
        self,
        snap: Snapshot,
        acc: ParsedRequest,
        decision: Decision,
        ctx: Context,
        keep_completion: bool = False,
        deadline: Deadline | None = None,
    ) -> RelayResponse:
        self.retrier(snap).record_request()
        candidates = self.candidates(snap, decision, ctx, deadline)
        stream, attempt = await self.open_stream(
            snap, acc.body, decision.alias_name, acc.endpoint, candidates, ctx
        )
        candidates.deadline = None  # committed: the stream's own limits apply from here
        headers = {**stream.headers, **ctx.headers()}
        headers.pop("content-type", None)
        relay = StreamRelay(self, snap, acc, decision, ctx, candidates, keep_completion)
        return RelayResponse(relay, stream, attempt, headers)

    async def open_stream(
        self,
        snap: Snapshot,
        body: dict[str, Any],
        alias: str,
        endpoint: str,
        candidates: Candidates,
        ctx: Context,
    ) -> tuple[UpstreamStream, Attempt]:
        """Open a stream on the first member that delivers a first chunk; the attempt stays
        open (the relay settles it when the stream ends)."""

        def send(m: ProviderState) -> Awaitable[UpstreamStream]:
            return m.client.adapter.open_stream(
                m.client,
                endpoint,
                body,
                m.config.model_for(alias),
                upstream_headers(ctx),
                m.config.timeouts,
            )

        return await self._first_success(snap, candidates, ctx, send)

    # -- trying members -------------------------------------------------------------------------

    async def _next_attempt(
        self, retrier: Retrier, attempt: int, f: UpstreamFailure, deadline: Deadline | None
    ) -> bool:
        """After a failed attempt: may we try again? Sleeps the backoff when yes."""
        if f.kind == "unsupported":
            # Nothing was sent (the member's type cannot express the request): the next member
            # is no retry of a failed call, so no backoff, no retry budget, and (`attempt`
            # counts calls sent) no attempt used.
            return attempt < retrier.settings.max_attempts
        if not retrier.should_retry(attempt, failure_kind(f.kind), bytes_sent_to_client=False):
            return False
        delay = retrier.delay_s(attempt, left_s=None if deadline is None else deadline.left_s())
        if delay is None:  # the wait would leave the deadline no time for another attempt
            self.budget.refund()
            return False
        if delay:
            await asyncio.sleep(delay)
        return True

    async def _first_success(
        self, snap: Snapshot, candidates: Candidates, ctx: Context, send: Send[T]
    ) -> tuple[T, Attempt]:
        """Try candidates in turn until `send(member)` succeeds; returns the answer and its
        still open attempt.

        A non-retryable 4xx goes back to the client as it is; retries stop when the retrier says
        so. In a pool that hedges, the first attempt may race a second one (see `_race`).
        """
        retrier = self.retrier(snap)
        deadline = candidates.deadline
        last: UpstreamFailure | None = None
        number = 0
        unsent = 0  # members that could not express the request: nothing was sent to them
        owed = False  # a retry token was spent for the next attempt, not made yet
        try:
            async for member in candidates:
                owed = False
                number += 1
                hedge = snap.pools[ctx.pool].config.hedge
                pool = ctx.pool
                if hedge.enabled and number == 1:
                    won, extra = await self._race(snap, candidates, ctx, send, member)
                    number += extra
                    if not isinstance(won, UpstreamFailure):
                        return won
                    failed = won
                else:
                    attempt = candidates.attempt(member)
                    try:
                        if deadline is None:
                            result = await _try(send, attempt)
                        else:
                            async with asyncio.timeout(deadline.left_s()) as limit:
                                result = await _try(send, attempt, limit)
                    except UpstreamFailure as f:
                        failed = f.with_traceback(None)  # kept: its frames would hold this one
                        self._client_error(snap, member, f, ctx)
                    except TimeoutError:  # only the deadline's: _try turns others into failures
                        assert deadline is not None
                        raise DeadlineExceeded(deadline, ctx.attempts) from None
                    else:
                        if hedge.enabled:
                            self.hedges.observe(pool, attempt.elapsed_s)
                        return result, attempt
                last = _telling(last, failed)
                owed = failed.kind != "unsupported"  # spent below when it says yes
                if failed.kind == "unsupported":
                    unsent += 1
                    candidates.unsent()
                sent = number - unsent
                if not await self._next_attempt(retrier, sent, failed, deadline):
                    owed = False  # this failure decides
                    break
        finally:
            if owed:  # no member was left to retry on (or the wait for one ended): not a retry
                self.budget.refund()
        if candidates.expired:
            assert deadline is not None
            raise DeadlineExceeded(deadline, ctx.attempts)
        raise exhausted(last, candidates)

    @staticmethod
    def _client_error(
        snap: Snapshot, member: ProviderState, f: UpstreamFailure, ctx: Context
    ) -> None:
        """A provider's 4xx goes back to the client (PassThrough) instead of being retried."""
        if f.kind in CLIENT_ERRORS:
            hosts = (urlsplit(member.config.base_url).hostname or "",)
            raise PassThrough(passthrough_error(f, ctx, snap.redactor, hosts)) from None

    async def _race(
        self,
        snap: Snapshot,
        candidates: Candidates,
        ctx: Context,
        send: Send[T],
        first: ProviderState,
    ) -> tuple[tuple[T, Attempt] | UpstreamFailure, int]:
        """The first attempt of a request in a hedging pool, and at most one hedge.

        When the first attempt has not answered after the pool's hedge delay, the same request
        goes to a second member (if one is free now and the retry budget allows); the first
        success wins and the other attempt is cancelled. Returns the winner, or the last failure
        when both failed, and the number of hedges sent (0 or 1). When the request's deadline
        comes first, both are cut (outrun) and DeadlineExceeded is raised; no hedge is sent with
        less than MIN_ATTEMPT_S of it left.
        """
        pool = ctx.pool
        settings = snap.pools[pool].config.hedge
        primary = candidates.attempt(first)
        running: dict[asyncio.Task[T], Attempt] = {
            asyncio.ensure_future(_try(send, primary)): primary
        }
        hedge_at = primary.start + self.hedges.delay_s(pool, settings)
        limit = candidates.deadline
        end = None if limit is None else limit.at
        hedged = False
        last: UpstreamFailure | None = None
        try:
            while running:
                now = time.monotonic()
                wait = None if hedged else max(0.0, hedge_at - now)
                ends = end is not None and (wait is None or end <= hedge_at)
                if end is not None and ends:
                    wait = max(0.0, end - now)
                done, _ = await asyncio.wait(
                    running, timeout=wait, return_when=asyncio.FIRST_COMPLETED
                )
                if not done and ends:
                    assert limit is not None
                    if ctx.hedged:
                        self.hedges.count(pool, won=False)
                    raise DeadlineExceeded(limit, ctx.attempts)
                if not done:
                    hedged = True
                    if end is not None and end - time.monotonic() < MIN_ATTEMPT_S:
                        continue  # too late for a hedge to answer in time
                    second = self._hedge(candidates, pool)
                    if second is not None:
                        ctx.hedged = True
                        extra = candidates.attempt(second)
                        running[asyncio.ensure_future(_try(send, extra))] = extra
                    continue
                for task in done:
                    attempt = running.pop(task)
                    try:
                        result = task.result()
                    except UpstreamFailure as f:
                        last = _telling(last, f)
                        self._client_error(snap, attempt.member, f, ctx)
                        continue
                    ctx.pool, ctx.provider = pool, attempt.member.name
                    now = time.monotonic()
                    # The attempts still running took at least this long: counting them keeps
                    # the observed percentile from drifting down to the hedges' quick answers.
                    for loser in running.values():
                        self.hedges.observe(pool, now - loser.start)
                    self.hedges.observe(pool, now - attempt.start)
                    if ctx.hedged:
                        self.hedges.count(pool, won=attempt is not primary)
                    return (result, attempt), int(ctx.hedged)
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
        """A member for the hedge, if one is free now and the retry budget has a token.

        The token is spent only when a hedge goes out: a slow request with no second member
        free (a pool of one, the others open or full) must not drain the budget that the
        process's real retries live on.
        """
        if not self.budget.has_room():
            return None
        member = candidates.hedge(pool)
        if member is not None:
            self.budget.try_spend()
        return member

    async def _reap(
        self, snap: Snapshot, ctx: Context, running: dict[asyncio.Task[Any], Attempt]
    ) -> None:
        """Cancel the attempts that lost a race; each is settled exactly once."""
        cancelled_at = time.monotonic()
        # Time to an answer compares with a ttft or total estimate, not with time per token.
        timed = snap.pools[ctx.pool].config.latency_signal != "per_token"
        for task, attempt in running.items():
            if task.done():
                continue  # failed (settled by its scope) or answered late (below)
            # Slower than the winner: a slow primary must not keep drawing traffic because its
            # hedges hide its latency (only ever raises the estimate).
            attempt.outrun(cancelled_at - attempt.start if timed else 0.0)
            task.cancel()
        for task, attempt in running.items():
            try:
                result = await task
            except BaseException:  # noqa: BLE001, S112 - failed or cancelled: settled already
                continue
            attempt.cancel()  # answered too, but later than the winner
            await _discard(result)
