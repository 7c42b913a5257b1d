"""Content-part lists in chat answers (Mistral's Magistral, reasoning servers) and keys quoted
percent-encoded, at the unit level: the checks and the redactor on their own."""

from __future__ import annotations

import json
from urllib.parse import quote

import orjson
import pytest

from gateway.redact import Redactor, sanitize_message, secret_like
from gateway.wire.answer_checks import (
    InvalidAnswer,
    ResponseLimits,
    StreamCheck,
    check_chunk,
    check_unary,
    flatten_content,
    flatten_parts,
)

THINK = {"type": "thinking", "thinking": [{"type": "text", "text": "hmm"}]}


def _chat(content: object) -> bytes:
    return orjson.dumps(
        {"choices": [{"index": 0, "message": {"role": "assistant", "content": content}}]}
    )


def _event(delta: dict[str, object]) -> bytes:
    return b"data: " + orjson.dumps({"choices": [{"index": 0, "delta": delta}]}) + b"\n\n"


@pytest.mark.parametrize(
    ("parts", "text"),
    [
        ([THINK, {"type": "text", "text": "Hel"}, {"type": "text", "text": "lo"}], "Hello"),
        ([{"type": "thinking", "thinking": "plain"}, {"type": "text", "text": "x"}], "x"),
        ([{"type": "text", "text": "a"}, {"type": "reference", "reference_ids": [1, 2]}], "a"),
        ([{"type": "output_text", "text": "b"}], "b"),
        ([THINK], None),
        ([], None),
    ],
)
def test_a_part_list_becomes_its_text(parts: list[object], text: str | None) -> None:
    assert flatten_parts(parts) == text
    doc = check_unary("chat", flatten_content("chat", _chat(parts)))
    assert doc["choices"][0]["message"]["content"] == text


@pytest.mark.parametrize(
    "parts",
    [
        [1],
        ["text"],
        [{"text": "no type"}],
        [{"type": 5, "text": "x"}],
        [{"type": "text"}],
        [{"type": "text", "text": ["x"]}],
        [{"type": "image_url", "image_url": {"url": "http://x"}}],
        [{"type": "thinking", "thinking": 3}],
        [{"type": "thinking", "thinking": [{"type": "text", "text": 3}]}],
        [{"type": "thinking", "thinking": ["x"]}],
    ],
)
def test_a_part_list_of_anything_else_is_refused(parts: list[object]) -> None:
    with pytest.raises(InvalidAnswer):
        flatten_parts(parts)
    body = _chat(parts)
    assert flatten_content("chat", body) == body  # left for the check, which refuses it
    with pytest.raises(InvalidAnswer):
        check_unary("chat", body)
    with pytest.raises(InvalidAnswer):
        check_chunk("chat", _event({"content": parts})[6:-2])
    check = StreamCheck(ResponseLimits())
    with pytest.raises(InvalidAnswer):
        if check.block(_event({"content": parts})) < 0:
            check.event(_event({"content": parts}))


def test_other_bodies_are_relayed_as_they_are() -> None:
    body = _chat("plain")
    assert flatten_content("chat", body) is body
    quoted = _chat('say "content": [1]')  # a false hit: parsed, unchanged
    assert flatten_content("chat", quoted) is quoted
    assert flatten_content("embeddings", b'{"data":[{"embedding":[1]}]}')


def test_a_streamed_part_list_is_relayed_as_text_on_both_paths() -> None:
    events = [
        _event({"role": "assistant", "content": [THINK]}),
        _event({"content": [{"type": "text", "text": "Hel"}]}),
        _event({"content": "lo"}),
    ]
    check = StreamCheck(ResponseLimits(), Redactor(["sk-some-key-0123456789"]))
    assert check.block(b"".join(events)) == -1  # re-encoded: never relayed as it came
    out = check.events(events)
    deltas = [json.loads(ev[6:])["choices"][0]["delta"] for ev in out]
    assert deltas == [{"role": "assistant"}, {"content": "Hel"}, {"content": "lo"}]
    assert check.chunks == 3


KEY = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLE+KEY"


@pytest.mark.parametrize(
    "form",
    [
        quote(KEY, safe=""),
        quote(KEY),
        quote(KEY, safe="").replace("%2F", "%2f"),
        "".join(f"%{b:02X}" for b in KEY.encode()),
        quote(quote(KEY, safe=""), safe=""),
    ],
)
def test_a_percent_encoded_key_is_masked_in_messages_tokens_and_bodies(form: str) -> None:
    r = Redactor([KEY])
    out = sanitize_message(f"signature {form} does not match", r)
    assert out == "signature [redacted] does not match"
    assert secret_like(form[:24], r)
    if form in (quote(KEY, safe=""), quote(KEY)):  # as URL encoders write it: in answers too
        assert r.plain(f"url ?sig={form}".encode()) == b"url ?sig=[redacted]"


def test_a_query_credential_of_another_key_is_masked_and_ordinary_text_stays() -> None:
    r = Redactor(["sk-mine-0123456789abcdef"])
    out = sanitize_message("GET models/g:generateContent?alt=sse&key=AIzaSy%2Dother9 failed", r)
    assert "AIzaSy" not in out and "other9" not in out and "alt=sse" in out
    for text in ("temperature must be under 100%", "50% of 2 is 1", "use %s here"):
        assert sanitize_message(text, r) == text
