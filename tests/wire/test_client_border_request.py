"""The client border, field by field: what a body may hold before anything reads it.

Prompt and embeddings input shapes (OpenAI's schema), both token limits, chat content part
types, client values echoed in errors, the depth of bodies parsed outside `parse_request`, the
Responses `metadata` bounds, the Messages fields a chat provider never sees, and the client
headers read as numbers.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.apis import messages, responses
from gateway.errors import GatewayError
from gateway.pipeline.stages.cache import clamp_ttl
from gateway.routing.affinity import leading_text, prefix_key
from gateway.wire.request import parse_request


def refused(body: dict[str, Any], endpoint: str = "chat") -> GatewayError:
    with pytest.raises(GatewayError) as raised:
        parse_request(orjson.dumps(body), endpoint)  # type: ignore[arg-type]
    assert raised.value.status == 400
    return raised.value


# -- B1: prompt and input -----------------------------------------------------------------------

GOOD_PROMPTS: list[Any] = ["hi", "", [], ["a", "b"], [1, 2, 3], [[1, 2], [3]], [0, 2**31 - 1]]
BAD_PROMPTS: list[tuple[Any, str]] = [
    ([None], "prompt[0]"),
    ([1.5], "prompt[0]"),
    ([{"a": 1}], "prompt[0]"),
    ([True], "prompt[0]"),
    (["a", 1], "prompt[1]"),
    ([1, "a"], "prompt[1]"),
    ([1, None], "prompt[1]"),
    ([1, True], "prompt[1]"),
    ([-1], "prompt[0]"),
    ([2**31], "prompt[0]"),
    ([2**62], "prompt[0]"),
    ([[]], "prompt[0]"),
    ([[1], []], "prompt[1]"),
    ([[1], 2], "prompt[1]"),
    ([[1, None]], "prompt[0][1]"),
    ([[1.5]], "prompt[0][0]"),
    ([[[1]]], "prompt[0][0]"),
    (5, "prompt"),
    ({"a": 1}, "prompt"),
    (True, "prompt"),
]


@pytest.mark.parametrize("prompt", GOOD_PROMPTS)
def test_every_prompt_shape_of_the_schema_is_accepted(prompt: Any) -> None:
    acc = parse_request(orjson.dumps({"model": "m", "prompt": prompt}), "completions")
    assert acc.body["prompt"] == prompt
    leading_text(acc.body, 100)  # routing reads it


@pytest.mark.parametrize(("prompt", "param"), BAD_PROMPTS)
def test_any_other_prompt_is_a_400_naming_where(prompt: Any, param: str) -> None:
    err = refused({"model": "m", "prompt": prompt}, "completions")
    assert err.param == param and "prompt" in err.message


@pytest.mark.parametrize(("inp", "param"), [*BAD_PROMPTS, ([], "prompt")])
def test_embeddings_input_is_checked_the_same_way(inp: Any, param: str) -> None:
    err = refused({"model": "m", "input": inp}, "embeddings")
    assert err.param == param.replace("prompt", "input")


@pytest.mark.parametrize(
    "prompt", [[None], [1.5], [{"a": 1}], [[None]], [[1.5]], [True, "x"], [[]], "x" * 10]
)
def test_routing_never_raises_on_a_prompt_it_was_handed_unchecked(prompt: Any) -> None:
    # gateway.routing is also called by tools that build bodies themselves (explain, replays).
    assert isinstance(leading_text({"prompt": prompt}, 64), str)
    prefix_key({"prompt": prompt})


# -- B7: both token limits -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"max_completion_tokens": 3, "max_tokens": "lots"}, "max_tokens"),
        ({"max_completion_tokens": 3, "max_tokens": 0}, "max_tokens"),
        ({"max_completion_tokens": 3, "max_tokens": True}, "max_tokens"),
        ({"max_completion_tokens": "x", "max_tokens": 3}, "max_completion_tokens"),
        ({"max_completion_tokens": -1, "max_tokens": 3}, "max_completion_tokens"),
    ],
)
def test_both_token_limits_are_checked_when_both_are_sent(
    fields: dict[str, Any], param: str
) -> None:
    err = refused({"model": "m", "messages": [{"role": "user", "content": "x"}], **fields})
    assert err.param == param


def test_max_completion_tokens_wins_over_max_tokens() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    acc = parse_request(orjson.dumps({**body, "max_completion_tokens": 3, "max_tokens": 9}), "chat")
    assert acc.max_tokens == 3
    assert parse_request(orjson.dumps({**body, "max_tokens": 9}), "chat").max_tokens == 9


# -- content part types, echoed values ----------------------------------------------------------


@pytest.mark.parametrize("kind", ["foo", "tool_use", "image", "input_text"])
def test_an_unknown_content_part_type_is_a_400_naming_its_path(kind: str) -> None:
    content = [{"type": "text", "text": "a"}, {"type": kind, "text": "b"}]
    err = refused({"model": "m", "messages": [{"role": "user", "content": content}]})
    assert err.param == "messages[0].content[1].type" and err.code == "invalid_value"


@pytest.mark.parametrize(
    "part",
    [
        {"type": "image_url", "image_url": {"url": "https://x/y.png"}},
        {"type": "input_audio", "input_audio": {"data": "AA==", "format": "wav"}},
        {"type": "file", "file": {"file_id": "f"}},
        {"type": "video_url", "video_url": {"url": "https://x/y.mp4"}},
    ],
)
def test_known_content_part_types_pass(part: dict[str, Any]) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": [part]}]}
    parse_request(orjson.dumps(body), "chat")


def test_a_huge_client_value_is_not_echoed_whole() -> None:
    err = refused({"model": "m", "messages": [{"role": "x" * 100_000, "content": "a"}]})
    assert len(err.message) < 600 and err.param == "messages[0].role"


# -- B5: depth and metadata of the other APIs' bodies --------------------------------------------


def _deep(levels: int) -> bytes:
    return b"[" * levels + b"]" * levels


@pytest.mark.parametrize("parse", [messages.parse, responses.parse])
def test_the_other_apis_bound_the_depth_of_what_the_client_sent(parse: Any) -> None:
    ok = b'{"model": "m", "metadata": {"a": %s}}' % _deep(60)
    assert parse(ok)["model"] == "m"
    for levels in (64, 200, 5000):
        with pytest.raises(GatewayError) as raised:
            parse(b'{"model": "m", "metadata": {"a": %s}}' % _deep(levels))
        assert raised.value.status == 400 and "nested" in raised.value.message
    with pytest.raises(GatewayError):
        parse(b'{"x": %s}' % _deep(20), 16)  # the policy's limit, when given


@pytest.mark.parametrize(
    ("metadata", "param"),
    [
        ("x", "metadata"),
        ([1], "metadata"),
        ({f"k{i}": "v" for i in range(17)}, "metadata"),
        ({"k" * 65: "v"}, "metadata"),
        ({"k": 1}, "metadata.k"),
        ({"k": None}, "metadata.k"),
        ({"k": {"a": "b"}}, "metadata.k"),
        ({"k": "v" * 513}, "metadata.k"),
    ],
)
def test_responses_metadata_is_bounded_like_openai_does(metadata: Any, param: str) -> None:
    req = {"model": "m", "input": "hi", "metadata": metadata}
    with pytest.raises(GatewayError) as raised:
        responses.to_chat(req, [], responses.turn_messages(req))
    assert (raised.value.status, raised.value.param) == (400, param)


def test_responses_metadata_at_its_bounds_passes() -> None:
    meta = {f"{i:02d}" + "k" * 62: "v" * 512 for i in range(16)}
    req = {"model": "m", "input": "hi", "metadata": meta}
    responses.to_chat(req, [], responses.turn_messages(req))


# -- Messages fields -----------------------------------------------------------------------------


def _msg(**fields: Any) -> dict[str, Any]:
    return {
        "model": "m",
        "max_tokens": 5,
        "messages": [{"role": "user", "content": "hi"}],
        **fields,
    }


@pytest.mark.parametrize(
    ("req", "param", "words"),
    [
        (
            _msg(messages=[{"role": "user", "content": [{"type": "text", "text": 5}]}]),
            "messages.0.content.0.text",
            "valid string",
        ),
        (
            _msg(
                messages=[
                    {"role": "user", "content": "q"},
                    {"role": "assistant", "content": [{"type": "text", "text": None}]},
                ]
            ),
            "messages.1.content.0.text",
            "valid string",
        ),
        (
            _msg(
                messages=[
                    {"role": "user", "content": "q"},
                    {
                        "role": "assistant",
                        "content": [{"type": "tool_use", "id": "t", "name": "f", "input": "{}"}],
                    },
                ]
            ),
            "messages.1.content.0.input",
            "object",
        ),
        (_msg(top_k="x"), "top_k", "integer"),
        (_msg(top_k=-1), "top_k", "integer"),
        (_msg(top_k=True), "top_k", "integer"),
        (_msg(metadata="x"), "metadata", "object"),
        (_msg(metadata={"user_id": 5}), "metadata.user_id", "string"),
        (_msg(metadata={"user_id": "u" * 257}), "metadata.user_id", "string"),
        (_msg(thinking="on"), "thinking", "object"),
        (_msg(output_config="json"), "output_config", "object"),
        (
            _msg(messages=[{"role": "user", "content": [{"type": "x" * 100_000}]}]),
            "messages.0.content.0",
            "not supported",
        ),
    ],
)
def test_messages_fields_are_checked(req: dict[str, Any], param: str, words: str) -> None:
    with pytest.raises(GatewayError) as raised:
        messages.to_chat(req)
    err = raised.value
    assert (err.status, err.param) == (400, param)
    assert words in err.message
    assert len(err.message) < 600


def test_a_text_block_with_a_number_is_not_called_unsupported() -> None:
    req = _msg(messages=[{"role": "user", "content": [{"type": "text", "text": 5}]}])
    with pytest.raises(GatewayError) as raised:
        messages.to_chat(req)
    assert "not supported" not in raised.value.message


def test_valid_messages_fields_still_pass() -> None:
    body = messages.to_chat(
        _msg(
            top_k=5,
            metadata={"user_id": "u-1"},
            thinking={"type": "disabled"},
            messages=[
                {"role": "user", "content": "q"},
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {"a": 1}}],
                },
            ],
        )
    )
    assert body["user"] == "u-1"
    assert body["messages"][1]["tool_calls"][0]["function"]["arguments"] == '{"a":1}'


@pytest.mark.parametrize("status", [405, 408, 499])
def test_messages_errors_keep_the_status_that_is_recorded(status: int) -> None:
    code, body = messages.anthropic_error(status, "m")
    assert code == status and orjson.loads(body)["type"] == "error"


# -- B2: client headers read as numbers ----------------------------------------------------------


@pytest.mark.parametrize(
    "header", ["\u00b2", "1\u00b9", "\u0663", "\uff11", "-5", "1e3", " 5", "5 ", "", "9" * 13]
)
def test_a_ttl_header_that_is_not_plain_ascii_digits_is_ignored(header: str) -> None:
    assert clamp_ttl(header, 600) == 600


@pytest.mark.parametrize(("header", "ttl"), [("5", 5), ("0", 0), ("000", 0), ("999999999999", 600)])
def test_a_ttl_header_may_only_shorten_the_ttl(header: str, ttl: int) -> None:
    assert clamp_ttl(header, 600) == ttl
