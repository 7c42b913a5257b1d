"""Traces: one OpenTelemetry span per pipeline step and per upstream attempt.

Off unless `OTEL_TRACES_EXPORTER` names an exporter (`otlp`, `console`); then the standard
variables apply: `OTEL_EXPORTER_OTLP_ENDPOINT` / `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (OTLP over
HTTP/protobuf), `OTEL_TRACES_SAMPLER` / `OTEL_TRACES_SAMPLER_ARG`, `OTEL_SERVICE_NAME`,
`OTEL_SDK_DISABLED`. When off, `Context.trace` stays None and the pipeline creates no span
objects at all (a `stage()` is then one shared no-op context manager).

Spans are started by hand (no ASGI/httpx auto-instrumentation, which costs far more per request)
and parented explicitly, so streams that end in another task still close under their request:

    gateway.request (SERVER, root; joins the client's W3C trace when it sent `traceparent`)
    ├── gateway.classify
    ├── gateway.cache
    ├── gateway.route
    │   └── gateway.attempt (CLIENT, one per upstream attempt; its id goes upstream as
    │                        `traceparent`)
    └── gateway.fallback

The client's `traceparent` and `tracestate` are checked here before OpenTelemetry sees them
(`client_trace_headers`): an invalid one is ignored silently (OpenTelemetry logged each refused
value whole, control characters included, once per request), and a `tracestate` beyond 512
characters or 32 members is not carried on to providers.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, cast

from opentelemetry.context import Context as OtelContext
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer, set_span_in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

if TYPE_CHECKING:
    from starlette.requests import Request

    from gateway.context import Context
    from gateway.providers.upstream import UpstreamFailure
    from gateway.runtime import ProviderState

log = logging.getLogger("gateway.telemetry")
_PROPAGATOR = TraceContextTextMapPropagator()
_NOOP: AbstractContextManager[None] = contextlib.nullcontext()
_SCOPE = "gateway"


# W3C trace context, as the client may send it: version 00 exactly; a later version may carry
# more fields after its four (printable ASCII); ff and all-zero ids are invalid.
_TRACEPARENT = re.compile(
    r"(?!ff)([0-9a-f]{2})-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}(-[\x21-\x7e]*)?"
)
_TRACESTATE_KEY = r"[a-z][_0-9a-z*/-]{0,255}|[a-z0-9][_0-9a-z*/-]{0,240}@[a-z][_0-9a-z*/-]{0,13}"
_TRACESTATE_VALUE = r"[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]"
_TRACESTATE_MEMBER = re.compile(f"({_TRACESTATE_KEY})=(?:{_TRACESTATE_VALUE})")
MAX_TRACEPARENT = 512
MAX_TRACESTATE = 512  # what W3C asks every participant to carry on
MAX_TRACESTATE_MEMBERS = 32


def client_trace_headers(headers: Mapping[str, str]) -> dict[str, str] | None:
    """The client's trace context when valid: `traceparent`, and `tracestate` when it is valid
    too and within bounds (else dropped alone); None when there is no valid `traceparent`."""
    parent = headers.get("traceparent")
    if parent is None or len(parent) > MAX_TRACEPARENT:
        return None
    parent = parent.strip(" \t")
    m = _TRACEPARENT.fullmatch(parent)
    if m is None or (m.group(1) == "00" and m.group(2)):
        return None
    carrier = {"traceparent": parent}
    state = headers.get("tracestate")
    if state is not None and len(state) <= MAX_TRACESTATE:
        members = [x.strip(" \t") for x in state.split(",")]
        members = [x for x in members if x]
        keys = set()
        for member in members:
            found = _TRACESTATE_MEMBER.fullmatch(member)
            if found is None or found.group(1) in keys:
                break
            keys.add(found.group(1))
        else:
            if 0 < len(members) <= MAX_TRACESTATE_MEMBERS:
                carrier["tracestate"] = ",".join(members)
    return carrier


class RequestTrace:
    """The spans of one request. Created only when tracing is on."""

    __slots__ = ("_attempt", "_parent", "_tracer", "recording", "root")

    def __init__(self, tracer: Tracer, client_headers: Mapping[str, str], path: str) -> None:
        self._tracer = tracer
        carrier = client_trace_headers(client_headers)
        incoming = None if carrier is None else _PROPAGATOR.extract(carrier)
        self.root = tracer.start_span(
            "gateway.request",
            context=incoming,
            kind=SpanKind.SERVER,
            attributes={"http.request.method": "POST", "http.route": path},
        )
        self._parent: OtelContext = set_span_in_context(self.root)
        self._attempt: Span | None = None
        # Sampled out: no child spans at all; the (unsampled) context still goes upstream.
        self.recording = self.root.is_recording()

    def child(self, name: str) -> Span:
        return self._tracer.start_span(name, context=self._parent)

    @contextlib.contextmanager
    def scope(self, span: Span) -> Iterator[None]:
        """Make `span` the parent of attempts started inside the block."""
        saved, self._parent = self._parent, set_span_in_context(span)
        try:
            yield
        finally:
            self._parent = saved

    def attempt(self, pool: str, member: ProviderState, number: int) -> None:
        """A new upstream attempt begins (the previous one, if still open, has succeeded)."""
        self._end_attempt()
        if not self.recording:
            return
        m = member.member
        self._attempt = self._tracer.start_span(
            "gateway.attempt",
            context=self._parent,
            kind=SpanKind.CLIENT,
            attributes={
                "gateway.pool": pool,
                "gateway.provider": member.name,
                "gateway.attempt": number,
                "gateway.breaker.state": member.breaker.state.value,
                "gateway.member.ewma_s": m.ewma.estimate(),
                "gateway.member.inflight": m.inflight,
            },
        )

    def attempt_failed(self, f: UpstreamFailure) -> None:
        span, self._attempt = self._attempt, None
        if span is None:
            return
        span.set_attribute("gateway.failure", f.kind)
        span.set_attribute("error.type", f.kind)
        if f.status is not None:
            span.set_attribute("http.response.status_code", f.status)
        span.set_status(Status(StatusCode.ERROR, f.kind))
        span.end()

    def upstream_headers(self) -> dict[str, str]:
        """W3C `traceparent` (and `tracestate`) naming the current attempt as the parent."""
        carrier: dict[str, str] = {}
        span = self._attempt or self.root
        _PROPAGATOR.inject(carrier, context=set_span_in_context(span))
        return carrier

    def _end_attempt(self) -> None:
        span, self._attempt = self._attempt, None
        if span is not None:
            span.end()

    def end(self, ctx: Context) -> None:
        """Close the last attempt and the root with the request's decision as attributes."""
        self._end_attempt()
        root = self.root
        if root.is_recording():
            root.set_attributes(_request_attributes(ctx))
            if ctx.status >= 500:
                root.set_status(Status(StatusCode.ERROR))
        root.end()


def _request_attributes(ctx: Context) -> dict[str, Any]:
    attrs: dict[str, Any] = {
        "gateway.request_id": ctx.request_id,
        "gateway.tenant": ctx.tenant,
        "gen_ai.request.model": ctx.alias,
        "gateway.class": ctx.request_class,
        "gateway.stream": ctx.stream,
        "gateway.cache": ctx.cache,
        "gateway.attempts": ctx.attempts,
        "gateway.retries": max(ctx.attempts - 1, 0),
        "gateway.degraded": ctx.degraded,
        "gateway.resumed": ctx.resumed,
        "gen_ai.usage.input_tokens": ctx.prompt_tokens,
        "http.response.status_code": ctx.status,
    }
    if ctx.pool:
        attrs["gateway.pool"], attrs["gateway.provider"] = ctx.pool, ctx.provider
    if ctx.ttft_s is not None:
        attrs["gateway.ttft_s"] = ctx.ttft_s
    if ctx.failures:
        attrs["gateway.failures"] = list(ctx.failures)
    return attrs


# What each step's span says about its outcome, read from the context when the step ends.
_STAGE_ATTRIBUTES: dict[str, Callable[[Context], dict[str, Any]]] = {
    "classify": lambda c: {
        "gateway.class": c.request_class,
        "gen_ai.usage.input_tokens": c.prompt_tokens,
    },
    "cache": lambda c: {"gateway.cache": c.cache},
    "route": lambda c: {
        "gateway.pool": c.pool,
        "gateway.provider": c.provider,
        "gateway.attempts": c.attempts,
        "gateway.retries": max(c.attempts - 1, 0),
    },
    "fallback": lambda c: {"gateway.degraded": c.degraded},
}


class _Stage:
    __slots__ = ("_ctx", "_name", "_scope", "_span", "_trace")

    def __init__(self, trace: RequestTrace, name: str, ctx: Context) -> None:
        self._trace, self._name, self._ctx = trace, name, ctx
        self._span: Span | None = None
        self._scope: AbstractContextManager[None] | None = None

    def __enter__(self) -> None:
        self._span = self._trace.child(f"gateway.{self._name}")
        if self._name == "route":
            self._scope = self._trace.scope(self._span)
            self._scope.__enter__()

    def __exit__(self, et: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        span = self._span
        assert span is not None
        if self._scope is not None:
            self._scope.__exit__(None, None, None)
        if span.is_recording():
            span.set_attributes(_STAGE_ATTRIBUTES[self._name](self._ctx))
            if exc is not None:
                span.set_attribute("error.type", type(exc).__name__)
                span.set_status(Status(StatusCode.ERROR, str(exc)[:200]))
        span.end()


def stage(ctx: Context, name: str) -> AbstractContextManager[None]:
    """A span around one pipeline step (`classify`, `cache`, `route`, `fallback`); no-op when off."""
    trace = ctx.trace
    if trace is None or not trace.recording:
        return _NOOP
    return _Stage(cast(RequestTrace, trace), name, ctx)


def upstream_headers(ctx: Context) -> dict[str, str] | None:
    """Headers to add to an upstream request (trace context), or None when not tracing."""
    trace = ctx.trace
    return None if trace is None else trace.upstream_headers()


class Tracing:
    """The process's tracer (or None when tracing is off) and the record-step observer."""

    def __init__(self, provider: TracerProvider | None = None) -> None:
        self.provider = provider
        self.tracer: Tracer | None = provider.get_tracer(_SCOPE) if provider is not None else None

    @property
    def enabled(self) -> bool:
        return self.tracer is not None

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> Tracing:
        return cls(provider_from_env(env))

    def begin(self, ctx: Context, request: Request) -> None:
        """Start the root span of a request (nothing at all when tracing is off)."""
        tracer = self.tracer
        if tracer is not None:
            ctx.trace = RequestTrace(tracer, request.headers, request.scope["path"])

    def finish(self, ctx: Context) -> None:
        """End the request's spans (the Trace stage, once the answer has ended)."""
        trace, ctx.trace = ctx.trace, None
        if trace is not None:
            cast(RequestTrace, trace).end(ctx)

    def shutdown(self) -> None:
        """Flush queued spans (at process end)."""
        if self.provider is not None:
            self.provider.shutdown()


def provider_from_env(env: Mapping[str, str] = os.environ) -> TracerProvider | None:
    """A TracerProvider exporting where the OTEL_* variables say, or None when tracing is off."""
    if env.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return None
    names = [n.strip() for n in env.get("OTEL_TRACES_EXPORTER", "").split(",") if n.strip()]
    exporters = [e for e in (_exporter(n) for n in names if n != "none") if e is not None]
    if not exporters:
        return None
    service = env.get("OTEL_SERVICE_NAME", "llm-gateway")
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    log.info("tracing on: exporters %s", ", ".join(names))
    return provider


def _exporter(name: str) -> SpanExporter | None:
    if name == "console":
        return ConsoleSpanExporter()
    if name == "otlp":
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError:
            log.error(
                "OTEL_TRACES_EXPORTER=otlp needs the package opentelemetry-exporter-otlp-proto-http;"
                " tracing stays off"
            )
            return None
        return OTLPSpanExporter()
    log.error("unknown OTEL_TRACES_EXPORTER %r (use otlp, console or none)", name)
    return None
