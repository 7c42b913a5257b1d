"""A client that leaves while its request waits (upstream, admission queue) is noticed: the
request's task is cancelled, its upstream call stops, and it is recorded once, as a 499."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import httpx
import orjson
import pytest

from tests.hostile import HostileUpstream
from tests.support import AccessLines, GatewayServer


@pytest.fixture(scope="module")
def upstream() -> Iterator[HostileUpstream]:
    with HostileUpstream() as h:
        yield h


@pytest.fixture(scope="module")
def gw(upstream: HostileUpstream) -> Iterator[GatewayServer]:
    policy = f"""
providers:
  s: {{base_url: '{upstream.url("slow")}', max_inflight: 1}}
pools:
  p: {{members: [s], max_attempts: 1, queue: {{max_wait_s: 10}}}}
models:
  m: {{pool: p}}
"""
    with GatewayServer(policy) as g:
        yield g


def leave_after(port: int, request_id: str, stream: bool, seconds: float) -> None:
    body = orjson.dumps(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    )
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"x-request-id: %s\r\nContent-Length: %d\r\n\r\n%s" % (request_id.encode(), len(body), body)
    )
    time.sleep(seconds)
    s.close()


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_gone_before_its_answer_is_a_499_at_once(
    gw: GatewayServer, upstream: HostileUpstream, access_log: AccessLines, stream: bool
) -> None:
    rid = f"gone-{int(stream)}-{time.monotonic_ns()}"
    start = time.monotonic()
    leave_after(gw.port, rid, stream, 0.3)
    line = access_log.wait_for(rid, within_s=2.5)
    assert line["status"] == 499 and time.monotonic() - start < 2.5  # not when the answer came
    time.sleep(0.1)
    assert [x["request_id"] for x in access_log.lines].count(rid) == 1


def test_a_client_gone_from_the_queue_frees_its_place(
    gw: GatewayServer, access_log: AccessLines
) -> None:
    """One request holds the member (max_inflight 1); two more wait and leave; a fourth is
    then next in line, answered after the first, not after all three."""
    first = time.monotonic()
    with httpx.Client(timeout=15) as client:
        results: list[httpx.Response] = []
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        holder = threading.Thread(
            target=lambda: results.append(client.post(gw.base_url + "/chat/completions", json=body))
        )
        holder.start()
        time.sleep(0.3)
        for i in range(2):
            leave_after(gw.port, f"queued-{i}-{time.monotonic_ns()}", False, 0.3)
        waiter = client.post(gw.base_url + "/chat/completions", json=body)
        holder.join()
    assert results[0].status_code == 200 and waiter.status_code == 200
    assert time.monotonic() - first < 8.5  # 3 s + 3 s, not 3 + 3 + 3 + 3


def test_a_pipelined_client_that_leaves_is_noticed_too(
    gw: GatewayServer, access_log: AccessLines
) -> None:
    """Two requests in one write: the first is answered while the second waits its turn; the
    client leaving cancels the first (not only the one queued behind it) and both are recorded
    once."""
    body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    rid = f"piped-{time.monotonic_ns()}"

    def request(n: int) -> bytes:
        return (
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"x-request-id: %s-%d\r\nContent-Length: %d\r\n\r\n%s"
            % (rid.encode(), n, len(body), body)
        )

    s = socket.create_connection(("127.0.0.1", gw.port), timeout=5)
    s.sendall(request(1) + request(2))
    time.sleep(0.4)
    s.close()
    line = access_log.wait_for(f"{rid}-1", within_s=2.5)
    assert line["status"] == 499
    time.sleep(0.2)
    assert [x["request_id"] for x in access_log.lines].count(f"{rid}-1") == 1
