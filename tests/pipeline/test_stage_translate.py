"""Translate (Anthropic Messages in front of chat): whatever the stages below answered goes
back in the client's API: a completion, a refusal, a bug, a stream."""

from __future__ import annotations

import orjson
import pytest
from starlette.responses import Response

from gateway.apis.messages import MessagesAPI
from gateway.context import Context
from gateway.errors import GatewayError
from gateway.pipeline.call import Call
from gateway.pipeline.stage import compose
from gateway.pipeline.stages.accept import Accept
from gateway.pipeline.stages.translate import Translate
from tests.pipeline.conftest import (
    COMPLETION,
    FakeNext,
    authenticated,
    drain,
    http_request,
    json_response,
    snapshot,
    stream_reply,
)

MESSAGES = {"model": "chat", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}
CHUNK = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "chat"}


def call(body: dict = MESSAGES) -> Call:
    ctx = Context("req-1", 0.0, endpoint="messages")
    return authenticated(
        Call(ctx, snapshot(), "chat", http_request(orjson.dumps(body)), MessagesAPI().begin())
    )


async def through(fake: FakeNext, body: dict = MESSAGES) -> tuple[Response, dict]:
    response = await compose([Translate(), Accept()], fake)(call(body))
    return response, orjson.loads(bytes(response.body)) if response.body else {}


async def test_a_completion_becomes_a_message() -> None:
    answer = json_response(COMPLETION)
    answer.headers["x-gateway-pool"] = "main"
    fake = FakeNext(answer)
    response, doc = await through(fake)
    assert fake.calls[0].acc.body["messages"] == [{"role": "user", "content": "hi"}]
    assert response.status_code == 200
    assert (doc["type"], doc["role"], doc["stop_reason"]) == ("message", "assistant", "end_turn")
    assert doc["content"] == [{"type": "text", "text": "hey"}]
    assert response.headers["x-gateway-pool"] == "main"  # the gateway's headers are kept


@pytest.mark.parametrize(
    ("error", "status", "kind"),
    [
        (GatewayError(429, "slow down", type="rate_limit_error"), 429, "rate_limit_error"),
        (GatewayError(503, "nobody"), 529, "overloaded_error"),
        (RuntimeError("bug"), 500, "api_error"),
    ],
)
async def test_a_refusal_or_bug_in_the_api_error_shape(error, status, kind) -> None:
    response, doc = await through(FakeNext(error=error))
    assert response.status_code == status
    assert doc["type"] == "error" and doc["error"]["type"] == kind
    assert response.headers["x-request-id"] == "req-1"


async def test_a_refusal_of_accept_is_translated_too() -> None:
    fake = FakeNext()
    response, doc = await through(fake, {**MESSAGES, "model": "nope"})
    assert (response.status_code, doc["error"]["type"]) == (404, "not_found_error")
    assert fake.calls == []


async def test_a_stream_keeps_its_hooks_and_is_translated() -> None:
    events = [
        {**CHUNK, "choices": [{"index": 0, "delta": {"role": "assistant", "content": "yo"}}]},
        {**CHUNK, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
    ]
    sse = [b"data: " + orjson.dumps(e) + b"\n\n" for e in events] + [b"data: [DONE]\n\n"]
    log: list[str] = []
    reply = stream_reply(sse, log)
    reply.on_finish(lambda: log.append("hook"))
    response = await compose([Translate(), Accept()], FakeNext(reply))(
        call({**MESSAGES, "stream": True})
    )
    assert response is reply
    body = await drain(reply)
    assert log == ["closed", "hook"]
    assert b"event: message_start" in body and b"event: message_stop" in body
    assert b'"text":"yo"' in body
