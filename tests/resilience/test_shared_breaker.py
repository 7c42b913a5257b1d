"""Breaker events shared between two replicas through a real Redis."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid

import pytest

from gateway.resilience.breaker import BreakerEvent, BreakerRegistry, BreakerSettings, BreakerState
from gateway.resilience.failures import FailureKind
from gateway.resilience.shared_breakers import SharedBreakers
from loadtests.processes import free_port

REDIS_URL = "redis://127.0.0.1:6379/3"
SETTINGS = BreakerSettings(consecutive_failures=3, cooldown_s=30, max_cooldown_s=60)


async def replica(url: str, channel: str, rid: str) -> tuple[BreakerRegistry, SharedBreakers]:
    registry = BreakerRegistry(SETTINGS)
    shared = SharedBreakers(registry, url, channel=channel, replica_id=rid, reconnect_max_s=0.5)
    await shared.start()
    return registry, shared


async def wait_for(pred, within: float = 2.0) -> float:  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    while not pred():
        if time.perf_counter() - start > within:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.001)
    return time.perf_counter() - start


async def test_open_close_and_cooldown_propagate_within_one_second() -> None:
    channel = f"test:breakers:{uuid.uuid4().hex}"
    reg_a, shared_a = await replica(REDIS_URL, channel, "A")
    reg_b, shared_b = await replica(REDIS_URL, channel, "B")
    try:
        assert await shared_a.wait_subscribed() and await shared_b.wait_subscribed()
        seen_b: list[tuple[float, BreakerEvent]] = []
        reg_b.on_transition(lambda e: seen_b.append((time.perf_counter(), e)))
        a = reg_a.get("provider-x")
        assert reg_b.get("provider-x").allow()

        delays = []
        for _ in range(5):  # open on A -> B stops sending; close on A -> B resumes
            t0 = time.perf_counter()
            for _ in range(3):
                a.record_failure(FailureKind.CONNECT_ERROR)
            assert a.state is BreakerState.OPEN
            await wait_for(lambda: not reg_b.get("provider-x").allow(), within=1.0)
            delays.append(seen_b[-1][0] - t0)
            assert seen_b[-1][1].source == "remote"
            remaining = reg_b.get("provider-x").snapshot()["open_remaining_s"]
            assert 29 < remaining <= 30  # B keeps A's deadline
            a.force(BreakerState.CLOSED)
            await wait_for(lambda: reg_b.get("provider-x").allow(), within=1.0)
        delays.sort()
        print(
            f"\nopen propagation A->B over 5 runs: median {delays[2] * 1000:.2f} ms, "
            f"max {delays[-1] * 1000:.2f} ms"
        )
        assert delays[-1] < 1.0

        # A 429 cool-down on B reaches A; A's own events never come back to A.
        reg_b.get("provider-y").cool_down(5.0)
        await wait_for(lambda: not reg_a.get("provider-y").allow(), within=1.0)
        assert reg_a.get("provider-y").state is BreakerState.CLOSED
        await asyncio.sleep(0.1)
        assert shared_a.applied == 1 and shared_b.applied == 10  # 5 opens + 5 closes
    finally:
        await shared_a.stop()
        await shared_b.stop()


async def test_no_echo_loop() -> None:
    channel = f"test:breakers:{uuid.uuid4().hex}"
    reg_a, shared_a = await replica(REDIS_URL, channel, "A")
    reg_b, shared_b = await replica(REDIS_URL, channel, "B")
    try:
        await shared_a.wait_subscribed()
        await shared_b.wait_subscribed()
        for _ in range(3):
            reg_a.get("p").record_failure(FailureKind.UPSTREAM_5XX)
        await wait_for(lambda: reg_b.get("p").state is BreakerState.OPEN)
        await asyncio.sleep(0.2)
        # One local event published by A, applied once by B, nothing re-published by B.
        assert (shared_a.published, shared_b.applied) == (1, 1)
        assert (shared_b.published, shared_a.applied) == (0, 0)
    finally:
        await shared_a.stop()
        await shared_b.stop()


async def test_redis_down_keeps_local_breakers_and_logs_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="gateway.resilience.shared_breakers")
    url = f"redis://127.0.0.1:{free_port()}/3"  # nothing listens there
    registry, shared = await replica(url, "test:breakers:down", "A")
    try:
        assert not await shared.wait_subscribed(within_s=0.5)
        breaker = registry.get("p")
        for _ in range(3):
            breaker.record_failure(FailureKind.CONNECT_ERROR)
        assert breaker.state is BreakerState.OPEN and not breaker.allow()
        await asyncio.sleep(0.6)  # several reconnect attempts
        assert not shared.connected
        warnings = [r for r in caplog.records if "unreachable" in r.getMessage()]
        assert len(warnings) == 1
    finally:
        await shared.stop()


class Forwarder:
    """A loopback TCP relay to Redis that the test can cut and restore."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.server: asyncio.base_events.Server | None = None
        self.writers: list[asyncio.StreamWriter] = []

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)

    async def cut(self) -> None:
        assert self.server is not None
        self.server.close()
        for w in self.writers:
            w.close()
        self.writers.clear()
        await self.server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", 6379)
        self.writers += [writer, up_writer]

        async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            with contextlib.suppress(Exception):
                while data := await r.read(65536):
                    w.write(data)
                    await w.drain()
            w.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))


async def test_reconnects_after_redis_outage() -> None:
    channel = f"test:breakers:{uuid.uuid4().hex}"
    relay = Forwarder(free_port())
    await relay.start()
    reg_a, shared_a = await replica(f"redis://127.0.0.1:{relay.port}/3", channel, "A")
    reg_b, shared_b = await replica(REDIS_URL, channel, "B")
    try:
        assert await shared_a.wait_subscribed() and await shared_b.wait_subscribed()
        await relay.cut()
        await wait_for(lambda: not shared_a.connected, within=3.0)
        # An event raised while A cannot reach Redis is kept and published after reconnect.
        for _ in range(3):
            reg_a.get("p").record_failure(FailureKind.CONNECT_ERROR)
        await asyncio.sleep(0.3)
        assert reg_b.get("p").allow()
        await relay.start()
        await wait_for(lambda: shared_a.connected, within=3.0)
        await wait_for(lambda: not reg_b.get("p").allow(), within=3.0)
        # And the subscription works again in the other direction.
        reg_b.get("q").cool_down(5)
        await wait_for(lambda: not reg_a.get("q").allow(), within=2.0)
    finally:
        await shared_a.stop()
        await shared_b.stop()
        await relay.cut()


def test_messages_from_redis_touch_only_known_breakers_with_sane_times() -> None:
    """A forged or broken message never creates a breaker (memory) nor sets an absurd time."""
    registry = BreakerRegistry(SETTINGS)
    shared = SharedBreakers(registry, REDIS_URL, channel="unused", replica_id="me")
    known = registry.get("known")
    for i in range(1000):
        shared._apply(b'{"provider": "made-up-%d", "state": "open", "remaining_s": 5}' % i)
    assert registry.names() == ["known"]
    for remaining in (b'"abc"', b"1e300", b"-5", b"NaN", b"[1]"):
        shared._apply(b'{"provider": "known", "state": "open", "remaining_s": %b}' % remaining)
        assert known.state is BreakerState.CLOSED, remaining
    shared._apply(b'{"provider": "known", "state": "open", "remaining_s": 5}')
    assert known.state is BreakerState.OPEN and shared.applied == 1
