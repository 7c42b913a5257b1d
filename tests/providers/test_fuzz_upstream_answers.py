"""Every field of a valid upstream answer, in each provider wire the gateway speaks (OpenAI,
Anthropic, Gemini, Bedrock), replaced by values of the wrong type or size (or removed), unary
and streamed: what reaches the client is a chat completion of the official OpenAI schema (a
field missing or null, and the open values of `object` and `finish_reason`, tolerated:
gateway/wire/answer_fields.py), or a 502 in the API's error shape; never a 500. A stream that
breaks after its first content ends with an error event instead of `[DONE]`.

A scripted upstream on loopback answers whatever the case holds; the gateway's breaker is
lenient so that every case reaches the member.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.fuzz import OPENAI, OPENAI_STREAM, Scripted, mutations, schema_problems, sse
from tests.support import GatewayServer, environment

# -- valid answers of each wire ----------------------------------------------------------------

ANTHROPIC = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "model": "claude",
    "content": [
        {"type": "text", "text": "hi"},
        {"type": "tool_use", "id": "tu_1", "name": "f", "input": {"a": 1}},
    ],
    "stop_reason": "tool_use",
    "stop_sequence": None,
    "usage": {"input_tokens": 3, "output_tokens": 2},
}
ANTHROPIC_STREAM = [
    {
        "type": "message_start",
        "message": {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "claude",
            "content": [],
            "usage": {"input_tokens": 3, "output_tokens": 0},
        },
    },
    {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "hel"}},
    {"type": "content_block_stop", "index": 0},
    {
        "type": "content_block_start",
        "index": 1,
        "content_block": {"type": "tool_use", "id": "tu_1", "name": "f", "input": {}},
    },
    {
        "type": "content_block_delta",
        "index": 1,
        "delta": {"type": "input_json_delta", "partial_json": '{"a":1}'},
    },
    {"type": "content_block_stop", "index": 1},
    {"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 2}},
    {"type": "message_stop"},
]
GEMINI = {
    "candidates": [
        {
            "content": {
                "role": "model",
                "parts": [{"text": "hi"}, {"functionCall": {"name": "f", "args": {"a": 1}}}],
            },
            "finishReason": "STOP",
            "index": 0,
        }
    ],
    "usageMetadata": {"promptTokenCount": 3, "candidatesTokenCount": 2, "totalTokenCount": 5},
    "modelVersion": "gemini-2.0-flash",
}
GEMINI_STREAM = [
    {"candidates": [{"content": {"role": "model", "parts": [{"text": "hel"}]}, "index": 0}]},
    {
        "candidates": [
            {
                "content": {
                    "role": "model",
                    "parts": [{"functionCall": {"name": "f", "args": {}}}],
                },
                "finishReason": "STOP",
                "index": 0,
            }
        ],
        "usageMetadata": {"promptTokenCount": 3, "candidatesTokenCount": 2},
    },
]
BEDROCK = {
    "output": {
        "message": {
            "role": "assistant",
            "content": [
                {"text": "hi"},
                {"toolUse": {"toolUseId": "t1", "name": "f", "input": {"a": 1}}},
            ],
        }
    },
    "stopReason": "tool_use",
    "usage": {"inputTokens": 3, "outputTokens": 2, "totalTokens": 5},
}


PROVIDER = {
    "openai": "",
    "anthropic": "type: anthropic, api_key_env: FZ_KEY,",
    "gemini": "type: gemini, api_key_env: FZ_KEY,",
    "bedrock": "type: bedrock, bedrock: {region: eu-west-1, access_key_id_env: FZ_ID, "
    "secret_access_key_env: FZ_KEY},",
}
UNARY = {"openai": OPENAI, "anthropic": ANTHROPIC, "gemini": GEMINI, "bedrock": BEDROCK}
# Bedrock streams in AWS's binary event-stream framing: its unary answers only here.
STREAMED = {"openai": OPENAI_STREAM, "anthropic": ANTHROPIC_STREAM, "gemini": GEMINI_STREAM}
REQUEST = {
    "model": "chat",
    "messages": [{"role": "user", "content": "hi"}],
    "max_tokens": 5,
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
}


@pytest.fixture(scope="module")
def upstream() -> Iterator[Scripted]:
    with Scripted() as server:
        yield server


@pytest.fixture(scope="module", params=sorted(PROVIDER))
def wire(request: pytest.FixtureRequest, upstream: Scripted) -> Iterator[tuple[str, str]]:
    """(wire, gateway URL): one gateway per wire, its one member the scripted upstream."""
    wire = request.param
    root = f"http://127.0.0.1:{upstream.port}" + ("/v1" if wire == "openai" else "")
    policy = f"""
providers:
  up: {{{PROVIDER[wire]} base_url: '{root}', models: {{'*': m1}},
        breaker: {{min_requests: 1000000, consecutive_failures: 0, failure_ratio: 1.0}}}}
pools:
  main: {{members: [up]}}
models:
  chat: {{pool: main, cache: {{exact: {{enabled: false}}}}}}
retry: {{max_attempts: 1}}
"""
    with environment(FZ_KEY="k", FZ_ID="AKIDFUZZ"), GatewayServer(policy) as gw:
        yield wire, gw.base_url


def _problems_unary(r: httpx.Response) -> list[str]:
    if r.status_code != 200:
        ok = r.status_code == 502 and isinstance(r.json().get("error"), dict)
        return [] if ok else [f"status {r.status_code}: {r.text[:200]}"]
    return schema_problems("CreateChatCompletionResponse", r.json())


def _problems_stream(r: httpx.Response) -> list[str]:
    if r.status_code != 200:
        ok = r.status_code == 502 and isinstance(r.json().get("error"), dict)
        return [] if ok else [f"status {r.status_code}: {r.text[:200]}"]
    data = [line[6:] for line in r.text.split("\n") if line.startswith("data: ")]
    if not data:
        return ["an empty stream"]
    out: list[str] = []
    for i, event in enumerate(data):
        if event == "[DONE]":
            continue
        doc = json.loads(event)
        if "error" in doc:  # a stream broken after it committed: its last event
            if i != len(data) - 1:
                out.append("events after an error event")
            continue
        out += schema_problems("CreateChatCompletionStreamResponse", doc)
    if data[-1] != "[DONE]" and "error" not in json.loads(data[-1]):
        out.append("a stream that ends with neither [DONE] nor an error event")
    return out


def test_every_answer_field_mutated_reaches_the_client_valid_or_as_a_502(
    upstream: Scripted, wire: tuple[str, str]
) -> None:
    name, base_url = wire
    cases: list[tuple[str, Any, Any]] = [
        ("unary", at, doc) for at, doc in mutations(UNARY[name], per_path=6, seed=1)
    ]
    events = STREAMED.get(name, [])
    for i, event in enumerate(events):
        for at, doc in mutations(event, per_path=3, seed=i):
            cases.append(("stream", (i, *at), sse(name, [*events[:i], doc, *events[i + 1 :]])))
    problems: list[str] = []
    with httpx.Client(base_url=base_url, timeout=20) as client:
        for kind, at, answer in cases:
            upstream.answer = answer
            r = client.post("/chat/completions", json={**REQUEST, "stream": kind == "stream"})
            found = _problems_unary(r) if kind == "unary" else _problems_stream(r)
            problems += [f"{kind} {at}: {p}" for p in found]
    assert not problems, "\n".join(problems[:20])


COMPLETION = {
    "id": "cmpl-1",
    "object": "text_completion",
    "created": 1700000000,
    "model": "m",
    "choices": [
        {
            "index": 0,
            "text": "hello",
            "logprobs": {
                "tokens": ["he"],
                "token_logprobs": [-0.1],
                "top_logprobs": [{"he": -0.1}],
                "text_offset": [0],
            },
            "finish_reason": "stop",
        }
    ],
    "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
}
EMBEDDINGS = {
    "object": "list",
    "model": "m",
    "data": [
        {"object": "embedding", "index": 0, "embedding": [0.1, 0.2]},
        {"object": "embedding", "index": 1, "embedding": [0.3, 0.4]},
    ],
    "usage": {"prompt_tokens": 2, "total_tokens": 2},
}
OTHER_ENDPOINTS = {
    "completions": (COMPLETION, "CreateCompletionResponse", {"prompt": "hi", "logprobs": 1}),
    "embeddings": (EMBEDDINGS, "CreateEmbeddingResponse", {"input": ["a", "b"]}),
}


@pytest.mark.parametrize("endpoint", sorted(OTHER_ENDPOINTS))
def test_completions_and_embeddings_answers_mutated_reach_the_client_valid_or_as_a_502(
    upstream: Scripted, endpoint: str
) -> None:
    answer, schema, request = OTHER_ENDPOINTS[endpoint]
    policy = f"""
providers:
  up: {{base_url: 'http://127.0.0.1:{upstream.port}/v1',
        breaker: {{min_requests: 1000000, consecutive_failures: 0, failure_ratio: 1.0}}}}
pools:
  main: {{members: [up]}}
models:
  chat: {{pool: main, cache: {{exact: {{enabled: false}}}}}}
retry: {{max_attempts: 1}}
"""
    problems: list[str] = []
    with GatewayServer(policy) as gw, httpx.Client(base_url=gw.base_url, timeout=20) as client:
        for at, doc in mutations(answer, per_path=8, seed=3):
            upstream.answer = doc
            r = client.post(f"/{endpoint}", json={"model": "chat", **request})
            if r.status_code != 200:
                if r.status_code != 502:
                    problems.append(f"{at}: status {r.status_code}")
                continue
            problems += [f"{at}: {p}" for p in schema_problems(schema, r.json())]
    assert not problems, "\n".join(problems[:20])
