"""One upstream attempt as a scoped object: its bookkeeping cannot be forgotten.

    async with Attempt(member, ctx, admission) as attempt:
        result = await send(member)
        attempt.succeed(latency_s)

Creating it counts the attempt (member in flight, latency clock, the attempt's span). Leaving settles
it exactly once, whichever way the block ends: `succeed` (latency estimate, breaker success),
an `UpstreamFailure` or any other exception (the attempt's failure: breaker, success share,
cool-down; an unexpected exception becomes an `attempt_error` failure, never a 500), cancellation
or a lost race (in-flight count and breaker probe released). A streamed answer outlives the block:
`keep()` hands the open attempt to the stream relay, which settles it when the stream ends.
"""

from __future__ import annotations

import contextlib
import logging
import time
from types import TracebackType

from gateway.context import Context
from gateway.providers.upstream import UpstreamFailure
from gateway.resilience.admission import Admission
from gateway.resilience.failures import FailureKind, failure_kind
from gateway.runtime import ProviderState

log = logging.getLogger("gateway")


def attempt_error(exc: BaseException) -> UpstreamFailure:
    """An unexpected exception inside an attempt, as that attempt's failure (logged once)."""
    log.warning("attempt failed with an unexpected %s", type(exc).__name__, exc_info=exc)
    return UpstreamFailure("attempt_error", type(exc).__name__)


class Attempt:
    __slots__ = ("admission", "ctx", "kept", "member", "settled", "start", "ticket")

    def __init__(self, member: ProviderState, ctx: Context, admission: Admission) -> None:
        self.member, self.ctx, self.admission = member, ctx, admission
        # Created right after the breaker admitted it: whether it is a half-open probe.
        self.ticket = member.breaker.ticket()
        self.start = member.member.begin()
        member.requests += 1
        if ctx.trace is not None:  # the attempt's span (its id goes upstream as traceparent)
            ctx.trace.attempt(ctx.pool, member, ctx.attempts)
        self.settled = False
        self.kept = False

    async def __aenter__(self) -> Attempt:
        return self

    async def __aexit__(
        self,
        et: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        out = self.exit(exc)
        if out is not None and out is not exc:
            raise out from None  # an unexpected exception, as this attempt's failure
        return False

    def exit(self, exc: BaseException | None) -> BaseException | None:
        """Settle for a scope that ends with `exc` (None: normally); returns what to raise."""
        if exc is None:
            if not self.kept:
                self.cancel()  # left without an outcome: free what it holds
            return None
        if isinstance(exc, UpstreamFailure):
            self.fail(exc)
            return exc
        if isinstance(exc, Exception):
            f = attempt_error(exc)
            self.fail(f)
            return f
        self.cancel()  # cancelled (client gone, lost race, server stopping)
        return exc

    def keep(self) -> Attempt:
        """The answer is a stream: the attempt stays open until the relay settles it."""
        self.kept = True
        return self

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.start

    def _settle(self) -> bool:
        if self.settled:
            return False
        self.settled = True
        self.admission.released()
        return True

    def succeed(self, latency_s: float) -> None:
        if not self._settle():
            return
        m = self.member
        m.member.end(latency_s)
        m.breaker.record_success()
        m.auth_failed_at = None

    def fail(self, f: UpstreamFailure) -> None:
        if not self._settle():
            return
        m, ctx = self.member, self.ctx
        ctx.failures.append(f"{m.name}:{f.kind}")
        if ctx.trace is not None:
            ctx.trace.attempt_failed(f)
        kind = failure_kind(f.kind)
        routing = m.member
        if kind is FailureKind.UPSTREAM_4XX or kind is FailureKind.UNSUPPORTED:
            routing.release()  # the request's fault (or the type's reach), not the member's
            m.breaker.release(self.ticket)
            return
        if kind is FailureKind.UPSTREAM_AUTH:
            m.auth_failed_at = time.monotonic()
        # Every other failure, fast or slow, whatever its kind (broken answers included), lowers
        # the member's success share without touching its latency estimate (see
        # Member.fail_fast): a latency penalty would hide the member after a single error, so its
        # breaker would never see the failures it needs to trip, and a recovered member would
        # stay shunned for minutes.
        routing.fail_fast(f.kind)
        m.breaker.record_failure(kind, self.ticket)
        if kind is FailureKind.RATE_LIMITED:
            m.breaker.cool_down(f.retry_after if f.retry_after is not None else 1.0)

    def outrun(self, elapsed_s: float) -> None:
        """Cancelled because another attempt answered first (see Member.outrun)."""
        if self._settle():
            self.member.member.outrun(elapsed_s)
            self.member.breaker.release(self.ticket)

    def cancel(self) -> None:
        if self._settle():
            self.member.member.release()
            self.member.breaker.release(self.ticket)

    def __del__(self) -> None:
        # A kept attempt whose stream was never settled (a bug): free the member's slot rather
        # than leave it in flight forever.
        if not self.settled:
            with contextlib.suppress(Exception):
                self.cancel()
