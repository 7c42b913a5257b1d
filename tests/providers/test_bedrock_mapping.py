"""OpenAI chat <-> Bedrock Converse translation (pure functions), checked against botocore's
service model of bedrock-runtime where a request is produced."""

from __future__ import annotations

import base64

import orjson
import pytest

from gateway.providers.bedrock_mapping import (
    StreamError,
    StreamTranslator,
    TranslationError,
    chat_to_converse,
    converse_to_chat,
    map_error,
)
from loadtests.simulator.bedrock import ApiError, validate_body
from tests.support import validate, validate_sse

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\nfake").decode()
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def converse(body: dict) -> dict:
    """Translate and check the result against botocore's Converse input shape."""
    out = chat_to_converse(body)
    validate_body("Converse", "anthropic.claude-3-haiku-20240307-v1:0", out)
    validate_body("ConverseStream", "anthropic.claude-3-haiku-20240307-v1:0", out)
    return out


def test_system_split_out_and_inference_config() -> None:
    out = converse(
        {
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "developer", "content": [{"type": "text", "text": "No lists."}]},
                {"role": "user", "content": "Hello"},
            ],
            "max_tokens": 50,
            "temperature": 0,
            "top_p": 0.5,
            "stop": "END",
        }
    )
    assert out["system"] == [{"text": "Be brief."}, {"text": "No lists."}]
    assert out["messages"] == [{"role": "user", "content": [{"text": "Hello"}]}]
    assert out["inferenceConfig"] == {
        "maxTokens": 50,
        "temperature": 0.0,
        "topP": 0.5,
        "stopSequences": ["END"],
    }
    assert converse({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 7})[
        "inferenceConfig"
    ] == {"maxTokens": 7}


def test_images_and_merged_roles() -> None:
    out = converse(
        {
            "messages": [
                {"role": "user", "content": "first"},
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "what is this?"},
                        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
                    ],
                },
            ]
        }
    )
    assert out["messages"] == [
        {
            "role": "user",
            "content": [
                {"text": "first"},
                {"text": "what is this?"},
                {"image": {"format": "png", "source": {"bytes": PNG}}},
            ],
        }
    ]
    with pytest.raises(TranslationError, match="data: URLs"):
        chat_to_converse(
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "image_url", "image_url": {"url": "https://x.test/a.png"}}
                        ],
                    }
                ]
            }
        )


def test_tools_and_tool_round_trip() -> None:
    body = {
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        ],
        "tools": [WEATHER],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
    }
    out = converse(body)
    assert out["messages"][1] == {
        "role": "assistant",
        "content": [
            {"toolUse": {"toolUseId": "call_1", "name": "get_weather", "input": {"city": "Paris"}}}
        ],
    }
    assert out["messages"][2] == {
        "role": "user",
        "content": [{"toolResult": {"toolUseId": "call_1", "content": [{"text": "sunny"}]}}],
    }
    assert out["toolConfig"]["tools"][0]["toolSpec"]["inputSchema"] == {
        "json": WEATHER["function"]["parameters"]
    }
    assert out["toolConfig"]["toolChoice"] == {"tool": {"name": "get_weather"}}
    assert converse({**body, "tool_choice": "required"})["toolConfig"]["toolChoice"] == {"any": {}}
    assert "toolChoice" not in converse({**body, "tool_choice": "auto"})["toolConfig"]
    # "none": no choice in Converse; the tools stay because the history holds tool blocks...
    assert "toolChoice" not in converse({**body, "tool_choice": "none"})["toolConfig"]
    # ...and are not offered at all without such history.
    plain = {"messages": [{"role": "user", "content": "hi"}], "tools": [WEATHER]}
    assert "toolConfig" not in converse({**plain, "tool_choice": "none"})


def test_response_format_becomes_output_config() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    out = converse(
        {
            "messages": [{"role": "user", "content": "x"}],
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "thing", "schema": schema, "strict": True},
            },
        }
    )
    spec = out["outputConfig"]["textFormat"]
    assert spec["type"] == "json_schema"
    assert orjson.loads(spec["structure"]["jsonSchema"]["schema"]) == schema
    assert spec["structure"]["jsonSchema"]["name"] == "thing"
    obj = converse(
        {"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_object"}}
    )
    assert orjson.loads(obj["outputConfig"]["textFormat"]["structure"]["jsonSchema"]["schema"]) == {
        "type": "object"
    }


def test_untranslatable_requests_are_refused_with_param() -> None:
    with pytest.raises(TranslationError) as e:
        chat_to_converse({"messages": [{"role": "user", "content": "x"}], "n": 2})
    assert e.value.param == "n"
    with pytest.raises(TranslationError) as e:
        chat_to_converse({"messages": [{"role": "wizard", "content": "x"}]})
    assert e.value.param == "messages[0].role"
    with pytest.raises(TranslationError):
        chat_to_converse({"messages": [{"role": "system", "content": "only a system prompt"}]})


def test_a_wrong_field_fails_the_service_model_check() -> None:
    """The check the simulator applies is strict enough to catch a mapping slip."""
    good = chat_to_converse({"messages": [{"role": "user", "content": "x"}], "max_tokens": 3})
    for bad in (
        {**good, "inferenceConfig": {"max_tokens": 3}},  # snake case
        {**good, "messages": [{"role": "user", "content": "x"}]},  # content not a list of blocks
        {**good, "messages": [{"role": "human", "content": [{"text": "x"}]}]},  # enum
        {**good, "modelId": "m"},  # belongs in the path
        {
            **good,
            "messages": [
                {
                    "role": "user",
                    "content": [{"image": {"format": "bmp", "source": {"bytes": PNG}}}],
                }
            ],
        },
    ):
        with pytest.raises(ApiError) as e:
            validate_body("Converse", "m", bad)
        assert e.value.status == 400 and e.value.name == "ValidationException"


def test_answer_mapping_with_usage_and_tool_calls() -> None:
    answer = {
        "output": {
            "message": {
                "role": "assistant",
                "content": [
                    {"text": "Let me check."},
                    {
                        "toolUse": {
                            "toolUseId": "t1",
                            "name": "get_weather",
                            "input": {"city": "Oslo"},
                        }
                    },
                ],
            }
        },
        "stopReason": "tool_use",
        "usage": {
            "inputTokens": 10,
            "outputTokens": 5,
            "totalTokens": 45,
            "cacheReadInputTokens": 20,
            "cacheWriteInputTokens": 10,
        },
        "metrics": {"latencyMs": 12},
    }
    chat = converse_to_chat(answer, "claude")
    validate("CreateChatCompletionResponse", chat)
    choice = chat["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == "Let me check."
    call = choice["message"]["tool_calls"][0]
    assert call["id"] == "t1" and orjson.loads(call["function"]["arguments"]) == {"city": "Oslo"}
    assert chat["usage"] == {
        "prompt_tokens": 40,
        "completion_tokens": 5,
        "total_tokens": 45,
        "prompt_tokens_details": {"cached_tokens": 20},
    }
    for reason, expected in (
        ("end_turn", "stop"),
        ("stop_sequence", "stop"),
        ("max_tokens", "length"),
        ("guardrail_intervened", "content_filter"),
    ):
        assert (
            converse_to_chat({**answer, "stopReason": reason}, "m")["choices"][0]["finish_reason"]
            == expected
        )


def _events(text_parts: list[str], tool: bool = False) -> list[tuple[str, dict]]:
    ev: list[tuple[str, dict]] = [("messageStart", {"role": "assistant"})]
    for p in text_parts:
        ev.append(("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": p}}))
    ev.append(("contentBlockStop", {"contentBlockIndex": 0}))
    if tool:
        start = {"toolUse": {"toolUseId": "t9", "name": "get_weather"}}
        ev.append(("contentBlockStart", {"contentBlockIndex": 1, "start": start}))
        for part in ('{"ci', 'ty": "Rome"}'):
            delta = {"toolUse": {"input": part}}
            ev.append(("contentBlockDelta", {"contentBlockIndex": 1, "delta": delta}))
        ev.append(("contentBlockStop", {"contentBlockIndex": 1}))
    ev.append(("messageStop", {"stopReason": "tool_use" if tool else "end_turn"}))
    usage = {"inputTokens": 3, "outputTokens": 2, "totalTokens": 5}
    ev.append(("metadata", {"usage": usage, "metrics": {"latencyMs": 1}}))
    return ev


def test_stream_translation_text_tools_and_usage() -> None:
    tr = StreamTranslator("claude", include_usage=True)
    out = b"".join(b"".join(tr.feed(t, p)) for t, p in _events(["Hel", "lo"], tool=True))
    out += b"".join(tr.finish())
    chunks = validate_sse(out)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == "Hello"
    calls = [
        c["choices"][0]["delta"]["tool_calls"][0]
        for c in chunks
        if c["choices"] and c["choices"][0]["delta"].get("tool_calls")
    ]
    assert calls[0]["id"] == "t9" and calls[0]["function"]["name"] == "get_weather"
    assert "".join(c["function"]["arguments"] for c in calls) == '{"city": "Rome"}'
    assert {c["id"] for c in chunks} == {chunks[0]["id"]}
    assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] == 5
    # Without include_usage: no usage chunk, still [DONE].
    tr = StreamTranslator("claude")
    out = b"".join(b"".join(tr.feed(t, p)) for t, p in _events(["x"])) + b"".join(tr.finish())
    assert all(c["choices"] for c in validate_sse(out))


def test_stream_errors() -> None:
    tr = StreamTranslator("m")
    tr.feed("messageStart", {"role": "assistant"})
    with pytest.raises(StreamError) as e:
        tr.feed("throttlingException", {"message": "slow down"}, exception=True)
    assert e.value.kind == "rate_limited"
    with pytest.raises(StreamError) as e:
        StreamTranslator("m").feed("internalServerException", {}, exception=True)
    assert e.value.kind == "upstream_5xx"
    cut = StreamTranslator("m")
    cut.feed("messageStart", {"role": "assistant"})
    with pytest.raises(StreamError) as e:
        cut.finish()
    assert e.value.kind == "stream_broken"


@pytest.mark.parametrize(
    ("status", "name", "message", "kind", "code"),
    [
        (
            403,
            "UnrecognizedClientException",
            "The security token is invalid.",
            "upstream_auth",
            None,
        ),
        (403, "AccessDeniedException", "not authorized", "upstream_auth", None),
        (429, "ThrottlingException", "Too many requests", "rate_limited", None),
        (503, "ServiceUnavailableException", "busy", "upstream_5xx", None),
        (500, "InternalServerException", "oops", "upstream_5xx", None),
        (424, "ModelErrorException", "model failed", "upstream_5xx", None),
        (
            400,
            "ValidationException",
            "Input is too long for requested model.",
            "upstream_4xx",
            "context_length_exceeded",
        ),
        (
            400,
            "ValidationException",
            "messages: field required",
            "upstream_4xx",
            "ValidationException",
        ),
        (
            400,
            "ValidationException",
            "The provided model identifier is invalid.",
            "upstream_auth",
            None,
        ),
    ],
)
def test_error_mapping(status: int, name: str, message: str, kind: str, code: str | None) -> None:
    headers = {"x-amzn-ErrorType": f"{name}:http://internal.amazon.com/coral/com.amazon.bedrock/"}
    mapped = map_error(status, headers, orjson.dumps({"message": message}))
    assert mapped.kind == kind
    err = orjson.loads(mapped.body)["error"]
    assert isinstance(err["message"], str) and err["message"]
    if code is not None:
        assert err["code"] == code
    # The exception name is also read from the body's __type when the header is absent.
    assert map_error(status, {}, orjson.dumps({"__type": name, "message": message})).kind == kind


def _adapter(monkeypatch):
    from gateway.policy.loader import parse_policy
    from gateway.providers.registry import make_adapter

    env = {"AWS_ACCESS_KEY_ID": "AKIDUNIT", "AWS_SECRET_ACCESS_KEY": "unit-secret-value"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    policy = parse_policy(
        "providers:\n  br: {type: bedrock, base_url: 'https://bedrock-runtime.us-west-2."
        "amazonaws.com', models: {'*': 'meta.llama3-8b-instruct-v1:0'}}\n"
        "pools:\n  p: {members: [br]}\nmodels:\n  m: {pool: p}\n",
        env=env,
    )
    return make_adapter(policy.providers["br"], None)


def test_adapter_signs_for_the_host_region_and_keeps_secrets(monkeypatch) -> None:
    adapter = _adapter(monkeypatch)
    req = adapter.request(
        "chat",
        {"messages": [{"role": "user", "content": "hi"}]},
        "meta.llama3-8b-instruct-v1:0",
        False,
    )
    assert req.path == "/model/meta.llama3-8b-instruct-v1%3A0/converse"
    auth = req.headers["Authorization"]
    assert (
        auth.startswith("AWS4-HMAC-SHA256 Credential=AKIDUNIT/") and "/us-west-2/bedrock/" in auth
    )
    assert "unit-secret-value" not in repr(req.headers)
    assert adapter.secrets() == ["unit-secret-value"]
    assert "authorization" not in {k.lower() for k in adapter.session_headers()}


def test_adapter_stream_translation_survives_any_chunking(monkeypatch) -> None:
    from loadtests.simulator.bedrock import event_message

    adapter = _adapter(monkeypatch)
    raw = b"".join(event_message(t, p) for t, p in _events(["one", " two", " three"], tool=True))
    body = {"messages": [], "stream_options": {"include_usage": True}}
    whole = adapter.stream("chat", body, "m")(raw)
    for size in (1, 7, 64):
        translate = adapter.stream("chat", body, "m")
        out = b"".join(translate(raw[i : i + size]) for i in range(0, len(raw), size))
        strip = [{**c, "id": "", "created": 0} for c in validate_sse(out)]
        assert strip == [{**c, "id": "", "created": 0} for c in validate_sse(whole)]


def test_adapter_refuses_junk_streams_and_answers(monkeypatch) -> None:
    from gateway.providers.upstream import UpstreamFailure
    from gateway.wire.answer_checks import InvalidAnswer
    from loadtests.simulator.bedrock import event_message, exception_message

    adapter = _adapter(monkeypatch)
    assert adapter.is_stream("application/vnd.amazon.eventstream")
    assert not adapter.is_stream("text/event-stream")
    with pytest.raises(InvalidAnswer):
        adapter.first_event_complete(b"<html><body>gateway timeout</body></html>")
    first = event_message("messageStart", {"role": "assistant"})
    assert not adapter.first_event_complete(first[:-1]) and adapter.first_event_complete(first)
    bad = bytearray(first)
    bad[-1] ^= 0xFF  # the message CRC
    with pytest.raises(InvalidAnswer):
        adapter.stream("chat", {}, "m")(bytes(bad))
    with pytest.raises(UpstreamFailure) as e:
        adapter.stream("chat", {}, "m")(exception_message("throttlingException", "slow down"))
    assert e.value.kind == "rate_limited"
    for junk in (b"not json", b"{}", b'{"output": {"message": {"content": "x"}}}'):
        with pytest.raises(InvalidAnswer):
            adapter.response("chat", junk, "m")
    with pytest.raises(UpstreamFailure) as e:
        adapter.request(
            "chat", {"messages": [{"role": "user", "content": "x"}], "n": 3}, "m", False
        )
    assert e.value.kind == "unsupported"
