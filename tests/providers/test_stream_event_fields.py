"""An OpenAI-compatible stream may carry SSE fields besides `data:` (`event: message`, `id:`,
`retry:`), comments, `data:` without its space and CRLF line ends: all legal SSE. The official
OpenAI SDK reads a named event as something else than a chunk (its text is lost) and an event of
fields alone as a chunk of empty data (it raises), so the gateway relays each chunk as the one
`data: {...}` line an OpenAI stream is made of, comments as comments, and nothing else.

Official clients -> gateway -> a real loopback upstream answering by mode.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest
from aiohttp import web

from tests.support import GatewayServer, ThreadedUpstream, validate_sse

MSG = [{"role": "user", "content": "hi"}]


def _data(delta: dict[str, Any], finish: str | None = None) -> bytes:
    doc = {
        "id": "c",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return json.dumps(doc).encode()


FIRST, HEL, LO, END = (
    _data({"role": "assistant", "content": ""}),
    _data({"content": "hel"}),
    _data({"content": "lo"}),
    _data({}, "stop"),
)
MODES: dict[str, list[bytes]] = {
    "named": [b"event: message\ndata: " + d + b"\n\n" for d in (FIRST, HEL, LO, END)]
    + [b"event: message\ndata: [DONE]\n\n"],
    "ids": [b"id: %d\ndata: " % i + d + b"\n\n" for i, d in enumerate((FIRST, HEL, LO, END))]
    + [b"data: [DONE]\n\n"],
    "fieldsalone": [
        b"retry: 3000\n\n",
        b"data: " + FIRST + b"\n\n",
        b"id: 7\n\n",
        b"data: " + HEL + b"\n\n",
        b": ping\nevent: keepalive\n\n",
        b"data: " + LO + b"\n\n",
        b"data: " + END + b"\n\n",
        b"data: [DONE]\n\n",
    ],
    "nospace": [b"data:" + d + b"\n\n" for d in (FIRST, HEL, LO, END)] + [b"data:[DONE]\n\n"],
    "crlf": [b"event: message\r\ndata: " + d + b"\r\n\r\n" for d in (FIRST, HEL, LO, END)]
    + [b"data: [DONE]\r\n\r\n"],
}


class Upstream(ThreadedUpstream):
    async def _handle(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        for ev in MODES[request.match_info["mode"]]:
            await resp.write(ev)
        await resp.write_eof()
        return resp

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/{mode}/v1/chat/completions", self._handle)


@pytest.fixture(scope="module")
def gw() -> Iterator[GatewayServer]:
    with Upstream() as up:
        lines = ["providers:"]
        lines += [f"  {m}: {{base_url: 'http://127.0.0.1:{up.port}/{m}/v1'}}" for m in MODES]
        lines += ["pools:"] + [f"  p_{m}: {{members: [{m}]}}" for m in MODES]
        lines += ["models:"] + [f"  {m}: {{pool: p_{m}}}" for m in MODES]
        with GatewayServer("\n".join(lines) + "\n") as server:
            yield server


@pytest.mark.parametrize("mode", list(MODES))
def test_the_openai_sdk_reads_the_whole_stream(gw: GatewayServer, mode: str) -> None:
    client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0)
    stream = client.chat.completions.create(model=mode, messages=MSG, stream=True)  # type: ignore[arg-type]
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == "hello"


@pytest.mark.parametrize("mode", list(MODES))
def test_each_relayed_event_is_one_data_line_or_a_comment(gw: GatewayServer, mode: str) -> None:
    body = {"model": mode, "messages": MSG, "stream": True}
    r = httpx.post(gw.base_url + "/chat/completions", json=body, timeout=10)
    assert r.status_code == 200
    events = [e for e in r.text.split("\n\n") if e]
    for ev in events:
        lines = ev.split("\n")
        assert all(line.startswith(":") for line in lines) or (
            len(lines) == 1 and lines[0].startswith("data: ")
        ), ev
    validate_sse("\n\n".join(e for e in events if not e.startswith(":")) + "\n\n")


@pytest.mark.parametrize("mode", list(MODES))
def test_the_messages_and_responses_apis_read_it_too(gw: GatewayServer, mode: str) -> None:
    an = anthropic.Anthropic(base_url=gw.url, api_key="x", max_retries=0)
    with an.messages.stream(model=mode, max_tokens=10, messages=MSG) as s:  # type: ignore[arg-type]
        assert "".join(s.text_stream) == "hello"
    oa = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0)
    events = list(oa.responses.create(model=mode, input="hi", stream=True))
    done = [e for e in events if e.type == "response.completed"]
    assert done and done[0].response.output_text == "hello"
