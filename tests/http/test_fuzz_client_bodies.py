"""Every field of a valid request body, on every inbound API, replaced by values of the wrong
type or size (or removed), sent to a live gateway over the project's simulator: each request is
answered (a success, or a 4xx in the API's own error shape; a 5xx only as an upstream failure),
never a 500, and each gets exactly one access-log line.

The bodies use the fields of each API a client sends most: chat with content parts, tools and a
tool round trip; Messages with a system list and a tool_use/tool_result pair; Responses with
typed input items. Each is sent as it is and, where the API streams, with `stream: true`.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from loadtests.simulator.testing import Fleet
from tests.fuzz import mutations
from tests.support import AccessLines, GatewayServer, policy, poll

FLEET = ["a"]
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
BODIES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {
        "model": "chat",
        "messages": [
            {"role": "system", "content": "s"},
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            {"role": "assistant", "content": None, "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "c1", "content": "r"},
        ],
        "max_tokens": 5,
        "temperature": 0,
        "tools": TOOLS,
        "tool_choice": "auto",
        "response_format": {"type": "json_object"},
        "stop": ["x"],
        "logit_bias": {"1": 2},
        "stream_options": None,
        "metadata": {"k": "v"},
    },
    "/v1/completions": {"model": "chat", "prompt": "hi", "max_tokens": 5, "stop": "x"},
    "/v1/embeddings": {"model": "chat", "input": ["a", "b"], "encoding_format": "float"},
    "/v1/messages": {
        "model": "chat",
        "max_tokens": 5,
        "system": [{"type": "text", "text": "s"}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {"a": "b"}}],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "r"}],
            },
        ],
        "tools": [{"name": "f", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "auto"},
        "stop_sequences": ["x"],
        "metadata": {"user_id": "u"},
    },
    "/v1/messages/count_tokens": {
        "model": "chat",
        "messages": [{"role": "user", "content": "hi"}],
        "system": "s",
    },
    "/v1/responses": {
        "model": "chat",
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
        "instructions": "i",
        "max_output_tokens": 16,
        "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
        "store": False,
        "text": {"format": {"type": "text"}},
        "metadata": {"a": "b"},
    },
}
STREAMS = {"/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/responses"}


@pytest.fixture(scope="module")
def gw(fleet: Fleet) -> Iterator[GatewayServer]:
    with GatewayServer(policy(fleet)) as server:
        yield server


@pytest.fixture(scope="module")
def access() -> Iterator[AccessLines]:
    lines = AccessLines()
    logger = logging.getLogger("gateway.access")
    logger.addHandler(lines)
    try:
        yield lines
    finally:
        logger.removeHandler(lines)


def error_shape(path: str, response: httpx.Response) -> str | None:
    """Why `response` is not an error of the API's own shape (None when it is)."""
    try:
        doc = response.json()
    except ValueError:
        return "not JSON"
    if path.startswith("/v1/messages"):
        err = doc.get("error") if isinstance(doc, dict) and doc.get("type") == "error" else None
    else:
        err = doc.get("error") if isinstance(doc, dict) else None
    if not isinstance(err, dict) or not isinstance(err.get("message"), str):
        return f"not an error object: {str(doc)[:200]}"
    if not isinstance(err.get("type"), str):
        return "error without a type"
    return None


@pytest.mark.parametrize("path", sorted(BODIES))
def test_every_field_mutated_is_answered_in_the_api_shape(
    gw: GatewayServer, access: AccessLines, path: str
) -> None:
    base = BODIES[path]
    sent, problems = 0, []
    before = len(access.lines)
    with httpx.Client(base_url=gw.url, timeout=20) as client:
        for at, body in mutations(base, per_path=3, seed=len(path)):
            for stream in (False, True) if path in STREAMS else (False,):
                if stream and isinstance(body, dict):
                    body = {**body, "stream": True}
                # json, not orjson: integers past 64 bits are part of the mutations.
                r = client.post(path, content=json.dumps(body).encode())
                sent += 1
                if r.status_code >= 500 and r.status_code not in (502, 503, 504):
                    problems.append(f"{at}: {r.status_code} {r.text[:200]}")
                elif r.status_code >= 400 and (why := error_shape(path, r)) is not None:
                    problems.append(f"{at}: {r.status_code} {why}")
    assert not problems, "\n".join(problems[:20])
    # One access-log line per request, however it ended (written just after the last byte).
    poll(lambda: len(access.lines) - before >= sent)
    assert len(access.lines) - before == sent


# Every request header the gateway reads, and some it should only pass by.
HEADERS = [
    "x-gateway-cache-namespace",
    "x-gateway-priority",
    "x-gateway-cache-ttl",
    "x-gateway-timeout",
    "x-stainless-timeout",
    "x-stainless-read-timeout",
    "x-request-id",
    "cache-control",
    "pragma",
    "traceparent",
    "tracestate",
    "authorization",
    "x-api-key",
    "content-type",
    "accept",
    "accept-encoding",
    "content-encoding",
    "anthropic-version",
    "anthropic-beta",
    "idempotency-key",
]
HEADER_VALUES = [
    "",
    "0",
    "-1",
    "1e309",
    "nan",
    "999999999999999999999999",
    "x" * 8000,
    "a,b,c",
    "max-age=99999999999999999999",
    "no-cache, no-store",
    "Bearer " + "x" * 5000,
    "Basic Zm9vOmJhcg==",
    "00-zz-zz-zz",
    "gzip",
    "br",
    "application/json; charset=latin-1",
    "text/plain",
    "\xe9",
    "\x7f",
    "-0",
]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages"])
def test_every_header_with_odd_values_is_answered_in_the_api_shape(
    gw: GatewayServer, access: AccessLines, path: str
) -> None:
    body = json.dumps({**BODIES[path], "stream": path == "/v1/messages"}).encode()
    sent, problems = 0, []
    before = len(access.lines)
    rng = random.Random(path)
    with httpx.Client(base_url=gw.url, timeout=20) as client:
        for name in HEADERS:
            for value in rng.sample(HEADER_VALUES, 6):
                headers = {"content-type": "application/json", name: value.encode("latin-1")}
                r = client.post(path, content=body, headers=headers)
                sent += 1
                if r.status_code >= 500 and r.status_code not in (502, 503, 504):
                    problems.append(f"{name}={value[:20]!r}: {r.status_code} {r.text[:200]}")
                elif r.status_code >= 400 and (why := error_shape(path, r)) is not None:
                    problems.append(f"{name}={value[:20]!r}: {r.status_code} {why}")
    assert not problems, "\n".join(problems[:20])
    poll(lambda: len(access.lines) - before >= sent)
    assert len(access.lines) - before == sent
