"""The Messages and Responses APIs over an OpenAI-wire member whose answer has every field
replaced by values of the wrong type or size (or removed), unary and streamed: the client gets
a valid Anthropic `Message` (its stream events valid `RawMessageStreamEvent`s) or a valid
OpenAI `Response` (its events valid `ResponseStreamEvent`s), or an error in the API's own shape
with a 5xx that says the upstream failed (502), never a 500: the translation never breaks on
what the upstream sent.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from anthropic.types import Message, RawMessageStreamEvent
from pydantic import TypeAdapter

from tests.apis.test_inbound_responses import _event_validators
from tests.apis.test_inbound_responses import validate as validate_responses
from tests.fuzz import OPENAI, OPENAI_STREAM, Scripted, mutations, sse
from tests.support import GatewayServer

EVENTS: TypeAdapter[Any] = TypeAdapter(RawMessageStreamEvent)
REQUESTS: dict[str, dict[str, Any]] = {
    "/messages": {
        "model": "chat",
        "max_tokens": 5,
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"name": "f", "input_schema": {"type": "object"}}],
    },
    "/responses": {
        "model": "chat",
        "input": "hi",
        "store": False,
        "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
    },
}


@pytest.fixture(scope="module")
def gw() -> Iterator[tuple[Scripted, GatewayServer]]:
    with Scripted() as upstream:
        policy = f"""
providers:
  up: {{base_url: 'http://127.0.0.1:{upstream.port}/v1',
        breaker: {{min_requests: 1000000, consecutive_failures: 0, failure_ratio: 1.0}}}}
pools:
  main: {{members: [up]}}
models:
  chat: {{pool: main, cache: {{exact: {{enabled: false}}}}}}
retry: {{max_attempts: 1}}
"""
        with GatewayServer(policy) as server:
            yield upstream, server


def _data(body: str) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in body.split("\n") if line.startswith("data: ")]


def _check(path: str, stream: bool, r: httpx.Response) -> None:
    if r.status_code != 200:
        assert r.status_code == 502, r.text[:300]
        doc = r.json()
        shaped = doc.get("type") == "error" if path == "/messages" else "error" in doc
        assert shaped and isinstance(doc["error"]["message"], str), doc
        return
    if path == "/messages":
        if not stream:
            Message.model_validate(r.json())
        for event in _data(r.text) if stream else []:
            if event.get("type") != "error":
                EVENTS.validate_python(event)
    elif not stream:
        validate_responses("Response", r.json())
    else:
        for event in _data(r.text):  # by its type's schema (the whole union is slow)
            _event_validators()[event["type"]].validate(event)


@pytest.mark.parametrize("path", sorted(REQUESTS))
def test_every_answer_field_mutated_is_translated_or_refused_as_a_502(
    gw: tuple[Scripted, GatewayServer], path: str
) -> None:
    upstream, server = gw
    cases: list[tuple[bool, Any, Any]] = [
        (False, at, doc) for at, doc in mutations(OPENAI, per_path=3, seed=2)
    ]
    for i, event in enumerate(OPENAI_STREAM):
        for at, doc in mutations(event, per_path=1, seed=i):
            events = [*OPENAI_STREAM[:i], doc, *OPENAI_STREAM[i + 1 :]]
            cases.append((True, (i, *at), sse("openai", events)))
    problems: list[str] = []
    with httpx.Client(base_url=server.base_url, timeout=20) as client:
        for stream, at, answer in cases:
            upstream.answer = answer
            r = client.post(path, json={**REQUESTS[path], "stream": stream})
            try:
                _check(path, stream, r)
            except Exception as e:  # noqa: BLE001 - every case's failure is listed
                problems.append(f"{'stream' if stream else 'unary'} {at}: {str(e)[:300]}")
    assert not problems, "\n".join(problems[:20])
