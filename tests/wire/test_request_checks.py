"""Request field checks: OpenAI's 400s (message, code, param) before any upstream call."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.errors import GatewayError
from gateway.wire.request import parse_request

MSG = [{"role": "user", "content": "hi"}]
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}


def rejected(body: dict[str, Any], endpoint: str = "chat") -> GatewayError:
    with pytest.raises(GatewayError) as e:
        parse_request(orjson.dumps(body), endpoint)  # type: ignore[arg-type]
    assert e.value.status == 400
    return e.value


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": MSG, **fields}


@pytest.mark.parametrize(
    ("fields", "param", "code"),
    [
        ({"temperature": "hot"}, "temperature", "invalid_type"),
        ({"temperature": 2.5}, "temperature", "decimal_above_max_value"),
        ({"temperature": -1}, "temperature", "integer_below_min_value"),
        ({"top_p": 1.5}, "top_p", "decimal_above_max_value"),
        ({"top_p": True}, "top_p", "invalid_type"),
        ({"presence_penalty": 3}, "presence_penalty", "integer_above_max_value"),
        ({"frequency_penalty": -2.5}, "frequency_penalty", "decimal_below_min_value"),
        ({"n": 0}, "n", "integer_below_min_value"),
        ({"n": 1.5}, "n", "invalid_type"),
        ({"max_tokens": 0}, "max_tokens", "integer_below_min_value"),
        ({"max_completion_tokens": "9"}, "max_completion_tokens", "invalid_type"),
        ({"stream": "yes"}, "stream", "invalid_type"),
        ({"stream_options": {"include_usage": True}}, "stream_options", "invalid_value"),
        ({"stream": True, "stream_options": []}, "stream_options", "invalid_type"),
        (
            {"stream": True, "stream_options": {"include_usage": "y"}},
            "stream_options.include_usage",
            "invalid_type",
        ),
        ({"seed": "1"}, "seed", "invalid_type"),
        ({"seed": 1.5}, "seed", "invalid_type"),
        ({"stop": 5}, "stop", "invalid_type"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "array_above_max_length"),
        ({"stop": ["a", 1]}, "stop[1]", "invalid_type"),
        ({"logprobs": "yes"}, "logprobs", "invalid_type"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs", "integer_above_max_value"),
        ({"top_logprobs": 3}, "logprobs", "invalid_value"),
        ({"tools": {}}, "tools", "invalid_type"),
        ({"tools": [{"type": 5, "function": {}}]}, "tools[0].type", "invalid_type"),
        ({"tools": [{"type": "function"}]}, "tools[0].function", "missing_required_parameter"),
        (
            {"tools": [TOOL, {"type": "function", "function": {"name": "bad name"}}]},
            "tools[1].function.name",
            "invalid_value",
        ),
        (
            {"tools": [{"type": "function", "function": {"name": "x" * 65}}]},
            "tools[0].function.name",
            "string_above_max_length",
        ),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]},
            "tools[0].function.parameters",
            "invalid_type",
        ),
        ({"tools": [TOOL], "tool_choice": "sometimes"}, "tool_choice", "invalid_value"),
        ({"tools": [TOOL], "tool_choice": 3}, "tool_choice", "invalid_type"),
        ({"tool_choice": "required"}, "tool_choice", None),
        (
            {"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice",
            None,
        ),
        ({"response_format": "json"}, "response_format", "invalid_type"),
        ({"response_format": {"type": 1}}, "response_format.type", "invalid_type"),
        ({"response_format": {}}, "response_format.type", "missing_required_parameter"),
        (
            {"response_format": {"type": "json_schema"}},
            "response_format.json_schema",
            "missing_required_parameter",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}},
            "response_format.json_schema.name",
            "missing_required_parameter",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": 1}}},
            "response_format.json_schema.schema",
            "invalid_type",
        ),
    ],
)
def test_chat_fields(fields: dict[str, Any], param: str, code: str | None) -> None:
    e = rejected(chat(**fields))
    assert (e.param, e.code) == (param, code), e.message
    assert e.type == "invalid_request_error" and e.message


def test_openai_wording() -> None:
    e = rejected(chat(temperature="hot"))
    assert (
        e.message == "Invalid type for 'temperature': expected a decimal, but got a string instead."
    )
    e = rejected(chat(temperature=3))
    assert e.message == (
        "Invalid 'temperature': integer above maximum value. Expected a value <= 2, "
        "but got 3 instead."
    )
    e = rejected({"model": "m", "messages": [{"role": "bot", "content": "x"}]})
    assert e.message == (
        "Invalid value: 'bot'. Supported values are: 'system', 'assistant', 'user', 'function', "
        "'tool', and 'developer'."
    )


@pytest.mark.parametrize(
    ("messages", "param", "code"),
    [
        ([], "messages", "empty_array"),
        ([{"content": "x"}], "messages[0].role", "missing_required_parameter"),
        ([{"role": 1, "content": "x"}], "messages[0].role", "invalid_type"),
        ([*MSG, {"role": "bot", "content": "x"}], "messages[1].role", "invalid_value"),
        ([{"role": "user"}], "messages[0].content", "missing_required_parameter"),
        ([{"role": "user", "content": 5}], "messages[0].content", "invalid_type"),
        ([{"role": "user", "content": []}], "messages[0].content", "empty_array"),
        ([{"role": "user", "content": ["x"]}], "messages[0].content[0]", "invalid_type"),
        ([{"role": "user", "content": [{"text": "x"}]}], "messages[0].content[0].type", None),
        ([{"role": "user", "content": [{"type": "text"}]}], "messages[0].content[0].text", None),
        ([{"role": "tool", "content": "r"}], "messages[0].tool_call_id", None),
        (
            [{"role": "assistant", "tool_calls": [{"id": "c", "type": "function"}]}],
            "messages[0].tool_calls[0].function",
            None,
        ),
        ([{"role": "user", "content": "x", "name": 3}], "messages[0].name", "invalid_type"),
    ],
)
def test_message_shapes(messages: list[Any], param: str, code: str | None) -> None:
    e = rejected({"model": "m", "messages": messages})
    assert e.param == param, e.message
    if code is not None:
        assert e.code == code


def test_valid_bodies_pass_untouched() -> None:
    body = chat(
        temperature=0,
        top_p=1,
        n=2,
        seed=-5,
        stop="\n",
        logprobs=True,
        top_logprobs=0,
        stream=True,
        stream_options={"include_usage": True},
        tools=[TOOL, {"type": "custom", "custom": {"name": "grep"}}],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        response_format={"type": "json_schema", "json_schema": {"name": "a-b", "schema": {}}},
        messages=[
            {"role": "developer", "content": [{"type": "text", "text": "be brief"}]},
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
            {"role": "function", "name": "f", "content": None},
        ],
        vendor_extension={"anything": [1, "x"]},
        parallel_tool_calls=False,
        temperature_unit="ignored",
    )
    acc = parse_request(orjson.dumps(body), "chat")
    assert acc.body == body
    # Provider-defined tool and format types are the provider's to judge.
    for extra in (
        {"tools": [{"type": "browser_search"}]},
        {"response_format": {"type": "json", "value": {"type": "object"}}},
        {"response_format": {"type": "structural_tag", "structures": []}},
    ):
        parse_request(orjson.dumps(chat(**extra)), "chat")
    # Nulls mean "not set" for every checked field.
    nulls = {k: None for k in ("temperature", "top_p", "seed", "stop", "tools", "tool_choice")}
    parse_request(orjson.dumps(chat(**nulls, response_format=None, stream_options=None)), "chat")


def test_completions_and_embeddings() -> None:
    e = rejected({"model": "m", "prompt": "x", "temperature": "hot"}, "completions")
    assert e.param == "temperature"
    e = rejected({"model": "m", "prompt": "x", "logprobs": 6}, "completions")
    assert (e.param, e.code) == ("logprobs", "integer_above_max_value")
    e = rejected({"model": "m", "prompt": "x", "echo": "no"}, "completions")
    assert e.param == "echo"
    parse_request(
        orjson.dumps({"model": "m", "prompt": "x", "logprobs": 2, "stop": "."}), "completions"
    )
    e = rejected({"model": "m", "input": "x", "encoding_format": "hex"}, "embeddings")
    assert (e.param, e.code) == ("encoding_format", "invalid_value")
    e = rejected({"model": "m", "input": "x", "dimensions": 0}, "embeddings")
    assert (e.param, e.code) == ("dimensions", "integer_below_min_value")
    parse_request(orjson.dumps({"model": "m", "input": ["a"], "dimensions": 8}), "embeddings")
