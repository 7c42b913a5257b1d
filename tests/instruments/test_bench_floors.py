"""The overhead floors (byte relay, bare uvicorn + aiohttp forwarder) and per-target headers."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from loadtests.bench.cli import Common, _targets
from loadtests.bench.echo_server import EchoServerThread
from tests.support import free_port, wait_http

ROOT = Path(__file__).resolve().parents[2]
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


@pytest.fixture(scope="module")
def echo() -> Iterator[EchoServerThread]:
    server = EchoServerThread().start()
    yield server
    server.stop()


def _start(module: str, *args: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    cmd = [sys.executable, "-m", module, *args]
    cmd = [c.replace("{port}", str(port)) for c in cmd]
    proc = subprocess.Popen(cmd, cwd=ROOT)
    url = f"http://127.0.0.1:{port}/v1"
    wait_http(url + "/models", proc)
    return proc, url


@pytest.mark.parametrize(
    ("module", "args"),
    [
        ("loadtests.tcp_relay", ("--listen", "127.0.0.1:{port}", "--to", "127.0.0.1:{up}")),
        ("loadtests.stack_floor", ("--port", "{port}", "--upstream", "http://127.0.0.1:{up}")),
    ],
)
def test_floor_answers_like_the_upstream(echo: EchoServerThread, module: str, args) -> None:
    proc, url = _start(module, *(a.replace("{up}", str(echo.port)) for a in args))
    try:
        direct = httpx.post(echo.url + "/chat/completions", json=BODY)
        via = httpx.post(url + "/chat/completions", json=BODY)
        assert via.status_code == 200 and via.json() == direct.json()
        with httpx.stream("POST", url + "/chat/completions", json={**BODY, "stream": True}) as r:
            events = [line for line in r.iter_lines() if line.startswith("data:")]
        assert events[-1] == "data: [DONE]" and len(events) == 4  # 3 tokens + [DONE]
    finally:
        proc.terminate()
        proc.wait(10)


def test_target_header_goes_to_its_target_only() -> None:
    c = Common(
        url=["a=http://127.0.0.1:1/v1", "b=http://127.0.0.1:2/v1"],
        target_header=["b=x-route: fast", "b=x-other:1"],
    )
    a, b = _targets(c)
    assert "x-route" not in a.headers()
    assert b.headers()["x-route"] == "fast" and b.headers()["x-other"] == "1"
    with pytest.raises(Exception, match="NAME=Header:value"):
        _targets(Common(url=["a=http://127.0.0.1:1/v1"], target_header=["zz=x:1"]))
