"""The OpenAI Responses API through the official `openai` SDK, over real loopback HTTP.

Every body and stream event the gateway emits is validated against the official JSON Schemas
(`Response`, `ResponseStreamEvent`; requests against `CreateResponse`). Stored responses live in
a real Redis (and in memory for a gateway without one).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest
import redis

from loadtests.simulator.testing import Fleet
from tests.support import GatewayServer

SCHEMAS = Path(__file__).resolve().parents[1] / "data" / "openai_responses_schemas.json"
TOOLS = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        "strict": False,
    }
]


# The request schema's input-item unions overlap (a message with a list content is both an
# EasyInputMessage and an InputMessage) once the spec's discriminators are dropped: for requests,
# `oneOf` is checked as "at least one".
_Lenient = jsonschema.validators.extend(
    jsonschema.Draft202012Validator,
    {"oneOf": jsonschema.Draft202012Validator.VALIDATORS["anyOf"]},
)


@cache
def _validator(name: str) -> jsonschema.protocols.Validator:
    schema = json.loads(SCHEMAS.read_text())["schemas"][name]
    cls = _Lenient if name == "CreateResponse" else jsonschema.Draft202012Validator
    return cls(schema)


@cache
def _event_validators() -> dict[str, jsonschema.Draft202012Validator]:
    """One validator per event type (the union's own errors say nothing useful)."""
    root = json.loads(SCHEMAS.read_text())["schemas"]["ResponseStreamEvent"]
    out = {}
    for ref in root["anyOf"]:
        name = ref["$ref"].split("/")[-1]
        kind = root["$defs"][name]["properties"]["type"]["enum"][0]
        schema = {"$schema": root["$schema"], "$ref": ref["$ref"], "$defs": root["$defs"]}
        out[kind] = jsonschema.Draft202012Validator(schema)
    return out


def validate(name: str, instance: Any) -> None:
    if name == "ResponseStreamEvent":
        _event_validators()[instance["type"]].validate(instance)
    _validator(name).validate(instance)


def events_of(text: str) -> list[dict[str, Any]]:
    """Parse and validate a Responses SSE body: `event:` names match, sequence numbers count up."""
    out = []
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        name, data = block.split("\n", 1)
        assert name.startswith("event: ") and data.startswith("data: ")
        ev = json.loads(data[6:])
        assert ev["type"] == name[7:]
        validate("ResponseStreamEvent", ev)
        assert ev["sequence_number"] == len(out)
        out.append(ev)
    return out


FLEET: list[Any] = [{"name": "a", "profile": "fast"}]


def _policy(fleet: Fleet) -> str:
    return f"""
providers:
  a: {{base_url: '{fleet.url("a")}', models: {{'*': sim-a}}, simulated: true}}
pools:
  main: {{members: [a]}}
models:
  chat: {{pool: main}}
"""


@pytest.fixture(scope="module")
def gw(fleet: Fleet, redis_url: str) -> Iterator[GatewayServer]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GATEWAY_API_KEYS", "team-a:key-a,team-b:key-b")
        mp.setenv("GATEWAY_REDIS_PREFIX", "gwtest:inbound:")
        with GatewayServer(_policy(fleet), redis_url=redis_url) as server:
            yield server


@pytest.fixture(scope="module")
def client(gw: GatewayServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key="key-a", max_retries=0)


def _post(gw: GatewayServer, body: dict[str, Any], key: str = "key-a") -> httpx.Response:
    validate("CreateResponse", body)
    return httpx.post(
        gw.base_url + "/responses", json=body, headers={"authorization": f"Bearer {key}"}
    )


def test_plain_response_validates(gw: GatewayServer, client: openai.OpenAI) -> None:
    body = {"model": "chat", "instructions": "Be brief.", "input": "Say hello"}
    r = _post(gw, body)
    assert r.status_code == 200
    doc = r.json()
    validate("Response", doc)
    assert doc["object"] == "response" and doc["status"] == "completed"
    assert doc["model"] == "chat" and doc["instructions"] == "Be brief."
    assert doc["output"][0]["type"] == "message"
    assert doc["usage"]["output_tokens"] > 0 and doc["usage"]["input_tokens"] > 0
    assert r.headers["x-gateway-provider"] == "a"
    resp = client.responses.create(model="chat", input="Say hello", max_output_tokens=16)
    assert resp.status == "incomplete" and resp.incomplete_details.reason == "max_output_tokens"
    assert len(resp.output_text.split()) == 16 and resp.usage.output_tokens == 16


def check_sequence(events: list[dict], head: list[str], repeated: str, tail: list[str]) -> int:
    """The stream of one output item: `head`, then `repeated` one or more times, then `tail`,
    between the response's and the item's opening and closing events. Returns the repeats."""
    kinds = [e["type"] for e in events]
    n = kinds.count(repeated)
    assert n > 0
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        *head,
        *[repeated] * n,
        *tail,
        "response.output_item.done",
        "response.completed",
    ]
    return n


def test_stream_event_sequence(gw: GatewayServer, client: openai.OpenAI) -> None:
    body = {"model": "chat", "input": [{"role": "user", "content": "Tell me"}], "stream": True}
    r = _post(gw, body)
    events = events_of(r.text)
    deltas = check_sequence(
        events,
        ["response.content_part.added"],
        "response.output_text.delta",
        ["response.output_text.done", "response.content_part.done"],
    )
    done = events[-1]["response"]
    validate("Response", done)
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert done["output"][0]["content"][0]["text"] == text
    assert done["usage"]["output_tokens"] == deltas  # the simulator sends a word per chunk
    # The same through the SDK's stream helper.
    with client.responses.stream(model="chat", input="Tell me") as stream:
        seen = [ev.type for ev in stream]
        final = stream.get_final_response()
    assert seen[-1] == "response.completed" and final.output_text == text


def test_function_call_round_trip(gw: GatewayServer, client: openai.OpenAI) -> None:
    first = client.responses.create(
        model="chat", input="Weather in Paris?", tools=TOOLS, tool_choice="required"
    )
    validate("Response", first.model_dump(mode="json", exclude_unset=True))
    call = first.output[0]
    assert call.type == "function_call" and call.name == "get_weather"
    assert set(json.loads(call.arguments)) == {"city"}
    # The tool result goes back without repeating the conversation: previous_response_id.
    second = client.responses.create(
        model="chat",
        previous_response_id=first.id,
        tools=TOOLS,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}],
    )
    assert second.output_text and second.previous_response_id == first.id
    # And stateless, with the call and its output as input items.
    third = client.responses.create(
        model="chat",
        tools=TOOLS,
        input=[
            {"role": "user", "content": "Weather in Paris?"},
            {
                "type": "function_call",
                "call_id": call.call_id,
                "name": call.name,
                "arguments": call.arguments,
            },
            {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"},
        ],
    )
    assert third.output_text == second.output_text  # the same conversation reached the model


def test_function_call_stream(gw: GatewayServer) -> None:
    body = {
        "model": "chat",
        "input": "Weather?",
        "tools": TOOLS,
        "tool_choice": {"type": "function", "name": "get_weather"},
        "stream": True,
    }
    events = events_of(_post(gw, body).text)
    check_sequence(
        events,
        [],
        "response.function_call_arguments.delta",
        ["response.function_call_arguments.done"],
    )
    args = "".join(e["delta"] for e in events if e["type"].endswith("arguments.delta"))
    assert events[-3]["arguments"] == args and set(json.loads(args)) == {"city"}
    item = events[-1]["response"]["output"][0]
    assert item["type"] == "function_call" and item["id"] == events[2]["item"]["id"]


def test_retrieve_delete_and_tenant_binding(
    gw: GatewayServer, client: openai.OpenAI, redis_url: str
) -> None:
    resp = client.responses.create(model="chat", input="remember me", metadata={"k": "v"})
    got = client.responses.retrieve(resp.id)
    assert got.id == resp.id and got.output_text == resp.output_text and got.metadata == {"k": "v"}
    validate(
        "Response",
        httpx.get(
            gw.base_url + f"/responses/{resp.id}", headers={"authorization": "Bearer key-a"}
        ).json(),
    )
    # Stored in Redis with a TTL (any replica can continue the conversation).
    r = redis.Redis.from_url(redis_url)
    keys = r.keys(f"gwtest:inbound:responses:team-a:{resp.id}")
    assert len(keys) == 1 and 0 < r.ttl(keys[0]) <= 30 * 24 * 3600
    # Another tenant can neither read, continue nor delete it.
    other = openai.OpenAI(base_url=gw.base_url, api_key="key-b", max_retries=0)
    with pytest.raises(openai.NotFoundError):
        other.responses.retrieve(resp.id)
    with pytest.raises(openai.BadRequestError) as e:
        other.responses.create(model="chat", input="x", previous_response_id=resp.id)
    assert e.value.body["param"] == "previous_response_id"
    with pytest.raises(openai.NotFoundError):
        other.responses.delete(resp.id)
    client.responses.delete(resp.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(resp.id)
    assert not r.exists(keys[0])


def test_store_false_is_not_kept(client: openai.OpenAI) -> None:
    resp = client.responses.create(model="chat", input="forget me", store=False)
    assert resp.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(resp.id)


def test_previous_response_carries_the_conversation(client: openai.OpenAI) -> None:
    """Continuing from an id answers like sending the whole conversation again."""
    first = client.responses.create(model="chat", input="Once upon a time", temperature=0)
    chained = client.responses.create(
        model="chat", previous_response_id=first.id, input="Go on", temperature=0
    )
    explicit = client.responses.create(
        model="chat",
        temperature=0,
        input=[
            {"role": "user", "content": "Once upon a time"},
            {"role": "assistant", "content": first.output_text},
            {"role": "user", "content": "Go on"},
        ],
    )
    assert chained.output_text == explicit.output_text
    # A streamed answer is stored too, before response.completed reaches the client.
    with client.responses.stream(
        model="chat", previous_response_id=chained.id, input="And then?"
    ) as stream:
        final = stream.get_final_response()
    assert client.responses.retrieve(final.id).output_text == final.output_text


def test_text_format_and_params_sent_upstream(capture_upstream, gateway) -> None:
    gw = gateway(
        f"""
providers:
  cap: {{base_url: '{capture_upstream.url}', models: {{'*': up}}}}
pools:
  p: {{members: [cap]}}
models:
  m: {{pool: p}}
"""
    )
    schema = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
    body = {
        "model": "m",
        "instructions": "Answer in JSON.",
        "input": [
            {"role": "developer", "content": "Be strict."},
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "Describe"},
                    {"type": "input_image", "image_url": "https://x/y.png", "detail": "low"},
                ],
            },
        ],
        "text": {
            "format": {"type": "json_schema", "name": "out", "schema": schema, "strict": True}
        },
        "max_output_tokens": 40,
        "temperature": 0.2,
        "tools": TOOLS,
        "tool_choice": "auto",
        "store": False,
    }
    r = _post(gw, body)
    assert r.status_code == 200
    doc = r.json()
    validate("Response", doc)
    sent = capture_upstream.last_body
    assert sent["messages"] == [
        {"role": "system", "content": "Answer in JSON."},
        {"role": "system", "content": "Be strict."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Describe"},
                {"type": "image_url", "image_url": {"url": "https://x/y.png", "detail": "low"}},
            ],
        },
    ]
    assert sent["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "out", "schema": schema, "strict": True},
    }
    assert sent["max_tokens"] == 40 and sent["temperature"] == 0.2
    assert sent["tools"][0] == {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather of a city",
            "parameters": TOOLS[0]["parameters"],
            "strict": False,
        },
    }
    assert "store" not in sent and "instructions" not in sent
    # The capturing upstream answers with a tool call.
    assert doc["output"][0]["type"] == "function_call" and doc["output"][0]["call_id"] == "call_1"
    assert doc["text"]["format"]["type"] == "json_schema"
    _post(gw, {**body, "text": {"format": {"type": "json_object"}}})
    assert capture_upstream.last_body["response_format"] == {"type": "json_object"}


def test_unsupported_and_invalid_requests(gw: GatewayServer, client: openai.OpenAI) -> None:
    cases = [
        ({"model": "chat", "input": "x", "tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"model": "chat", "input": "x", "background": True}, "background"),
        ({"model": "chat"}, "input"),
        ({"model": "chat", "input": [{"type": "item_reference", "id": "x"}]}, "input[0].type"),
        ({"model": "chat", "input": "x", "previous_response_id": "resp_nope"}, None),
        ({"model": "chat", "input": "x", "previous_response_id": "r" * 100_000}, None),
        ({"model": "chat", "input": "x", "previous_response_id": ["x"]}, None),
        ({"model": "chat", "input": "x", "store": "x"}, "store"),
        ({"model": "chat", "input": "x", "stream": "yes"}, "stream"),
    ]
    for body, param in cases:
        r = httpx.post(
            gw.base_url + "/responses", json=body, headers={"authorization": "Bearer key-a"}
        )
        assert r.status_code == 400, body
        validate_error = r.json()
        assert set(validate_error["error"]) == {"message", "type", "param", "code"}
        if param is not None:
            assert validate_error["error"]["param"] == param
        assert len(r.content) < 2000  # a client's value is echoed cut short
    r = httpx.get(
        gw.base_url + "/responses/" + "x" * 30_000, headers={"authorization": "Bearer key-a"}
    )
    assert r.status_code in (404, 414, 431) and len(r.content) < 2000
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="nope", input="x")
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=gw.base_url, api_key="bad", max_retries=0).responses.create(
            model="chat", input="x"
        )


def test_in_memory_store_without_redis(fleet: Fleet, gateway) -> None:
    gw = gateway(_policy(fleet))
    client = openai.OpenAI(base_url=gw.base_url, api_key="key-a", max_retries=0)
    first = client.responses.create(model="chat", input="hello")
    second = client.responses.create(model="chat", input="more", previous_response_id=first.id)
    assert client.responses.retrieve(second.id).previous_response_id == first.id


def test_models_list_keeps_aliases(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == ["chat"]


def test_stream_broken_midway_ends_failed(gw: GatewayServer, fleet: Fleet) -> None:
    fleet.set_faults("a", cut_stream_after_chunks=4)
    try:
        r = _post(gw, {"model": "chat", "input": "A long story", "stream": True})
    finally:
        fleet.set_faults("a")
    events = events_of(r.text)  # every event valid, the failure ones included
    kinds = [e["type"] for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-2:] == ["error", "response.failed"]
    failed = events[-1]["response"]
    assert failed["status"] == "failed" and failed["error"]["code"] == "server_error"
    assert "response.completed" not in kinds
