"""Builders for the stage tests: real policies, runtimes and calls; only `next` is a fake."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from gateway.context import Context
from gateway.governance.service import Principal
from gateway.pipeline.call import Call
from gateway.pipeline.reply import StreamReply
from gateway.policy.loader import parse_policy
from gateway.routing.decision import decide
from gateway.runtime import Runtime, Snapshot
from gateway.wire.request import parse_request
from tests.support import policy

UPSTREAM = {"p1": "http://127.0.0.1:9/v1", "p2": "http://127.0.0.1:9/v2"}
COMPLETION = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1,
    "model": "chat",
    "choices": [
        {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "hey"}}
    ],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
}


def runtime(**sections: Any) -> Runtime:
    """A real runtime of `tests.support.policy(UPSTREAM, **sections)`: providers p1 and p2 in
    pool `main`, the alias `chat`."""
    return Runtime(parse_policy(policy(UPSTREAM, **sections)))


def snapshot(**sections: Any) -> Snapshot:
    return runtime(**sections).snapshot


def chat_body(text: str = "hi", **fields: Any) -> dict[str, Any]:
    return {"model": "chat", "messages": [{"role": "user", "content": text}], **fields}


def make_call(
    snap: Snapshot,
    body: dict[str, Any] | None = None,
    request: Request | None = None,
    tenant: str = "default",
    classify: bool = True,
) -> Call:
    """A call as Accept (and Classify, unless `classify=False`) would hand it down."""
    ctx = Context("req-1", 0.0, tenant=tenant, endpoint="chat")
    call = Call(ctx, snap, "chat", request)
    call.raw = orjson.dumps(body or chat_body())
    call.acc = call.sent = parse_request(call.raw, "chat")
    ctx.alias, ctx.stream = call.acc.model, call.acc.stream
    if classify:
        call.decision = decide(snap.policy, call.acc, tenant, None)
    return call


def http_request(
    body: bytes = b"", headers: dict[str, str] | None = None, gone: bool = False
) -> Request:
    """A starlette Request over a minimal ASGI scope whose body arrives in one message (or,
    `gone`, whose client disconnects instead)."""
    raw = [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/chat/completions",
        "query_string": b"",
        "headers": raw,
    }

    async def receive() -> dict[str, Any]:
        if gone:
            return {"type": "http.disconnect"}
        return {"type": "http.request", "body": body, "more_body": False}

    return Request(scope, receive)


def incoming(snap: Snapshot, body: bytes = b"", headers: dict[str, str] | None = None) -> Call:
    """A call as the HTTP server hands it to the front stages (nothing found yet)."""
    return Call(Context("req-1", 0.0), snap, "chat", http_request(body, headers))


def authenticated(call: Call, principal: Principal | None = None) -> Call:
    """`call` as Authenticate leaves it: for the stages after it (an open gateway's caller)."""
    call.principal = principal if principal is not None else Principal("default", "")
    return call


class FakeNext:
    """`next` for a stage: records the calls it gets, answers `response` or raises `error`."""

    def __init__(self, response: Response | None = None, error: BaseException | None = None):
        self.response = response if response is not None else json_response(COMPLETION)
        self.error = error
        self.calls: list[Call] = []

    async def __call__(self, call: Call) -> Response:
        self.calls.append(call)
        if self.error is not None:
            raise self.error
        return self.response


def json_response(doc: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(doc), status_code=status, media_type="application/json")


def stream_reply(chunks: list[bytes], log: list[str] | None = None) -> StreamReply:
    """A StreamReply over `chunks`; `log` gets "closed" when its body's clean-up ran."""

    async def body() -> AsyncIterator[bytes]:
        try:
            for c in chunks:
                yield c
        finally:
            if log is not None:
                log.append("closed")

    return StreamReply(body(), {})


async def drain(reply: StreamReply) -> bytes:
    """Iterate a stream's body to its end, then end it the way the server does."""
    out = b"".join([c async for c in reply.body_iterator])
    await reply.abandon()
    return out


def error_of(response: Response) -> dict[str, Any]:
    """The `error` object of an OpenAI-shaped error response."""
    return orjson.loads(bytes(response.body))["error"]
