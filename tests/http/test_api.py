"""The OpenAI-compatible API through the official `openai` client, over real loopback HTTP.

Upstreams are the project's simulator; every body and stream chunk is validated against the
official OpenAI JSON Schemas.
"""

from __future__ import annotations

import time

import httpx
import openai
import pytest

from tests.support import validate, validate_sse


def policy_for(fleet, members=("a", "b"), extra: str = "") -> str:
    providers = "\n".join(
        f"  {m}: {{base_url: '{fleet.url(m)}', models: {{'*': sim-{m}}}, simulated: true}}"
        for m in members
    )
    return f"""
providers:
{providers}
pools:
  main: {{members: [{", ".join(members)}]}}
models:
  chat: {{pool: main}}
{extra}
"""


@pytest.fixture
def client(fleet, gateway):
    gw = gateway(policy_for(fleet))
    return openai.OpenAI(base_url=gw.base_url, api_key="anything", max_retries=0)


def test_chat_completion(client) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model="chat", messages=[{"role": "user", "content": "Say hello"}], max_tokens=12
    )
    resp = raw.parse()
    validate("CreateChatCompletionResponse", resp.model_dump(exclude_unset=True))
    validate("CreateChatCompletionResponse", raw.http_response.json())
    assert resp.choices[0].message.content
    assert resp.usage.completion_tokens == 12
    assert raw.headers["x-gateway-provider"] in ("a", "b")
    assert raw.headers["x-gateway-pool"] == "main"
    assert raw.headers["x-request-id"]


def test_stream_with_usage(fleet, gateway) -> None:
    gw = gateway(policy_for(fleet))
    body = {
        "model": "chat",
        "messages": [{"role": "user", "content": "Count to ten"}],
        "max_tokens": 10,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    r = httpx.post(gw.base_url + "/chat/completions", json=body, timeout=10)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    chunks = validate_sse(r.content)
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["completion_tokens"] == 10
    client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0)
    text = "".join(
        c.choices[0].delta.content or ""
        for c in client.chat.completions.create(**body)
        if c.choices
    )
    assert len(text.split()) == 10


def test_stream_is_not_buffered(fleet, gateway) -> None:
    """With the simulator decoding at ~20 tokens/s, the first chunk arrives long before the end."""
    gw = gateway(policy_for(fleet, members=("slow",)))
    client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0)
    start = time.perf_counter()
    first = None
    for chunk in client.chat.completions.create(
        model="chat",
        messages=[{"role": "user", "content": "Tell a story"}],
        max_tokens=30,
        stream=True,
    ):
        if first is None and chunk.choices and chunk.choices[0].delta.content:
            first = time.perf_counter() - start
    total = time.perf_counter() - start
    assert first is not None
    assert total > 1.0, total
    assert first < total / 4, (first, total)


def test_completions_and_embeddings(client) -> None:
    c = client.completions.with_raw_response.create(
        model="chat", prompt="Once upon a time", max_tokens=5
    )
    validate("CreateCompletionResponse", c.http_response.json())
    e = client.embeddings.with_raw_response.create(
        model="chat", input=["one", "two"], encoding_format="float"
    )
    body = e.http_response.json()
    validate("CreateEmbeddingResponse", body)
    assert len(body["data"]) == 2
    assert len(client.embeddings.create(model="chat", input="three").data[0].embedding) > 0


def test_models_list_and_retrieve(client) -> None:
    models = client.models.with_raw_response.list()
    body = models.http_response.json()
    validate("ListModelsResponse", body)
    assert [m["id"] for m in body["data"]] == ["chat"]
    assert "simulated" in body["data"][0]["owned_by"]
    m = client.models.retrieve("chat")
    assert m.id == "chat"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("nope")


def test_unknown_fields_pass_through_and_model_is_mapped(
    gateway, capture_upstream, monkeypatch
) -> None:
    monkeypatch.setenv("CAPTURE_KEY", "sk-capture")
    gw = gateway(
        f"""
providers:
  cap: {{base_url: '{capture_upstream.url}', models: {{chat: upstream-model-7}}, api_key_env: CAPTURE_KEY}}
pools:
  p: {{members: [cap]}}
models:
  chat: {{pool: p}}
"""
    )
    tools = [
        {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    ]
    client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0)
    resp = client.chat.completions.create(
        model="chat",
        messages=[{"role": "user", "content": "weather?"}],
        tools=tools,
        tool_choice="auto",
        response_format={"type": "json_object"},
        logprobs=True,
        seed=7,
        n=1,
        extra_body={"vendor_extension": {"x": [1, 2]}},
    )
    body = capture_upstream.last_body
    assert body["model"] == "upstream-model-7"
    assert body["tools"] == tools
    assert body["tool_choice"] == "auto"
    assert body["response_format"] == {"type": "json_object"}
    assert body["logprobs"] is True and body["seed"] == 7 and body["n"] == 1
    assert body["vendor_extension"] == {"x": [1, 2]}
    assert capture_upstream.last_headers["authorization"] == "Bearer sk-capture"
    # Response fields pass through too, including ones the gateway does not know.
    assert resp.model_extra.get("vendor_field") == {"kept": True}
    assert resp.choices[0].message.tool_calls[0].function.name == "get_weather"
