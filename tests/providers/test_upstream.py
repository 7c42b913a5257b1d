"""The upstream client's failure kinds, against the simulator's faults and tiny raw servers."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import orjson
import pytest

from gateway.policy.schema import Provider, Timeouts
from gateway.providers.upstream import UpstreamClient, UpstreamFailure
from loadtests.simulator.testing import Fleet
from tests.support import unconnectable_port

PATH = "/chat/completions"
FAST = Timeouts(connect_s=1.0, first_byte_s=2.0, idle_s=2.0, total_s=5.0)


def body(stream: bool = False, max_tokens: int = 8) -> bytes:
    return orjson.dumps(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "hello there"}],
            "max_tokens": max_tokens,
            "stream": stream,
        }
    )


FLEET: list[Any] = [{"name": "u", "profile": "fast"}]


@pytest.fixture
def sim(fleet: Fleet) -> Iterator[Fleet]:
    yield fleet
    fleet.set_faults("u")


@contextlib.asynccontextmanager
async def client(url: str) -> AsyncIterator[UpstreamClient]:
    c = UpstreamClient("u", Provider(base_url=url), api_key="sk-test")
    try:
        yield c
    finally:
        await c.aclose()


async def kind_of(coro: object) -> str:
    with pytest.raises(UpstreamFailure) as e:
        await coro  # type: ignore[misc]
    return e.value.kind


async def test_send_ok_and_no_provider_header_forwarded(sim: Fleet) -> None:
    async with client(sim.url("u")) as c:
        resp = await c.send(PATH, body(), None, FAST)
    assert resp.status == 200
    assert orjson.loads(resp.body)["object"] == "chat.completion"
    assert resp.headers == {}  # allow-list: only x-ratelimit-*, and only when the policy says so


async def test_stream_first_chunk_then_rest(sim: Fleet) -> None:
    async with client(sim.url("u")) as c:
        s = await c.open_stream(PATH, body(stream=True), None, FAST)
        assert s.status == 200 and s.first.startswith(b"data: ")
        rest = b"".join([chunk async for chunk in s.chunks()])
    assert (s.first + rest).rstrip().endswith(b"data: [DONE]")
    assert s.closed


async def test_status_failures(sim: Fleet) -> None:
    async with client(sim.url("u")) as c:
        sim.set_faults("u", error_rate=1.0, error_status=[503])
        assert await kind_of(c.send(PATH, body(), None, FAST)) == "upstream_5xx"
        assert await kind_of(c.open_stream(PATH, body(True), None, FAST)) == "upstream_5xx"
        sim.set_faults("u", error_rate=1.0, error_status=[400])
        with pytest.raises(UpstreamFailure) as e:
            await c.send(PATH, body(), None, FAST)
        assert e.value.kind == "upstream_4xx" and e.value.status == 400 and e.value.body
        sim.set_faults("u", rate_limit=1.0, retry_after_s=3)
        with pytest.raises(UpstreamFailure) as e:
            await c.send(PATH, body(), None, FAST)
        assert e.value.kind == "rate_limited" and e.value.retry_after == 3.0


async def test_connect_error_when_refused(sim: Fleet) -> None:
    sim.set_faults("u", refuse_connections=True)
    async with client(sim.url("u")) as c:
        assert await kind_of(c.send(PATH, body(), None, FAST)) == "connect_error"
        assert await kind_of(c.open_stream(PATH, body(True), None, FAST)) == "connect_error"


async def test_timeouts_first_byte_and_total(sim: Fleet) -> None:
    sim.set_faults("u", hang=True)
    t = Timeouts(connect_s=1.0, first_byte_s=0.2, idle_s=1.0, total_s=0.3)
    async with client(sim.url("u")) as c:
        assert await kind_of(c.send(PATH, body(), None, t)) == "total_timeout"
        t = Timeouts(connect_s=1.0, first_byte_s=0.2, idle_s=1.0, total_s=5.0)
        assert await kind_of(c.open_stream(PATH, body(True), None, t)) == "first_byte_timeout"


async def test_idle_timeout_mid_stream(sim: Fleet) -> None:
    # 2000 tokens/s alone, slowed 2000x: a second between chunks.
    sim.set_faults("u", slow_decode=2000.0)
    t = Timeouts(connect_s=1.0, first_byte_s=5.0, idle_s=0.3, total_s=10.0)
    async with client(sim.url("u")) as c:
        s = await c.open_stream(PATH, body(True), None, t)
        with pytest.raises(UpstreamFailure) as e:
            async for _ in s.chunks():
                pass
    assert e.value.kind == "idle_timeout"


async def test_stream_broken_mid_way(sim: Fleet) -> None:
    sim.set_faults("u", cut_stream_after_chunks=2)
    async with client(sim.url("u")) as c:
        s = await c.open_stream(PATH, body(True, max_tokens=16), None, FAST)
        with pytest.raises(UpstreamFailure) as e:
            async for _ in s.chunks():
                pass
    assert e.value.kind == "stream_broken"


async def test_connect_timeout() -> None:
    t = Timeouts(connect_s=0.2, first_byte_s=2.0, idle_s=2.0, total_s=3.0)
    with unconnectable_port() as port:
        async with client(f"http://127.0.0.1:{port}/v1") as c:
            assert await kind_of(c.send(PATH, body(), None, t)) == "connect_timeout"


class DropSecond:
    """Answers the first request on each connection; closes at the second one (a stale pool)."""

    RESPONSE = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"

    def __init__(self, drop_first: bool = False) -> None:
        self.requests = 0
        self.drop_first = drop_first

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        served = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                await reader.readexactly(length)
                self.requests += 1
                if served >= 1 or self.drop_first:
                    break  # close without answering, as a server timing out an idle connection
                writer.write(self.RESPONSE)
                await writer.drain()
                served += 1
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


async def test_stale_pooled_connection_is_resent_once() -> None:
    srv = DropSecond()
    server = await asyncio.start_server(srv.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server, client(f"http://127.0.0.1:{port}/v1") as c:
        assert (await c.send(PATH, body(), None, FAST)).body == b"{}"
        # Reuses the pooled connection, which the server drops: resent on a fresh one.
        assert (await c.send(PATH, body(), None, FAST)).body == b"{}"
    assert srv.requests == 3


async def test_fresh_connection_dropped_is_not_resent() -> None:
    srv = DropSecond(drop_first=True)
    server = await asyncio.start_server(srv.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server, client(f"http://127.0.0.1:{port}/v1") as c:
        assert await kind_of(c.send(PATH, body(), None, FAST)) == "connect_error"
    assert srv.requests == 1
