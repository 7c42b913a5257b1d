"""`on_finish` hooks: run exactly once, in registration order, however the answer ended."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from starlette.background import BackgroundTask
from starlette.responses import Response

from gateway.pipeline.reply import StreamReply, finish_now, on_finish
from tests.pipeline.conftest import drain, stream_reply


def hooks(response: Response, log: list[str], names: str = "ab") -> None:
    for name in names:
        on_finish(response, lambda name=name: log.append(name))


async def test_unary_hooks_run_after_its_own_background_once_in_order() -> None:
    log: list[str] = []

    async def first() -> None:
        log.append("background")

    response = Response(b"x", background=BackgroundTask(first))
    hooks(response, log)
    assert log == []
    await response.background()
    assert log == ["background", "a", "b"]


async def test_unary_without_background() -> None:
    log: list[str] = []
    response = Response(b"x")
    hooks(response, log, "abc")
    await response.background()
    assert log == ["a", "b", "c"]


async def test_stream_fully_iterated_then_abandoned() -> None:
    log: list[str] = []
    reply = stream_reply([b"data: 1\n\n", b"data: 2\n\n"], log)
    hooks(reply, log)
    assert await drain(reply) == b"data: 1\n\ndata: 2\n\n"
    await reply.abandon()
    assert log == ["closed", "a", "b"]


async def test_stream_abandoned_before_iteration_runs_hooks_once() -> None:
    log: list[str] = []
    started: list[bool] = []

    async def body() -> AsyncIterator[bytes]:
        started.append(True)
        yield b"never"

    reply = StreamReply(body(), {})
    hooks(reply, log)
    await reply.abandon()
    await reply.abandon()
    assert log == ["a", "b"]
    assert started == []


async def test_stream_whose_body_raises() -> None:
    log: list[str] = []

    async def body() -> AsyncIterator[bytes]:
        yield b"data: 1\n\n"
        raise RuntimeError("upstream broke")

    reply = StreamReply(body(), {})
    hooks(reply, log)
    with pytest.raises(RuntimeError, match="upstream broke"):
        await drain(reply)
    assert log == []  # the server's clean-up has not run yet
    await reply.abandon()
    assert log == ["a", "b"]


async def test_a_failing_hook_does_not_stop_the_others() -> None:
    log: list[str] = []

    def broken() -> None:
        raise ValueError("hook bug")

    for response in (Response(b"x"), stream_reply([])):
        on_finish(response, lambda: log.append("first"))
        on_finish(response, broken)
        on_finish(response, lambda: log.append("last"))
        if isinstance(response, StreamReply):
            await response.abandon()
        else:
            await response.background()
    assert log == ["first", "last", "first", "last"]


async def test_finish_now_runs_hooks_without_sending() -> None:
    log: list[str] = []
    unary = Response(b"x")
    hooks(unary, log, "ab")
    finish_now(unary)
    assert log == ["a", "b"] and unary.background is None
    reply = stream_reply([b"x"])
    hooks(reply, log, "cd")
    finish_now(reply)
    await reply.abandon()  # ended already: hooks do not run twice
    assert log == ["a", "b", "c", "d"]


async def test_finish_now_without_hooks_keeps_the_background() -> None:
    task = BackgroundTask(lambda: None)
    response = Response(b"x", background=task)
    finish_now(response)
    assert response.background is task


async def test_unary_hooks_never_run_twice() -> None:
    log: list[str] = []
    response = Response(b"x")
    hooks(response, log)
    assert response.background is not None
    await response.background()
    await response.background()
    finish_now(response)
    assert log == ["a", "b"]


async def test_a_translated_answer_keeps_the_hooks() -> None:
    from gateway.apis.exchange import rebuild

    log: list[str] = []
    response = Response(b"{}", media_type="application/json")
    hooks(response, log)
    translated = rebuild(response, b"{}")
    assert translated.background is not None
    await translated.background()
    assert log == ["a", "b"]
