"""Open-loop latency counts from the scheduled send time, so a server stall is not hidden.

A real HTTP server on 127.0.0.1 holds every request arriving during one 1-second window. With at
most one request in flight, the open-loop generator cannot send on time during the stall; the
requests it was supposed to send then must report the time they waited. A closed-loop client just
stops sending during the stall and reports one slow request (coordinated omission).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from loadtests.bench import modes
from loadtests.bench.client import Client, Sample, Target
from loadtests.bench.echo_server import EchoServerThread
from loadtests.bench.progress import LiveProgress
from loadtests.bench.prompts import RequestFactory, TokenDist
from loadtests.bench.result import Bench

RATE, DURATION, STALL_AT, STALL_S = 50.0, 2.5, 0.5, 1.0


@pytest.fixture
def server() -> Iterator[EchoServerThread]:
    srv = EchoServerThread().start()
    yield srv
    srv.stop()


async def _run(server: EchoServerThread, open_loop: bool) -> list[Sample]:
    factory = RequestFactory("m", TokenDist.parse("10"), 4, stream=False)
    async with Client(4, timeout_s=10) as client:
        b = Bench(client, [Target("echo", server.url)], factory, LiveProgress(False))
        asyncio.get_running_loop().call_later(STALL_AT, server.stall, STALL_S)
        if open_loop:
            res = await modes.openloop(b, RATE, DURATION, None, "constant", max_inflight=1)
        else:
            res = await modes.stepped(b, [1], DURATION)
        return res.samples


def _slow(values: list[float]) -> int:
    return sum(v > 0.2 for v in values)


async def test_open_loop_counts_waiting_from_scheduled_time(server: EchoServerThread) -> None:
    samples = await _run(server, open_loop=True)
    assert all(s.error is None for s in samples)
    assert len(samples) == pytest.approx(RATE * DURATION, abs=2)
    latencies = [s.latency for s in samples]
    # Requests scheduled in the first ~0.8 s of the stall waited more than 0.2 s each.
    assert _slow(latencies) >= 30
    assert max(latencies) >= 0.9 * STALL_S
    # Timed from the actual send, the same run would show only the one stalled request.
    assert _slow([s.service for s in samples]) <= 2
    assert max(s.lateness for s in samples) >= 0.7 * STALL_S


async def test_closed_loop_omits_the_waiting(server: EchoServerThread) -> None:
    samples = await _run(server, open_loop=False)
    assert len(samples) > 100  # it ran the whole time, fast before and after the stall
    assert _slow([s.latency for s in samples]) <= 2  # yet only the stalled request looks slow
