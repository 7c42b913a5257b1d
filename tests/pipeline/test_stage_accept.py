"""Accept: the body within its limit, parsed and checked; the alias known."""

from __future__ import annotations

import orjson
import pytest

from gateway.context import READ_TIMEOUT_KEY, Context
from gateway.errors import GatewayError
from gateway.pipeline.call import Call
from gateway.pipeline.stages.accept import Accept
from tests.pipeline.conftest import (
    FakeNext,
    authenticated,
    chat_body,
    http_request,
    incoming,
    snapshot,
)

SMALL = {"server": {"max_body_bytes": 1024}}


async def refused(call: Call) -> GatewayError:
    fake = FakeNext()
    with pytest.raises(GatewayError) as raised:
        await Accept()(call, fake)
    assert fake.calls == []
    return raised.value


async def test_accepts_and_hands_down_the_parsed_request() -> None:
    raw = orjson.dumps(chat_body("hello", stream=True, max_tokens=7))
    call, fake = authenticated(incoming(snapshot(), raw)), FakeNext()
    assert await Accept()(call, fake) is fake.response
    assert fake.calls == [call]
    assert call.raw == raw and call.ctx.request_body == raw
    assert (call.acc.model, call.acc.stream, call.acc.max_tokens) == ("chat", True, 7)
    assert call.sent is call.acc
    assert (call.ctx.alias, call.ctx.stream) == ("chat", True)


@pytest.mark.parametrize("declared", [True, False])
async def test_too_large_a_body_is_413(declared: bool) -> None:
    raw = orjson.dumps(chat_body("x" * 2000))
    headers = {"content-length": str(len(raw))} if declared else {}
    err = await refused(incoming(snapshot(**SMALL), raw, headers))
    assert (err.status, err.code) == (413, "request_too_large")


async def test_bad_json_is_400() -> None:
    err = await refused(incoming(snapshot(), b'{"model": "chat", "messages": ['))
    assert err.status == 400


async def test_an_unknown_model_is_404() -> None:
    err = await refused(incoming(snapshot(), orjson.dumps({**chat_body(), "model": "gpt-9"})))
    assert (err.status, err.code, err.param) == (404, "model_not_found", "model")


@pytest.mark.parametrize(("timed_out", "status"), [(False, 499), (True, 408)])
async def test_a_body_that_never_came(timed_out: bool, status: int) -> None:
    request = http_request(gone=True)
    if timed_out:
        request.scope[READ_TIMEOUT_KEY] = True
    err = await refused(Call(Context("r", 0.0), snapshot(), "chat", request))
    assert err.status == status


async def test_a_replay_brings_its_body_and_is_never_streamed() -> None:
    ctx = Context("r", 0.0, replay=True)
    call = authenticated(Call(ctx, snapshot(), "chat"))
    call.raw = orjson.dumps(chat_body(stream=True))
    fake = FakeNext()
    await Accept()(call, fake)
    assert fake.calls == [call] and call.acc.stream is False and ctx.stream is False
    assert ctx.request_body is None  # nothing read from a request
