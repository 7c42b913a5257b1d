"""The Anthropic Messages API through the official `anthropic` SDK, over real loopback HTTP.

The gateway translates each request to chat and runs the same pipeline; upstreams are the
project's simulator (and a capturing upstream to check what the translation sends).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import pytest

from loadtests.simulator.testing import Fleet
from tests.support import GatewayServer

TOOLS = [
    {
        "name": "get_weather",
        "description": "Weather of a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
]


FLEET: list[Any] = [{"name": n, "profile": "fast"} for n in ("a", "c", "d")]


def _policy(fleet: Fleet) -> str:
    return f"""
server: {{max_body_bytes: 65536}}
governance:
  tenants:
    team-r: {{limits: {{requests_per_minute: 1}}}}
providers:
  a: {{base_url: '{fleet.url("a")}', models: {{'*': sim-a}}, simulated: true}}
  c: {{base_url: '{fleet.url("c")}', models: {{'*': sim-c}}, simulated: true}}
  d: {{base_url: '{fleet.url("d")}', models: {{'*': sim-d}}, simulated: true}}
pools:
  main: {{members: [a]}}
  broken: {{members: [c]}}
  cut: {{members: [d]}}
models:
  chat: {{pool: main}}
  down: {{pool: broken}}
  cut: {{pool: cut}}
"""


@pytest.fixture(scope="module")
def gw(fleet: Fleet) -> Iterator[GatewayServer]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GATEWAY_API_KEYS", "team-a:key-a,team-r:key-r")
        with GatewayServer(_policy(fleet)) as server:
            yield server


@pytest.fixture(scope="module")
def client(gw: GatewayServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gw.url, api_key="key-a", max_retries=0)


def test_plain_message(client: anthropic.Anthropic) -> None:
    raw = client.messages.with_raw_response.create(
        model="chat", max_tokens=12, messages=[{"role": "user", "content": "Say hello"}]
    )
    msg = raw.parse()
    assert msg.type == "message" and msg.role == "assistant"
    assert msg.model == "chat"  # the alias the client asked for
    assert msg.id.startswith("msg_")
    assert msg.content[0].type == "text" and len(msg.content[0].text.split()) == 12
    assert msg.stop_reason == "max_tokens"
    assert msg.usage.output_tokens == 12 and msg.usage.input_tokens > 0
    assert raw.headers["x-gateway-provider"] == "a"  # the gateway's headers are kept


def test_stream_event_sequence(client: anthropic.Anthropic) -> None:
    with client.messages.stream(
        model="chat", max_tokens=8, messages=[{"role": "user", "content": "Count"}]
    ) as stream:
        kinds = [ev.type for ev in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start"
    raw = [
        k
        for k in kinds
        if k
        in {
            "message_start",
            "content_block_start",
            "content_block_stop",
            "message_delta",
            "message_stop",
        }
    ]
    assert raw == [
        "message_start",
        "content_block_start",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert kinds.count("content_block_delta") == 8
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 8
    assert len(final.content[0].text.split()) == 8


def test_stream_wire_format(gw: GatewayServer) -> None:
    """Each event has its `event:` line matching the payload's type (what the SDKs dispatch on)."""
    body = {
        "model": "chat",
        "max_tokens": 3,
        "stream": True,
        "messages": [{"role": "user", "content": "x"}],
    }
    r = httpx.post(gw.url + "/v1/messages", json=body, headers={"x-api-key": "key-a"}, timeout=10)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = [b for b in r.text.split("\n\n") if b.strip()]
    for block in events:
        name, data = block.split("\n", 1)
        assert name.startswith("event: ") and data.startswith("data: ")
        assert json.loads(data[6:])["type"] == name[7:]
    delta = json.loads(events[-2].split("\n", 1)[1][6:])
    assert delta["delta"]["stop_reason"] == "max_tokens" and delta["usage"]["output_tokens"] == 3


def test_tool_use_round_trip(client: anthropic.Anthropic) -> None:
    msg = client.messages.create(
        model="chat",
        max_tokens=50,
        system=[{"type": "text", "text": "You call tools."}],
        tools=TOOLS,
        tool_choice={"type": "tool", "name": "get_weather"},
        messages=[{"role": "user", "content": "Weather in Paris?"}],
    )
    assert msg.stop_reason == "tool_use"
    use = msg.content[-1]
    assert use.type == "tool_use" and use.name == "get_weather"
    assert set(use.input) == {"city"}
    follow = client.messages.create(
        model="chat",
        max_tokens=10,
        tools=TOOLS,
        messages=[
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": msg.content},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny"}],
            },
        ],
    )
    assert follow.content[0].type == "text" and follow.stop_reason in ("end_turn", "max_tokens")


def test_tool_use_stream(client: anthropic.Anthropic) -> None:
    with client.messages.stream(
        model="chat",
        max_tokens=50,
        tools=TOOLS,
        tool_choice={"type": "any"},
        messages=[{"role": "user", "content": "Weather?"}],
    ) as stream:
        kinds = [ev.type for ev in stream]
        final = stream.get_final_message()
    assert "input_json" in kinds  # the SDK's event for input_json_delta
    assert final.stop_reason == "tool_use"
    assert final.content[0].type == "tool_use" and set(final.content[0].input) == {"city"}


def test_translation_sent_upstream(gw: GatewayServer, capture_upstream, gateway) -> None:
    """System (blocks), images (base64 -> data URL), tool results, stop_sequences, tool_choice."""
    cap_gw = gateway(
        f"""
providers:
  cap: {{base_url: '{capture_upstream.url}', models: {{'*': up}}}}
pools:
  p: {{members: [cap]}}
models:
  m: {{pool: p}}
"""
    )
    png = base64.b64encode(b"\x89PNG fake").decode()
    client = anthropic.Anthropic(base_url=cap_gw.url, api_key="key-a", max_retries=0)
    msg = client.messages.create(
        model="m",
        max_tokens=20,
        system=[{"type": "text", "text": "Rule one."}, {"type": "text", "text": "Rule two."}],
        stop_sequences=["END"],
        extra_body={"temperature": 0.5},
        output_config={"format": {"type": "json_schema", "schema": {"type": "object"}}},
        metadata={"user_id": "u-1"},
        tools=TOOLS,
        tool_choice={"type": "auto", "disable_parallel_tool_use": True},
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is this?"},
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/png", "data": png},
                    },
                ],
            },
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t1", "name": "get_weather", "input": {}}],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "t1",
                        "content": "rain",
                        "is_error": True,
                    },
                    {"type": "text", "text": "and now?"},
                ],
            },
        ],
    )
    sent = capture_upstream.last_body
    assert sent["messages"][0] == {"role": "system", "content": "Rule one.\nRule two."}
    assert sent["messages"][1]["content"][1] == {
        "type": "image_url",
        "image_url": {"url": f"data:image/png;base64,{png}"},
    }
    assert sent["messages"][2]["tool_calls"][0]["function"] == {
        "name": "get_weather",
        "arguments": "{}",
    }
    assert sent["messages"][3] == {"role": "tool", "tool_call_id": "t1", "content": "Error: rain"}
    assert sent["messages"][4] == {"role": "user", "content": "and now?"}
    assert sent["stop"] == ["END"] and sent["temperature"] == 0.5 and sent["user"] == "u-1"
    assert sent["max_tokens"] == 20 and sent["model"] == "up"
    assert sent["tools"][0]["function"]["parameters"] == TOOLS[0]["input_schema"]
    assert sent["tool_choice"] == "auto" and sent["parallel_tool_calls"] is False
    assert sent["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "output", "schema": {"type": "object"}, "strict": True},
    }
    # The capturing upstream answers a tool call with "{}" arguments.
    assert msg.stop_reason == "tool_use" and msg.content[0].input == {}
    assert msg.usage.input_tokens == 5 and msg.usage.output_tokens == 3


def test_count_tokens(client: anthropic.Anthropic, gw: GatewayServer) -> None:
    short = client.messages.count_tokens(
        model="chat", messages=[{"role": "user", "content": "hello"}]
    )
    longer = client.messages.count_tokens(
        model="chat",
        system="You are a helpful assistant who answers briefly.",
        tools=TOOLS,
        messages=[{"role": "user", "content": "hello " * 50}],
    )
    assert 0 < short.input_tokens < longer.input_tokens
    r = httpx.post(
        gw.url + "/v1/messages/count_tokens",
        json={"model": "chat", "messages": [{"role": "user", "content": "hi"}]},
        headers={"x-api-key": "key-a"},
    )
    assert r.headers["x-gateway-token-count"].startswith("estimate")
    with pytest.raises(anthropic.NotFoundError) as e:
        client.messages.count_tokens(model="nope", messages=[{"role": "user", "content": "x"}])
    assert e.value.body["error"]["type"] == "not_found_error"


def _error(call) -> anthropic.APIStatusError:
    with pytest.raises(anthropic.APIStatusError) as e:
        call()
    body = e.value.response.json()
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}
    return e.value


def test_errors_in_anthropic_shape(gw: GatewayServer, fleet: Fleet) -> None:
    def create(key: str, **kw) -> object:
        c = anthropic.Anthropic(base_url=gw.url, api_key=key, max_retries=0)
        args = {"model": "chat", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}
        return c.messages.create(**{**args, **kw})

    e = _error(lambda: create("wrong-key"))
    assert e.status_code == 401 and e.body["error"]["type"] == "authentication_error"
    e = _error(lambda: create("key-a", model="nope"))
    assert e.status_code == 404 and e.body["error"]["type"] == "not_found_error"
    e = _error(lambda: create("key-a", messages=[]))
    assert e.status_code == 400 and e.body["error"]["type"] == "invalid_request_error"
    assert "messages" in e.body["error"]["message"]
    e = _error(lambda: create("key-a", tools=[{"type": "web_search_20250305", "name": "w"}]))
    assert e.status_code == 400 and "server tool" in e.body["error"]["message"]
    e = _error(lambda: create("key-a", messages=[{"role": "user", "content": "x" * 70000}]))
    assert e.status_code == 413 and e.body["error"]["type"] == "request_too_large"
    assert create("key-r") is not None  # team-r: one request a minute
    e = _error(lambda: create("key-r"))
    assert e.status_code == 429 and e.body["error"]["type"] == "rate_limit_error"
    assert int(e.response.headers["retry-after"]) >= 1
    # Every attempt rate-limited upstream: the gateway's 503 is Anthropic's 529 "overloaded".
    fleet.set_faults("c", error_rate=1.0, error_status=[429])
    try:
        e = _error(lambda: create("key-a", model="down"))
    finally:
        fleet.set_faults("c")
    assert e.status_code == 529 and e.body["error"]["type"] == "overloaded_error"
    assert isinstance(e, anthropic.APIStatusError)


def test_bearer_auth_and_missing_max_tokens(gw: GatewayServer) -> None:
    body = {"model": "chat", "max_tokens": 2, "messages": [{"role": "user", "content": "x"}]}
    ok = httpx.post(gw.url + "/v1/messages", json=body, headers={"authorization": "Bearer key-a"})
    assert ok.status_code == 200 and ok.json()["type"] == "message"
    missing = httpx.post(
        gw.url + "/v1/messages",
        json={k: v for k, v in body.items() if k != "max_tokens"},
        headers={"x-api-key": "key-a"},
    )
    assert missing.status_code == 400
    assert missing.json()["error"]["type"] == "invalid_request_error"
    bad_json = httpx.post(gw.url + "/v1/messages", content=b"{", headers={"x-api-key": "key-a"})
    assert bad_json.status_code == 400 and bad_json.json()["type"] == "error"


def test_cached_answer_replayed_as_messages_stream(gw: GatewayServer) -> None:
    """A cache hit (the chat pipeline's exact cache) is replayed in the Messages event format."""
    c = anthropic.Anthropic(base_url=gw.url, api_key="key-a", max_retries=0)
    args = {
        "model": "chat",
        "max_tokens": 6,
        "extra_body": {"temperature": 0},
        "messages": [{"role": "user", "content": "cache me"}],
    }
    first = c.messages.with_raw_response.create(**args)
    assert first.headers["x-gateway-cache"] == "miss"
    with c.messages.stream(**args) as stream:
        final = stream.get_final_message()
        assert stream.response.headers["x-gateway-cache"] == "hit-exact"
    assert final.content[0].text == first.parse().content[0].text
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 6


def test_stream_broken_midway_ends_with_an_error_event(
    gw: GatewayServer, fleet: Fleet, client: anthropic.Anthropic
) -> None:
    body = {
        "model": "cut",
        "max_tokens": 30,
        "stream": True,
        "messages": [{"role": "user", "content": "A long story"}],
    }
    fleet.set_faults("d", cut_stream_after_chunks=4)
    try:
        r = httpx.post(gw.url + "/v1/messages", json=body, headers={"x-api-key": "key-a"})
        args = {k: v for k, v in body.items() if k != "stream"}
        with pytest.raises(anthropic.APIStatusError) as e, client.messages.stream(**args) as s:
            for _ in s:
                pass
    finally:
        fleet.set_faults("d")
    blocks = [b for b in r.text.split("\n\n") if b.strip()]
    assert blocks[0].startswith("event: message_start")
    assert any(b.startswith("event: content_block_delta") for b in blocks)
    last = blocks[-1]
    assert last.startswith("event: error\ndata: ")
    err = json.loads(last.split("\n", 1)[1][6:])
    assert err["type"] == "error" and err["error"]["type"] == "api_error"
    assert not any(b.startswith("event: message_stop") for b in blocks)
    assert e.value.body["type"] == "error"
