"""Streamed tool arguments through the Messages API, as the official `anthropic` SDK reads them.

A chat provider's tool arguments are text the model wrote: not always a JSON object (free text,
a list, an object followed by junk). The SDK parses each `input_json_delta` as it arrives and
raises on text that can begin no JSON object, so the gateway streams only what can, and gives a
call whose arguments never began one the same `{"_raw_arguments": ...}` input as the unary
answer. Official client -> gateway -> a real loopback upstream answering by mode.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import pytest
from aiohttp import web

from gateway.apis.messages import _ObjectPrefix
from tests.support import GatewayServer, ThreadedUpstream

MSG = [{"role": "user", "content": "weather?"}]
TOOLS = [
    {
        "name": "f",
        "description": "a tool",
        "input_schema": {"type": "object", "properties": {"a": {"type": "integer"}}},
    }
]


def _chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    doc = {
        "id": "c",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return b"data: " + json.dumps(doc).encode() + b"\n\n"


def _call(index: int, args: str, name: str | None = None) -> bytes:
    call: dict[str, Any] = {"index": index, "function": {"arguments": args}}
    if name is not None:
        call.update(id=f"call_{index}", type="function")
        call["function"]["name"] = name
    return _chunk({"tool_calls": [call]})


# mode -> (argument pieces per call, the input the client must end with per call)
CASES: dict[str, tuple[list[list[str]], list[Any]]] = {
    "object": ([['{"a"', ": 1", "}"]], [{"a": 1}]),
    "text": ([["not ", "json"]], [{"_raw_arguments": "not json"}]),
    "list": ([["[1,", " 2]"]], [{"_raw_arguments": "[1, 2]"}]),
    "string": ([['"just a string"']], [{"_raw_arguments": '"just a string"'}]),
    "trailing": ([['{"a"', ": 1} and more"]], [{"a": 1}]),
    "junkafter": ([['{"a": 1}', " ok?"]], [{"a": 1}]),
    "two": ([["oops"], ['{"a":', " 2}"]], [{"_raw_arguments": "oops"}, {"a": 2}]),
    "escapes": ([['{"a": "x\\u00e9\\n', '\\"q\\""}']], [{"a": 'xé\n"q"'}]),
    "nested": (
        [['{"a": [1, {"b": nu', "ll}], ", '"c": -2.5e1}']],
        [{"a": [1, {"b": None}], "c": -25.0}],
    ),
    "empty": ([[""]], [{}]),
    "interleaved": ([], [{"a": 1}, {"a": 2}]),
}


def _stream(mode: str) -> list[bytes]:
    if mode == "interleaved":  # two calls whose argument pieces alternate
        return [
            _chunk({"role": "assistant", "content": None}),
            _call(0, '{"a"', "f"),
            _call(1, '{"a": 2', "f"),
            _call(0, ": 1}"),
            _call(1, "}"),
            _chunk({}, "tool_calls"),
            b"data: [DONE]\n\n",
        ]
    calls, _ = CASES[mode]
    events = [_chunk({"role": "assistant", "content": None})]
    for i, pieces in enumerate(calls):
        events.append(_call(i, pieces[0], "f"))
        events += [_call(i, p) for p in pieces[1:]]
    events.append(_chunk({}, "tool_calls"))
    return [*events, b"data: [DONE]\n\n"]


class Upstream(ThreadedUpstream):
    async def _handle(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        for ev in _stream(request.match_info["mode"]):
            await resp.write(ev)
        await resp.write_eof()
        return resp

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/{mode}/v1/chat/completions", self._handle)


@pytest.fixture(scope="module")
def gw() -> Iterator[GatewayServer]:
    with Upstream() as up:
        lines = ["providers:"]
        lines += [f"  {m}: {{base_url: 'http://127.0.0.1:{up.port}/{m}/v1'}}" for m in CASES]
        lines += ["pools:"] + [f"  p_{m}: {{members: [{m}]}}" for m in CASES]
        lines += ["models:"] + [f"  {m}: {{pool: p_{m}}}" for m in CASES]
        with GatewayServer("\n".join(lines) + "\n") as server:
            yield server


@pytest.mark.parametrize("mode", list(CASES))
def test_streamed_tool_input_is_what_the_sdk_can_read(gw: GatewayServer, mode: str) -> None:
    client = anthropic.Anthropic(base_url=gw.url, api_key="x", max_retries=0)
    with client.messages.stream(model=mode, max_tokens=20, messages=MSG, tools=TOOLS) as s:  # type: ignore[arg-type]
        final = s.get_final_message()
    assert final.stop_reason == "tool_use"
    inputs = [b.input for b in final.content if b.type == "tool_use"]
    assert inputs == CASES[mode][1]


@pytest.mark.parametrize("mode", ["object", "nested", "escapes"])
def test_a_valid_tool_input_still_streams_in_pieces(gw: GatewayServer, mode: str) -> None:
    body = {"model": mode, "max_tokens": 20, "messages": MSG, "tools": TOOLS, "stream": True}
    r = httpx.post(gw.url + "/v1/messages", json=body, timeout=10)
    deltas = [
        json.loads(line[6:])["delta"]["partial_json"]
        for line in r.text.splitlines()
        if line.startswith("data: ") and '"input_json_delta"' in line
    ]
    assert deltas == CASES[mode][0][0]


@pytest.mark.parametrize(
    "text",
    [
        "{}",
        ' { "a" : [1, -2.5e-3, true, false, null, {"b": "}\\"\\u00e9"}, []], "c": {} } ',
    ],
)
def test_every_start_of_an_object_is_a_prefix(text: str) -> None:
    for cut in range(len(text) + 1):
        assert _ObjectPrefix().feed(text[:cut]) == cut, text[:cut]
    p = _ObjectPrefix()
    assert all(p.feed(ch) == 1 for ch in text) and p.closed


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ("not json", 0),
        ("[1]", 0),
        ('"s"', 0),
        ("12", 0),
        ('{"a":1}}', 7),
        ('{"a":1,}', 7),
        ('{"a":[1,]}', 8),
        ("{a:1}", 1),
        ('{"a" 1}', 5),
        ('{"a":tru e}', 8),
        ('{"a":"\\x"}', 7),
        ('{"a":-}', 6),
        ('{"a":1]', 6),
        ('{"a":nul}', 8),
        ('{"a":"\x01"}', 6),
    ],
)
def test_what_can_begin_no_object_is_found_where_it_goes_wrong(text: str, ok: int) -> None:
    assert _ObjectPrefix().feed(text) == ok
