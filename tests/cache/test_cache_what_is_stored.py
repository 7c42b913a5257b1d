"""Which answers the caches store, through the HTTP API with a real upstream on loopback.

An answer a content filter stopped (`finish_reason: content_filter`, in any choice) is relayed
but never stored, in the exact or the semantic cache, streamed or not: a filter's verdict is the
provider's policy of the moment (often a false positive), and stored it would be every identical
or similar request's answer for the whole TTL. An answer cut at max_tokens (`length`; max_tokens
is part of the key) and a tool call (the tools are part of the key) are what the same request
gets again: they are stored and replayed, as JSON and as a stream.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.hostile import HostileUpstream, _chunk, _completion
from tests.support import SEMANTIC_ONLY, TWO_TENANTS, GatewayServer, policy, validate_sse

pytest.importorskip("faiss", reason="the semantic extra is not installed")

TOOL_CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
}


class Finishing(HostileUpstream):
    """Answers that end with a given finish_reason: mode `<reason>` (content_filter, length,
    tool_calls). Each answer's text names its request number, so a replay is told apart."""

    def __getattr__(self, name: str) -> Any:
        if not name.startswith("mode_"):
            raise AttributeError(name)
        reason = name.removeprefix("mode_")

        async def mode(w: asyncio.StreamWriter, req: dict, endpoint: str, key: str) -> None:
            await self._finishing(w, req, reason)

        return mode

    async def _finishing(self, w: asyncio.StreamWriter, req: dict, reason: str) -> None:
        model = req.get("model", "m")
        text = f"answer {self.requests[reason]}"
        tool = reason == "tool_calls"
        if req.get("stream"):
            first = {"role": "assistant", "content": None if tool else ""}
            body = {"tool_calls": [{"index": 0, **TOOL_CALL}]} if tool else {"content": text}
            events = [_chunk(model, first), _chunk(model, body), _chunk(model, {}, reason)]
            await self._sse(w, [*events, b"data: [DONE]\n\n"])
            return
        doc = _completion(model, text)
        doc["choices"][0]["finish_reason"] = reason
        if tool:
            doc["choices"][0]["message"].update(content=None, tool_calls=[TOOL_CALL])
        await self._respond(w, 200, json.dumps(doc).encode())


REASONS = ("content_filter", "length", "tool_calls")


@pytest.fixture(scope="module")
def upstream() -> Iterator[Finishing]:
    with Finishing() as u:
        yield u


@pytest.fixture(scope="module")
def gw(upstream: Finishing) -> Iterator[GatewayServer]:
    models: dict[str, Any] = {}
    for reason in REASONS:
        models[reason] = {"pool": reason}
        models["sem-" + reason] = {"pool": reason, **SEMANTIC_ONLY}
    text = policy(
        {r: upstream.url(r) for r in REASONS},
        auth=TWO_TENANTS,
        pool={"members": ["length"]},
        pools={r: {"members": [r]} for r in REASONS},
        models=models,
    )
    with GatewayServer(text) as server:
        yield server


def ask(gw: GatewayServer, model: str, question: str, stream: bool) -> httpx.Response:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": question}],
        "temperature": 0,
        "max_tokens": 16,
        "stream": stream,
        "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}],
    }
    r = httpx.post(
        gw.base_url + "/chat/completions",
        json=body,
        headers={"authorization": "Bearer key-1"},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    return r


def finish_of(r: httpx.Response) -> str:
    if r.headers["content-type"].startswith("text/event-stream"):
        chunks = validate_sse(r.content)
        return [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1]
    return r.json()["choices"][0]["finish_reason"]


@pytest.mark.parametrize("first_streamed", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("reason", REASONS)
def test_exact_cache_stores_all_but_filtered_answers(
    gw: GatewayServer, upstream: Finishing, reason: str, first_streamed: bool
) -> None:
    question = f"exact {reason} {first_streamed}?"
    before = upstream.requests.get(reason, 0)
    first = ask(gw, reason, question, first_streamed)
    assert first.headers["x-gateway-cache"] == "miss" and finish_of(first) == reason
    for stream in (False, True):
        again = ask(gw, reason, question, stream)
        assert finish_of(again) == reason
        if reason == "content_filter":
            assert again.headers["x-gateway-cache"] == "miss"
        else:
            assert again.headers["x-gateway-cache"] == "hit-exact"
    calls = upstream.requests[reason] - before
    assert calls == (3 if reason == "content_filter" else 1)


def test_a_replayed_tool_call_reaches_the_official_client(gw: GatewayServer) -> None:
    ask(gw, "tool_calls", "Weather in Oslo?", False)
    oai = openai.OpenAI(base_url=gw.base_url, api_key="key-1", max_retries=0)
    stream = oai.chat.completions.create(
        model="tool_calls",
        messages=[{"role": "user", "content": "Weather in Oslo?"}],
        temperature=0,
        max_tokens=16,
        stream=True,
        tools=[{"type": "function", "function": {"name": "get_weather", "parameters": {}}}],
    )
    calls = [tc for c in stream if c.choices for tc in c.choices[0].delta.tool_calls or []]
    assert [(tc.id, tc.function.name, tc.function.arguments) for tc in calls] == [
        ("call_1", "get_weather", '{"city": "Oslo"}')
    ]


@pytest.mark.parametrize("streamed", [False, True], ids=["json", "stream"])
def test_semantic_cache_does_not_store_filtered_answers(
    gw: GatewayServer, upstream: Finishing, streamed: bool
) -> None:
    stores = gw.pipeline.cache.semantic.cache
    question = f"How do I reset my password ({streamed})?"
    stored = stores.stored
    for _ in range(2):
        assert (
            ask(gw, "sem-content_filter", question, streamed).headers["x-gateway-cache"] == "miss"
        )
    # A stored answer of the same alias is served to the same question: the store path works.
    ask(gw, "sem-length", question, streamed)
    deadline = time.monotonic() + 10
    while stores.stored == stored and time.monotonic() < deadline:
        time.sleep(0.02)
    assert stores.stored == stored + 1  # the length answer only
    refused = httpx.get(gw.url + "/metrics", timeout=10).text
    line = 'gateway_semantic_stores_total{outcome="refused",reason="content_filter"}'
    assert [x for x in refused.splitlines() if x.startswith(line)]
    assert ask(gw, "sem-length", question, streamed).headers["x-gateway-cache"] == "hit-semantic"
