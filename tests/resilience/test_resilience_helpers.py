"""Shared pieces of the resilience acceptance tests (this module holds no tests itself).

Everything is real: simulated providers over loopback HTTP, the gateway served by uvicorn, Redis.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from gateway.context import Context
from gateway.infra.shared_state import SharedState
from gateway.policy.loader import parse_policy
from loadtests.simulator.testing import Fleet, run_fleet
from tests.support import GatewayServer, free_port

MSG = [{"role": "user", "content": "Tell me about resilient systems"}]


def fleet_of(*names: str) -> Any:
    """A module-scoped `fleet` fixture: fast simulated providers with these names."""

    @pytest.fixture(scope="module")
    def fleet() -> Iterator[Fleet]:
        with run_fleet([{"name": n, "profile": "fast"} for n in names]) as f:
            yield f

    return fleet


@pytest.fixture(autouse=True)
def healthy_fleet(fleet: Fleet) -> Iterator[None]:
    """Import into a test module: every test leaves the module's providers without faults."""
    yield
    for name in fleet.names:
        fleet.clear_faults(name)


class Gateway(GatewayServer):
    """The in-thread gateway, with a Redis key prefix of its own and every finished request kept."""

    def __init__(self, policy_yaml: str, redis_url: str | None = None, prefix: str = "") -> None:
        from gateway.http.app import create_app

        self.policy = parse_policy(policy_yaml)
        prefix = prefix or f"gwres:{uuid.uuid4().hex[:8]}:"
        self.state = SharedState(redis_url, prefix=prefix)
        self.app = create_app(self.policy, self.state)
        self.seen: list[Context] = []
        self.app.state.pipeline.observers.append(self.seen.append)
        import threading

        import uvicorn

        self.port = free_port()
        self.config = uvicorn.Config(
            self.app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on"
        )
        self.server = uvicorn.Server(self.config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def runtime(self) -> Any:
        return self.app.state.runtime

    @property
    def pipeline(self) -> Any:
        return self.app.state.pipeline

    def breaker(self, provider: str) -> dict[str, Any]:
        return self.runtime.breakers.snapshot()[provider]

    def chat(self, timeout: float = 15.0, **body: Any) -> httpx.Response:
        payload = {"model": "chat", "messages": MSG, "max_tokens": 8, **body}
        n = len(self.seen)
        r = httpx.post(self.base_url + "/chat/completions", json=payload, timeout=timeout)
        # The gateway records a request just after its last byte is sent: wait for that record.
        deadline = time.monotonic() + 2.0
        while len(self.seen) == n and time.monotonic() < deadline:
            time.sleep(0.002)
        return r


@pytest.fixture
def start_gateway() -> Iterator[Callable[..., Gateway]]:
    started: list[Gateway] = []

    def start(policy_yaml: str, redis_url: str | None = None, prefix: str = "") -> Gateway:
        gw = Gateway(policy_yaml, redis_url, prefix)
        gw.__enter__()
        started.append(gw)
        return gw

    yield start
    for gw in started:
        gw.__exit__(None, None, None)


def requests_at(fleet: Any, name: str) -> int:
    """Chat requests the simulator instance received (the count the gateway cannot fake)."""
    return int(fleet.stats(name)["by_endpoint"].get("chat", 0))


def poll(condition: Callable[[], Any], within_s: float = 5.0, every_s: float = 0.02) -> Any:
    """Wait until ``condition()`` is truthy; returns it, or fails the test after ``within_s``."""
    deadline = time.monotonic() + within_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"condition not met within {within_s} s")
        time.sleep(every_s)


@contextlib.contextmanager
def unconnectable_port() -> Iterator[int]:
    """A port whose TCP handshake never completes: a listener with a full accept backlog.

    SYNs to it are dropped, so a connect hangs until the client's connect timeout (a closed
    port would refuse at once: that is a connect *error*, not a timeout).
    """
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    for _ in range(3):
        s = socket.socket()
        s.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            s.connect(("127.0.0.1", port))
        fillers.append(s)
    time.sleep(0.05)
    try:
        yield port
    finally:
        for s in fillers:
            s.close()
        listener.close()


class RedisProcess:
    """A throwaway redis-server on its own port (never the shared one), killable and restartable."""

    def __init__(self, port: int | None = None) -> None:
        if shutil.which("redis-server") is None:
            pytest.skip("redis-server is not installed")
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisProcess:
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port)):
                return self
            time.sleep(0.02)
        raise RuntimeError("redis-server did not start")

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(5)
            self.proc = None

    def __enter__(self) -> RedisProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.kill()
