"""A provider key is masked in a relayed stream whatever the stream does with it: cut into
pieces of any size (1, 3 or 7 characters, one piece per event), in any text a chunk carries
(content, reasoning_content, reasoning, refusal, a tool call's or a legacy function call's
arguments, a completion's text), events sent one by one or several in one read. The client
reads the text with the key replaced by the mask and no run of 8 of its characters.

Official-shaped streams -> gateway (the key configured for the provider) -> client.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gateway.wire.sse import split_events
from tests.support import GatewayServer
from tests.wire.test_stream_border_upstream import Scripted, chat_chunk, scripted_policy, sse

KEY = "sk-Zq8vN3xK7pL2mW9rT4yB6cD1fG5hJ0aE"
TEXT = "before " + KEY + " after"
MSG = [{"role": "user", "content": "hi"}]
FIELDS = ["content", "reasoning_content", "reasoning", "refusal", "tool_args", "function_args"]
SIZES = [1, 3, 7]


def _delta(field: str, piece: str) -> dict[str, Any]:
    if field == "tool_args":
        return {"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}
    if field == "function_args":
        return {"function_call": {"arguments": piece}}
    return {field: piece}


def _pieces(size: int) -> list[str]:
    return [TEXT[i : i + size] for i in range(0, len(TEXT), size)]


def _chat_events(field: str, size: int) -> list[bytes]:
    first: dict[str, Any] = {"role": "assistant", "content": None if "args" in field else ""}
    if field == "tool_args":
        first["tool_calls"] = [
            {"index": 0, "id": "c1", "type": "function", "function": {"name": "f", "arguments": ""}}
        ]
    if field == "function_args":
        first["function_call"] = {"name": "f", "arguments": ""}
    events = [sse(chat_chunk(first))]
    events += [sse(chat_chunk(_delta(field, p))) for p in _pieces(size)]
    return [*events, sse(chat_chunk({}, "stop")), sse(b"[DONE]")]


def _text_events(size: int) -> list[bytes]:
    def ev(text: str, finish: str | None = None) -> bytes:
        doc = {"id": "c", "object": "text_completion", "created": 1, "model": "m"}
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        return sse(json.dumps({**doc, "choices": [choice]}).encode())

    return [ev(p) for p in _pieces(size)] + [ev("", "stop"), sse(b"[DONE]")]


SCRIPTS: dict[str, list[Any]] = {}
for _size in SIZES:
    for _field in FIELDS:
        SCRIPTS[f"{_field}-{_size}-apart"] = [
            x for ev in _chat_events(_field, _size) for x in (ev, 0.001)
        ]
        SCRIPTS[f"{_field}-{_size}-together"] = [b"".join(_chat_events(_field, _size))]
    SCRIPTS[f"text-{_size}-apart"] = [x for ev in _text_events(_size) for x in (ev, 0.001)]
    SCRIPTS[f"text-{_size}-together"] = [b"".join(_text_events(_size))]


@pytest.fixture(scope="module")
def gw() -> Iterator[GatewayServer]:
    with Scripted(SCRIPTS) as up:
        text = scripted_policy(up, list(SCRIPTS), provider=", api_key_env: STREAM_BORDER_KEY")
        with GatewayServer(text, env={"STREAM_BORDER_KEY": KEY}) as server:
            yield server


def _read(body: bytes, field: str) -> str:
    out = ""
    for ev in split_events(body):
        data = ev.removeprefix(b"data: ").strip()
        if not data.startswith(b"{"):
            continue
        for c in json.loads(data).get("choices") or []:
            d = c.get("delta") or {}
            if field == "text":
                out += c.get("text") or ""
            elif field == "tool_args":
                out += "".join(
                    (tc.get("function") or {}).get("arguments") or ""
                    for tc in d.get("tool_calls") or []
                )
            elif field == "function_args":
                out += (d.get("function_call") or {}).get("arguments") or ""
            else:
                out += d.get(field) or ""
    return out


@pytest.mark.parametrize("mode", list(SCRIPTS))
def test_a_key_cut_into_any_pieces_never_reaches_the_client(gw: GatewayServer, mode: str) -> None:
    field = mode.split("-")[0]
    path = "/completions" if field == "text" else "/chat/completions"
    body: dict[str, Any] = {"model": mode, "stream": True}
    body.update({"prompt": "hi"} if field == "text" else {"messages": MSG})
    r = httpx.post(gw.base_url + path, json=body, timeout=10)
    assert r.status_code == 200, r.text
    runs = {KEY[i : i + 8] for i in range(3, len(KEY) - 7)}  # past the public `sk-`
    assert not [run for run in runs if run in r.text], r.text
    got = _read(r.content, field)
    assert got.startswith("before ") and got.endswith(" after") and "[redacted]" in got, got
