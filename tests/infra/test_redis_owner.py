"""The one owner of Redis connections (`RedisHub`) against a private redis-server that the test
kills and restarts, and the one file watcher (`FileWatch`)."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from gateway.infra.filewatch import FileWatch, file_signature
from gateway.infra.hub import RedisHub
from gateway.infra.shared_state import SharedState
from gateway.resilience.breaker import BreakerRegistry
from gateway.resilience.degradation import Degradation
from gateway.resilience.shared_breakers import SharedBreakers
from tests.support import RedisProcess, free_port

needs_redis = pytest.mark.skipif(shutil.which("redis-server") is None, reason="no redis-server")


class PrivateRedis(RedisProcess):
    """A redis-server of this test alone, without persistence: killed and started at will."""

    def publish(self, channel: str, data: bytes) -> int:
        return int(redis.Redis(port=self.port, socket_timeout=1).publish(channel, data))


@pytest.fixture
def server() -> Iterator[PrivateRedis]:
    srv = PrivateRedis()
    srv.start()
    try:
        yield srv
    finally:
        srv.kill()


async def until(pred, within: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + within
    while not pred():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


@needs_redis
async def test_one_pool_shared_by_all_users(server: PrivateRedis) -> None:
    state = SharedState(server.url, prefix="t:")
    hub = state.hub
    breakers = SharedBreakers(BreakerRegistry(), hub, channel="t:breakers", replica_id="a")
    degradation = Degradation(None, hub, prefix="t:deferred")
    try:
        await breakers.start()
        assert await breakers.wait_subscribed()
        assert state.redis is hub.client
        # The deferred queue reads with BLOCK: the hub's blocking client, made once.
        assert degradation.queue.redis is hub.blocking  # type: ignore[attr-defined]
        assert hub.blocking is hub.blocking
        assert await state.call(lambda r: r.ping(), False)
        # Several subscriptions, one pub/sub connection.
        got: list[bytes] = []
        sub = hub.subscribe("t:other", got.append)
        assert await sub.wait_live()
        clients = redis.Redis(port=server.port).client_list()
        assert len([c for c in clients if int(c.get("sub", 0)) > 0]) == 1
    finally:
        await breakers.stop()
        await degradation.stop()
        await state.aclose()


@needs_redis
async def test_subscribe_restart_raising_handler_and_shutdown(
    server: PrivateRedis, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="gateway.redis")
    hub = RedisHub(server.url, reconnect_min_s=0.05, reconnect_max_s=0.5)
    got: list[bytes] = []
    resubscribed: list[float] = []
    lost: list[BaseException] = []

    def bad(data: bytes) -> None:
        raise ValueError("a handler bug")

    async def slow(data: bytes) -> None:
        await asyncio.sleep(0.01)
        got.append(b"slow:" + data)

    sub = hub.subscribe("t:a", got.append, on_subscribed=lambda: resubscribed.append(1.0))
    hub.subscribe("t:a", bad, on_lost=lost.append)
    hub.subscribe("t:b", slow)
    try:
        assert await sub.wait_live()
        await until(lambda: hub.connected and len(resubscribed) == 1)
        await until(lambda: server.publish("t:b", b"x") == 1)
        assert server.publish("t:a", b"1") == 1  # one connection subscribed for both handlers
        await until(lambda: sorted(got) == [b"1", b"slow:x"])

        # Raising handler: logged, the loop goes on.
        server.publish("t:a", b"2")
        await until(lambda: got[-1] == b"2")
        assert any("handler failed" in r.getMessage() for r in caplog.records)

        # Restart: the subscription resumes by itself, once the server is back.
        server.kill()
        await until(lambda: not sub.live, within=5)
        assert lost
        await asyncio.sleep(1.0)  # several attempts while it is down
        server.start()
        await until(lambda: sub.live, within=10)
        assert len(resubscribed) == 2  # callers catch up after each (re)subscription
        await until(lambda: server.publish("t:a", b"3") == 1)
        await until(lambda: got[-1] == b"3")
        await until(lambda: server.publish("t:b", b"y") == 1)
        await until(lambda: got[-1] == b"slow:y")
        lost_lines = [r for r in caplog.records if "pub/sub lost" in r.getMessage()]
        assert len(lost_lines) == 1  # once per outage, not once per retry
        assert hub.reconnects == 1
    finally:
        await hub.aclose()
    # Shutdown: the loop is gone and nothing listens on the channels any more.
    assert hub._task is None
    assert not sub.live
    assert server.publish("t:a", b"4") == 0
    await asyncio.sleep(0.1)
    assert got[-1] == b"slow:y"


@needs_redis
async def test_unsubscribe_leaves_others_and_messages_are_data(server: PrivateRedis) -> None:
    hub = RedisHub(server.url)
    a: list[bytes] = []
    b: list[bytes] = []
    sub_a = hub.subscribe("t:a", a.append)
    sub_b = hub.subscribe("t:b", b.append)
    try:
        assert await sub_a.wait_live() and await sub_b.wait_live()
        await sub_a.close()
        await until(lambda: server.publish("t:a", b"x") == 0)
        assert server.publish("t:b", b"\x00not json") == 1
        await until(lambda: b == [b"\x00not json"])  # raw bytes, as published
        assert a == []
    finally:
        await hub.aclose()


async def test_disabled_hub_never_subscribes() -> None:
    hub = RedisHub(None)
    sub = hub.subscribe("t:a", lambda data: None)
    assert not hub.enabled and hub.client is None and hub.blocking is None
    assert not await sub.wait_live(0.05)
    await hub.aclose()


async def test_unreachable_redis_logs_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="gateway.redis")
    hub = RedisHub(f"redis://127.0.0.1:{free_port()}/0", reconnect_max_s=0.1)
    lost: list[BaseException] = []
    sub = hub.subscribe("t:a", lambda data: None, on_lost=lost.append)
    try:
        await until(lambda: len(lost) >= 3)
        assert not sub.live
        assert len([r for r in caplog.records if "pub/sub lost" in r.getMessage()]) == 1
    finally:
        await hub.aclose()


# ---- the file watcher ----------------------------------------------------------------------


async def test_changed_file_triggers_the_callback_once(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text("a: 1\n")
    calls: list[float] = []

    async def changed() -> None:
        calls.append(time.monotonic())

    watch = FileWatch(
        tmp_path, changed, signature=lambda: file_signature(path), debounce_ms=50, recursive=False
    )
    watch.start()
    try:
        await asyncio.sleep(0.3)  # the watcher is ready
        path.write_text("a: 22\n")
        await until(lambda: len(calls) == 1)
        await asyncio.sleep(0.5)
        assert len(calls) == 1
        # An unrelated file in the folder does not change what the path resolves to.
        (tmp_path / "other.txt").write_text("x")
        await asyncio.sleep(0.5)
        assert len(calls) == 1
    finally:
        await watch.stop()


async def test_configmap_symlink_swap_and_delete(tmp_path: Path) -> None:
    """A Kubernetes ConfigMap volume: policy.yaml -> ..data/policy.yaml, ..data -> a folder that
    is replaced by a new one on each update."""
    v1, v2 = tmp_path / "..v1", tmp_path / "..v2"
    v1.mkdir()
    v2.mkdir()
    (v1 / "policy.yaml").write_text("a: 1\n")
    (v2 / "policy.yaml").write_text("a: 2\n")
    os.symlink("..v1", tmp_path / "..data")
    path = tmp_path / "policy.yaml"
    os.symlink("..data/policy.yaml", path)
    calls: list[int] = []

    async def changed() -> None:
        calls.append(1)

    watch = FileWatch(
        tmp_path, changed, signature=lambda: file_signature(path), debounce_ms=50, recursive=False
    )
    watch.start()
    try:
        await asyncio.sleep(0.3)
        os.symlink("..v2", tmp_path / "..data_tmp")
        os.replace(tmp_path / "..data_tmp", tmp_path / "..data")  # the atomic swap
        await until(lambda: len(calls) == 1)
        assert path.read_text() == "a: 2\n"
        # Deleted, then written again: both are changes, the watch goes on.
        path.unlink()
        await until(lambda: len(calls) == 2)
        path.write_text("a: 3\n")
        await until(lambda: len(calls) == 3)
    finally:
        await watch.stop()


async def test_a_failing_callback_does_not_end_the_watch(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text("x")
    calls: list[int] = []

    async def changed() -> None:
        calls.append(1)
        raise RuntimeError("bad file")

    watch = FileWatch(tmp_path, changed, debounce_ms=50)
    watch.start()
    try:
        await asyncio.sleep(0.3)
        path.write_text("xy")
        await until(lambda: len(calls) == 1)
        path.write_text("xyz")
        await until(lambda: len(calls) == 2)
    finally:
        await watch.stop()
