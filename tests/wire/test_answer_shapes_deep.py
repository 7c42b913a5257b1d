"""Answers of the right outer shape with the wrong types inside, usage that is not a count, keys
cut, escaped or quoted in parts: each is caught where the answer crosses into the gateway."""

from __future__ import annotations

import json

import pytest

from gateway.redact import Redactor, sanitize_message, secret_like
from gateway.resilience.breaker import CircuitBreaker
from gateway.resilience.failures import MAX_RETRY_AFTER_S, parse_retry_after
from gateway.wire.answer_checks import (
    InvalidAnswer,
    ResponseLimits,
    StreamCheck,
    check_chunk,
    check_unary,
    usage_counts,
)

KEY = "sk-test-0123456789abcdefXYZ"


def chat(message: object, usage: object = None, finish: object = "stop") -> bytes:
    doc: dict = {"choices": [{"index": 0, "message": message, "finish_reason": finish}]}
    if usage is not None:
        doc["usage"] = usage
    return json.dumps(doc).encode()


def test_a_chat_message_holds_the_types_the_api_promises() -> None:
    good = [
        {"role": "assistant", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        ]},
        {"role": "assistant", "content": None, "refusal": "no"},
    ]  # fmt: skip
    for message in good:
        check_unary("chat", chat(message))
    bad = [
        {"content": 12345},
        {"content": {"x": [1]}},
        {},  # nothing at all
        {"content": None, "tool_calls": "not-a-list"},
        {"content": None, "tool_calls": [{"id": 1, "function": "x"}]},
        {"content": None, "tool_calls": [{"function": {"name": 3, "arguments": "{}"}}]},
        {"content": "x", "role": ["assistant"]},
    ]
    for message in bad:
        with pytest.raises(InvalidAnswer):
            check_unary("chat", chat(message))
    with pytest.raises(InvalidAnswer):
        check_unary("chat", chat({"content": "x"}, finish=7))


@pytest.mark.parametrize(
    "usage",
    [
        {"prompt_tokens": -1, "completion_tokens": 2},
        {"prompt_tokens": "3", "completion_tokens": 2},
        {"prompt_tokens": 1, "completion_tokens": [1]},
        {"prompt_tokens": 1, "completion_tokens": 2**40},
        {"prompt_tokens": True, "completion_tokens": 2},
        {"prompt_tokens": 1, "prompt_tokens_details": {"cached_tokens": -5}},
        "lots",
    ],
)
def test_usage_must_be_counts(usage: object) -> None:
    with pytest.raises(InvalidAnswer):
        check_unary("chat", chat({"content": "x"}, usage))
    assert usage_counts(usage) != (-1, 2)


def test_usage_counts_keep_only_counts() -> None:
    assert usage_counts({"prompt_tokens": 3, "completion_tokens": 4}) == (3, 4)
    assert usage_counts({"prompt_tokens": -3, "completion_tokens": 4.5}) == (None, None)
    assert usage_counts(None) == (None, None)


def test_embeddings_hold_numbers() -> None:
    check_unary("embeddings", b'{"data":[{"embedding":[0.1, 2, -3e-5]}]}')
    with pytest.raises(InvalidAnswer):
        check_unary("embeddings", b'{"data":[{"embedding":[0.1, "x", 0.3]}]}')
    # A boolean (a number to `sum`) in any item of a batch, the first or a later one.
    for bad in (b"[true, 1.0]", b"[0.5, false]"):
        with pytest.raises(InvalidAnswer):
            check_unary("embeddings", b'{"data":[{"embedding":[0.1]},{"embedding":' + bad + b"}]}")
        with pytest.raises(InvalidAnswer):
            check_unary("embeddings", b'{"data":[{"embedding":' + bad + b'},{"embedding":[1]}]}')


@pytest.mark.parametrize(
    "payload",
    [
        b"hello, not json",
        b"[1, 2]",
        b'{"error": ["overloaded"]}',
        b'{"error": "overloaded"}',
        b'{"foo": 1}',
        b'{"choices": "nope"}',
        b'{"choices": [{"delta": {"content": 5}}]}',
        b'{"choices": [{"delta": {"tool_calls": [{"index": [0]}]}}]}',
        b'{"choices":[{"index":0,"delta":{"content":"x"}}',
    ],
)
def test_stream_chunks_are_checked_one_by_one(payload: bytes) -> None:
    with pytest.raises(InvalidAnswer):
        check_chunk("chat", payload)
    check = StreamCheck(ResponseLimits())
    with pytest.raises(InvalidAnswer):
        check.event(b"data: " + payload + b"\n\n")
    block = b'data: {"choices":[{"delta":{"content":"a"}}]}\n\ndata: ' + payload + b"\n\n"
    with pytest.raises(InvalidAnswer):
        n = StreamCheck(ResponseLimits()).block(block)
        if n < 0:
            StreamCheck(ResponseLimits()).events([block[: block.index(b"\n\n") + 2], block])


def test_good_chunks_pass_and_are_counted() -> None:
    check = StreamCheck(ResponseLimits())
    block = (
        b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
        b'data: {"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}\n\n'
        b'data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1}}\n\n'
        b"data: [DONE]\n\n"
    )
    assert check.block(block) == 4 and check.chunks == 3 and check.done
    check = StreamCheck(ResponseLimits())
    assert check.event(b": keep-alive\n\n") == b": keep-alive\n\n"
    # Fields alone are no chunk: an OpenAI SDK would parse their empty data and fail.
    assert check.event(b"event: message\nid: 3\n\n") == b""
    assert check.event(b": ping\nretry: 10\n\n") == b": ping\n\n"
    assert check.chunks == 0
    with pytest.raises(InvalidAnswer):
        check.event(b'event: error\ndata: {"type":"overloaded_error"}\n\n')
    with pytest.raises(InvalidAnswer):
        StreamCheck(ResponseLimits()).event(b"garbage line\n\n")


def _relay(check: StreamCheck, texts: list[str]) -> str:
    out = ""
    for text in texts:
        ev = b"data: " + json.dumps({"choices": [{"delta": {"content": text}}]}).encode() + b"\n\n"
        n = check.block(ev)
        relayed = ev if n >= 0 else check.event(ev)
        out += json.loads(relayed[6:])["choices"][0]["delta"]["content"]
    return out


@pytest.mark.parametrize("cut", [4, 8, 13, len(KEY) - 8, len(KEY) - 3])
def test_a_key_cut_between_two_events_leaks_under_8_characters(cut: int) -> None:
    text = _relay(StreamCheck(ResponseLimits(), Redactor([KEY])), ["key=" + KEY[:cut], KEY[cut:]])
    assert not any(KEY[i : i + 8] in text for i in range(len(KEY) - 7)), text
    assert "[redacted]" in text


def test_a_key_written_as_escapes_is_masked() -> None:
    escaped = "".join(f"\\u{ord(c):04x}" for c in KEY)
    r = Redactor([KEY])
    body = b'{"choices":[{"message":{"content":"key=ESC"}}]}'.replace(b"ESC", escaped.encode())
    out = r.json(body, json.loads(body))
    assert KEY not in json.loads(out)["choices"][0]["message"]["content"]
    ev = b'data: {"choices":[{"delta":{"content":"key=ESC"}}]}\n\n'.replace(
        b"ESC", escaped.encode()
    )
    check = StreamCheck(ResponseLimits(), r)
    assert check.block(ev) == -1
    assert KEY not in json.loads(check.event(ev)[6:])["choices"][0]["delta"]["content"]
    plain = b'{"choices":[{"message":{"content":"caf\\u00e9"}}]}'  # no secret: as is
    assert r.json(plain, json.loads(plain)) == plain


def test_error_tokens_and_messages_never_carry_part_of_a_key() -> None:
    r = Redactor([KEY])
    assert secret_like(KEY, r) and secret_like(KEY[3:], r) and secret_like(KEY[:20], r)
    assert secret_like("sk-other-abcdef123456", None)
    assert not secret_like("invalid_request_error", r) and not secret_like("temperature", r)
    out = sanitize_message(f"bad key part {KEY[3:]} and tail {KEY[-10:]}", r)
    assert not any(KEY[i : i + 8] in out for i in range(len(KEY) - 7)), out


def test_retry_after_is_finite_and_bounded() -> None:
    assert parse_retry_after("inf") is None and parse_retry_after("nan") is None
    assert parse_retry_after("1e12") == MAX_RETRY_AFTER_S
    assert parse_retry_after("Fri, 31 Dec 9999 23:59:59 GMT") == MAX_RETRY_AFTER_S
    now = [0.0]
    b = CircuitBreaker("m", clock=lambda: now[0])
    assert b.allow()
    b.cool_down(1e12)
    assert not b.allow()
    now[0] = MAX_RETRY_AFTER_S + 1
    assert b.allow()


def test_a_choice_has_a_delta_object_and_a_small_index() -> None:
    for payload in (
        b'{"choices": [{"index": 0, "delta": null}]}',
        b'{"choices": [{"index": 1000000000, "delta": {}}]}',
        b'{"choices": [{"index": "0", "delta": {}}]}',
    ):
        with pytest.raises(InvalidAnswer):
            check_chunk("chat", payload)
    check_chunk("chat", b'{"choices": [{"index": 1, "delta": {}, "finish_reason": "stop"}]}')


def test_a_secret_written_with_escaped_slashes_is_masked() -> None:
    secret = "abcd/efgh/ijkl/mnop+qrst=="
    r = Redactor([secret])
    body = b'{"choices":[{"message":{"content":"auth abcd\\/efgh\\/ijkl\\/mnop+qrst=="}}]}'
    out = json.loads(r.json(body, json.loads(body)))
    assert secret not in out["choices"][0]["message"]["content"]


def test_logprobs_go_where_a_secret_was_masked() -> None:
    """The tokens of `logprobs` spell the content in pieces: masking the content alone is not
    enough."""
    r = Redactor([KEY])
    tokens = [{"token": KEY[i : i + 4], "logprob": -0.1} for i in range(0, len(KEY), 4)]
    doc = {"choices": [{"message": {"content": "key=" + KEY}, "logprobs": {"content": tokens}}]}
    body = json.dumps(doc).encode()
    out = json.loads(r.json(body, doc))
    assert out["choices"][0]["logprobs"] is None
    assert KEY not in json.dumps(out)


def test_only_credential_headers_are_secrets_and_ratelimit_values_are_numbers() -> None:
    from gateway.providers.upstream import forwardable_headers
    from gateway.redact import provider_secrets

    headers = {
        "HTTP-Referer": "https://myapp.example.com",
        "X-Title": "My Application",
        "anthropic-version": "2023-06-01",
        "x-api-key": "abcdefgh12345",
        "Authorization": "Bearer tok-123456789",
    }
    found = provider_secrets("http://h/v1", headers, "sk-live-12345678")
    assert "2023-06-01" not in found and "https://myapp.example.com" not in found
    assert {"abcdefgh12345", "tok-123456789", "sk-live-12345678"} <= set(found)
    upstream = {
        "x-ratelimit-remaining-requests": "99",
        "x-ratelimit-reset-tokens": "6m0s",
        "x-ratelimit-reset-at": "2026-12-06T03:00:00Z",
        "x-ratelimit-key": KEY,
        "x-ratelimit-debug": "key=" + KEY[3:],
        **{f"x-ratelimit-n{i}": "1" for i in range(40)},
    }
    out = forwardable_headers(upstream, ratelimit=True)
    assert len(out) <= 16 and not any(KEY[3:] in v for v in out.values())
    assert (
        out["x-ratelimit-remaining-requests"] == "99" and out["x-ratelimit-reset-tokens"] == "6m0s"
    )


def _relay_stream(check: StreamCheck, events: list[dict]) -> list[dict]:
    """Each chunk through the relay's paths (as a block, else event by event), then [DONE]."""
    out = []
    for doc in [*events, None]:
        ev = b"data: [DONE]\n\n" if doc is None else b"data: " + json.dumps(doc).encode() + b"\n\n"
        n = check.block(ev)
        relayed = ev if n >= 0 else check.event(ev)
        for part in relayed.split(b"\n\n"):
            if part.startswith(b"data: {"):
                out.append(json.loads(part[6:]))
    return out


def _leaks(text: str) -> list[str]:
    """Runs of 4 or more of the key's characters past its 3-character public prefix."""
    return [KEY[i : i + 4] for i in range(1, len(KEY) - 3) if KEY[i : i + 4] in text]


@pytest.mark.parametrize("size", [1, 2, 3, 4, 5, 7, 9, 13])
@pytest.mark.parametrize("field", ["content", "arguments", "text"])
def test_a_key_streamed_a_few_characters_at_a_time_is_masked(size: int, field: str) -> None:
    """A key relayed token by token matches no byte string in any event: the text is
    followed across events, and a possible start of a key held back until it is known."""
    text = 'key="' + KEY + '" and more text'
    pieces = [text[i : i + size] for i in range(0, len(text), size)]

    def chunk(piece: str) -> dict:
        if field == "text":
            return {"choices": [{"index": 0, "text": piece}]}
        if field == "arguments":
            call = {"index": 0, "function": {"arguments": piece}}
            return {"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]}
        return {"choices": [{"index": 0, "delta": {"content": piece}}]}

    endpoint = "completions" if field == "text" else "chat"
    check = StreamCheck(ResponseLimits(), Redactor([KEY]), endpoint)
    finish = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    if endpoint == "completions":
        finish = {"choices": [{"index": 0, "text": "", "finish_reason": "stop"}]}
    out = _relay_stream(check, [chunk(p) for p in pieces] + [finish])

    def text_of(c: dict) -> str:
        ch = c["choices"][0]
        if field == "text":
            return ch.get("text") or ""
        if field == "arguments":
            return "".join(t["function"]["arguments"] for t in ch["delta"].get("tool_calls", []))
        return ch["delta"].get("content") or ""

    joined = "".join(text_of(c) for c in out)
    assert not _leaks(joined), joined
    assert "[redacted]" in joined and joined.endswith('" and more text')


def test_held_text_goes_out_when_the_stream_ends_without_finishing() -> None:
    check = StreamCheck(ResponseLimits(), Redactor([KEY]))
    events = [{"id": "c", "choices": [{"index": 0, "delta": {"content": "see " + KEY[:6]}}]}]
    out = _relay_stream(check, events)
    joined = "".join(c["choices"][0]["delta"].get("content") or "" for c in out)
    assert joined == "see " + KEY[:6] and out[-1]["id"] == "c"  # 6 < 8: not masked, not lost


def test_held_text_goes_out_ahead_of_a_tool_call() -> None:
    """Text held for a possible key is released, in order, when the choice moves on to a tool
    call (it waited for a text that never continued)."""
    check = StreamCheck(ResponseLimits(), Redactor([KEY]))
    call = {"index": 0, "id": "c1", "type": "function", "function": {"name": "f", "arguments": ""}}
    events = [
        {"choices": [{"index": 0, "delta": {"content": "I will call " + KEY[:5]}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
    ]  # fmt: skip
    out = _relay_stream(check, events)
    order = []
    for c in out:
        delta = c["choices"][0]["delta"]
        if delta.get("content"):
            order.append(("text", delta["content"]))
        for t in delta.get("tool_calls") or []:
            order.append(("call", t["function"].get("arguments", "")))
    assert "".join(x for k, x in order if k == "text") == "I will call " + KEY[:5]
    assert [k for k, _ in order] == ["text", "text", "call", "call"]


def test_a_key_that_begins_with_another_key_is_masked_whole() -> None:
    longer = KEY + "EXTRA9876"
    r = Redactor([KEY, longer])
    assert r.text(f"before {longer} after") == "before [redacted] after"
    check = StreamCheck(ResponseLimits(), r)
    text = _relay(check, ["before " + longer[:9], longer[9:] + " after"])
    assert "EXTRA" not in text and text.endswith(" after")


def test_legitimate_text_that_looks_like_a_configured_value_is_left_alone() -> None:
    """False positives the strict checks must not have: a key's public prefix in documentation
    text, a long non-credential header value, Azure's filter annotations and nested filter
    errors."""
    from gateway.redact import provider_secrets

    project_key = "sk-proj-AbCdEfGhIjKlMnOpQrStUvWx"
    r = Redactor([project_key])
    doc = {
        "choices": [{"message": {"content": "Keys begin with sk-proj- (e.g. sk-proj-EXAMPLE)."}}]
    }
    body = json.dumps(doc).encode()
    assert r.json(body, doc) == body  # unary: unchanged, logprobs kept
    check = StreamCheck(ResponseLimits(), r)
    text = _relay(check, ["Keys begin with sk-", "proj- (e.g. sk-proj-EX", "AMPLE)."])
    assert text == "Keys begin with sk-proj- (e.g. sk-proj-EXAMPLE)."
    headers = {
        "HTTP-Referer": "https://my-app-git-feature-branch-myteam.vercel.app/",
        "anthropic-beta": "token-efficient-tools-2025-02-19",
    }
    assert provider_secrets("http://h/v1", headers, None) == []
    # Azure: a chunk of filter annotations (no delta), and filter results carrying an error.
    check_chunk(
        "chat",
        b'{"choices":[{"index":0,"finish_reason":null,"content_filter_offsets":'
        b'{"check_offset":0,"start_offset":0,"end_offset":5},"content_filter_results":{}}]}',
    )
    nested = (
        b'data: {"choices":[{"index":0,"delta":{"content":"hi"},"content_filter_results":'
        b'{"error":{"code":"ContentFilterError","message":"filter unavailable"}}}]}\n\n'
    )
    assert StreamCheck(ResponseLimits()).event(nested) == nested
    from gateway.wire.answer_checks import first_event_complete

    assert first_event_complete(nested)
