"""Record: every request is seen once by every observer, after its answer ended; never raises
for an exception (the OpenAI error shape), re-raises a cancellation after recording it."""

from __future__ import annotations

import asyncio

import pytest

from gateway.context import Context
from gateway.errors import GatewayError
from gateway.pipeline.client_errors import PassThrough
from gateway.pipeline.stages.record import Record
from tests.pipeline.conftest import (
    FakeNext,
    drain,
    error_of,
    json_response,
    make_call,
    snapshot,
    stream_reply,
)


def recorder() -> tuple[Record, list[tuple[str, int]]]:
    seen: list[tuple[str, int]] = []
    return Record([lambda ctx: seen.append((ctx.request_id, ctx.status))]), seen


async def test_a_200_is_seen_once_after_it_was_sent() -> None:
    record, seen = recorder()
    fake = FakeNext()
    response = await record(make_call(snapshot()), fake)
    assert response is fake.response and seen == []
    await response.background()
    assert seen == [("req-1", 200)]


async def test_a_gateway_error_is_answered_in_its_shape() -> None:
    record, seen = recorder()
    err = GatewayError(429, "slow down", type="rate_limit_error", code="rl", headers={"a": "b"})
    response = await record(make_call(snapshot()), FakeNext(error=err))
    assert response.status_code == 429 and response.headers["a"] == "b"
    assert response.headers["x-request-id"] == "req-1"
    assert error_of(response) == {
        "message": "slow down",
        "type": "rate_limit_error",
        "param": None,
        "code": "rl",
    }
    await response.background()
    assert seen == [("req-1", 429)]


async def test_a_provider_4xx_is_answered_as_it_is() -> None:
    record, seen = recorder()
    answer = json_response({"error": {"message": "bad"}}, status=422)
    response = await record(make_call(snapshot()), FakeNext(error=PassThrough(answer)))
    assert response is answer
    await response.background()
    assert seen == [("req-1", 422)]


async def test_an_unexpected_exception_is_a_500_never_raised() -> None:
    record, seen = recorder()
    response = await record(make_call(snapshot()), FakeNext(error=ZeroDivisionError()))
    assert response.status_code == 500
    assert error_of(response)["code"] == "internal_error"
    assert error_of(response)["type"] == "server_error"
    await response.background()
    assert seen == [("req-1", 500)]


async def test_a_cancellation_is_recorded_as_499_and_re_raised() -> None:
    record, seen = recorder()
    with pytest.raises(asyncio.CancelledError):
        await record(make_call(snapshot()), FakeNext(error=asyncio.CancelledError()))
    assert seen == [("req-1", 499)]


async def test_a_stream_is_seen_only_once_it_ended() -> None:
    record, seen = recorder()
    reply = stream_reply([b"data: 1\n\n"])
    response = await record(make_call(snapshot()), FakeNext(reply))
    assert response is reply and seen == []
    assert await drain(reply) == b"data: 1\n\n"
    await reply.abandon()
    assert seen == [("req-1", 200)]


async def test_observers_added_later_count_and_end_is_set() -> None:
    observers: list = []
    record = Record(observers)
    ends: list[float] = []
    observers.append(lambda ctx: ends.append(ctx.end))
    ctx = Context("r", 0.0)
    record.record(ctx)
    assert len(ends) == 1 and ends[0] > 0.0 and ctx.end == ends[0]
