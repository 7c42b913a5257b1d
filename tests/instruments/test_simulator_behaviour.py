"""The simulator behaves like a model: n, structured output, tools, logprobs, seed, stop.

Every answer is checked against OpenAI's published schemas, streamed and not; the fast path
(no such option) stays the precomputed one.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import pytest

from loadtests.simulator.behaviour import apply_stop, needs_plan, pieces_of, tools_to_call
from loadtests.simulator.schema_values import value_for
from loadtests.simulator.testing import Fleet
from tests.support import validate

WEATHER: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "minLength": 3},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city", "unit", "days"],
            "additionalProperties": False,
        },
    },
}
PERSON: Any = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "exclusiveMinimum": 0, "maximum": 120},
        "score": {"type": "number", "minimum": 0, "maximum": 1},
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 4},
        "home": {"$ref": "#/$defs/Place"},
        "nick": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        "kind": {"enum": ["a", "b"]},
        "ok": {"type": "boolean"},
        "when": {"type": "string", "format": "date-time"},
    },
    "required": ["name", "age", "score", "tags", "home", "nick", "kind", "ok", "when"],
    "additionalProperties": False,
    "$defs": {
        "Place": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "zip": {"type": ["string", "null"]}},
            "required": ["city", "zip"],
            "additionalProperties": False,
        }
    },
}


def ask(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


FLEET: list[Any] = [
    {"name": "fast", "profile": "fast"},
    {"name": "static", "profile": "zero-latency"},
]


@pytest.fixture(scope="module")
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=10) as c:
        yield c


def call(http: httpx.Client, fleet: Fleet, body: dict[str, Any], inst: str = "fast") -> Any:
    """The unary answer and the streamed one (chunks without [DONE]), both schema-checked."""
    url = fleet.url(inst) + "/chat/completions"
    doc = http.post(url, json={"model": "m", **body}).json()
    validate("CreateChatCompletionResponse", doc)
    streamed = {"model": "m", **body, "stream": True, "stream_options": {"include_usage": True}}
    with http.stream("POST", url, json=streamed) as r:
        lines = [ln[6:] for ln in r.iter_lines() if ln.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    chunks = [json.loads(x) for x in lines[:-1]]
    for c in chunks:
        validate("CreateChatCompletionStreamResponse", c)
    return doc, chunks


def streamed_text(chunks: list[Any], index: int = 0) -> str:
    return "".join(
        c["choices"][0]["delta"].get("content") or ""
        for c in chunks
        if c["choices"] and c["choices"][0]["index"] == index
    )


def finishes(chunks: list[Any]) -> dict[int, str]:
    return {
        c["choices"][0]["index"]: c["choices"][0]["finish_reason"]
        for c in chunks
        if c["choices"] and c["choices"][0]["finish_reason"]
    }


@pytest.mark.parametrize("inst", ["fast", "static"])
def test_n_choices_streamed_with_indexes(fleet: Fleet, http: httpx.Client, inst: str) -> None:
    doc, chunks = call(http, fleet, {"messages": ask("hi"), "n": 3, "max_tokens": 4}, inst)
    texts = [c["message"]["content"] for c in doc["choices"]]
    assert [c["index"] for c in doc["choices"]] == [0, 1, 2]
    assert len(set(texts)) == 3 and all(len(t.split()) == 4 for t in texts)
    assert doc["usage"]["completion_tokens"] == 12
    assert [streamed_text(chunks, i) for i in range(3)] == texts
    assert finishes(chunks) == {0: "length", 1: "length", 2: "length"}
    assert chunks[-1]["usage"]["completion_tokens"] == 12


@pytest.mark.parametrize("inst", ["fast", "static"])
def test_json_schema_output_validates(fleet: Fleet, http: httpx.Client, inst: str) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    doc, chunks = call(http, fleet, {"messages": ask("a person"), "response_format": fmt}, inst)
    text = doc["choices"][0]["message"]["content"]
    jsonschema.validate(json.loads(text), PERSON)
    assert streamed_text(chunks) == text
    assert doc["choices"][0]["finish_reason"] == "stop"
    doc, _ = call(http, fleet, {"messages": ask("x"), "response_format": {"type": "json_object"}})
    assert isinstance(json.loads(doc["choices"][0]["message"]["content"]), dict)


def test_tool_calls_forced_auto_none(fleet: Fleet, http: httpx.Client) -> None:
    forced = {"type": "function", "function": {"name": "get_weather"}}
    for choice, text, calls in [
        (forced, "hello", True),
        ("required", "hello", True),
        ("auto", "What's the weather in Paris?", True),
        ("auto", "Tell me a story", False),
        ("none", "What's the weather in Paris?", False),
    ]:
        body = {"messages": ask(text), "tools": [WEATHER], "tool_choice": choice}
        doc, chunks = call(http, fleet, body)
        msg, finish = doc["choices"][0]["message"], doc["choices"][0]["finish_reason"]
        if not calls:
            assert msg["content"] and "tool_calls" not in msg and finish != "tool_calls", choice
            continue
        assert msg["content"] is None and finish == "tool_calls", choice
        (tc,) = msg["tool_calls"]
        assert tc["function"]["name"] == "get_weather" and tc["id"].startswith("call_")
        jsonschema.validate(
            json.loads(tc["function"]["arguments"]), WEATHER["function"]["parameters"]
        )
        deltas = [
            d
            for c in chunks
            if c["choices"]
            for d in c["choices"][0]["delta"].get("tool_calls") or []
        ]
        assert (
            deltas[0]["id"].startswith("call_") and deltas[0]["function"]["name"] == "get_weather"
        )
        assert "".join(d["function"]["arguments"] for d in deltas) == tc["function"]["arguments"]
        assert finishes(chunks) == {0: "tool_calls"}
    # After the tool's result, the model answers in text (an agent loop ends).
    history = [
        *ask("What's the weather in Paris?"),
        {"role": "assistant", "content": None, "tool_calls": [tc]},
        {"role": "tool", "tool_call_id": tc["id"], "content": "sunny"},
    ]
    doc, _ = call(http, fleet, {"messages": history, "tools": [WEATHER], "tool_choice": "auto"})
    assert doc["choices"][0]["message"]["content"]


def test_parallel_tool_calls(fleet: Fleet, http: httpx.Client) -> None:
    flights: Any = {
        "type": "function",
        "function": {
            "name": "search_flights",
            "parameters": {
                "type": "object",
                "properties": {"to": {"type": "string"}, "seats": {"type": "integer"}},
                "required": ["to", "seats"],
            },
        },
    }
    body = {"messages": ask("Weather in Rome, and flights there?"), "tools": [WEATHER, flights]}
    doc, chunks = call(http, fleet, body)
    calls = doc["choices"][0]["message"]["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["get_weather", "search_flights"]
    assert len({c["id"] for c in calls}) == 2
    deltas = [
        d for c in chunks if c["choices"] for d in c["choices"][0]["delta"].get("tool_calls") or []
    ]
    for k, expected in enumerate(calls):
        mine = [d for d in deltas if d["index"] == k]
        assert mine[0]["id"].startswith("call_") and all("id" not in d for d in mine[1:])
        assert mine[0]["function"]["name"] == expected["function"]["name"]
        args = "".join(d["function"]["arguments"] for d in mine)
        assert args == expected["function"]["arguments"]
        schema = (WEATHER, flights)[k]["function"]["parameters"]
        jsonschema.validate(json.loads(args), schema)
    doc, _ = call(http, fleet, {**body, "parallel_tool_calls": False})
    assert len(doc["choices"][0]["message"]["tool_calls"]) == 1


def test_logprobs_shape_in_bodies_and_streams(fleet: Fleet, http: httpx.Client) -> None:
    body = {"messages": ask("hi"), "logprobs": True, "top_logprobs": 3, "max_tokens": 5}
    doc, chunks = call(http, fleet, body)
    content = doc["choices"][0]["logprobs"]["content"]
    assert "".join(e["token"] for e in content) == doc["choices"][0]["message"]["content"]
    for e in content:
        assert e["logprob"] <= 0 and bytes(e["bytes"]).decode() == e["token"]
        tops = [t["logprob"] for t in e["top_logprobs"]]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True)
        assert e["top_logprobs"][0]["token"] == e["token"]
    streamed = [
        e
        for c in chunks
        if c["choices"] and c["choices"][0]["logprobs"]
        for e in c["choices"][0]["logprobs"]["content"]
    ]
    assert streamed == content
    doc, _ = call(http, fleet, {"messages": ask("hi"), "logprobs": True, "max_tokens": 2})
    assert all(e["top_logprobs"] == [] for e in doc["choices"][0]["logprobs"]["content"])


def test_seed_and_stop(fleet: Fleet, http: httpx.Client) -> None:
    def text(**kw: Any) -> str:
        doc, _ = call(http, fleet, {"messages": ask("tell me"), "max_tokens": 30, **kw})
        return doc["choices"][0]["message"]["content"]

    assert text(seed=5) == text(seed=5) != text(seed=6)
    full = text(seed=5)
    word = full.split()[5]
    doc, chunks = call(
        http,
        fleet,
        {"messages": ask("tell me"), "max_tokens": 30, "seed": 5, "stop": ["zzz", " " + word]},
    )
    cut = doc["choices"][0]["message"]["content"]
    assert full.startswith(cut) and len(cut) <= full.index(" " + word)
    assert doc["choices"][0]["finish_reason"] == "stop" and streamed_text(chunks) == cut
    assert doc["usage"]["completion_tokens"] < 30


def test_legacy_completions_n_logprobs_stop(fleet: Fleet, http: httpx.Client) -> None:
    url = fleet.url("fast") + "/completions"
    body = {"model": "m", "prompt": "hi", "n": 2, "logprobs": 2, "max_tokens": 3}
    doc = http.post(url, json=body).json()
    validate("CreateCompletionResponse", doc)
    assert [c["index"] for c in doc["choices"]] == [0, 1]
    lp = doc["choices"][0]["logprobs"]
    assert "".join(lp["tokens"]) == doc["choices"][0]["text"]
    assert all(len(t) == 2 for t in lp["top_logprobs"]) and lp["text_offset"][0] == 0
    echoed = http.post(url, json={**body, "n": 1, "echo": True}).json()
    validate("CreateCompletionResponse", echoed)
    text = echoed["choices"][0]["text"]
    assert text.startswith("hi") and text[2:] == doc["choices"][0]["text"]
    assert echoed["choices"][0]["logprobs"]["text_offset"][0] == 2
    assert echoed["usage"] == doc["usage"] | {"completion_tokens": 3, "total_tokens": 4}
    with http.stream("POST", url, json={**body, "n": 1, "echo": True, "stream": True}) as r:
        lines = [json.loads(x[6:]) for x in r.iter_lines() if x.startswith("data: {")]
    assert "".join(c["choices"][0]["text"] for c in lines) == text


def test_fast_path_untouched_without_options(fleet: Fleet, http: httpx.Client) -> None:
    assert not needs_plan({"messages": [], "n": 1, "logprobs": False, "stop": None})
    assert not needs_plan({"response_format": {"type": "text"}, "seed": 3, "temperature": 1})
    assert needs_plan({"n": 2}) and needs_plan({"tools": []}) and needs_plan({"stop": "x"})
    doc, _ = call(http, fleet, {"messages": ask("hi"), "max_tokens": 3}, "static")
    assert doc["choices"][0]["logprobs"] is None and len(doc["choices"]) == 1


def test_schema_values_and_helpers() -> None:
    rng = random.Random(1)
    for _ in range(20):
        jsonschema.validate(value_for(PERSON, rng), PERSON)
    tree = {
        "$ref": "#/$defs/Node",
        "$defs": {
            "Node": {
                "type": "object",
                "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/Node"}}},
                "required": ["kids"],
            }
        },
    }
    jsonschema.validate(value_for(tree, rng), tree)  # recursive schemas end
    multiple = {"type": "integer", "minimum": 10, "maximum": 40, "multipleOf": 7}
    assert value_for(multiple, rng) in (14, 21, 28, 35)
    assert pieces_of('{"a": 1}') and "".join(pieces_of('{"a": [1, "b c"]}')) == '{"a": [1, "b c"]}'
    assert apply_stop(["a", " b", "c", " d"], ["bc"]) == ["a", " "]
    assert apply_stop(["a", " b"], "zz") is None
    tools = [WEATHER, {"type": "function", "function": {"name": "searchFlights"}}]
    (found,) = tools_to_call({"tools": tools}, ask("find flights to Rome"))
    assert found["name"] == "searchFlights"
    assert tools_to_call({"tools": tools}, ask("get me a list")) == []
    both = ask("the weather in Rome, and flights there")
    assert len(tools_to_call({"tools": tools}, both)) == 2
    assert len(tools_to_call({"tools": tools, "parallel_tool_calls": False}, both)) == 1
