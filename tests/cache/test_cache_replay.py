"""A cached answer replayed to a streaming request is its endpoint's stream, whole.

Through the HTTP API with the official openai and anthropic clients: a completions answer is
replayed as text_completion events (it came back as chat chunks with the text lost), a refused
chat answer as refusal deltas (it came back as an empty answer), with the answer's id, usage when
asked, and `[DONE]`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.hostile import HostileUpstream
from tests.support import TWO_TENANTS, GatewayServer, policy, poll, requests_at, validate_sse


@pytest.fixture(scope="module")
def hostile() -> Iterator[HostileUpstream]:
    with HostileUpstream() as h:
        yield h


@pytest.fixture
def gw(fleet: Any, gateway: Any, hostile: HostileUpstream) -> GatewayServer:
    fleet.reset("a")
    return gateway(
        policy(
            {"p": fleet.url("a"), "r": hostile.url("refusal")},
            "p",
            auth=TWO_TENANTS,
            pool={"members": ["p"]},
            pools={"refusing": {"members": ["r"]}},
            models={"refusing": {"pool": "refusing"}},
        )
    )


def client(gw: GatewayServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key="key-1", max_retries=0)


def sse_payloads(body: bytes) -> list[dict[str, Any]]:
    out = []
    for block in body.decode().split("\n\n"):
        if block.startswith("data: ") and block != "data: [DONE]":
            out.append(json.loads(block[6:]))
    assert body.rstrip().endswith(b"data: [DONE]")
    return out


@pytest.mark.parametrize("include_usage", [True, False])
def test_a_completions_answer_is_replayed_as_a_completions_stream(gw, fleet, include_usage) -> None:
    oai = client(gw)
    first = oai.completions.create(model="chat", prompt="Say hi", temperature=0, max_tokens=8)
    options = {"include_usage": True} if include_usage else None
    raw = httpx.post(
        gw.base_url + "/completions",
        json={
            "model": "chat",
            "prompt": "Say hi",
            "temperature": 0,
            "max_tokens": 8,
            "stream": True,
            **({"stream_options": options} if options else {}),
        },
        headers={"authorization": "Bearer key-1"},
        timeout=30,
    )
    assert raw.headers["x-gateway-cache"] == "hit-exact"
    assert raw.headers["content-type"].startswith("text/event-stream")
    chunks = sse_payloads(raw.content)
    for chunk in chunks:
        assert chunk["object"] == "text_completion" and chunk["id"] == first.id
    text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    assert text == first.choices[0].text and text
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert finishes[-1] == first.choices[0].finish_reason and set(finishes[:-1]) <= {None}
    usage = [c["usage"] for c in chunks if c.get("usage")]
    assert usage == ([first.usage.model_dump(exclude_none=True)] if include_usage else [])
    # Shaped like the live stream the provider sends (asked with no-store: not from the cache).
    live = httpx.post(
        gw.base_url + "/completions",
        json={"model": "chat", "prompt": "Say hi", "temperature": 0, "max_tokens": 8,
              "stream": True},
        headers={"authorization": "Bearer key-1", "cache-control": "no-store"},
        timeout=30,
    )  # fmt: skip
    live_chunks = [c for c in sse_payloads(live.content) if c["choices"]]
    assert {c["object"] for c in live_chunks} == {"text_completion"}
    for chunk in chunks:
        assert set(chunk) <= set(live_chunks[0]) | {"usage"}
        for choice in chunk["choices"]:
            assert set(choice) == set(live_chunks[0]["choices"][0])
    # The official client reads it as a completions stream.
    stream = oai.completions.create(
        model="chat", prompt="Say hi", temperature=0, max_tokens=8, stream=True
    )
    assert "".join(c.choices[0].text for c in stream if c.choices) == first.choices[0].text
    assert requests_at(fleet, "a") == 0  # completions are counted apart from chat
    assert fleet.stats("a")["by_endpoint"].get("completions") == 2  # the first, the live one


def test_a_refused_answer_is_replayed_as_a_refusal(gw) -> None:
    oai = client(gw)
    msgs = [{"role": "user", "content": "Help me with something bad"}]
    first = oai.chat.completions.create(model="refusing", messages=msgs, temperature=0)
    refusal = first.choices[0].message.refusal
    assert refusal and first.choices[0].message.content is None
    raw = httpx.post(
        gw.base_url + "/chat/completions",
        json={"model": "refusing", "messages": msgs, "temperature": 0, "stream": True},
        headers={"authorization": "Bearer key-1"},
        timeout=30,
    )
    assert raw.headers["x-gateway-cache"] == "hit-exact"
    chunks = validate_sse(raw.content)
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert "".join(d.get("refusal") or "" for d in deltas) == refusal
    assert not any(d.get("content") for d in deltas)
    stream = oai.chat.completions.create(
        model="refusing", messages=msgs, temperature=0, stream=True
    )
    got = "".join(c.choices[0].delta.refusal or "" for c in stream if c.choices)
    assert got == refusal
    # A Messages client streaming a cached refusal gets the refusal's text too.
    ac = anthropic.Anthropic(base_url=gw.url, api_key="key-1", max_retries=0)
    ask = {
        "model": "refusing",
        "max_tokens": 64,
        "messages": msgs,
        "extra_body": {"temperature": 0},
    }
    unary = ac.messages.create(**ask)  # type: ignore[call-overload]
    with ac.messages.stream(**ask) as s:  # type: ignore[arg-type]
        assert s.response.headers["x-gateway-cache"] == "hit-exact"
        final = s.get_final_message()
    assert final.stop_reason == unary.stop_reason
    assert [b.model_dump() for b in final.content] == [b.model_dump() for b in unary.content]
    assert refusal in json.dumps([b.model_dump() for b in final.content])


def test_a_streamed_refusal_is_not_stored_as_an_empty_answer(gw) -> None:
    """A refusal streamed in `refusal` deltas became an empty answer, stored and served as the
    answer; it is now stored as the refusal it was."""
    msgs = [{"role": "user", "content": "Something else that is refused"}]
    body = {"model": "refusing", "messages": msgs, "temperature": 0}
    headers = {"authorization": "Bearer key-1"}
    url = gw.base_url + "/chat/completions"
    n = len(gw.seen)
    streamed = httpx.post(url, json={**body, "stream": True}, headers=headers, timeout=30)
    refusal = "".join(
        c["choices"][0]["delta"].get("refusal") or ""
        for c in validate_sse(streamed.content)
        if c["choices"]
    )
    assert refusal
    poll(lambda: len(gw.seen) > n)  # stored once the stream ended on the gateway's side
    unary = httpx.post(url, json=body, headers=headers, timeout=30)
    assert unary.headers["x-gateway-cache"] == "hit-exact"  # the streamed answer, stored whole
    assert unary.json()["choices"][0]["message"]["refusal"] == refusal
    assert unary.json()["choices"][0]["message"]["content"] is None
    again = httpx.post(url, json={**body, "stream": True}, headers=headers, timeout=30)
    assert again.headers["x-gateway-cache"] == "hit-exact"
    assert refusal in again.text
    assert gw.pipeline.cache.invalid_entries == 0


def test_a_streamed_completions_answer_is_not_stored_in_another_shape(gw, fleet) -> None:
    """A completions stream became a chat-shaped answer with no text, stored under the
    completions key (every later request found an invalid entry); it is now stored as the
    text_completion it was."""
    body = {"model": "chat", "prompt": "Count to three", "temperature": 0, "max_tokens": 8}
    headers = {"authorization": "Bearer key-1"}
    url = gw.base_url + "/completions"
    n = len(gw.seen)
    streamed = httpx.post(url, json={**body, "stream": True}, headers=headers, timeout=30)
    assert streamed.headers["x-gateway-cache"] == "miss"
    poll(lambda: len(gw.seen) > n)  # stored once the stream ended on the gateway's side
    unary = httpx.post(url, json=body, headers=headers, timeout=30)
    assert unary.headers["x-gateway-cache"] == "hit-exact"
    assert unary.json()["object"] == "text_completion"
    streamed_text = "".join(
        c["choices"][0]["text"] for c in sse_payloads(streamed.content) if c["choices"]
    )
    assert unary.json()["choices"][0]["text"] == streamed_text != ""
    assert gw.pipeline.cache.invalid_entries == 0
    hit = httpx.post(url, json={**body, "stream": True}, headers=headers, timeout=30)
    assert hit.headers["x-gateway-cache"] == "hit-exact"
    text = "".join(c["choices"][0]["text"] for c in sse_payloads(hit.content) if c["choices"])
    assert text == unary.json()["choices"][0]["text"]
    assert fleet.stats("a")["by_endpoint"].get("completions") == 1
