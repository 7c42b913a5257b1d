"""A member's `max_inflight` under `gateway serve --workers 2`: the workers share it. A limit
smaller than the number of workers once left a worker with no slot, which refused (429) every
request it got for that member, one request in two, with the one slot idle in the other worker;
without Redis each worker took a slot of its own (two in flight for a limit of 1). Now the limit
is the replica's: N requests in flight across its workers, never more, and a request waits in
the queue for a slot held by the other worker. A real `gateway serve --workers 2`, a real Redis,
a counting upstream on loopback, the official OpenAI client; and two members sharing one slot
folder in one process for the slot bookkeeping of every way an attempt ends."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import openai
import pytest

from gateway.resilience.slots import SlotFiles
from gateway.routing.member import Member
from tests.support import ThreadedUpstream, free_port, wait_http

ANSWER = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1,
    "model": "m",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}
    ],
    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
}


class Counting(ThreadedUpstream):
    """Answers after 0.15 s and keeps the largest number of requests it had at once."""

    def __init__(self) -> None:
        super().__init__()
        self.now = self.peak = self.total = 0

    def routes(self, app: Any) -> None:
        from aiohttp import web

        async def chat(request: web.Request) -> web.Response:
            self.now += 1
            self.total += 1
            self.peak = max(self.peak, self.now)
            try:
                await asyncio.sleep(0.15)
            finally:
                self.now -= 1
            return web.json_response(ANSWER)

        app.router.add_post("/v1/chat/completions", chat)


@pytest.mark.parametrize("redis", [True, False], ids=["redis", "no-redis"])
def test_a_limit_of_one_is_one_in_flight_across_two_workers(
    tmp_path: Path, redis_url: str, redis: bool
) -> None:
    with Counting() as up:
        policy = tmp_path / "policy.yaml"
        policy.write_text(f"""
providers:
  one: {{base_url: 'http://127.0.0.1:{up.port}/v1', max_inflight: 1}}
pools:
  main: {{members: [one], queue: {{max_wait_s: 10}}}}
models:
  chat: {{pool: main, cache: {{exact: {{enabled: false}}}}}}
""")
        port = free_port()
        env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
        env["GATEWAY_REDIS_PREFIX"] = f"gwtest:{uuid.uuid4().hex[:8]}:"
        if redis:
            env["REDIS_URL"] = redis_url
        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway.cli", "serve", "--port", str(port)]
            + ["--workers", "2", "--policy", str(policy), "--log-level", "warning"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_http(f"http://127.0.0.1:{port}/ready", proc, timeout=60)
            client = openai.OpenAI(
                base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0, timeout=30
            )

            def ask(_: int) -> str:
                msg = [{"role": "user", "content": "hi"}]
                answer = client.chat.completions.create(model="chat", messages=msg)
                return answer.choices[0].message.content or ""

            # One at a time (new connections, spread over both workers): each is served.
            assert [ask(i) for i in range(8)] == ["hi"] * 8
            # Eight at once: they take turns on the one slot, whichever worker has them.
            with ThreadPoolExecutor(8) as pool:
                assert list(pool.map(ask, range(8))) == ["hi"] * 8
            assert up.peak == 1 and up.total == 16
        finally:
            proc.terminate()
            proc.wait(30)


def test_every_way_an_attempt_ends_gives_its_slot_back(tmp_path: Path) -> None:
    """Two members on one slot folder stand for the same member in two workers."""
    a, b = Member("m", max_inflight=2), Member("m", max_inflight=2)
    a.share_slots(SlotFiles(tmp_path, "m", 2))
    b.share_slots(SlotFiles(tmp_path, "m", 2))
    for finish in (
        lambda m: m.end(0.1),
        lambda m: m.fail_fast("upstream_5xx"),
        lambda m: m.outrun(0.1),
        lambda m: m.release(),
    ):
        assert a.has_capacity()
        a.begin()
        assert b.has_capacity()
        b.begin()
        assert not a.has_capacity() and not b.has_capacity()  # both slots taken, one each
        finish(b)
        assert a.has_capacity()  # the slot b gave back, for a second request of a
        a.begin()
        assert not b.has_capacity()
        finish(a)
        finish(a)
        assert a.inflight == b.inflight == 0
    # A worker that dies (its files closed) frees what it held.
    b.has_capacity()
    b.begin()
    b.begin()
    assert not a.has_capacity()
    b.share_slots(None)
    assert a.has_capacity()


async def test_a_checked_slot_is_kept_for_the_start_in_the_same_turn(tmp_path: Path) -> None:
    """Between `has_capacity` and `begin` another worker cannot take the slot; a check not
    followed by a start gives it back on the next turn of the loop."""
    a, b = Member("m", max_inflight=1), Member("m", max_inflight=1)
    a.share_slots(SlotFiles(tmp_path, "m", 1))
    b.share_slots(SlotFiles(tmp_path, "m", 1))
    assert a.has_capacity()
    assert not b.has_capacity()
    a.begin()
    await asyncio.sleep(0)
    assert not b.has_capacity()
    a.end(0.1)
    assert b.has_capacity()  # checked, never begun
    await asyncio.sleep(0)
    assert a.has_capacity()
