"""OpenAI conformance battery: the official SDK against `gateway serve` with the built-in demo.

What a new user runs first (no policy: the simulated fleet), asked everything an OpenAI client
asks: chat, streams (with usage), tools (forced and auto), n, structured output with `.parse()`,
logprobs, seed, stop, errors, models, embeddings and legacy completions. Every body is validated
against OpenAI's published schemas (tests/data/openai_schemas.json, from openai-openapi).
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pydantic
import pytest

from tests.support import free_port, validate, wait_http

KEY = "sk-conformance-demo"
MSG: Any = [{"role": "user", "content": "Hi"}]
WEATHER: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}


class Address(pydantic.BaseModel):
    city: str
    postcode: str | None


class Person(pydantic.BaseModel):
    name: str
    age: int
    hobbies: list[str]
    address: Address


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    """`gateway serve` with no policy (the demo), a gateway key set so that keys are checked."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "GATEWAY_POLICY")}
    env["GATEWAY_API_KEYS"] = f"conformance:{KEY}"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gateway.cli",
            "serve",
            "--port",
            str(port),
            "--log-level",
            "warning",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/health", proc, timeout=60)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="module")
def client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key=KEY, max_retries=0, timeout=30)


@pytest.fixture(scope="module")
def http(base_url: str) -> Iterator[httpx.Client]:
    headers = {"authorization": f"Bearer {KEY}"}
    with httpx.Client(base_url=base_url, headers=headers, timeout=30) as c:
        yield c


def raw_chat(client: openai.OpenAI, **kw: Any) -> dict[str, Any]:
    """A chat answer as the JSON the server sent, validated against the schema."""
    r = client.chat.completions.with_raw_response.create(model="demo", **kw)
    doc = json.loads(r.http_response.content)
    validate("CreateChatCompletionResponse", doc)
    assert doc["model"] == "demo"  # the alias asked for, not the simulated provider's id
    return doc


def raw_stream(http: httpx.Client, path: str = "/chat/completions", **kw: Any) -> list[Any]:
    """A stream's chunks (without `[DONE]`, which must end it), each validated."""
    body = {"model": "demo", "stream": True, **kw}
    with http.stream("POST", path, json=body) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        data = [ln[6:] for ln in r.iter_lines() if ln.startswith("data: ")]
    assert data[-1] == "[DONE]" and "[DONE]" not in data[:-1]
    chunks = [json.loads(d) for d in data[:-1]]
    for c in chunks:
        if path == "/chat/completions":
            validate("CreateChatCompletionStreamResponse", c)
        else:
            completion_chunk(c)
        assert c["model"] == "demo"
    return chunks


def completion_chunk(chunk: dict[str, Any]) -> None:
    """Legacy completion chunks have the body's schema, with `finish_reason: null` until the end
    (as OpenAI streams them; the published schema has no separate chunk type)."""
    if chunk["choices"]:
        chunk = {
            **chunk,
            "choices": [
                {**c, "finish_reason": c["finish_reason"] or "stop"} for c in chunk["choices"]
            ],
        }
    validate("CreateCompletionResponse", chunk)


def test_chat(client: openai.OpenAI) -> None:
    doc = raw_chat(client, messages=MSG, max_tokens=8)
    choice = doc["choices"][0]
    assert choice["message"]["role"] == "assistant" and choice["message"]["content"]
    assert choice["finish_reason"] in ("stop", "length")
    u = doc["usage"]
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"] > 0


def test_stream_and_include_usage(client: openai.OpenAI, http: httpx.Client) -> None:
    chunks = raw_stream(http, messages=MSG, max_tokens=6)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    assert all("usage" not in c or c["usage"] is None for c in chunks)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert len(text.split()) == 6
    chunks = raw_stream(http, messages=MSG, max_tokens=6, stream_options={"include_usage": True})
    last = chunks[-1]
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 6
    assert all(c["usage"] is None for c in chunks[:-1])
    # The SDK's own reading of the stream (what the README's snippet prints).
    got = [
        c.choices[0].delta.content
        for c in client.chat.completions.create(
            model="demo", messages=MSG, max_tokens=6, stream=True
        )
        if c.choices and c.choices[0].delta.content
    ]
    assert "".join(got) == text


@pytest.mark.parametrize("stream", [False, True])
def test_tools_forced_and_auto(client: openai.OpenAI, http: httpx.Client, stream: bool) -> None:
    forced = {"type": "function", "function": {"name": "get_weather"}}
    asks = [
        (forced, "Hello"),
        ("auto", "What is the weather in Paris?"),
    ]
    params = WEATHER["function"]["parameters"]
    for choice, text in asks:
        body: dict[str, Any] = {"messages": [{"role": "user", "content": text}], "tools": [WEATHER]}
        if not stream:
            doc = raw_chat(client, **body, tool_choice=choice)
            assert doc["choices"][0]["finish_reason"] == "tool_calls"
            (call,) = doc["choices"][0]["message"]["tool_calls"]
            assert call["function"]["name"] == "get_weather"
            jsonschema.validate(json.loads(call["function"]["arguments"]), params)
            continue
        chunks = raw_stream(http, **body, tool_choice=choice)
        deltas = [
            d
            for c in chunks
            if c["choices"]
            for d in c["choices"][0]["delta"].get("tool_calls") or []
        ]
        assert deltas[0]["function"]["name"] == "get_weather" and deltas[0]["id"]
        args = "".join(d["function"].get("arguments") or "" for d in deltas)
        jsonschema.validate(json.loads(args), params)
        assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    # `auto` without a reason to call, and `none`: text.
    doc = raw_chat(client, messages=MSG, tools=[WEATHER], tool_choice="auto", max_tokens=5)
    assert (
        doc["choices"][0]["message"]["content"]
        and doc["choices"][0]["finish_reason"] != "tool_calls"
    )
    ask = [{"role": "user", "content": "weather in Paris?"}]
    doc = raw_chat(client, messages=ask, tools=[WEATHER], tool_choice="none", max_tokens=5)
    assert doc["choices"][0]["message"]["content"]


def test_n_choices(client: openai.OpenAI, http: httpx.Client) -> None:
    doc = raw_chat(client, messages=MSG, n=2, max_tokens=5)
    assert [c["index"] for c in doc["choices"]] == [0, 1]
    assert doc["choices"][0]["message"]["content"] != doc["choices"][1]["message"]["content"]
    chunks = raw_stream(http, messages=MSG, n=2, max_tokens=5)
    assert {c["choices"][0]["index"] for c in chunks if c["choices"]} == {0, 1}


def test_structured_output_parse(client: openai.OpenAI) -> None:
    r = client.chat.completions.parse(
        model="demo",
        messages=[{"role": "user", "content": "Describe a person."}],
        response_format=Person,
    )
    person = r.choices[0].message.parsed
    assert isinstance(person, Person) and isinstance(person.address, Address)
    assert r.model == "demo"
    with client.chat.completions.stream(
        model="demo", messages=MSG, response_format=Person
    ) as stream:
        final = stream.get_final_completion()
    assert isinstance(final.choices[0].message.parsed, Person)
    # Strict function tools from a pydantic model: the SDK parses the call's arguments.
    r = client.chat.completions.parse(
        model="demo",
        messages=[{"role": "user", "content": "Look up the weather."}],
        tools=[openai.pydantic_function_tool(Address, name="lookup_address")],
        tool_choice="required",
    )
    (call,) = r.choices[0].message.tool_calls or []
    assert isinstance(call.function.parsed_arguments, Address)
    doc = raw_chat(client, messages=MSG, response_format={"type": "json_object"})
    assert isinstance(json.loads(doc["choices"][0]["message"]["content"]), dict)


def test_logprobs(client: openai.OpenAI, http: httpx.Client) -> None:
    doc = raw_chat(client, messages=MSG, max_tokens=4, logprobs=True, top_logprobs=2)
    content = doc["choices"][0]["logprobs"]["content"]
    assert len(content) == 4 and all(len(e["top_logprobs"]) == 2 for e in content)
    assert "".join(e["token"] for e in content) == doc["choices"][0]["message"]["content"]
    chunks = raw_stream(http, messages=MSG, max_tokens=4, logprobs=True, top_logprobs=2)
    streamed = [
        e
        for c in chunks
        if c["choices"] and c["choices"][0]["logprobs"]
        for e in c["choices"][0]["logprobs"]["content"]
    ]
    assert len(streamed) == 4


def test_seed_and_stop(client: openai.OpenAI) -> None:
    def text(**kw: Any) -> str:
        doc = raw_chat(client, messages=MSG, max_tokens=12, **kw)
        return doc["choices"][0]["message"]["content"]

    a = text(seed=42)
    assert text(seed=42) == a
    word = " " + a.split()[4]
    doc = raw_chat(client, messages=MSG, max_tokens=12, seed=42, stop=[word])
    cut = doc["choices"][0]["message"]["content"]
    assert a.startswith(cut) and word not in cut and doc["choices"][0]["finish_reason"] == "stop"


def test_errors(base_url: str, client: openai.OpenAI, http: httpx.Client) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="demo", messages=MSG, temperature="hot")  # type: ignore[call-overload]
    assert e.value.status_code == 400
    body = e.value.response.json()
    validate("ErrorResponse", body)
    assert body["error"]["param"] == "temperature" and body["error"]["code"] == "invalid_type"
    assert "x-gateway-provider" not in e.value.response.headers  # nothing was sent upstream
    cases: list[tuple[dict[str, Any], str]] = [
        ({"top_p": 2}, "top_p"),
        ({"n": 0}, "n"),
        ({"max_tokens": -1}, "max_tokens"),
        (
            {"tools": [{"type": "function", "function": {"name": "has space"}}]},
            "tools[0].function.name",
        ),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
    ]
    for bad, param in cases:
        r = http.post("/chat/completions", json={"model": "demo", "messages": MSG, **bad})
        assert r.status_code == 400, bad
        validate("ErrorResponse", r.json())
        assert r.json()["error"]["param"] == param
    with pytest.raises(openai.NotFoundError) as nf:
        client.chat.completions.create(model="no-such-model", messages=MSG)
    validate("ErrorResponse", nf.value.response.json())
    assert nf.value.response.json()["error"]["code"] == "model_not_found"
    bad_key = openai.OpenAI(base_url=base_url, api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as au:
        bad_key.chat.completions.create(model="demo", messages=MSG)
    validate("ErrorResponse", au.value.response.json())


def test_models(client: openai.OpenAI, http: httpx.Client) -> None:
    doc = http.get("/models").json()
    validate("ListModelsResponse", doc)
    ids = [m["id"] for m in doc["data"]]
    assert "demo" in ids
    one = http.get("/models/demo").json()
    validate("Model", one)
    assert client.models.retrieve("demo").id == "demo"
    assert {m.id for m in client.models.list()} == set(ids)
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")


def test_embeddings(client: openai.OpenAI, http: httpx.Client) -> None:
    doc = http.post("/embeddings", json={"model": "demo", "input": ["a", "b"]}).json()
    validate("CreateEmbeddingResponse", doc)
    assert [d["index"] for d in doc["data"]] == [0, 1] and doc["model"] == "demo"
    r = client.embeddings.create(model="demo", input="hello")  # the SDK asks for base64
    vec = r.data[0].embedding
    assert len(vec) == len(doc["data"][0]["embedding"]) and abs(sum(v * v for v in vec) - 1) < 1e-3
    raw = http.post(
        "/embeddings", json={"model": "demo", "input": "x", "encoding_format": "base64"}
    ).json()
    assert len(base64.b64decode(raw["data"][0]["embedding"])) == 4 * len(vec)


def test_legacy_completions(client: openai.OpenAI, http: httpx.Client) -> None:
    r = client.completions.with_raw_response.create(model="demo", prompt="Say", max_tokens=5)
    doc = json.loads(r.http_response.content)
    validate("CreateCompletionResponse", doc)
    assert doc["model"] == "demo" and doc["choices"][0]["text"]
    chunks = raw_stream(http, "/completions", prompt="Say", max_tokens=5)
    assert (
        "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
        == doc["choices"][0]["text"]
    )
    echoed = client.completions.create(model="demo", prompt="Say", max_tokens=5, echo=True)
    assert echoed.choices[0].text == "Say" + doc["choices"][0]["text"]
    both = client.completions.create(model="demo", prompt="Say", max_tokens=3, n=2, logprobs=1)
    assert [c.index for c in both.choices] == [0, 1] and both.choices[0].logprobs is not None
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="demo", prompt="x", logprobs=9)
    assert e.value.response.json()["error"]["param"] == "logprobs"


def test_readme_quick_start_snippet(base_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """The README's first snippet, run as written (our port and key): the streamed line is text
    only (no stray `None` from the role or finish chunks)."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
    snippet = next(b for b in blocks if 'base_url="http://127.0.0.1:8080/v1"' in b)
    snippet = snippet.replace("http://127.0.0.1:8080/v1", base_url).replace("unused-in-demo", KEY)
    exec(compile(snippet, "README.md", "exec"), {})  # noqa: S102 - the project's own README
    streamed = capsys.readouterr().out.rstrip("\n").splitlines()[-1]
    assert streamed and "None" not in streamed
    assert re.fullmatch(r"[a-z]+( [a-z]+)*", streamed), streamed
