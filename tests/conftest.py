"""Shared fixtures: a simulated fleet, gateways on loopback, a real Redis."""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from loadtests.simulator.testing import Fleet, run_fleet
from tests.support import AccessLines, GatewayServer


def _default_redis_url() -> str:
    """Database 3, or one of its own for each pytest-xdist worker (gw0 → 8, gw1 → 9...): each
    flushes its own at the end, while the others still run."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not (worker.startswith("gw") and worker[2:].isdigit()):
        return "redis://127.0.0.1:6379/3"
    if int(worker[2:]) > 7:  # Redis has 16 databases; sharing one would flush another's keys
        raise RuntimeError("at most 8 test workers (TEST_WORKERS): one Redis database each")
    return f"redis://127.0.0.1:6379/{8 + int(worker[2:])}"


REDIS_URL = os.environ.get("TEST_REDIS_URL") or _default_redis_url()


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """A real Redis (CI starts one). Tests use their own key prefixes; db 3 is flushed at the end."""
    client = redis.Redis.from_url(REDIS_URL)
    client.ping()
    yield REDIS_URL
    client.flushdb()
    client.close()


@pytest.fixture
def redis_prefix() -> str:
    return f"gwtest:{uuid.uuid4().hex[:8]}:"


# The simulated providers a test module gets unless it sets FLEET: two fast ones, a slow-decoding
# one and a spare for fault tests.
DEFAULT_FLEET: list[Any] = [
    "a",
    "b",
    {
        "name": "slow",
        "profile": "fast",
        "overrides": {"decode_tps_alone": 20, "decode_tps_full": 10},
    },
    "c",
]


@pytest.fixture(scope="module")
def fleet(request: pytest.FixtureRequest) -> Iterator[Fleet]:
    """The module's simulated providers, in a background thread.

    A module sets ``FLEET`` (instance specs, or names of "fast" instances) for others than
    DEFAULT_FLEET, and ``FLEET_ADMIN = True`` for the fleet's admin port.
    """
    specs = getattr(request.module, "FLEET", DEFAULT_FLEET)
    with run_fleet(
        [{"name": s, "profile": "fast"} if isinstance(s, str) else s for s in specs],
        admin=getattr(request.module, "FLEET_ADMIN", False),
    ) as f:
        yield f


@pytest.fixture
def healthy_fleet(fleet: Fleet) -> Iterator[Fleet]:
    """The module's fleet, every instance's faults cleared after the test (use it with
    ``pytestmark = pytest.mark.usefixtures("healthy_fleet")`` where tests set faults)."""
    yield fleet
    for name in fleet.names:
        fleet.clear_faults(name)


@pytest.fixture
def gateway() -> Iterator[Callable[..., GatewayServer]]:
    """Factory: start a gateway (tests.support.GatewayServer's arguments); all are stopped at the
    end of the test."""
    started: list[GatewayServer] = []

    def start(policy_yaml: str, redis_url: str | None = None, **kw: Any) -> GatewayServer:
        gw = GatewayServer(policy_yaml, redis_url, **kw)
        gw.__enter__()
        started.append(gw)
        return gw

    yield start
    for gw in started:
        gw.__exit__(None, None, None)


class CaptureUpstream:
    """A tiny real upstream that records what the gateway sent and answers a fixed completion."""

    def __init__(self) -> None:
        from starlette.applications import Starlette
        from starlette.requests import Request
        from starlette.responses import JSONResponse
        from starlette.routing import Route

        self.last_body: dict = {}
        self.last_headers: dict = {}
        self.status = 200
        self.error_body: dict = {
            "error": {
                "message": "bad thing",
                "type": "invalid_request_error",
                "param": None,
                "code": "bad",
            }
        }

        async def chat(request: Request) -> JSONResponse:
            self.last_body = await request.json()
            self.last_headers = dict(request.headers)
            if self.status != 200:
                return JSONResponse(self.error_body, status_code=self.status)
            return JSONResponse(
                {
                    "id": "chatcmpl-cap",
                    "object": "chat.completion",
                    "created": 1,
                    "model": self.last_body.get("model"),
                    "vendor_field": {"kept": True},
                    "choices": [
                        {
                            "index": 0,
                            "finish_reason": "tool_calls",
                            "logprobs": None,
                            "message": {
                                "role": "assistant",
                                "content": None,
                                "refusal": None,
                                "tool_calls": [
                                    {
                                        "id": "call_1",
                                        "type": "function",
                                        "function": {"name": "get_weather", "arguments": "{}"},
                                    }
                                ],
                            },
                        }
                    ],
                    "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8},
                }
            )

        self.app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"


@pytest.fixture
def capture_upstream() -> Iterator[CaptureUpstream]:
    import threading
    import time

    import uvicorn

    from tests.support import free_port

    cap = CaptureUpstream()
    cap.port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(cap.app, host="127.0.0.1", port=cap.port, log_level="warning")
    )
    t = threading.Thread(target=server.run, daemon=True)
    t.start()
    while not server.started:
        time.sleep(0.01)
    yield cap
    server.should_exit = True
    t.join(5)


@pytest.fixture
def access_log() -> Iterator[AccessLines]:
    """The access log's lines, as JSON objects, while the test runs."""
    handler = AccessLines()
    logger = logging.getLogger("gateway.access")
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)
