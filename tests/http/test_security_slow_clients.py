"""Slow or idle clients cannot exhaust the gateway.

Header and body read timeouts (408 or close), the keep-alive timeout, and the per-worker
connection cap that closes the longest-idle connections first: with the open-file limit at 256,
300 idle sockets do not keep a legitimate request out.
"""

from __future__ import annotations

import os
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from gateway.context import Context
from gateway.http.protocol import configure_connections
from gateway.policy.schema import Server
from tests.http.test_api import policy_for
from tests.support import free_port, wait_http

FAST = "server: {header_timeout_s: 0.4, body_timeout_s: 0.4, keepalive_timeout_s: 0.4}"
HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
BODY = b'{"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}'


def connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    return s


def read_until_closed(s: socket.socket, within_s: float = 3.0) -> tuple[bytes, float]:
    """Everything the gateway sends until it closes the connection, and how long that took."""
    started = time.monotonic()
    s.settimeout(within_s)
    data = b""
    try:
        while chunk := s.recv(65536):
            data += chunk
    except TimeoutError:
        raise AssertionError(f"still open after {within_s} s; got {data[:200]!r}") from None
    except ConnectionResetError:
        pass
    return data, time.monotonic() - started


@pytest.fixture
def gw(fleet, gateway):  # type: ignore[no-untyped-def]
    g = gateway(policy_for(fleet, extra=FAST))
    g.seen = []
    g.app.state.pipeline.observers.append(g.seen.append)
    yield g
    # The limits are per process: later in-process gateways of other tests get the defaults back.
    configure_connections(Server())


def test_a_socket_that_sends_nothing_is_closed(gw) -> None:  # type: ignore[no-untyped-def]
    data, took = read_until_closed(connect(gw.port))
    assert data == b"" and took < 2.0


def test_partial_headers_get_408(gw) -> None:  # type: ignore[no-untyped-def]
    s = connect(gw.port)
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")  # and never the blank line
    data, took = read_until_closed(s)
    assert data.startswith(b"HTTP/1.1 408") and took < 2.0


def test_trickled_headers_still_time_out(gw) -> None:  # type: ignore[no-untyped-def]
    """One byte at a time keeps a per-read timer alive for ever; the header deadline is total."""
    s = connect(gw.port)
    started = time.monotonic()
    s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ")
    with pytest.raises((BrokenPipeError, ConnectionResetError)):
        for _ in range(40):
            s.sendall(b"a")  # a valid header value, one byte every 100 ms
            time.sleep(0.1)
    assert time.monotonic() - started < 2.0


def _last(gw, status: int) -> Context:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline:
        for ctx in gw.seen:
            if ctx.status == status:
                return ctx
        time.sleep(0.01)
    raise AssertionError(f"no request recorded with status {status}: {gw.seen}")


def test_short_body_under_a_larger_content_length_gets_408(gw) -> None:  # type: ignore[no-untyped-def]
    s = connect(gw.port)
    s.sendall(HEAD + b"content-length: %d\r\n\r\n" % (len(BODY) + 50) + BODY)
    data, took = read_until_closed(s)
    assert data.startswith(b"HTTP/1.1 408") and b"request_timeout" in data
    assert took < 2.0
    assert _last(gw, 408).endpoint == "chat"  # recorded: access log and metrics see it


def test_a_chunked_body_that_never_ends_gets_408(gw) -> None:  # type: ignore[no-untyped-def]
    s = connect(gw.port)
    s.sendall(HEAD + b"transfer-encoding: chunked\r\n\r\n" + b"%x\r\n%s\r\n" % (5, BODY[:5]))
    data, took = read_until_closed(s)
    assert data.startswith(b"HTTP/1.1 408") and took < 2.0


def test_idle_keep_alive_connection_is_closed(gw) -> None:  # type: ignore[no-untyped-def]
    s = connect(gw.port)
    s.sendall(HEAD + b"content-length: %d\r\n\r\n" % len(BODY) + BODY)
    data, took = read_until_closed(s)
    assert data.startswith(b"HTTP/1.1 200") and took < 2.0


def test_a_prompt_client_on_a_kept_alive_connection_is_served(gw) -> None:  # type: ignore[no-untyped-def]
    client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0)
    for _ in range(3):  # same pooled connection, well within the keep-alive timeout
        assert client.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "hi"}], max_tokens=2
        ).choices


# -- the connection cap under a low open-file limit ---------------------------------------------


def _limit_files() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))


@pytest.fixture
def low_fd_gateway(fleet, tmp_path: Path) -> Iterator[str]:  # type: ignore[no-untyped-def]
    policy = tmp_path / "p.yaml"
    # Long read timeouts: the cap alone must keep the gateway usable.
    policy.write_text(policy_for(fleet, extra="server: {header_timeout_s: 60}"))
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gateway.cli",
            "serve",
            "--port",
            str(port),
            "--policy",
            str(policy),
        ],
        env={**os.environ, "GATEWAY_LOG_LEVEL": "warning", "GATEWAY_ACCESS_LOG": "0"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        preexec_fn=_limit_files,
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/health", proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_idle_sockets_beyond_the_open_file_limit_do_not_block_a_request(low_fd_gateway) -> None:  # type: ignore[no-untyped-def]
    url = low_fd_gateway
    port = int(url.rsplit(":", 1)[1])
    idle = [connect(port) for _ in range(300)]
    try:
        time.sleep(0.3)  # let the gateway accept them all
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=10)
        for _ in range(3):
            reply = client.chat.completions.create(
                model="chat", messages=[{"role": "user", "content": "hi"}], max_tokens=2
            )
            assert reply.choices
        # The oldest idle connections were the ones closed.
        idle[0].settimeout(2)
        assert idle[0].recv(1) == b""
    finally:
        for s in idle:
            s.close()
