"""The client's W3C trace context over a real loopback gateway: a valid `traceparent` is joined
and a valid, bounded `tracestate` carried on to the provider; anything else is ignored without a
word in the logs (OpenTelemetry logged each refused value whole, 8 KiB values included, at
WARNING, once per request: a log any client could flood)."""

from __future__ import annotations

import logging
import socket

import httpx
import pytest

from gateway.observability.tracing import client_trace_headers
from tests.observability.test_observability_tracing import CHAT, by_name, traced, wait_spans

PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
TRACE_ID = "0af7651916cd43dd8448eb211c80319c"


@pytest.fixture
def gw(gateway, capture_upstream):  # type: ignore[no-untyped-def]
    return gateway(
        f"""
providers:
  cap: {{base_url: '{capture_upstream.url}', models: {{'*': up}}}}
pools:
  main: {{members: [cap]}}
models:
  chat: {{pool: main}}
"""
    )


def raw_post(port: int, headers: bytes) -> bytes:
    """A chat request with header bytes no client library would send."""
    body = b'{"model":"chat","messages":[{"role":"user","content":"hi"}],"max_tokens":5}'
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Connection: close\r\n%sContent-Length: %d\r\n\r\n%s" % (headers, len(body), body)
    )
    out = b""
    while chunk := s.recv(65536):
        out += chunk
    s.close()
    return out


def test_a_valid_trace_context_is_joined_and_carried_on(gw, capture_upstream) -> None:  # type: ignore[no-untyped-def]
    exporter = traced(gw)
    state = "vendor=abc,t@sys=x y"
    r = httpx.post(
        gw.base_url + "/chat/completions",
        json=CHAT,
        headers={"traceparent": PARENT, "tracestate": state},
    )
    assert r.status_code == 200
    (root,) = by_name(wait_spans(exporter, 1), "gateway.request")
    assert f"{root.context.trace_id:032x}" == TRACE_ID
    assert capture_upstream.last_headers["traceparent"].startswith(f"00-{TRACE_ID}-")
    assert capture_upstream.last_headers["tracestate"] == state


@pytest.mark.parametrize(
    ("traceparent", "tracestate", "joined"),
    [
        (PARENT, "a=\xe9t\xe9\tb", True),  # bytes beyond ASCII, a tab
        (PARENT, "a=" + "b" * 255 + "," + ",".join(f"k{i}=v" for i in range(40)), True),
        (PARENT, ",".join(f"k{i}=v" for i in range(41)), True),  # 41 members, short enough
        (PARENT, "x=" + "y" * 8000, True),  # within OpenTelemetry's 8 KiB, beyond W3C's 512
        (PARENT, "a=1,a=2", True),  # a duplicate key
        (PARENT + "-\xff" + "x" * 600, "a=b", False),  # too long
        ("ff-" + PARENT[3:], "a=b", False),  # version ff
        (PARENT + "-extra", "a=b", False),  # version 00 has four fields exactly
        ("00-" + "0" * 32 + PARENT[35:], "a=b", False),  # an all-zero trace id
        ("\xc3\xa9t\xc3\xa9", "a=b", False),
    ],
)
def test_an_invalid_trace_context_is_ignored_quietly(  # type: ignore[no-untyped-def]
    gw, capture_upstream, caplog, traceparent: str, tracestate: str, joined: bool
) -> None:
    exporter = traced(gw)
    caplog.set_level(logging.DEBUG, logger="opentelemetry")
    out = raw_post(
        gw.port,
        b"traceparent: %s\r\ntracestate: %s\r\n"
        % (traceparent.encode("latin-1"), tracestate.encode("latin-1")),
    )
    assert out.startswith(b"HTTP/1.1 200"), out[:200]
    (root,) = by_name(wait_spans(exporter, 1), "gateway.request")
    assert (f"{root.context.trace_id:032x}" == TRACE_ID) is joined
    assert "tracestate" not in capture_upstream.last_headers
    sent = capture_upstream.last_headers["traceparent"]
    assert len(sent) == 55 and sent.isascii() and sent.isprintable()
    assert not [r for r in caplog.records if r.name.startswith("opentelemetry")], caplog.text


def test_client_trace_headers_bounds() -> None:
    assert client_trace_headers({}) is None
    assert client_trace_headers({"traceparent": " " + PARENT + "\t"}) == {"traceparent": PARENT}
    # A later version may add fields; its first four are still required.
    later = "01" + PARENT[2:] + "-what-comes-next"
    assert client_trace_headers({"traceparent": later}) == {"traceparent": later}
    assert client_trace_headers({"traceparent": PARENT.upper()}) is None
    ok = {"traceparent": PARENT, "tracestate": " a=1 ,, b=2 "}
    assert client_trace_headers(ok) == {"traceparent": PARENT, "tracestate": "a=1,b=2"}
    full = ",".join(f"k{i}=v" for i in range(32))
    assert client_trace_headers({"traceparent": PARENT, "tracestate": full}) == {
        "traceparent": PARENT,
        "tracestate": full,
    }
    assert "tracestate" not in client_trace_headers(  # type: ignore[operator]
        {"traceparent": PARENT, "tracestate": full + ",k32=v"}
    )
    assert "tracestate" not in client_trace_headers(  # type: ignore[operator]
        {"traceparent": PARENT, "tracestate": "a=" + "b" * 600}
    )
