"""A provider key quoted base64-encoded (standard or URL-safe alphabet, at any alignment: alone,
or inside an encoded `user:KEY` credential) or URL-quoted in a streamed answer is masked like in
a unary answer, whether it arrives whole or cut into pieces of any size, in every text a chunk
carries (content, reasoning, refusal, tool and function call arguments, a completion's text),
and through every streaming API (/v1/chat/completions, /v1/completions, /v1/messages,
/v1/responses).

Official-shaped streams -> gateway (the key configured for the provider) -> client, which reads
the text back from the events in order: no run of 8 characters of any spelling of the key.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from gateway.redact import base64_cores
from gateway.wire.sse import split_events
from tests.support import GatewayServer
from tests.wire.test_stream_border_upstream import Scripted, chat_chunk, scripted_policy, sse

# `/` and `+` in the key: its URL-quoted and URL-safe base64 spellings differ from the others.
KEY = "sk-Zq8vN3xK7p/L2mW9rT4+yB6cD1fG5hJ0aE"
FORMS = {
    "b64": base64.b64encode(KEY.encode()).decode(),
    "b64-basic": base64.b64encode(b"user:" + KEY.encode()).decode(),  # another alignment
    "b64-urlsafe": base64.urlsafe_b64encode(b"u:" + KEY.encode()).decode(),
    "url": quote(KEY, safe=""),
}
FIELDS = ["content", "reasoning_content", "refusal", "tool_args", "function_args", "text"]
SIZES: list[int | str] = [1, "two"]  # pieces of 1 character, or the form cut once in its middle
MSG = [{"role": "user", "content": "hi"}]
# Every run the client must not read: 8 characters of a spelling of the key (past `sk-`).
SPELLINGS = [KEY[3:], quote(KEY, safe="")[3:], *base64_cores(KEY)]
RUNS = {s[i : i + 8] for s in SPELLINGS for i in range(len(s) - 7)}


def _pieces(text: str, size: int | str) -> list[str]:
    if size == "two":
        mid = len(text) // 2
        return [text[:mid], text[mid:]]
    assert isinstance(size, int)
    return [text[i : i + size] for i in range(0, len(text), size)]


def _delta(field: str, piece: str) -> dict[str, Any]:
    if field == "tool_args":
        return {"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}
    if field == "function_args":
        return {"function_call": {"arguments": piece}}
    return {field: piece}


def _chat_events(field: str, text: str, size: int | str) -> list[bytes]:
    first: dict[str, Any] = {"role": "assistant", "content": None if "args" in field else ""}
    if field == "tool_args":
        first["tool_calls"] = [
            {"index": 0, "id": "c1", "type": "function", "function": {"name": "f", "arguments": ""}}
        ]
    if field == "function_args":
        first["function_call"] = {"name": "f", "arguments": ""}
    pieces = ["before "] + _pieces(text, size) + [" after"]
    events = [sse(chat_chunk(first))] + [sse(chat_chunk(_delta(field, p))) for p in pieces]
    return [*events, sse(chat_chunk({}, "stop")), sse(b"[DONE]")]


def _text_events(text: str, size: int | str) -> list[bytes]:
    def ev(piece: str, finish: str | None = None) -> bytes:
        doc = {"id": "c", "object": "text_completion", "created": 1, "model": "m"}
        choice = {"index": 0, "text": piece, "logprobs": None, "finish_reason": finish}
        return sse(json.dumps({**doc, "choices": [choice]}).encode())

    pieces = ["before "] + _pieces(text, size) + [" after"]
    return [ev(p) for p in pieces] + [ev("", "stop"), sse(b"[DONE]")]


def stream_scripts(
    forms: dict[str, str], fields: list[str], sizes: list[int | str]
) -> dict[str, list[Any]]:
    """A stream per `field.form.size`: the form's text cut into pieces of that size, between
    "before " and " after", in that field of a chat delta (or a completion's text)."""
    out: dict[str, list[Any]] = {}
    for form, text in forms.items():
        for size in sizes:
            for field in fields:
                evs = (
                    _text_events(text, size) if field == "text" else _chat_events(field, text, size)
                )
                # One event per read (1-character pieces) or all in one read (the block path).
                out[f"{field}.{form}.{size}"] = (
                    [x for ev in evs for x in (ev, 0.0005)] if size == 1 else [b"".join(evs)]
                )
    return out


SCRIPTS = stream_scripts(FORMS, FIELDS, SIZES)
for _form, _text in FORMS.items():
    # A spelling whole in one event, in a field the text guard does not read (the chunk's id).
    SCRIPTS[f"id.{_form}.whole"] = [
        sse(chat_chunk({"role": "assistant", "content": "ok"}, id=f"chatcmpl-{_text}")),
        sse(chat_chunk({}, "stop"), b"[DONE]"),
    ]


@pytest.fixture(scope="module")
def gw() -> Iterator[GatewayServer]:
    with Scripted(SCRIPTS) as up:
        text = scripted_policy(up, list(SCRIPTS), provider=", api_key_env: STREAM_BORDER_4_KEY")
        with GatewayServer(text, env={"STREAM_BORDER_4_KEY": KEY}) as server:
            yield server


_TEXT_KEYS = {
    "content",
    "reasoning_content",
    "refusal",
    "arguments",
    "text",
    "delta",
    "thinking",
    "partial_json",
    "id",
}


def _read(body: bytes) -> str:
    """Every text the events carry, in order (any API's event shapes)."""
    out: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                if isinstance(v, str) and k in _TEXT_KEYS:
                    out.append(v)
                else:
                    walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    for ev in split_events(body):
        for line in ev.split(b"\n"):
            if line.startswith(b"data:") and line[5:].strip().startswith(b"{"):
                walk(json.loads(line[5:]))
    return "".join(out)


def _assert_masked(r: httpx.Response, whole: bool = True) -> str:
    assert r.status_code == 200, r.text
    got = _read(r.content)
    leaked = [run for run in RUNS if run in got or run in r.text]
    assert not leaked, got
    if whole:
        assert "before " in got and " after" in got and "[redacted]" in got, got
    return got


def post_mode(gw: GatewayServer, mode: str, stream: bool) -> httpx.Response:
    """The request of a `field.form.size` script: a completion for `text`, else a chat."""
    text = mode.split(".")[0] == "text"
    body: dict[str, Any] = {"model": mode, "stream": stream}
    body.update({"prompt": "hi"} if text else {"messages": MSG})
    path = "/completions" if text else "/chat/completions"
    return httpx.post(gw.base_url + path, json=body, timeout=10)


@pytest.mark.parametrize("mode", [m for m in SCRIPTS if not m.startswith("id.")])
def test_an_encoded_key_cut_into_pieces_is_masked_in_chat_and_completions(
    gw: GatewayServer, mode: str
) -> None:
    _assert_masked(post_mode(gw, mode, stream=True))


@pytest.mark.parametrize("form", list(FORMS))
def test_an_encoded_key_in_a_chunk_id_is_masked(gw: GatewayServer, form: str) -> None:
    body = {"model": f"id.{form}.whole", "stream": True, "messages": MSG}
    r = httpx.post(gw.base_url + "/chat/completions", json=body, timeout=10)
    assert "[redacted]" in _assert_masked(r, whole=False)


@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("field", ["content", "tool_args"])
def test_an_encoded_key_is_masked_in_the_messages_stream(
    gw: GatewayServer, form: str, field: str
) -> None:
    body: dict[str, Any] = {
        "model": f"{field}.{form}.two",
        "max_tokens": 64,
        "stream": True,
        "messages": MSG,
    }
    if field == "tool_args":
        body["tools"] = [{"name": "f", "input_schema": {"type": "object"}}]
    _assert_masked(httpx.post(gw.base_url + "/messages", json=body, timeout=10))


@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("field", ["content", "tool_args"])
def test_an_encoded_key_is_masked_in_the_responses_stream(
    gw: GatewayServer, form: str, field: str
) -> None:
    body: dict[str, Any] = {"model": f"{field}.{form}.1", "stream": True, "input": "hi"}
    if field == "tool_args":
        body["tools"] = [{"type": "function", "name": "f", "parameters": {"type": "object"}}]
    _assert_masked(httpx.post(gw.base_url + "/responses", json=body, timeout=10))
