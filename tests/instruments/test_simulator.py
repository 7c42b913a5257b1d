"""Provider simulator: OpenAI schema validity, engine timing model, determinism, continuation."""

from __future__ import annotations

import asyncio
import json
import math
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest

from loadtests.simulator.testing import Fleet

ROOT = Path(__file__).resolve().parents[2]
SCHEMA_FILE = ROOT / "tests" / "data" / "openai_schemas.json"


def _schemas() -> dict[str, Any] | None:
    return json.loads(SCHEMA_FILE.read_text())["schemas"]


SCHEMAS = _schemas()
needs_schemas = pytest.mark.skipif(SCHEMAS is None, reason="openai_schemas.json not found")


def validate(name: str, doc: Any) -> None:
    assert SCHEMAS is not None
    jsonschema.Draft202012Validator(SCHEMAS[name]).validate(doc)


def completion_chunk_schema() -> dict[str, Any]:
    """Legacy completion chunks share the body schema, but stream null finish_reason like OpenAI."""
    assert SCHEMAS is not None
    schema = json.loads(json.dumps(SCHEMAS["CreateCompletionResponse"]))
    fr = schema["properties"]["choices"]["items"]["properties"]["finish_reason"]
    fr["type"] = ["string", "null"]
    fr["enum"] = [*fr["enum"], None]
    return schema


def user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def sse(r: httpx.Response) -> list[Any]:
    """Parsed ``data:`` payloads; the literal [DONE] stays a string."""
    out: list[Any] = []
    for line in r.iter_lines():
        if line.startswith("data: "):
            data = line[6:]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def stream_ttft(client: httpx.Client, url: str, body: dict[str, Any]) -> tuple[float, str, Any]:
    """Time to the first content chunk, the whole text and the usage chunk."""
    t0 = time.perf_counter()
    first, parts, usage = None, [], None
    with client.stream(
        "POST",
        url + "/chat/completions",
        json={**body, "stream": True, "stream_options": {"include_usage": True}},
    ) as r:
        assert r.status_code == 200
        for chunk in sse(r):
            if chunk == "[DONE]":
                break
            if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                first = first or time.perf_counter() - t0
                parts.append(chunk["choices"][0]["delta"]["content"])
            if chunk.get("usage"):
                usage = chunk["usage"]
    assert first is not None
    return first, "".join(parts), usage


SLOW_PREFILL = {"ttft_base_ms": 5, "prefill_ms_per_token": 0.1}


FLEET: list[Any] = [
    {"name": "fast", "profile": "fast"},
    {"name": "prefill", "profile": "fast", "overrides": SLOW_PREFILL},
    {
        "name": "batch1",
        "profile": "fast",
        "overrides": {"max_batch": 1, "decode_tps_alone": 200, "decode_tps_full": 200},
    },
    {
        "name": "batch4",
        "profile": "fast",
        "overrides": {"max_batch": 4, "decode_tps_alone": 400, "decode_tps_full": 100},
    },
    {
        "name": "q0",
        "profile": "fast",
        "overrides": {
            "max_batch": 1,
            "max_queue": 0,
            "decode_tps_alone": 100,
            "decode_tps_full": 100,
        },
    },
    {"name": "auth", "profile": "fast", "api_key": "sekret"},
    {"name": "zero", "profile": "zero-latency"},
]


@pytest.fixture(scope="module")
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=10) as c:
        yield c


# -- schemas -------------------------------------------------------------------------------------
@needs_schemas
@pytest.mark.parametrize("name", ["fast", "zero"])
def test_chat_plain_and_stream_match_openai_schemas(
    fleet: Fleet, client: httpx.Client, name: str
) -> None:
    body = {
        "model": "m1",
        "messages": user("Say something."),
        "max_tokens": 12,
        "unknown_vendor_field": {"x": 1},
        "temperature": 0.3,
    }
    r = client.post(fleet.url(name) + "/chat/completions", json=body)
    assert r.status_code == 200 and r.headers["x-sim-instance"] == name
    doc = r.json()
    validate("CreateChatCompletionResponse", doc)
    assert doc["system_fingerprint"] and doc["model"] == "m1"
    u = doc["usage"]
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
    assert u["completion_tokens"] == len(doc["choices"][0]["message"]["content"].split())

    stream_body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    with client.stream("POST", fleet.url(name) + "/chat/completions", json=stream_body) as s:
        assert s.headers["content-type"].startswith("text/event-stream")
        chunks = sse(s)
    assert chunks[-1] == "[DONE]"
    for c in chunks[:-1]:
        validate("CreateChatCompletionStreamResponse", c)
    assert chunks[-2]["choices"] == [] and chunks[-2]["usage"] == u
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks[:-2])
    assert text == doc["choices"][0]["message"]["content"]


@needs_schemas
def test_completions_models_embeddings_errors_match_schemas(
    fleet: Fleet, client: httpx.Client
) -> None:
    base = fleet.url("fast")
    r = client.post(base + "/completions", json={"model": "m", "prompt": "Once", "max_tokens": 5})
    validate("CreateCompletionResponse", r.json())
    assert r.json()["usage"]["completion_tokens"] == 5
    with client.stream(
        "POST",
        base + "/completions",
        json={
            "prompt": "Once",
            "max_tokens": 5,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    ) as s:
        chunks = sse(s)
    assert chunks[-1] == "[DONE]" and chunks[-2]["usage"]["completion_tokens"] == 5
    for c in chunks[:-1]:
        jsonschema.Draft202012Validator(completion_chunk_schema()).validate(c)
    assert "".join(c["choices"][0]["text"] for c in chunks[:-2]) == r.json()["choices"][0]["text"]

    validate("ListModelsResponse", client.get(base + "/models").json())
    emb = client.post(base + "/embeddings", json={"model": "e", "input": ["a", "b"]}).json()
    validate("CreateEmbeddingResponse", emb)

    bad = client.post(base + "/chat/completions", content=b"{not json")
    assert bad.status_code == 400
    validate("ErrorResponse", bad.json())
    missing = client.post(base + "/chat/completions", json={"model": "m"})
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "messages"
    assert client.get(base + "/nope").status_code == 404


def test_embeddings_are_deterministic_unit_vectors(fleet: Fleet, client: httpx.Client) -> None:
    url = fleet.url("fast") + "/embeddings"
    a = client.post(url, json={"input": "hello", "dimensions": 64}).json()
    b = client.post(url, json={"input": ["hello", "world"], "dimensions": 64}).json()
    va, vb0, vb1 = a["data"][0]["embedding"], b["data"][0]["embedding"], b["data"][1]["embedding"]
    assert len(va) == 64 and va == vb0 and va != vb1
    assert math.isclose(sum(x * x for x in va), 1.0, rel_tol=1e-9)
    # The official client asks for base64 by default and decodes it.
    oc = openai.OpenAI(base_url=fleet.url("fast"), api_key="x")
    got = oc.embeddings.create(model="e", input="hello", dimensions=64).data[0].embedding
    assert max(abs(x - y) for x, y in zip(got, va, strict=True)) < 1e-6


def test_official_client_chat_and_stream(fleet: Fleet) -> None:
    oc = openai.OpenAI(base_url=fleet.url("fast"), api_key="x")
    msgs: Any = user("hi")
    full = oc.chat.completions.create(model="m", messages=msgs, max_tokens=8, seed=3)
    assert full.usage is not None and full.usage.completion_tokens == 8
    stream = oc.chat.completions.create(model="m", messages=msgs, max_tokens=8, seed=3, stream=True)
    parts = [c.choices[0].delta.content or "" for c in stream if c.choices]
    assert "".join(parts) == full.choices[0].message.content


def test_auth_only_when_configured(fleet: Fleet, client: httpx.Client) -> None:
    url = fleet.url("auth") + "/chat/completions"
    body = {"messages": user("x"), "max_tokens": 2}
    r = client.post(url, json=body)
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    ok = client.post(url, json=body, headers={"Authorization": "Bearer sekret"})
    assert ok.status_code == 200
    assert client.post(fleet.url("fast") + "/chat/completions", json=body).status_code == 200


@needs_schemas
@pytest.mark.parametrize("stream", [False, True])
def test_forced_tool_call(fleet: Fleet, client: httpx.Client, stream: bool) -> None:
    tool = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
    body = {
        "messages": user("weather?"),
        "tools": [tool],
        "stream": stream,
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
    }
    url = fleet.url("fast") + "/chat/completions"
    if not stream:
        doc = client.post(url, json=body).json()
        validate("CreateChatCompletionResponse", doc)
        call = doc["choices"][0]["message"]["tool_calls"][0]
        assert doc["choices"][0]["finish_reason"] == "tool_calls"
        assert call["function"]["name"] == "get_weather"
        assert set(json.loads(call["function"]["arguments"])) == {"city"}
        return
    with client.stream("POST", url, json=body) as s:
        chunks = sse(s)[:-1]
    for c in chunks:
        validate("CreateChatCompletionStreamResponse", c)
    args = "".join(
        tc["function"].get("arguments", "")
        for c in chunks
        for tc in c["choices"][0]["delta"].get("tool_calls", [])
    )
    assert set(json.loads(args)) == {"city"}
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    # Under `auto`, a message that does not ask for the tool gets text.
    plain = {**body, "tool_choice": "auto", "stream": False, "messages": user("hello")}
    assert client.post(url, json=plain).json()["choices"][0]["message"]["content"]


# -- determinism and continuation ----------------------------------------------------------------
def test_determinism_for_seed_and_prompt(fleet: Fleet, client: httpx.Client) -> None:
    url = fleet.url("fast") + "/chat/completions"

    def text(**kw: Any) -> str:
        r = client.post(url, json={"messages": user("tell me"), "max_tokens": 20, **kw})
        return r.json()["choices"][0]["message"]["content"]

    assert text(seed=1) == text(seed=1)
    assert text(seed=1) != text(seed=2)
    assert text() == text()  # no seed: the prompt alone fixes the answer


@pytest.mark.parametrize("limit", [None, 40])
def test_continuation_completes_the_unbroken_answer(
    fleet: Fleet, client: httpx.Client, limit: int | None
) -> None:
    url = fleet.url("fast") + "/chat/completions"
    msgs = [{"role": "system", "content": "be brief"}, *user(f"question {uuid.uuid4()}")]
    extra = {} if limit is None else {"max_tokens": limit}
    whole = client.post(url, json={"messages": msgs, **extra}).json()
    full = whole["choices"][0]["message"]["content"]
    words = full.split()
    assert len(words) >= 4
    for k in (1, len(words) // 2, len(words) - 1):
        partial = " ".join(words[:k])
        budget = {} if limit is None else {"max_tokens": limit - k}
        cont = client.post(
            url, json={"messages": [*msgs, {"role": "assistant", "content": partial}], **budget}
        )
        doc = cont.json()
        assert partial + doc["choices"][0]["message"]["content"] == full
        assert doc["usage"]["completion_tokens"] == len(words) - k
        assert doc["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]


# -- engine timing ---------------------------------------------------------------------------
def test_ttft_grows_with_prompt_length(fleet: Fleet, client: httpx.Client) -> None:
    url = fleet.url("prefill")
    short, _, u1 = stream_ttft(
        client, url, {"messages": user(f"hi {uuid.uuid4()}"), "max_tokens": 2}
    )
    long_text = f"{uuid.uuid4()} " + "lorem ipsum dolor " * 450  # ~2000 tokens
    long, _, u2 = stream_ttft(client, url, {"messages": user(long_text), "max_tokens": 2})
    assert u2["prompt_tokens"] > 1900 and u2["prompt_tokens_details"]["cached_tokens"] == 0
    # 0.1 ms per prompt token: ~200 ms more for ~2000 more tokens.
    assert long - short > 0.15, (short, long)


def test_repeated_prefix_is_cached_and_faster(fleet: Fleet, client: httpx.Client) -> None:
    url = fleet.url("prefill")
    system = {"role": "system", "content": f"{uuid.uuid4()} " + "policy text here " * 500}
    cold, _, u1 = stream_ttft(client, url, {"messages": [system, *user("first?")], "max_tokens": 2})
    warm, _, u2 = stream_ttft(
        client, url, {"messages": [system, *user("second?")], "max_tokens": 2}
    )
    assert u1["prompt_tokens_details"]["cached_tokens"] == 0
    cached = u2["prompt_tokens_details"]["cached_tokens"]
    assert cached >= u1["prompt_tokens"] - 32 and cached % 16 == 0
    assert warm < cold - 0.12, (cold, warm)
    assert fleet.stats("prefill")["prefix_cache_hit_tokens"] >= cached


async def _stream_timings(url: str, n: int, max_tokens: int) -> list[tuple[float, float]]:
    """(TTFT, total) of ``n`` concurrent streams."""
    async with httpx.AsyncClient(timeout=10) as ac:

        async def one(i: int) -> tuple[float, float]:
            t0, first = time.perf_counter(), None
            body = {
                "messages": user(f"req {i} {uuid.uuid4()}"),
                "max_tokens": max_tokens,
                "stream": True,
            }
            async with ac.stream("POST", url + "/chat/completions", json=body) as r:
                async for line in r.aiter_lines():
                    if first is None and '"content":"' in line and '"content":""' not in line:
                        first = time.perf_counter() - t0
            return first or 0.0, time.perf_counter() - t0

        return await asyncio.gather(*(one(i) for i in range(n)))


async def test_queueing_when_batch_is_full_raises_ttft(fleet: Fleet) -> None:
    # max_batch 1 at 200 tok/s: 30 tokens hold the slot ~150 ms, so the second one waits.
    timings = sorted(await _stream_timings(fleet.url("batch1"), 2, 30))
    assert timings[0][0] < 0.1
    assert timings[1][0] > 0.1, timings


async def test_decode_slows_as_batch_fills(fleet: Fleet) -> None:
    alone = await _stream_timings(fleet.url("batch4"), 1, 40)  # 400 tok/s: ~0.1 s
    full = await _stream_timings(fleet.url("batch4"), 4, 40)  # 100 tok/s each: ~0.4 s
    assert min(t for _, t in full) > 2 * alone[0][1], (alone, full)


async def test_bounded_queue_overflows_with_503(fleet: Fleet) -> None:
    async with httpx.AsyncClient(timeout=10) as ac:
        body = {"messages": user("x"), "max_tokens": 20}
        url = fleet.url("q0") + "/chat/completions"
        first = asyncio.ensure_future(ac.post(url, json=body))
        await asyncio.sleep(0.05)
        second = await ac.post(url, json=body)
        assert (await first).status_code == 200
    assert second.status_code == 503 and second.json()["error"]["code"] == "overloaded"
    assert fleet.stats("q0")["overloaded"] >= 1
