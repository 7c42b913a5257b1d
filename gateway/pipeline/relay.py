"""The client's stream: whole SSE events as they arrive from the open attempt, resumed on another
member when it breaks (if the alias enables it), settled and closed however it ends.

A stream that breaks after it started is resumed on another member when the alias enables it
(the partial answer is sent as a trailing assistant message and the continuation is spliced into
the same client stream); otherwise it ends with an OpenAI-shaped error event.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, Protocol

import orjson

from gateway.context import Context
from gateway.errors import GatewayError
from gateway.pipeline.attempt import Attempt, attempt_error
from gateway.pipeline.candidates import Candidates
from gateway.pipeline.client_errors import PassThrough
from gateway.pipeline.reply import StreamReply
from gateway.providers.upstream import UpstreamFailure, UpstreamStream
from gateway.resilience.failures import failure_kind
from gateway.resilience.retry import Retrier
from gateway.routing.decision import Decision
from gateway.routing.member import SignalKind, latency_signal
from gateway.runtime import Snapshot
from gateway.wire.answer_checks import InvalidAnswer, StreamCheck
from gateway.wire.chunks import StreamAssembler
from gateway.wire.request import ParsedRequest
from gateway.wire.sse import (
    DONE,
    EventTooLarge,
    SSESplitter,
    encode_event,
    event_data,
    split_events,
)

log = logging.getLogger("gateway")


class Reopen(Protocol):
    """What a relay asks of the failover stage to resume a broken stream on another member."""

    def retrier(self, snap: Snapshot) -> Retrier: ...

    async def open_stream(
        self,
        snap: Snapshot,
        body: dict[str, Any],
        alias: str,
        endpoint: str,
        candidates: Candidates,
        ctx: Context,
    ) -> tuple[UpstreamStream, Attempt]: ...


class RelayResponse(StreamReply):
    """The client's stream; `completion` is the whole answer once it completed (for the cache)."""

    def __init__(
        self, relay: StreamRelay, stream: UpstreamStream, attempt: Attempt, headers: dict[str, str]
    ) -> None:
        super().__init__(relay.run(stream, attempt), headers)
        self.relay = relay
        self._first = (stream, attempt)

    @property
    def completion(self) -> bytes | None:
        return self.relay.completion

    async def closed(self) -> None:
        if not self.relay.started:
            stream, attempt = self._first
            await self.relay.never_started(stream, attempt)


class StreamRelay:
    """Forwards one client stream: whole SSE events as they arrive, resuming on breaks."""

    def __init__(
        self,
        failover: Reopen,
        snap: Snapshot,
        acc: ParsedRequest,
        decision: Decision,
        ctx: Context,
        candidates: Candidates,
        keep_completion: bool,
    ) -> None:
        self.f, self.snap, self.acc, self.decision, self.ctx = failover, snap, acc, decision, ctx
        self.candidates = candidates
        self.keep_completion = keep_completion
        self.resume = decision.alias.resume and acc.endpoint == "chat"
        self.rename = snap.answer_model(acc.model)
        self.assembler = StreamAssembler(acc.endpoint) if (keep_completion or self.resume) else None
        self.completion: bytes | None = None
        self.resumed_from: str | None = None
        self._partial_tokens = 0  # output already sent when the stream was last resumed
        self._broken: UpstreamFailure | None = None
        self.started = False
        self._fwd: AsyncGenerator[bytes, None] | None = None

    async def never_started(self, stream: UpstreamStream, attempt: Attempt) -> None:
        """The client went away before the first byte was sent: free the attempt."""
        attempt.cancel()
        await stream.aclose()
        if self.ctx.status == 200:
            self.ctx.status = 499

    async def run(self, stream: UpstreamStream, attempt: Attempt) -> AsyncIterator[bytes]:
        self.started = True
        completed = False
        try:
            while True:
                fwd = self._fwd = self._forward(stream, attempt)
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
                stream, attempt = reopened
        except Exception as e:  # resuming failed unexpectedly: end the stream in shape
            log.warning("stream relay failed: %s", type(e).__name__, exc_info=e)
            err = GatewayError(502, "The upstream stream broke.", code="attempt_error")
            yield encode_event(err.to_bytes())
        finally:
            if self._fwd is not None:
                await self._fwd.aclose()  # settles the attempt now, not when collected
            asm = self.assembler
            if completed and asm is not None and self.keep_completion and asm.complete():
                self.completion = orjson.dumps(asm.to_completion())
            if not completed and self.ctx.status == 200:
                self.ctx.status = 502 if self._broken is not None else 499

    async def _forward(
        self, stream: UpstreamStream, attempt: Attempt
    ) -> AsyncGenerator[bytes, None]:
        """Relay one upstream stream; sets self._broken when it fails mid-way."""
        self._broken = None
        limits = attempt.member.config.limits
        splitter = SSESplitter(limits.max_event_bytes)
        check = StreamCheck(limits, self.snap.redactor or None, self.acc.endpoint)
        signal: SignalKind = self.snap.pools[self.ctx.pool].config.latency_signal
        events = 0
        continuation = self.resumed_from is not None
        gov = self.ctx.governance
        watch = gov if gov is not None and gov.watch_stream else None
        # A stream whose client asked for usage, assembled anyway (cache, resume): its usage is
        # read once from the assembled answer at the end instead of event by event.
        usage_at_end = (
            watch
            if watch is not None and not watch.hide_usage and self.assembler is not None
            else None
        )
        if usage_at_end is not None:
            watch = None
        rename = self.rename
        try:
            chunks = _prepend(stream.first, stream.chunks())
            # Each read's whole events are handled as one block: checked, renamed and kept at
            # once; the events are split apart only when something needs them one by one.
            one_by_one = continuation or watch is not None
            async for chunk in chunks:
                check.count(len(chunk))
                block = splitter.feed_block(chunk)
                if not block or check.done:
                    continue  # an event still incomplete, or anything after the end marker
                n = -1 if one_by_one else check.block(block)
                if n >= 0:
                    if rename is not None:
                        renamed = rename.block(block, n - check.done)
                        if renamed is None:
                            renamed = b"".join(map(rename, split_events(block)))
                        block = renamed
                    if self.assembler is not None:
                        self.assembler.feed(block)
                else:
                    out = check.events(split_events(block))
                    if rename is not None:
                        out = [rename(ev) for ev in out]
                    if continuation:
                        out = [ev for ev in map(self._splice, out) if ev is not None]
                    if self.assembler is not None:
                        self.assembler.feed(out)
                    if watch is not None:
                        out = [kept for kept in map(watch.stream_event, out) if kept is not None]
                    if not out:
                        continue
                    # Events that arrived together leave together: one write instead of one each.
                    n, block = len(out), b"".join(out)
                events += n
                if self.ctx.ttft_s is None:
                    self.ctx.ttft_s = time.perf_counter() - self.ctx.start
                yield block
            if check.chunks == 0:
                raise InvalidAnswer("the stream held no chunk")
            if not check.done:
                if not check.finished or splitter.tail().strip():
                    raise InvalidAnswer("the stream ended without [DONE]")
                # The provider's own final chunk but no `[DONE]`: clients still get their end.
                if self.assembler is not None:
                    self.assembler.feed_event(DONE)
                yield DONE
            if usage_at_end is not None and self.assembler is not None:
                usage_at_end.take_usage(self.assembler.usage)
            attempt.succeed(latency_signal(signal, stream.ttft_s, attempt.elapsed_s, events))
        except (InvalidAnswer, EventTooLarge) as e:
            f = UpstreamFailure("bad_response", str(e))
            attempt.fail(f)
            self._broken = f
            held = check.flush_held()
            if held:  # words held back for a possible key: they were the answer's
                if self.assembler is not None:
                    self.assembler.feed(held)
                yield held
        except Exception as e:
            if check.done:
                # The provider failed after its end marker went out (a late event, a dropped
                # connection): the client has the whole answer, and an error event after its
                # end would turn it into a failure.
                log.info("upstream stream failed after its end marker (%s)", type(e).__name__)
                if usage_at_end is not None and self.assembler is not None:
                    usage_at_end.take_usage(self.assembler.usage)
                attempt.succeed(latency_signal(signal, stream.ttft_s, attempt.elapsed_s, events))
                return
            # An unexpected exception while relaying is this attempt's failure too: resumed on
            # another member or ended with an error event, never a cut connection.
            f = e if isinstance(e, UpstreamFailure) else attempt_error(e)
            attempt.fail(f)
            self._broken = f.with_traceback(None)  # kept: its frames hold this relay
            held = check.flush_held()
            if held:  # words held back for a possible key: they were the answer's
                if self.assembler is not None:
                    self.assembler.feed(held)
                yield held
        finally:
            attempt.cancel()  # the client went away (a no-op once settled)
            self.ctx.output_chunks += events
            await stream.aclose()

    async def _reopen(self, broke: UpstreamFailure) -> tuple[UpstreamStream, Attempt] | None:
        """Ask another member to continue the partial answer; None when nothing can."""
        asm = self.assembler
        if asm is None or len(asm.choices) > 1:
            return None
        retrier = self.f.retrier(self.snap)
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
        tried = self.ctx.attempts
        try:
            return await self.f.open_stream(
                self.snap, body, self.decision.alias_name, "chat", self.candidates, self.ctx
            )
        except (GatewayError, PassThrough):
            if self.ctx.attempts == tried:  # no member was left to resume on: not a retry
                retrier.budget.refund()
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


async def _prepend(first: bytes, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    yield first
    async for chunk in rest:
        yield chunk
