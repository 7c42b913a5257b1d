"""A mapping adapter (anthropic, gemini) given an answer of the right outer shape with a value of
the wrong type inside (a list for a stop reason, a string where an object belongs) fails the
attempt as `bad_response`, like any answer the checks refuse: retried on another member before
the first byte, a 502 `upstream_bad_response` when none is left, an error event mid-stream. Never
an unexpected exception inside the gateway (logged with a traceback, counted apart).

Official `openai` client -> gateway on loopback -> a real aiohttp upstream that speaks the
vendor's wire format and answers by mode (the first path segment of the provider's base_url).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from aiohttp import web

from tests.support import GatewayServer, ThreadedUpstream, poll, validate_sse

MSG = [{"role": "user", "content": "hi"}]
_AN_OK = {
    "type": "message",
    "id": "msg_1",
    "model": "claude",
    "role": "assistant",
    "content": [{"type": "text", "text": "hi"}],
    "stop_reason": "end_turn",
    "usage": {"input_tokens": 3, "output_tokens": 2},
}


def _an(event: dict[str, Any]) -> bytes:
    return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()


_AN_START = _an(
    {"type": "message_start", "message": {"id": "m", "model": "c", "usage": {"input_tokens": 3}}}
)
_AN_TEXT = _an(
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi"}}
)

# mode -> (unary answer, stream events): anthropic
ANTHROPIC: dict[str, tuple[Any, list[bytes]]] = {
    "an_stop_list": (
        {**_AN_OK, "stop_reason": ["end_turn"]},
        [
            _AN_START,
            _AN_TEXT,
            _an({"type": "message_delta", "delta": {"stop_reason": ["x"]}, "usage": {}}),
        ],
    ),
    "an_stop_object": (
        {**_AN_OK, "stop_reason": {"r": 1}},
        [_AN_START, _AN_TEXT, _an({"type": "message_delta", "delta": "end", "usage": {}})],
    ),
    "an_delta_text": (
        {**_AN_OK, "stop_reason": ["x"]},
        [_AN_START, _AN_TEXT, _an({"type": "content_block_delta", "index": 0, "delta": "x"})],
    ),
    "an_block_index": (
        {**_AN_OK, "stop_reason": ["x"]},
        [
            _AN_START,
            _AN_TEXT,
            _an(
                {
                    "type": "content_block_start",
                    "index": [0],
                    "content_block": {"type": "tool_use", "id": "t", "name": "f"},
                }
            ),
        ],
    ),
    "an_usage_text": (
        {**_AN_OK, "stop_reason": ["x"]},
        [_AN_START, _AN_TEXT, _an({"type": "message_delta", "delta": {}, "usage": "many"})],
    ),
}
GOOD_STREAM = [
    _AN_START,
    _an({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "hi"}}),
    _an({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {}}),
    _an({"type": "message_stop"}),
]
# A bad first event: nothing was sent, the attempt is retried (or a 502).
FIRST_BAD: dict[str, list[bytes]] = {
    "an_message_text": [_an({"type": "message_start", "message": "hello"})],
    "ge_error_code": [b'data: {"error": {"code": [500], "message": "x"}}\n\n'],
}
GEMINI_UNARY = {"candidates": [{"content": {"parts": [{"text": "hi"}]}, "finishReason": "STOP"}]}


class VendorUpstream(ThreadedUpstream):
    def root(self, mode: str) -> str:
        return f"http://127.0.0.1:{self.port}/{mode}"

    async def _anthropic(self, request: web.Request) -> web.StreamResponse:
        mode = request.match_info["mode"]
        body = await request.json()
        if not body.get("stream"):
            answer = ANTHROPIC[mode][0] if mode in ANTHROPIC else _AN_OK
            return web.json_response(answer)
        events = ANTHROPIC[mode][1] if mode in ANTHROPIC else FIRST_BAD.get(mode, GOOD_STREAM)
        return await self._sse(request, events)

    async def _gemini(self, request: web.Request) -> web.StreamResponse:
        mode = "ge_error_code"  # the only Gemini mode (its base_url has no path of its own)
        if "stream" not in request.match_info["method"]:
            return web.json_response(GEMINI_UNARY)
        return await self._sse(request, FIRST_BAD[mode])

    @staticmethod
    async def _sse(request: web.Request, events: list[bytes]) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        for ev in events:
            await resp.write(ev)
            await asyncio.sleep(0.05)  # one event per read: the first goes out alone
        await resp.write_eof()
        return resp

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/{mode}/v1/messages", self._anthropic)
        app.router.add_post("/v1beta/models/{method}", self._gemini)


MODES = [*ANTHROPIC, *FIRST_BAD]


def _policy(up: VendorUpstream) -> str:
    lines = ["providers:", f"  good: {{type: anthropic, base_url: '{up.root('good')}'}}"]
    pools, models = ["pools:"], ["models:"]
    for mode in MODES:
        kind = "gemini" if mode.startswith("ge_") else "anthropic"
        base = f"http://127.0.0.1:{up.port}" if kind == "gemini" else up.root(mode)
        for name, fallback in ((mode, ", fallback: [p_good]"), (f"{mode}_solo", "")):
            lines.append(
                f"  {name}: {{type: {kind}, base_url: '{base}', "
                "breaker: {consecutive_failures: 1000}}"
            )
            pools.append(f"  p_{name}: {{members: [{name}], max_attempts: 1{fallback}}}")
            models.append(f"  {name}: {{pool: p_{name}}}")
    pools.append("  p_good: {members: [good]}")
    retry = (
        "retry: {max_attempts: 3, base_backoff_ms: 1, max_backoff_ms: 2, budget_min_per_s: 1000}"
    )
    return "\n".join([retry, *lines, *pools, *models]) + "\n"


@pytest.fixture(scope="module")
def gw() -> Iterator[GatewayServer]:
    with VendorUpstream() as up, GatewayServer(_policy(up)) as server:
        yield server


def _failures(gw: GatewayServer, alias: str) -> list[str]:
    """The failures of the last finished request of `alias` (its record follows its last byte)."""
    ctx = poll(lambda: next((c for c in reversed(gw.seen) if c.alias == alias), None))
    return list(ctx.failures)


@pytest.mark.parametrize("mode", list(ANTHROPIC))
def test_a_malformed_unary_answer_is_a_bad_response(
    gw: GatewayServer, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="gateway"):
        r = gw.chat(model=f"{mode}_solo")
        assert r.status_code == 502, r.text
        assert r.json()["error"]["code"] == "upstream_bad_response"
        assert _failures(gw, f"{mode}_solo") == [f"{mode}_solo:bad_response"]
        # Retried on the good member: the client gets the answer.
        answer = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0)
        done = answer.chat.completions.create(model=mode, messages=MSG)  # type: ignore[arg-type]
        assert done.choices[0].message.content == "hi"
        assert _failures(gw, mode) == [f"{mode}:bad_response"]
    assert not [r for r in caplog.records if "unexpected" in r.getMessage()]


@pytest.mark.parametrize("mode", list(ANTHROPIC))
def test_a_malformed_event_mid_stream_ends_with_an_error_event(
    gw: GatewayServer, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="gateway"):
        body = {"model": f"{mode}_solo", "messages": MSG, "stream": True}
        r = httpx.post(gw.base_url + "/chat/completions", json=body, timeout=15)
        assert r.status_code == 200
        assert b'"error"' in r.content and b"data: [DONE]" not in r.content
        events = [e for e in r.text.split("\n\n") if e.startswith("data: {")]
        assert json.loads(events[-1][6:])["error"]["code"] == "bad_response"
        # The chunks before it are valid chunks.
        validate_sse(r.content.rsplit(b"data: {", 1)[0] + b"data: [DONE]\n\n")
        assert "Hi" in r.text
    assert not [r for r in caplog.records if "unexpected" in r.getMessage()]


@pytest.mark.parametrize("mode", list(FIRST_BAD))
def test_a_malformed_first_event_is_retried_before_any_byte(
    gw: GatewayServer, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="gateway"):
        body = {"model": f"{mode}_solo", "messages": MSG, "stream": True}
        r = httpx.post(gw.base_url + "/chat/completions", json=body, timeout=15)
        assert r.status_code == 502, r.text
        assert r.json()["error"]["code"] == "upstream_bad_response"
        client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0)
        stream = client.chat.completions.create(model=mode, messages=MSG, stream=True)  # type: ignore[arg-type]
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == "hi"
    assert not [r for r in caplog.records if "unexpected" in r.getMessage()]
