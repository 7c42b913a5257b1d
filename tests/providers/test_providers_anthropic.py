"""The anthropic adapter's mapping, unit by unit (the end-to-end tests are test_providers_e2e)."""

from __future__ import annotations

import orjson
import pytest

from gateway.policy.schema import Provider
from gateway.providers.anthropic import AnthropicAdapter, BadRequest
from gateway.providers.base import UnsupportedEndpoint
from gateway.providers.settings import AnthropicSettings
from gateway.providers.upstream import UpstreamFailure
from gateway.wire.answer_checks import InvalidAnswer
from gateway.wire.sse import event_data

CFG = Provider(
    type="anthropic", base_url="https://api.anthropic.com", anthropic=AnthropicSettings()
)


def adapter(**settings: object) -> AnthropicAdapter:
    cfg = CFG.model_copy(update={"anthropic": AnthropicSettings(**settings)})  # type: ignore[arg-type]
    return AnthropicAdapter(cfg, "sk-ant-test")


def params(body: dict, **settings: object) -> dict:
    req = adapter(**settings).request("chat", {"model": "m", **body}, "claude-x", False)
    assert req.path == "/v1/messages"
    return orjson.loads(req.body)


def test_headers() -> None:
    h = adapter(beta=["a-1", "b-2"]).session_headers()
    assert h["x-api-key"] == "sk-ant-test" and h["anthropic-version"] == "2023-06-01"
    assert h["anthropic-beta"] == "a-1,b-2" and "authorization" not in h


def test_system_and_consecutive_turns_are_merged() -> None:
    p = params(
        {
            "messages": [
                {"role": "system", "content": "a"},
                {"role": "developer", "content": [{"type": "text", "text": "b"}]},
                {"role": "user", "content": "u1"},
                {"role": "user", "content": "u2"},
            ],
            "max_completion_tokens": 9,
            "temperature": 0.3,
            "seed": 1,
        }
    )
    assert p["system"] == [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    assert p["messages"] == [
        {
            "role": "user",
            "content": [{"type": "text", "text": "u1"}, {"type": "text", "text": "u2"}],
        }
    ]
    assert p["max_tokens"] == 9 and "temperature" not in p and "seed" not in p


def test_cache_prefix_marks_tools_system_and_first_turn_unless_the_client_did() -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    body = {
        "messages": [
            {"role": "system", "content": "s"},
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "a"},
            {"role": "user", "content": "q2"},
        ],
        "tools": [tool],
    }
    p = params(body, cache_prefix=True)
    eph = {"type": "ephemeral"}
    assert p["tools"][-1]["cache_control"] == eph and p["system"][-1]["cache_control"] == eph
    assert p["messages"][0]["content"][-1]["cache_control"] == eph
    assert "cache_control" not in p["messages"][2]["content"][-1]
    assert "cache_control" not in orjson.dumps(params(body)).decode()
    own = {
        **body,
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "x", "cache_control": eph}]}
        ],
    }
    p = params(own, cache_prefix=True)
    assert "cache_control" not in p["tools"][-1]  # the client places its own breakpoints


def test_tool_choices() -> None:
    tool = {"type": "function", "function": {"name": "f"}}

    def choice(c: object, parallel: object = None) -> object:
        body = {"messages": [{"role": "user", "content": "x"}], "tools": [tool], "tool_choice": c}
        if parallel is not None:
            body["parallel_tool_calls"] = parallel
        return params(body).get("tool_choice")

    assert choice("auto") == {"type": "auto"} and choice(None) is None
    assert choice("none") == {"type": "none"} and choice("required") == {"type": "any"}
    assert choice({"type": "function", "function": {"name": "f"}}) == {"type": "tool", "name": "f"}
    assert choice(None, False) == {"type": "auto", "disable_parallel_tool_use": True}


def test_what_cannot_be_expressed() -> None:
    with pytest.raises(UnsupportedEndpoint):
        params({"messages": [{"role": "user", "content": "x"}], "n": 2})
    with pytest.raises(UnsupportedEndpoint):
        params(
            {
                "messages": [
                    {"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}
                ]
            }
        )
    with pytest.raises(UnsupportedEndpoint):
        adapter().request("embeddings", {"model": "m", "input": "x"}, "m", False)
    with pytest.raises(BadRequest) as e:
        params(
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "image_url", "image_url": {"url": "data:image/bmp;base64,AA"}}
                        ],
                    }
                ]
            }
        )
    assert (
        e.value.kind == "upstream_4xx" and b"messages[0].content[0].image_url.url" in e.value.body
    )


def test_response_maps_text_tools_stop_reason_and_cached_usage() -> None:
    msg = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-x",
        "content": [
            {"type": "thinking", "thinking": "hm", "signature": "s"},
            {"type": "text", "text": "Let me check."},
            {"type": "tool_use", "id": "tu_1", "name": "f", "input": {"a": 1}},
        ],
        "stop_reason": "tool_use",
        "stop_sequence": None,
        "usage": {
            "input_tokens": 10,
            "cache_read_input_tokens": 100,
            "cache_creation_input_tokens": 5,
            "output_tokens": 7,
        },
    }
    out = orjson.loads(adapter().response("chat", orjson.dumps(msg), "claude-x"))
    c = out["choices"][0]
    assert c["finish_reason"] == "tool_calls" and c["message"]["content"] == "Let me check."
    assert c["message"]["tool_calls"][0]["function"] == {"name": "f", "arguments": '{"a":1}'}
    assert out["usage"] == {
        "prompt_tokens": 115,
        "completion_tokens": 7,
        "total_tokens": 122,
        "prompt_tokens_details": {"cached_tokens": 100},
    }
    for bad in (b"<html>", b'{"type":"error"}', b'{"type":"message","content":"x"}'):
        with pytest.raises(InvalidAnswer):
            adapter().response("chat", bad, "m")


def _sse(*events: dict) -> bytes:
    return b"".join(
        b"event: " + e["type"].encode() + b"\ndata: " + orjson.dumps(e) + b"\n\n" for e in events
    )


STREAM = _sse(
    {
        "type": "message_start",
        "message": {
            "id": "msg_s",
            "model": "claude-x",
            "usage": {"input_tokens": 3, "cache_read_input_tokens": 4, "output_tokens": 1},
        },
    },
    {"type": "ping"},
    {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hé"}},
    {"type": "content_block_stop", "index": 0},
    {
        "type": "content_block_start",
        "index": 1,
        "content_block": {"type": "tool_use", "id": "tu", "name": "f", "input": {}},
    },
    {
        "type": "content_block_delta",
        "index": 1,
        "delta": {"type": "input_json_delta", "partial_json": '{"a":'},
    },
    {
        "type": "content_block_delta",
        "index": 1,
        "delta": {"type": "input_json_delta", "partial_json": "1}"},
    },
    {"type": "content_block_stop", "index": 1},
    {"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 9}},
    {"type": "message_stop"},
)


@pytest.mark.parametrize("piece", [1, 7, len(STREAM)])
def test_stream_translation_whatever_the_chunking(piece: int) -> None:
    tr = adapter().stream("chat", {"stream_options": {"include_usage": True}}, "claude-x")
    out = b"".join(tr(STREAM[i : i + piece]) for i in range(0, len(STREAM), piece))
    events = [event_data(e + b"\n\n") for e in out.split(b"\n\n") if e]
    assert events[-1] == b"[DONE]"
    chunks = [orjson.loads(e) for e in events[:-1]]
    assert {c["id"] for c in chunks} == {"msg_s"}
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == "Hé"
    calls = [
        tc for c in chunks if c["choices"] for tc in c["choices"][0]["delta"].get("tool_calls", [])
    ]
    assert (
        calls[0]["id"] == "tu" and "".join(t["function"]["arguments"] for t in calls) == '{"a":1}'
    )
    assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["prompt_tokens_details"] == {
        "cached_tokens": 4
    }
    assert (
        chunks[-1]["usage"]["completion_tokens"] == 9 and chunks[-1]["usage"]["prompt_tokens"] == 7
    )


def test_stream_error_events_and_bad_events() -> None:
    tr = adapter().stream("chat", {}, "m")
    with pytest.raises(UpstreamFailure) as e:
        tr(_sse({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}))
    assert e.value.kind == "upstream_5xx"
    with pytest.raises(InvalidAnswer):
        adapter().stream("chat", {}, "m")(b"data: {cut\n\n")
    with pytest.raises(InvalidAnswer):
        adapter().stream("chat", {}, "m")(_sse({"type": "content_block_stop", "index": 0}))


def err(kind: str, message: str) -> bytes:
    return orjson.dumps({"type": "error", "error": {"type": kind, "message": message}})


def test_errors_map_to_failure_kinds() -> None:
    a = adapter()
    assert (
        a.failure(401, err("authentication_error", "invalid x-api-key"), {}, False).kind
        == "upstream_auth"
    )
    f = a.failure(429, err("rate_limit_error", "slow down"), {"retry-after": "12"}, False)
    assert f.kind == "rate_limited" and f.retry_after == 12
    f = a.failure(529, err("overloaded_error", "Overloaded"), {"retry-after": "3"}, False)
    assert f.kind == "upstream_5xx" and f.retry_after == 3
    f = a.failure(
        400,
        err("invalid_request_error", "prompt is too long: 210000 tokens > 200000 maximum"),
        {},
        False,
    )
    assert f.kind == "upstream_4xx"
    assert orjson.loads(f.body)["error"]["code"] == "context_length_exceeded"
    f = a.failure(404, err("not_found_error", "model: claude-nope"), {}, False)
    assert f.kind == "upstream_auth"


def test_a_final_assistant_turn_is_a_prefill_without_trailing_whitespace() -> None:
    p = params(
        {
            "messages": [
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": "The answer is "},
            ]
        }
    )
    assert p["messages"][-1] == {
        "role": "assistant",
        "content": [{"type": "text", "text": "The answer is"}],
    }
    p = params(
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "  "}]}
    )
    assert [m["role"] for m in p["messages"]] == ["user"]


def test_bad_stop_is_a_client_error_and_a_huge_stream_is_cut() -> None:
    with pytest.raises(BadRequest):
        params({"messages": [{"role": "user", "content": "q"}], "stop": [1]})
    cfg = CFG.model_copy(
        update={"limits": CFG.limits.model_copy(update={"max_stream_bytes": 1024})}
    )
    tr = AnthropicAdapter(cfg, "k").stream("chat", {}, "m")
    ping = _sse({"type": "ping"})
    with pytest.raises(InvalidAnswer):
        for _ in range(1024 // len(ping) + 2):
            tr(ping)


def test_a_stream_opening_with_an_error_event_fails_with_its_kind() -> None:
    a = adapter()
    assert a.first_event_complete(STREAM) is True
    limited = _sse({"type": "error", "error": {"type": "rate_limit_error", "message": "slow"}})
    with pytest.raises(UpstreamFailure) as e:
        a.first_event_complete(limited)
    assert e.value.kind == "rate_limited"
    with pytest.raises(InvalidAnswer):  # an error of no known type stays a bad answer
        a.first_event_complete(_sse({"type": "error", "error": {"type": "odd_error"}}))


def test_a_streamed_tool_without_input_has_empty_object_arguments() -> None:
    """Anthropic streams no JSON for a tool that takes no input: the chat call's arguments are
    "{}" as in the unary answer, never "" (which json.loads refuses)."""
    stream = _sse(
        {"type": "message_start", "message": {"id": "m", "model": "c", "usage": {}}},
        {
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "tool_use", "id": "tu", "name": "now", "input": {}},
        },
        {"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": ""}},
        {"type": "content_block_stop", "index": 0},
        {"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 2}},
        {"type": "message_stop"},
    )  # fmt: skip
    out = adapter().stream("chat", {}, "claude-x")(stream)
    chunks = [orjson.loads(e[6:]) for e in out.split(b"\n\n") if e and e != b"data: [DONE]"]
    calls = [
        tc for c in chunks if c["choices"] for tc in c["choices"][0]["delta"].get("tool_calls", [])
    ]
    assert "".join(t["function"]["arguments"] for t in calls) == "{}"
