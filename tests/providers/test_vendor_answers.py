"""Odd-but-legal and hostile vendor answers, end to end: official clients -> gateway -> a real
loopback upstream that answers the way one vendor does.

- Content-part lists (Mistral's Magistral, reasoning servers): `message.content` and
  `delta.content` as lists of text, thinking and reference parts reach clients as the string
  the chat API promises (thinking dropped), unary and streamed, through the chat, Messages and
  Responses APIs; a list of anything else is still a bad answer.
- A provider key quoted percent-encoded in an upstream error (`sk%2D...`, `?key=AIza...` in a
  Gemini URL, every character escaped, quoted twice) never reaches the client.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import anthropic
import httpx
import openai
import pytest
from aiohttp import web

from tests.support import GatewayServer, ThreadedUpstream, validate_sse

KEY = "sk-vendor-key-0123456789abcdefXYZ"
GEMINI_KEY = "AIzaSyD-vendorKEY_0123456789abcdefghij"
SLASH_KEY = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLE+KEY"
MSG = [{"role": "user", "content": "hi"}]
THINK = {"type": "thinking", "thinking": [{"type": "text", "text": "Let me think."}]}


def _answer(content: Any) -> dict[str, Any]:
    return {
        "id": "cmpl-v",
        "object": "chat.completion",
        "created": 1,
        "model": "magistral",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7},
    }


def _chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    doc = {
        "id": "cmpl-v",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "magistral",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return b"data: " + json.dumps(doc).encode() + b"\n\n"


# Answers by mode (the first path segment of the provider's base_url).
UNARY: dict[str, Any] = {
    "parts": _answer([THINK, {"type": "text", "text": "Hel"}, {"type": "text", "text": "lo"}]),
    "thinkingstr": _answer(
        [{"type": "thinking", "thinking": "hm"}, {"type": "text", "text": "ok"}]
    ),
    "reference": _answer(
        [{"type": "text", "text": "Paris"}, {"type": "reference", "reference_ids": [1]}]
    ),
    # Azure's content filters: the answer holds no content at all
    "filtered": {
        **_answer(None),
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant"},
                "finish_reason": "content_filter",
                "content_filter_results": {"violence": {"filtered": True, "severity": "high"}},
            }
        ],
    },
    "emptystop": {
        **_answer(None),
        "choices": [{"index": 0, "message": {}, "finish_reason": "stop"}],
    },
    # garbage stays garbage
    "numbers": _answer([1, 2]),
    "unknownpart": _answer([{"type": "image_url", "image_url": {"url": "http://x"}}]),
    "badtext": _answer([{"type": "text", "text": {"nested": True}}]),
    "badthinking": _answer([{"type": "thinking", "thinking": 42}]),
    "untyped": _answer([{"text": "hi"}]),
}
STREAMS: dict[str, list[bytes]] = {
    "parts": [
        _chunk({"role": "assistant", "content": [THINK]}),
        _chunk({"content": [{"type": "text", "text": "Hel"}]}),
        _chunk({"content": "lo"}),
        _chunk({"content": [{"type": "text", "text": " there"}]}, "stop"),
    ],
    "numbers": [_chunk({"role": "assistant", "content": ""}), _chunk({"content": [1]}, "stop")],
    "unknownpart": [
        _chunk({"role": "assistant", "content": ""}),
        _chunk({"content": [{"type": "audio", "data": "x"}]}, "stop"),
    ],
}
GOOD = ["parts", "thinkingstr", "reference", "filtered"]
BAD = ["numbers", "unknownpart", "badtext", "badthinking", "untyped", "emptystop"]
# Error bodies quoting a key percent-encoded, each as a provider or its proxy writes it.
LEAKS: dict[str, str] = {
    "dash": "Incorrect API key provided: " + KEY.replace("-", "%2D") + ".",
    "every": "key " + "".join(f"%{b:02X}" for b in KEY.encode()) + " is not valid",
    "lower": "key " + "".join(f"%{b:02x}" for b in KEY.encode()) + " is not valid",
    "twice": "key " + quote(KEY.replace("-", "%2D"), safe="") + " is not valid",
    "gemini": "API key not valid: generativelanguage.googleapis.com/v1beta/models/"
    f"g:generateContent?alt=sse&key={GEMINI_KEY}",
    "geminiother": "request to models/g:generateContent?key=AIzaSy%2DsomeOtherKey9 was refused",
    "slash": "bad signature for " + quote(SLASH_KEY, safe=""),
    "slashlower": "bad signature for "
    + re.sub(r"%[0-9A-F]{2}", lambda m: m[0].lower(), quote(SLASH_KEY, safe="")),
}


class VendorUpstream(ThreadedUpstream):
    """One aiohttp server on loopback; its answer is chosen by the path's first segment."""

    def url(self, mode: str) -> str:
        return f"http://127.0.0.1:{self.port}/{mode}/v1"

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        mode = request.match_info.get("mode", "reference")  # Azure's v1 path: no mode
        body = await request.json()
        if mode in LEAKS:
            err = {"error": {"message": LEAKS[mode], "type": "invalid_request_error"}}
            return web.json_response(err, status=400)
        if not body.get("stream"):
            return web.json_response(UNARY[mode])
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        for ev in STREAMS[mode]:
            await resp.write(ev)
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/{mode}/v1/chat/completions", self._handle)
        app.router.add_post("/openai/v1/chat/completions", self._handle)


def _policy(up: VendorUpstream) -> str:
    lines = ["providers:"]
    pools, models = ["pools:"], ["models:"]
    keys = {"gemini": "GEMINI_KEY", "slash": "SLASH_KEY", "slashlower": "SLASH_KEY"}
    for mode in [*GOOD, *BAD, *LEAKS]:
        env = keys.get(mode, "VENDOR_KEY")
        ptype = "azure" if mode == "reference" else "openai"
        extra = ", azure: {surface: v1}" if ptype == "azure" else ""
        base = f"http://127.0.0.1:{up.port}" if ptype == "azure" else up.url(mode)
        lines.append(
            f"  {mode}: {{type: {ptype}, base_url: '{base}', api_key_env: {env}{extra}, "
            "breaker: {consecutive_failures: 1000}}"
        )
        pools.append(f"  p_{mode}: {{members: [{mode}], max_attempts: 1}}")
        models.append(f"  {mode}: {{pool: p_{mode}}}")
    return "\n".join([*lines, *pools, *models]) + "\n"


@pytest.fixture(scope="module")
def gw() -> Iterator[GatewayServer]:
    with VendorUpstream() as up, pytest.MonkeyPatch.context() as mp:
        mp.setenv("VENDOR_KEY", KEY)
        mp.setenv("GEMINI_KEY", GEMINI_KEY)
        mp.setenv("SLASH_KEY", SLASH_KEY)
        with GatewayServer(_policy(up)) as server:
            yield server


def _oa(gw: GatewayServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0)


# -- content-part lists ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "text"), [("parts", "Hello"), ("thinkingstr", "ok"), ("reference", "Paris")]
)
def test_a_content_part_list_answer_reaches_clients_as_a_string(
    gw: GatewayServer, mode: str, text: str
) -> None:
    r = httpx.post(gw.base_url + "/chat/completions", json={"model": mode, "messages": MSG})
    assert r.status_code == 200, r.text
    message = r.json()["choices"][0]["message"]
    assert message["content"] == text  # a string: the thinking is dropped
    assert set(message) == {"role", "content"}, message  # no part left over
    answer = _oa(gw).chat.completions.create(model=mode, messages=MSG)  # type: ignore[arg-type]
    assert answer.choices[0].message.content == text
    assert answer.usage is not None and answer.usage.completion_tokens == 4


def test_a_streamed_content_part_list_reaches_clients_as_strings(gw: GatewayServer) -> None:
    body = {"model": "parts", "messages": MSG, "stream": True}
    r = httpx.post(gw.base_url + "/chat/completions", json=body)
    assert r.status_code == 200
    chunks = validate_sse(r.content)
    deltas = [c["choices"][0]["delta"] for c in chunks if c.get("choices")]
    assert all(isinstance(d.get("content", ""), str) for d in deltas), deltas
    assert "".join(d.get("content") or "" for d in deltas) == "Hello there"
    assert "Let me think" not in r.text
    stream = _oa(gw).chat.completions.create(model="parts", messages=MSG, stream=True)  # type: ignore[arg-type]
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == "Hello there"


def test_content_part_lists_through_the_messages_and_responses_apis(gw: GatewayServer) -> None:
    client = anthropic.Anthropic(base_url=gw.url, api_key="x", max_retries=0)
    msg = client.messages.create(model="parts", max_tokens=20, messages=MSG)  # type: ignore[arg-type]
    assert [b.type for b in msg.content] == ["text"] and msg.content[0].text == "Hello"  # type: ignore[union-attr]
    with client.messages.stream(model="parts", max_tokens=20, messages=MSG) as s:  # type: ignore[arg-type]
        assert "".join(s.text_stream) == "Hello there"
    oa = _oa(gw)
    resp = oa.responses.create(model="parts", input="hi")
    assert resp.output_text == "Hello"
    events = list(oa.responses.create(model="parts", input="hi", stream=True))
    done = [e for e in events if e.type == "response.completed"]
    assert done and done[0].response.output_text == "Hello there"


@pytest.mark.parametrize("mode", BAD)
def test_a_part_list_of_anything_else_is_still_a_bad_answer(gw: GatewayServer, mode: str) -> None:
    r = httpx.post(gw.base_url + "/chat/completions", json={"model": mode, "messages": MSG})
    assert r.status_code == 502, r.text
    assert r.json()["error"]["code"] == "upstream_bad_response"


@pytest.mark.parametrize("mode", ["numbers", "unknownpart"])
def test_a_streamed_part_list_of_anything_else_breaks_the_stream(
    gw: GatewayServer, mode: str
) -> None:
    body = {"model": mode, "messages": MSG, "stream": True}
    r = httpx.post(gw.base_url + "/chat/completions", json=body)
    # The first chunk was good (sent): the bad one ends the stream with an error event.
    assert r.status_code == 200
    assert b'"error"' in r.content and b"[1]" not in r.content and b"audio" not in r.content


def test_a_filtered_answer_without_content_is_the_answer(gw: GatewayServer) -> None:
    """Azure answers a completion its content filters stopped with a message holding no content:
    the provider's verdict, relayed (not a broken answer retried elsewhere, nor a 502)."""
    r = httpx.post(gw.base_url + "/chat/completions", json={"model": "filtered", "messages": MSG})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "content_filter" and choice["message"] == {
        "role": "assistant"
    }
    answer = _oa(gw).chat.completions.create(model="filtered", messages=MSG)  # type: ignore[arg-type]
    assert answer.choices[0].finish_reason == "content_filter"
    assert answer.choices[0].message.content is None
    client = anthropic.Anthropic(base_url=gw.url, api_key="x", max_retries=0)
    msg = client.messages.create(model="filtered", max_tokens=5, messages=MSG)  # type: ignore[arg-type]
    assert msg.stop_reason == "refusal" and msg.content == []
    resp = _oa(gw).responses.create(model="filtered", input="hi")
    assert resp.output_text == ""


# -- keys quoted percent-encoded -----------------------------------------------------------------


def _leaks(text: str) -> list[str]:
    """Any 8-character run of a key, in the text or in the text decoded (once and twice)."""
    from urllib.parse import unquote

    seen = []
    for form in (text, unquote(text), unquote(unquote(text))):
        for key in (KEY, GEMINI_KEY, SLASH_KEY):
            for k in (key, quote(key, safe=""), quote(key, safe="").lower()):
                seen += [k[i : i + 8] for i in range(len(k) - 7) if k[i : i + 8] in form]
    # A key's public prefix (`sk-vendor-`, `AIzaSy`) alone is no leak.
    return [s for s in seen if not any(p.startswith(s) for p in ("sk-vendor-key-", "AIzaSyD-"))]


@pytest.mark.parametrize("mode", sorted(LEAKS))
def test_a_percent_encoded_key_in_an_upstream_error_never_reaches_the_client(
    gw: GatewayServer, mode: str
) -> None:
    r = httpx.post(gw.base_url + "/chat/completions", json={"model": mode, "messages": MSG})
    assert r.status_code == 400, r.text
    assert not _leaks(r.text), r.text
    assert not _leaks(json.dumps(dict(r.headers))), r.headers
    with pytest.raises(openai.BadRequestError) as e:
        _oa(gw).chat.completions.create(model=mode, messages=MSG)  # type: ignore[arg-type]
    assert not _leaks(str(e.value.body))
    # The same through the Messages API, in Anthropic's error shape.
    client = anthropic.Anthropic(base_url=gw.url, api_key="x", max_retries=0)
    with pytest.raises(anthropic.BadRequestError) as ae:
        client.messages.create(model=mode, max_tokens=5, messages=MSG)  # type: ignore[arg-type]
    assert isinstance(ae.value.body, dict) and ae.value.body.get("type") == "error"
    assert not _leaks(json.dumps(ae.value.body))


def test_a_percent_encoded_error_message_keeps_its_words(gw: GatewayServer) -> None:
    r = httpx.post(gw.base_url + "/chat/completions", json={"model": "dash", "messages": MSG})
    message = r.json()["error"]["message"]
    assert message.startswith("Incorrect API key provided:") and "[redacted]" in message
