"""Traces over a real loopback gateway: span names, attributes, parents, and `traceparent` upstream."""

from __future__ import annotations

import time

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gateway.context import Context
from gateway.observability.tracing import Tracing, provider_from_env, stage

CHAT = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}


def traced(gw) -> InMemorySpanExporter:
    """Turn tracing on in a running gateway, exporting to memory."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    gw.app.state.pipeline.set_tracing(Tracing(provider))
    return exporter


def wait_spans(exporter: InMemorySpanExporter, root_count: int) -> list[ReadableSpan]:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        spans = list(exporter.get_finished_spans())
        if sum(s.name == "gateway.request" for s in spans) >= root_count:
            return spans
        time.sleep(0.02)
    raise AssertionError(f"spans: {[s.name for s in exporter.get_finished_spans()]}")


def by_name(spans: list[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


def test_unary_spans_and_traceparent_upstream(gateway, capture_upstream) -> None:
    gw = gateway(
        f"""
providers:
  cap: {{base_url: '{capture_upstream.url}', models: {{'*': up}}}}
pools:
  main: {{members: [cap]}}
models:
  chat: {{pool: main}}
"""
    )
    exporter = traced(gw)
    client_parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    r = httpx.post(
        gw.base_url + "/chat/completions",
        json={**CHAT, "temperature": 0},
        headers={"traceparent": client_parent},
    )
    assert r.status_code == 200
    spans = wait_spans(exporter, 1)
    (root,) = by_name(spans, "gateway.request")
    (classify,) = by_name(spans, "gateway.classify")
    (cache,) = by_name(spans, "gateway.cache")
    (route,) = by_name(spans, "gateway.route")
    (attempt,) = by_name(spans, "gateway.attempt")
    # The gateway joins the client's trace.
    assert f"{root.context.trace_id:032x}" == "0af7651916cd43dd8448eb211c80319c"
    assert f"{root.parent.span_id:016x}" == "b7ad6b7169203331"
    for child in (classify, cache, route):
        assert child.parent.span_id == root.context.span_id
    assert attempt.parent.span_id == route.context.span_id
    assert classify.attributes["gateway.class"] == "default"
    assert cache.attributes["gateway.cache"] == "miss"
    assert attempt.attributes["gateway.provider"] == "cap"
    assert attempt.attributes["gateway.pool"] == "main"
    assert attempt.attributes["gateway.breaker.state"] == "closed"
    a = root.attributes
    assert a["gateway.provider"] == "cap" and a["gateway.attempts"] == 1
    assert a["http.response.status_code"] == 200 and a["gen_ai.request.model"] == "chat"
    assert a["gateway.request_id"] == r.headers["x-request-id"]
    # The provider saw the attempt span as its parent.
    sent = capture_upstream.last_headers["traceparent"]
    assert sent == f"00-{attempt.context.trace_id:032x}-{attempt.context.span_id:016x}-01"


def test_failover_attempts_and_stream(fleet, gateway) -> None:
    gw = gateway(
        f"""
providers:
  c: {{base_url: '{fleet.url("c")}', models: {{'*': sim}}}}
  a: {{base_url: '{fleet.url("a")}', models: {{'*': sim}}}}
pools:
  first: {{members: [c], max_attempts: 1, fallback: [second]}}
  second: {{members: [a]}}
models:
  chat: {{pool: first}}
"""
    )
    exporter = traced(gw)
    fleet.set_faults("c", error_rate=1.0, error_status=[503])
    try:
        r = httpx.post(gw.base_url + "/chat/completions", json={**CHAT, "stream": True})
        assert r.status_code == 200 and r.headers["x-gateway-provider"] == "a"
    finally:
        fleet.set_faults("c")
    spans = wait_spans(exporter, 1)
    (root,) = by_name(spans, "gateway.request")
    failed, ok = sorted(by_name(spans, "gateway.attempt"), key=lambda s: s.start_time)
    assert failed.attributes["gateway.provider"] == "c"
    assert failed.attributes["gateway.failure"] == "upstream_5xx"
    assert failed.attributes["http.response.status_code"] == 503
    assert not failed.status.is_ok
    assert ok.attributes["gateway.provider"] == "a" and ok.attributes["gateway.pool"] == "second"
    assert "gateway.failure" not in ok.attributes
    assert root.attributes["gateway.attempts"] == 2 and root.attributes["gateway.retries"] == 1
    assert root.attributes["gateway.failures"] == ("c:upstream_5xx",)
    assert root.attributes["gateway.ttft_s"] > 0
    # The stream's spans close when the stream has ended, not when it opened.
    assert root.end_time >= ok.end_time


def test_off_by_default_creates_nothing() -> None:
    assert provider_from_env({}) is None
    assert provider_from_env({"OTEL_TRACES_EXPORTER": "none"}) is None
    assert (
        provider_from_env({"OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "true"}) is None
    )
    tracing = Tracing()
    ctx = Context("r", 0.0)
    tracing.begin(ctx, None)  # type: ignore[arg-type]  # never looked at when off
    assert ctx.trace is None
    assert stage(ctx, "classify") is stage(ctx, "route")  # one shared no-op


@pytest.mark.parametrize("sampler", ["always_off", "traceidratio"])
def test_sampler_from_env(monkeypatch, sampler: str) -> None:
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", sampler)
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0")
    provider = provider_from_env({"OTEL_TRACES_EXPORTER": "console"})
    assert provider is not None
    try:
        span = provider.get_tracer("t").start_span("x")
        assert not span.is_recording()  # sampled out: spans are no-ops
    finally:
        provider.shutdown()
