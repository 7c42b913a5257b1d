"""The Bedrock-shaped simulator checks what it receives as Bedrock does (SigV4 with botocore,
botocore's service model) and answers in Bedrock's wire format (JSON, binary event stream)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import jsonschema
import orjson
import pytest
from botocore.eventstream import ChecksumMismatch, EventStreamBuffer

from gateway.providers.bedrock_wire import Signer, operation_path
from loadtests.simulator.bedrock import (
    ApiError,
    BedrockCredentials,
    run_bedrock,
    verify_signature,
)

CREDS = BedrockCredentials("AKIDSIMTEST", "sim-secret-key", "sim-session-token", "eu-west-1")
MODEL = "anthropic.claude-3-haiku-20240307-v1:0"
HELLO = {"messages": [{"role": "user", "content": [{"text": "Hello there"}]}]}


@pytest.fixture(scope="module")
def sim() -> Iterator:
    with run_bedrock(CREDS, models=(MODEL,), context_window=200) as s:
        yield s


def post(
    sim,
    body: dict | bytes,
    *,
    stream: bool = False,
    signer: Signer | None = None,
    model: str = MODEL,
) -> httpx.Response:
    url = sim.url + operation_path(model, stream)
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    signer = signer or Signer(
        CREDS.access_key_id, CREDS.secret_access_key, CREDS.session_token, CREDS.region
    )
    return httpx.post(url, content=data, headers=signer.headers(url, data), timeout=10)


def error_name(r: httpx.Response) -> str:
    return r.headers["x-amzn-errortype"].split(":")[0]


def decode(raw: bytes) -> list[tuple[str, dict]]:
    buf = EventStreamBuffer()
    buf.add_data(raw)
    out = []
    for m in buf:
        kind = m.headers.get(":event-type") or m.headers.get(":exception-type")
        out.append((kind, orjson.loads(m.payload)))
    return out


def test_signed_request_answers(sim) -> None:
    r = post(sim, HELLO)
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["output"]["message"]["content"][0]["text"]
    assert doc["stopReason"] == "end_turn"
    assert doc["usage"]["totalTokens"] == doc["usage"]["inputTokens"] + doc["usage"]["outputTokens"]
    # The model id's ':' travelled percent-encoded, and the signature covered it.
    assert "%3A" in operation_path(MODEL, False)


@pytest.mark.parametrize(
    ("signer", "name"),
    [
        (
            Signer(CREDS.access_key_id, "wrong-secret", CREDS.session_token, CREDS.region),
            "InvalidSignatureException",
        ),
        (
            Signer(CREDS.access_key_id, CREDS.secret_access_key, CREDS.session_token, "us-east-1"),
            "InvalidSignatureException",
        ),
        (
            Signer("AKIDUNKNOWN", CREDS.secret_access_key, CREDS.session_token, CREDS.region),
            "UnrecognizedClientException",
        ),
        (
            Signer(CREDS.access_key_id, CREDS.secret_access_key, None, CREDS.region),
            "UnrecognizedClientException",
        ),
    ],
)
def test_bad_signatures_are_refused(sim, signer: Signer, name: str) -> None:
    r = post(sim, HELLO, signer=signer)
    assert r.status_code == 403 and error_name(r) == name


def test_tampered_body_and_stale_date_are_refused(sim) -> None:
    url = sim.url + operation_path(MODEL, False)
    signer = Signer(CREDS.access_key_id, CREDS.secret_access_key, CREDS.session_token, CREDS.region)
    data = orjson.dumps(HELLO)
    headers = signer.headers(url, data)
    r = httpx.post(url, content=data.replace(b"Hello", b"Jello"), headers=headers)
    assert r.status_code == 403 and error_name(r) == "InvalidSignatureException"
    r = httpx.post(url, headers={"content-type": "application/json"}, content=data)
    assert r.status_code == 403
    # A signature from ten minutes ago is expired even though it is otherwise right.
    host = url.split("/")[2]
    lower = {**{k.lower(): v for k, v in headers.items()}, "host": host}
    verify_signature(CREDS, "POST", host, operation_path(MODEL, False), lower, data)
    with pytest.raises(ApiError, match="expired"):
        verify_signature(
            CREDS, "POST", host, operation_path(MODEL, False), lower, data, now=time.time() + 600
        )


def test_wrong_fields_and_conversation_rules_are_validation_errors(sim) -> None:
    for body in (
        {"messages": [{"role": "user", "content": [{"text": "x"}]}], "max_tokens": 5},
        {"messages": [{"role": "user", "content": "x"}]},
        {"messages": [{"role": "assistant", "content": [{"text": "x"}]}]},
        {
            "messages": [
                {"role": "user", "content": [{"text": "a"}]},
                {"role": "user", "content": [{"text": "b"}]},
            ]
        },
        {
            "messages": [
                {"role": "user", "content": [{"text": "a"}]},
                {
                    "role": "assistant",
                    "content": [{"toolUse": {"toolUseId": "t", "name": "f", "input": {}}}],
                },
                {
                    "role": "user",
                    "content": [{"toolResult": {"toolUseId": "t", "content": [{"text": "r"}]}}],
                },
            ]
        },  # tool blocks without toolConfig
    ):
        r = post(sim, body)
        assert r.status_code == 400 and error_name(r) == "ValidationException", body
    r = post(sim, HELLO, model="no.such-model-v1:0")
    assert r.status_code == 400 and "model identifier is invalid" in r.json()["message"]
    r = post(sim, {"messages": [{"role": "user", "content": [{"text": "long " * 400}]}]})
    assert r.status_code == 400 and "too long" in r.json()["message"]


def test_stream_is_a_valid_aws_event_stream(sim) -> None:
    r = post(sim, HELLO, stream=True)
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/vnd.amazon.eventstream"
    events = decode(r.content)
    kinds = [k for k, _ in events]
    assert kinds[0] == "messageStart" and kinds[-2:] == ["messageStop", "metadata"]
    text = "".join(p["delta"]["text"] for k, p in events if k == "contentBlockDelta")
    assert text == post(sim, HELLO).json()["output"]["message"]["content"][0]["text"]
    # The CRCs are real: one flipped payload byte fails botocore's check.
    raw = bytearray(r.content)
    raw[40] ^= 0x01
    with pytest.raises(ChecksumMismatch):
        decode(bytes(raw))


def test_forced_tool_and_json_schema_answers_fit_their_schemas(sim) -> None:
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city", "days"],
    }
    tools = {
        "tools": [{"toolSpec": {"name": "forecast", "inputSchema": {"json": schema}}}],
        "toolChoice": {"any": {}},
    }
    doc = post(sim, {**HELLO, "toolConfig": tools}).json()
    assert doc["stopReason"] == "tool_use"
    use = doc["output"]["message"]["content"][0]["toolUse"]
    jsonschema.validate(use["input"], schema)
    events = decode(post(sim, {**HELLO, "toolConfig": tools}, stream=True).content)
    raw = "".join(p["delta"]["toolUse"]["input"] for k, p in events if k == "contentBlockDelta")
    assert orjson.loads(raw) == use["input"]
    fmt = {
        "textFormat": {
            "type": "json_schema",
            "structure": {"jsonSchema": {"schema": orjson.dumps(schema).decode(), "name": "f"}},
        }
    }
    doc = post(sim, {**HELLO, "outputConfig": fmt}).json()
    jsonschema.validate(orjson.loads(doc["output"]["message"]["content"][0]["text"]), schema)


def test_cache_point_prefix_is_read_from_cache_the_second_time(sim) -> None:
    body = {
        **HELLO,
        "system": [
            {"text": "You are a careful assistant. " * 4},
            {"cachePoint": {"type": "default"}},
        ],
    }
    first = post(sim, body).json()["usage"]
    second = post(sim, body).json()["usage"]
    assert "cacheReadInputTokens" not in first
    assert second["cacheReadInputTokens"] > 0
    assert second["inputTokens"] + second["cacheReadInputTokens"] == first["inputTokens"]


def test_faults_and_stream_exceptions(sim) -> None:
    sim.set_fault(429, "ThrottlingException", "Too many requests")
    try:
        r = post(sim, HELLO)
        assert r.status_code == 429 and error_name(r) == "ThrottlingException"
    finally:
        sim.clear_faults()
    sim.sim.stream_exception = (2, "throttlingException")
    try:
        events = decode(post(sim, HELLO, stream=True).content)
        assert events[-1][0] == "throttlingException" and len(events) == 3
    finally:
        sim.clear_faults()
