"""Units of the upstream-facing guards: answer shapes, stream checks, redaction, sanitising."""

from __future__ import annotations

import pytest

from gateway.providers.upstream import _status_failure, forwardable_headers
from gateway.redact import Redactor, provider_secrets, redacted_dump, sanitize_message
from gateway.resilience.breaker import BreakerState, CircuitBreaker
from gateway.resilience.failures import FailureKind, counts_against_breaker, is_retryable
from gateway.wire.answer_checks import (
    InvalidAnswer,
    ResponseLimits,
    StreamCheck,
    check_unary,
    first_event_complete,
    is_event_stream,
)
from gateway.wire.sse import EventTooLarge, SSESplitter

CHAT = b'{"id":"c","choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}]}'


def test_unary_shapes_per_endpoint() -> None:
    assert check_unary("chat", CHAT)["id"] == "c"
    assert check_unary("completions", b'{"choices":[{"text":"x"}]}')
    assert check_unary("embeddings", b'{"data":[{"embedding":[0.1]}]}')
    # base64: the bytes of float32 values (here one 0.0)
    assert check_unary("embeddings", b'{"data":[{"embedding":"AAAAAA=="}]}')
    for endpoint, body in [
        ("chat", b"<html>"),
        ("chat", CHAT[:-5]),
        ("chat", b"[1, 2]"),
        ("chat", b'{"choices": []}'),
        ("chat", b'{"choices": [{"text": "x"}]}'),
        ("chat", b'{"error": {"message": "x"}}'),
        ("completions", b'{"choices":[{"message":{}}]}'),
        ("embeddings", b'{"data":[{"index":0}]}'),
        ("embeddings", b'{"data":[{"embedding":"AAAA"}]}'),  # 3 bytes: no float32 values
        ("embeddings", b'{"data":[{"embedding":""}]}'),
        ("embeddings", b'{"data":[{"embedding":"not base64!"}]}'),
        ("embeddings", b'{"data":[{"embedding":[0.1, true]}]}'),
        ("embeddings", b'{"data":[{"embedding":[0.1], "object": 7}]}'),
    ]:
        with pytest.raises(InvalidAnswer):
            check_unary(endpoint, body)


def test_first_event_of_a_stream() -> None:
    assert is_event_stream("text/event-stream; charset=utf-8")
    assert not is_event_stream("application/json") and not is_event_stream(None)
    assert not first_event_complete(b'data: {"a"')
    assert first_event_complete(b': ping\n\nevent: x\n\ndata: {"a":1}\n\n')
    assert first_event_complete(b'data: {"a":1}\r\n\r\n')
    for bad in (
        b"<html>\n\n",
        b"data: <html>\n\n",
        b'data: {"error": {"message": "x"}}\n\n',
        b"data: [DONE]\n\n",  # an answer of nothing
        b'event: error\ndata: {"type": "overloaded_error"}\n\n',
    ):
        with pytest.raises(InvalidAnswer):
            first_event_complete(bad)


def test_stream_check_end_errors_utf8_and_size() -> None:
    check = StreamCheck(ResponseLimits(max_stream_bytes=2048))
    check.event(b'data: {"choices":[{"delta":{},"finish_reason":null}]}\n\n')
    assert not check.complete()
    check.event(b'data: {"choices":[{"delta":{},"finish_reason":"stop"}]}\n\n')
    assert check.complete() and not check.done
    check.event(b"data: [DONE]\n\n")
    assert check.done
    with pytest.raises(InvalidAnswer):
        check.event(b'data: {"error": {"message": "boom"}}\n\n')
    assert check.event(b'data: {"error": null, "choices": []}\n\n')  # a null error is no error
    fixed = check.event(
        b'data: {"choices":[{"delta":{"content":"ok \xff ' + "€".encode()[:2] + b'"}}]}\n\n'
    )
    assert fixed.decode() == 'data: {"choices":[{"delta":{"content":"ok \ufffd \ufffd"}}]}\n\n'
    # A character cut between two events' texts arrives whole.
    euro = "€".encode()
    first = check.event(b'data: {"choices":[{"delta":{"content":"a ' + euro[:1] + b'"}}]}\n\n')
    second = check.event(b'data: {"choices":[{"delta":{"content":"' + euro[1:] + b' b"}}]}\n\n')
    assert first.decode() == 'data: {"choices":[{"delta":{"content":"a "}}]}\n\n'
    assert second.decode() == 'data: {"choices":[{"delta":{"content":"€ b"}}]}\n\n'
    with pytest.raises(InvalidAnswer):
        check.count(4096)
    redacting = StreamCheck(ResponseLimits(), Redactor(["sk-secret-12345678"]))
    ev = b'data: {"choices":[{"delta":{"content":"sk-secret-12345678"}}]}\n\n'
    assert b"sk-secret" not in redacting.event(ev)


def test_splitter_bounds_an_unfinished_event() -> None:
    s = SSESplitter(max_event=1024)
    assert s.feed(b"data: 1\n\ndata: ") == [b"data: 1\n\n"]
    with pytest.raises(EventTooLarge):
        s.feed(b"x" * 2048)


def test_sanitize_message() -> None:
    key = "sk-live-0123456789abcdef"
    r = Redactor(provider_secrets("http://u:hunter2pass@10.1.2.3:8000/v1", {}, key))
    out = sanitize_message(
        f"bad key {key}, Bearer abc.def, sk-proj-****abcd, at http://10.1.2.3:8000/v1/x "
        "from vllm-3.svc.cluster.local and gpu-7:8000, password hunter2pass. Check temperature.",
        r,
        hosts=("10.1.2.3",),
    )
    for leaked in (key, "abc.def", "sk-proj", "http", "10.1.2.3", "vllm-3", "gpu-7", "hunter2"):
        assert leaked not in out, (leaked, out)
    assert "Check temperature." in out
    assert len(sanitize_message("x" * 10_000, None)) < 600


def test_redacted_dump_masks_headers_url_credentials_and_values() -> None:
    r = Redactor(["secret-value-123"])
    doc = {
        "providers": {
            "a": {
                "base_url": "https://user:pw-abcdefgh@host/v1?api-key=k12345678",
                "headers": {"x-api-key": "anything"},
                "note": "contains secret-value-123",
            }
        }
    }
    out = redacted_dump(doc, r)["providers"]["a"]
    assert out["headers"] == {"x-api-key": "[redacted]"}
    assert "pw-abcdefgh" not in out["base_url"] and "k12345678" not in out["base_url"]
    assert out["base_url"].endswith("@host/v1?api-key=[redacted]")
    assert out["note"] == "contains [redacted]"


def test_failure_kinds() -> None:
    for kind in (FailureKind.UPSTREAM_AUTH, FailureKind.BAD_RESPONSE):
        assert is_retryable(kind, bytes_sent_to_client=False)
        assert not is_retryable(kind, bytes_sent_to_client=True)
        assert counts_against_breaker(kind)
    b = CircuitBreaker("m")
    b.record_failure(FailureKind.BAD_RESPONSE)
    assert b.state is BreakerState.CLOSED  # a run of them trips it, like 5xx
    b.record_failure(FailureKind.UPSTREAM_AUTH)
    assert b.state is BreakerState.OPEN  # one refused key is enough


def test_status_classification_and_header_allow_list() -> None:
    for status in (401, 403, 404):
        assert _status_failure(status, b"{}", {}).kind == "upstream_auth"
    vllm = b'{"object":"error","message":"The model `m` does not exist.","code":404}'
    assert _status_failure(400, vllm, {}).kind == "upstream_auth"
    assert _status_failure(400, b'{"error":{"code":"model_not_found"}}', {}).kind == "upstream_auth"
    assert (
        _status_failure(400, b'{"error":{"message":"bad temperature"}}', {}).kind == "upstream_4xx"
    )
    assert _status_failure(503, b"", {}).kind == "upstream_5xx"
    assert _status_failure(429, b"", {"retry-after": "2"}).retry_after == 2.0
    headers = {"X-RateLimit-Remaining-Requests": "9", "Location": "http://x", "Server": "y"}
    assert forwardable_headers(headers) == {}
    assert forwardable_headers(headers, ratelimit=True) == {"x-ratelimit-remaining-requests": "9"}


def test_limits_are_validated_policy_settings() -> None:
    from gateway.policy.loader import PolicyError, parse_policy

    base = (
        "providers:\n  a:\n    base_url: http://127.0.0.1:9/v1\n{extra}"
        "pools:\n  p: {{members: [a]}}\nmodels:\n  m: {{pool: p}}\n"
    )
    policy = parse_policy(base.format(extra=""))
    limits = policy.providers["a"].limits
    assert (limits.max_response_bytes, limits.max_event_bytes) == (16 * 2**20, 2**20)
    assert policy.providers["a"].forward_ratelimit_headers is False
    bad = "    limits: {max_event_bytes: 10, max_stream_bytez: 5}\n"
    with pytest.raises(PolicyError) as e:
        parse_policy(base.format(extra=bad))
    text = str(e.value)
    assert "providers.a.limits.max_event_bytes" in text
    assert "providers.a.limits.max_stream_bytez" in text


def test_error_events_are_found_wherever_the_member_is() -> None:
    check = StreamCheck(ResponseLimits())
    for ev in (
        b'data: {"id": "x", "error": {"message": "m"}}\n\n',
        b'data: {"error": "overloaded"}\n\n',
    ):
        with pytest.raises(InvalidAnswer):
            check.event(ev)
    quoted = b'data: {"choices":[{"delta":{"content":"say \\"error\\": {x}"}}]}\n\n'
    assert check.event(quoted) == quoted
