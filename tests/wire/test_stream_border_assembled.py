"""The answer assembled from a stream (what the cache stores and replays, what a resume sends
back) is what was streamed: a refusal, a provider's reasoning text, text and tool calls, a legacy
function call, and a legacy completions stream (`choices[].text`) all come back from the cache as
they were streamed the first time.

Official clients -> gateway (exact cache) -> a scripted loopback upstream; the second identical
request is a cache hit and its stream reads the same as the first.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from gateway.pipeline.stages.cache import faithful
from gateway.wire.answer_checks import check_unary
from gateway.wire.chunks import StreamAssembler
from gateway.wire.sse import split_events
from tests.support import GatewayServer, poll
from tests.wire.test_stream_border_upstream import Scripted, chat_chunk, scripted_policy, sse

MSG = [{"role": "user", "content": "hi"}]


def _call(index: int, **fn: str) -> dict[str, Any]:
    return {"index": index, "function": fn}


CHAT: dict[str, list[bytes]] = {
    "refusal": [
        chat_chunk({"role": "assistant", "content": None, "refusal": ""}),
        chat_chunk({"refusal": "I can't "}),
        chat_chunk({"refusal": "help with that."}),
        chat_chunk({}, "stop"),
    ],
    "reasoning": [
        chat_chunk({"role": "assistant", "content": "", "reasoning_content": None}),
        chat_chunk({"reasoning_content": "think "}),
        chat_chunk({"reasoning_content": "hard"}),
        chat_chunk({"content": "the answer"}),
        chat_chunk({}, "stop"),
    ],
    "text_and_tools": [
        chat_chunk({"role": "assistant", "content": ""}),
        chat_chunk({"content": "Let me check."}),
        chat_chunk({"tool_calls": [{**_call(0, name="get", arguments=""), "id": "c1"}]}),
        chat_chunk({"tool_calls": [_call(0, arguments='{"q":')]}),
        chat_chunk({"tool_calls": [_call(0, arguments=' "x"}')]}),
        chat_chunk({"tool_calls": [{**_call(1, name="put", arguments="{}"), "id": "c2"}]}),
        chat_chunk({}, "tool_calls"),
    ],
    "function_call": [
        chat_chunk({"role": "assistant", "content": None}),
        chat_chunk({"function_call": {"name": "get", "arguments": ""}}),
        chat_chunk({"function_call": {"arguments": '{"q": 1}'}}),
        chat_chunk({}, "function_call"),
    ],
}


def _text_chunk(text: str, finish: str | None = None) -> bytes:
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
    doc = {"id": "cmpl-up", "object": "text_completion", "created": 1, "model": "m"}
    return json.dumps({**doc, "choices": [choice]}).encode()


COMPLETIONS = {
    "legacy": [
        _text_chunk("Once"),
        _text_chunk(" upon"),
        _text_chunk(" a time"),
        _text_chunk("", "stop"),
    ]
}
SCRIPTS = {m: [sse(*evs, b"[DONE]")] for m, evs in {**CHAT, **COMPLETIONS}.items()}


@pytest.fixture(scope="module")
def up() -> Iterator[Scripted]:
    with Scripted(SCRIPTS) as server:
        yield server


@pytest.fixture(scope="module")
def gw(up: Scripted) -> Iterator[GatewayServer]:
    with GatewayServer(scripted_policy(up, list(SCRIPTS))) as server:
        yield server


def streamed(body: bytes) -> dict[int, dict[str, Any]]:
    """What a client reads from a stream, per choice: every text joined, tool calls by index."""
    out: dict[int, dict[str, Any]] = {}
    for ev in split_events(body):
        data = ev.removeprefix(b"data: ").strip()
        if not data.startswith(b"{"):
            continue
        for c in json.loads(data).get("choices") or []:
            slot = out.setdefault(c["index"], {"tool_calls": {}})
            if "text" in c:
                slot["text"] = slot.get("text", "") + (c["text"] or "")
            for k, v in (c.get("delta") or {}).items():
                if k == "tool_calls":
                    for tc in v:
                        cur = slot["tool_calls"].setdefault(tc["index"], {"name": "", "args": ""})
                        cur["name"] += (tc.get("function") or {}).get("name") or ""
                        cur["args"] += (tc.get("function") or {}).get("arguments") or ""
                        cur["id"] = tc.get("id") or cur.get("id")
                elif k == "function_call":
                    slot[k] = (
                        slot.get(k, "") + (v.get("name") or "") + "|" + (v.get("arguments") or "")
                    )
                elif isinstance(v, str) and k != "role":
                    slot[k] = slot.get(k, "") + v
            if c.get("finish_reason"):
                slot["finish"] = c["finish_reason"]
    return out


# A legacy function call alone is not stored by the cache (`faithful`): assembled, not cached.
@pytest.mark.parametrize("mode", [m for m in SCRIPTS if m != "function_call"])
def test_a_cached_stream_replays_what_was_streamed(
    gw: GatewayServer, up: Scripted, mode: str
) -> None:
    path = "/completions" if mode in COMPLETIONS else "/chat/completions"
    body: dict[str, Any] = {"model": mode, "stream": True, "max_tokens": 20, "temperature": 0}
    body.update({"prompt": "hi"} if mode in COMPLETIONS else {"messages": MSG})
    n = len(gw.seen)
    first = httpx.post(gw.base_url + path, json=body, timeout=10)
    assert first.status_code == 200 and first.headers["x-gateway-cache"] == "miss"
    # The answer is stored once its stream has ended on the gateway's side.
    poll(lambda: len(gw.seen) > n)
    for _ in range(20):
        again = httpx.post(gw.base_url + path, json=body, timeout=10)
        if again.headers["x-gateway-cache"] == "hit-exact":
            break
        time.sleep(0.05)
    assert again.headers["x-gateway-cache"] == "hit-exact", "the streamed answer was not stored"
    assert up.hits[mode] == 1
    assert streamed(again.content) == streamed(first.content) != {}


def test_the_official_clients_read_the_replayed_refusal_and_text(gw: GatewayServer) -> None:
    client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0)
    for _ in range(2):
        chunks = list(
            client.chat.completions.create(
                model="refusal", messages=MSG, max_tokens=21, stream=True
            )
        )  # type: ignore[arg-type]
        assert "".join(c.choices[0].delta.refusal or "" for c in chunks if c.choices) == (
            "I can't help with that."
        )
        text = client.completions.create(
            model="legacy", prompt="hey", max_tokens=21, stream=True, temperature=0
        )
        assert "".join(c.choices[0].text for c in text) == "Once upon a time"


@pytest.mark.parametrize("mode", list(SCRIPTS))
def test_the_assembled_answer_is_a_valid_answer_of_the_endpoint(mode: str) -> None:
    endpoint = "completions" if mode in COMPLETIONS else "chat"
    asm = StreamAssembler(endpoint)
    raw = SCRIPTS[mode][0]
    for ev in split_events(raw):
        asm.feed_event(ev)
    assert asm.complete()
    doc = asm.to_completion()
    check_unary(endpoint, json.dumps(doc).encode())
    assert faithful(endpoint, json.dumps(doc).encode()) or mode == "function_call"
    choice = doc["choices"][0]
    if endpoint == "completions":
        assert doc["object"] == "text_completion" and choice["text"] == "Once upon a time"
        return
    msg = choice["message"]
    want = {
        "refusal": {"content": None, "refusal": "I can't help with that."},
        "reasoning": {"content": "the answer", "reasoning_content": "think hard"},
        "text_and_tools": {"content": "Let me check."},
        "function_call": {"function_call": {"name": "get", "arguments": '{"q": 1}'}},
    }[mode]
    assert {k: msg.get(k) for k in want} == want
    if mode == "text_and_tools":
        calls = [
            (c["id"], c["function"]["name"], c["function"]["arguments"]) for c in msg["tool_calls"]
        ]
        assert calls == [("c1", "get", '{"q": "x"}'), ("c2", "put", "{}")]
