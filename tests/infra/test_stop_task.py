"""`stop_task`: a background task that swallows a cancellation still stops, after its grace time;
one that finishes its clean-up within the grace time is not cancelled twice; one that never
stops is given up on, not waited for forever."""

from __future__ import annotations

import asyncio
import time

import pytest

from gateway.infra import tasks
from gateway.infra.tasks import stop_task


async def test_a_swallowed_cancellation_is_sent_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tasks, "GRACE_S", 0.2)
    cancels = []

    async def loop() -> None:
        while True:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                cancels.append(time.monotonic())
                if len(cancels) > 1:
                    raise
                # swallowed, as a library racing its own timeout does: the loop goes on

    task = asyncio.create_task(loop())
    await asyncio.sleep(0.01)
    started = time.monotonic()
    assert await stop_task(task)
    assert task.cancelled() and len(cancels) == 2
    assert 0.2 <= time.monotonic() - started < 1.0


async def test_clean_up_within_the_grace_time_is_not_interrupted() -> None:
    cleaned = []

    async def loop() -> None:
        try:
            await asyncio.sleep(10)
        finally:
            await asyncio.sleep(0.3)  # e.g. a last flush
            cleaned.append(True)

    task = asyncio.create_task(loop())
    await asyncio.sleep(0.01)
    assert await stop_task(task)
    assert cleaned == [True]


async def test_a_task_that_never_stops_is_given_up_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tasks, "GRACE_S", 0.1)
    monkeypatch.setattr(tasks, "LIMIT_S", 0.5)
    stop = asyncio.Event()

    async def stubborn() -> None:
        while not stop.is_set():
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                continue

    task = asyncio.create_task(stubborn())
    await asyncio.sleep(0.01)
    assert not await stop_task(task)
    stop.set()
    task.cancel()
    await asyncio.wait({task}, timeout=1)


async def test_an_error_the_task_ended_with_is_not_raised() -> None:
    async def broken() -> None:
        raise RuntimeError("loop died")

    task = asyncio.create_task(broken())
    await asyncio.sleep(0.01)
    assert await stop_task(task)
    assert await stop_task(None)
