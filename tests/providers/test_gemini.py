"""`type: gemini` providers: the mapping checked against the official google-genai SDK's request
types, and the gateway end to end (official `openai` client) against the Gemini-shaped simulator."""

from __future__ import annotations

import os
from collections.abc import Iterator

import httpx
import jsonschema
import openai
import orjson
import pytest

pytest.importorskip("google.genai", reason="the Gemini simulator checks requests with google-genai")

from gateway.providers.gemini_mapping import (  # noqa: E402
    GeminiStream,
    chat_to_gemini,
    gemini_to_chat,
    map_error,
)
from loadtests.simulator.gemini import ApiError, run_gemini, validate_request  # noqa: E402
from tests.support import GatewayServer, validate, validate_sse  # noqa: E402

KEY = "gemini-test-key-value"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city", "days"],
            "additionalProperties": False,
        },
    },
}


def test_request_mapping_passes_the_sdk_types() -> None:
    body = {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Weather?"},
                    {
                        "type": "image_url",
                        "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="},
                    },
                ],
            },
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {
                            "name": "get_weather",
                            "arguments": '{"city": "Oslo", "days": 1}',
                        },
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "rain"},
        ],
        "tools": [WEATHER],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "max_tokens": 20,
        "temperature": 0.5,
        "top_p": 0.9,
        "stop": ["END"],
        "n": 2,
        "seed": 7,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "x", "schema": {"type": "object"}},
        },
    }
    out = chat_to_gemini(body)
    validate_request(out)
    assert out["systemInstruction"] == {"parts": [{"text": "Be brief."}]}
    assert [c["role"] for c in out["contents"]] == ["user", "model", "user"]
    assert out["contents"][1]["parts"][0]["functionCall"] == {
        "name": "get_weather",
        "args": {"city": "Oslo", "days": 1},
    }
    assert out["contents"][2]["parts"][0]["functionResponse"]["name"] == "get_weather"
    assert out["toolConfig"] == {
        "functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["get_weather"]}
    }
    assert out["generationConfig"]["candidateCount"] == 2
    assert out["generationConfig"]["responseMimeType"] == "application/json"
    for bad in (
        {**out, "generation_config": {}},
        {**out, "generationConfig": {"max_tokens": 3}},
        {**out, "contents": [{"role": "assistant", "parts": [{"text": "x"}]}]},
    ):
        with pytest.raises(ApiError):
            validate_request(bad)


def test_answer_and_stream_mapping() -> None:
    answer = {
        "candidates": [
            {
                "content": {
                    "role": "model",
                    "parts": [{"functionCall": {"name": "f", "args": {"a": 1}}}],
                },
                "finishReason": "STOP",
                "index": 0,
            }
        ],
        "usageMetadata": {
            "promptTokenCount": 30,
            "candidatesTokenCount": 5,
            "cachedContentTokenCount": 20,
            "thoughtsTokenCount": 2,
            "totalTokenCount": 37,
        },
    }
    chat = gemini_to_chat(answer, "gemini-x")
    validate("CreateChatCompletionResponse", chat)
    assert chat["choices"][0]["finish_reason"] == "tool_calls"
    assert chat["usage"] == {
        "prompt_tokens": 30,
        "completion_tokens": 7,
        "total_tokens": 37,
        "prompt_tokens_details": {"cached_tokens": 20},
    }
    st = GeminiStream("gemini-x", include_usage=True)
    sse = b"".join(
        st.feed(b"data: " + orjson.dumps(c) + b"\r\n\r\n")
        for c in (
            {"candidates": [{"content": {"role": "model", "parts": [{"text": "Hel"}]}}]},
            {
                "candidates": [
                    {
                        "content": {"role": "model", "parts": [{"text": "lo"}]},
                        "finishReason": "MAX_TOKENS",
                    }
                ],
                "usageMetadata": {"promptTokenCount": 3, "candidatesTokenCount": 2},
            },
        )
    )
    chunks = validate_sse(sse)
    assert (
        "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
        == "Hello"
    )
    assert (
        chunks[-2]["choices"][0]["finish_reason"] == "length"
        and chunks[-1]["usage"]["total_tokens"] == 5
    )


@pytest.mark.parametrize(
    ("status", "body", "kind", "code"),
    [
        (
            400,
            {
                "code": 400,
                "message": "API key not valid.",
                "status": "INVALID_ARGUMENT",
                "details": [{"reason": "API_KEY_INVALID"}],
            },
            "upstream_auth",
            None,
        ),
        (
            403,
            {"code": 403, "message": "denied", "status": "PERMISSION_DENIED"},
            "upstream_auth",
            None,
        ),
        (
            429,
            {"code": 429, "message": "quota", "status": "RESOURCE_EXHAUSTED"},
            "rate_limited",
            None,
        ),
        (
            503,
            {"code": 503, "message": "overloaded", "status": "UNAVAILABLE"},
            "upstream_5xx",
            None,
        ),
        (
            400,
            {
                "code": 400,
                "message": "The input token count (9000) exceeds the maximum number of tokens allowed (8192).",
                "status": "INVALID_ARGUMENT",
            },
            "upstream_4xx",
            "context_length_exceeded",
        ),
        (
            400,
            {"code": 400, "message": "bad field", "status": "INVALID_ARGUMENT"},
            "upstream_4xx",
            "INVALID_ARGUMENT",
        ),
    ],
)
def test_error_mapping(status: int, body: dict, kind: str, code: str | None) -> None:
    mapped = map_error(status, orjson.dumps({"error": body}))
    assert mapped.kind == kind
    if code:
        assert orjson.loads(mapped.body)["error"]["code"] == code


@pytest.fixture(scope="module")
def sim() -> Iterator:
    os.environ["GEMINI_TEST_KEY"] = KEY
    try:
        with run_gemini(KEY, context_window=2000) as s:
            yield s
    finally:
        os.environ.pop("GEMINI_TEST_KEY", None)


def _policy(sim_url: str, fleet_url: str | None = None, key_env: str = "GEMINI_TEST_KEY") -> str:
    members = ["gm"] + (["oa"] if fleet_url else [])
    oa = (
        f"\n  oa: {{base_url: '{fleet_url}', models: {{'*': sim-a}}, breaker: {{consecutive_failures: 2}}}}"
        if fleet_url
        else ""
    )
    return f"""
providers:
  gm: {{type: gemini, base_url: '{sim_url}', api_key_env: {key_env}, models: {{'*': gemini-2.0-flash}}, breaker: {{consecutive_failures: 2}}}}{oa}
pools:
  main: {{members: [{", ".join(members)}], balancer: {{strategy: round_robin}}}}
models:
  chat: {{pool: main}}
"""


@pytest.fixture(scope="module")
def gw(sim) -> Iterator[GatewayServer]:
    with GatewayServer(_policy(sim.url)) as g:
        yield g


def test_gateway_plain_stream_tools_json_and_n(gw, sim) -> None:
    client = openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0)
    body = {
        "model": "chat",
        "messages": [{"role": "system", "content": "Terse."}, {"role": "user", "content": "Hi"}],
        "max_tokens": 6,
    }
    resp = client.chat.completions.create(**body)
    assert resp.choices[0].message.content and resp.usage.completion_tokens == 6
    assert sim.stats.last_body["systemInstruction"] == {"parts": [{"text": "Terse."}]}
    r = httpx.post(
        gw.base_url + "/chat/completions",
        json={**body, "stream": True, "stream_options": {"include_usage": True}},
        timeout=10,
    )
    chunks = validate_sse(r.content)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == resp.choices[0].message.content and chunks[-1]["usage"]["completion_tokens"] == 6
    forced = client.chat.completions.create(
        model="chat",
        messages=[{"role": "user", "content": "Weather in Oslo?"}],
        tools=[WEATHER],
        tool_choice="required",
    )
    call = forced.choices[0].message.tool_calls[0]
    jsonschema.validate(orjson.loads(call.function.arguments), WEATHER["function"]["parameters"])
    follow = client.chat.completions.create(
        model="chat",
        messages=[
            {"role": "user", "content": "Weather in Oslo?"},
            forced.choices[0].message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": "rain"},
        ],
        tools=[WEATHER],
    )
    assert follow.choices[0].message.content
    schema = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
    js = client.chat.completions.create(
        model="chat",
        messages=[{"role": "user", "content": "x"}],
        response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": schema}},
    )
    jsonschema.validate(orjson.loads(js.choices[0].message.content), schema)
    two = client.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "x"}], n=2, max_tokens=3
    )
    assert [c.index for c in two.choices] == [0, 1]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "word " * 3000}]
        )
    assert e.value.code == "context_length_exceeded"


def test_gateway_errors_and_mixed_pool(sim, fleet) -> None:
    with GatewayServer(_policy(sim.url, key_env="GEMINI_NO_SUCH_KEY")) as g:
        r = httpx.post(
            g.base_url + "/chat/completions",
            json={"model": "chat", "messages": [{"role": "user", "content": "x"}]},
            timeout=10,
        )
        assert r.status_code == 502 and r.json()["error"]["code"] == "upstream_auth_failed"
    with GatewayServer(_policy(sim.url, fleet.url("a"))) as g:
        sim.set_fault(503, "UNAVAILABLE", "overloaded")
        try:
            for i in range(6):
                r = httpx.post(
                    g.base_url + "/chat/completions",
                    json={
                        "model": "chat",
                        "stream": bool(i % 2),
                        "messages": [{"role": "user", "content": "x"}],
                    },
                    timeout=10,
                )
                assert r.status_code == 200
        finally:
            sim.clear_faults()
        assert httpx.get(g.url + "/admin/breakers").json()["gm"]["state"] != "closed"


def test_streamed_tool_calls_and_messages_api(gw) -> None:
    import anthropic

    client = openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0)
    stream = client.chat.completions.create(
        model="chat",
        messages=[{"role": "user", "content": "Weather in Rome?"}],
        tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        stream=True,
    )
    args, finish = "", None
    for c in stream:
        if c.choices:
            for tc in c.choices[0].delta.tool_calls or []:
                args += tc.function.arguments or ""
            finish = c.choices[0].finish_reason or finish
    assert finish == "tool_calls"
    jsonschema.validate(orjson.loads(args), WEATHER["function"]["parameters"])
    claude = anthropic.Anthropic(base_url=gw.url, api_key="unused", max_retries=0)
    msg = claude.messages.create(
        model="chat", max_tokens=5, messages=[{"role": "user", "content": "Hello"}]
    )
    assert msg.content[0].text and msg.usage.output_tokens == 5


def test_stream_with_two_candidates() -> None:
    st = GeminiStream("g", candidates=2)
    out = b""
    for index, word in ((0, "a"), (1, "b")):
        chunk = {
            "candidates": [
                {
                    "content": {"role": "model", "parts": [{"text": word}]},
                    "index": index,
                    "finishReason": "STOP",
                }
            ]
        }
        out += st.feed(b"data: " + orjson.dumps(chunk) + b"\r\n\r\n")
    chunks = validate_sse(out)
    by_index: dict[int, str] = {}
    for c in chunks:
        ch = c["choices"][0]
        by_index[ch["index"]] = by_index.get(ch["index"], "") + (ch["delta"].get("content") or "")
    assert by_index == {0: "a", 1: "b"} and st.done


def test_an_event_after_the_end_does_not_break_a_finished_stream() -> None:
    """A usage-only event after every candidate finished: the answer stands, nothing raises."""
    st = GeminiStream("g", include_usage=True)
    done = {
        "candidates": [
            {"content": {"role": "model", "parts": [{"text": "hi"}]}, "finishReason": "STOP"}
        ],
        "usageMetadata": {"promptTokenCount": 2, "candidatesTokenCount": 1},
    }
    out = st.feed(b"data: " + orjson.dumps(done) + b"\r\n\r\n")
    assert out.endswith(b"data: [DONE]\n\n") and st.done
    late = {
        "usageMetadata": {"promptTokenCount": 2, "candidatesTokenCount": 1},
        "promptFeedback": None,
    }
    assert st.feed(b"data: " + orjson.dumps(late) + b"\r\n\r\n") == b""
