"""Test support: run the gateway as a real HTTP server on loopback, validate OpenAI shapes."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import uvicorn

from gateway.http.app import create_app
from gateway.http.protocol import GatewayHttpProtocol
from gateway.http.server import FastRoutes
from gateway.infra.shared_state import SharedState
from gateway.policy.loader import parse_policy

# Shared with the load tests (which never import tests/).
from loadtests.processes import free_port as free_port
from loadtests.processes import gateway_process as gateway_process
from loadtests.processes import wait_http as wait_http

ROOT = Path(__file__).resolve().parent.parent
SCHEMAS = Path(__file__).resolve().parent / "data" / "openai_schemas.json"


@cache
def _schemas() -> dict[str, Any]:
    return json.loads(SCHEMAS.read_text())["schemas"]


@cache
def _validator(name: str) -> jsonschema.Draft202012Validator:
    # Built once per schema: `jsonschema.validate` re-checks the (large) schema on every call.
    return jsonschema.Draft202012Validator(_schemas()[name])


def validate(name: str, instance: Any) -> None:
    """Validate against the official OpenAI JSON Schema `name` (e.g. CreateChatCompletionResponse)."""
    _validator(name).validate(instance)


def validate_sse(body: bytes | str) -> list[dict[str, Any]]:
    """Parse an SSE body; validate each chunk; require the `[DONE]` terminator. Returns the chunks."""
    text = body.decode() if isinstance(body, bytes) else body
    chunks = []
    done = False
    for block in text.split("\n\n"):
        block = block.strip()
        if not block:
            continue
        assert block.startswith("data: "), block
        data = block[6:]
        if data == "[DONE]":
            done = True
            continue
        assert not done, "data after [DONE]"
        chunk = json.loads(data)
        validate("CreateChatCompletionStreamResponse", chunk)
        chunks.append(chunk)
    assert done, "stream did not end with [DONE]"
    return chunks


class GatewayServer:
    """The gateway app served by uvicorn in a background thread (its own event loop)."""

    def __init__(
        self, policy_yaml: str, redis_url: str | None = None, env: dict[str, str] | None = None
    ) -> None:
        self.policy = parse_policy(policy_yaml, env={**os.environ, **(env or {})})
        prefix = os.environ.get("GATEWAY_REDIS_PREFIX", "gw:")
        self.app = create_app(self.policy, SharedState(redis_url, prefix=prefix))
        self.port = free_port()
        # The same ASGI entry point `gateway serve` runs (inference routes straight to the pipeline).
        self.config = uvicorn.Config(
            FastRoutes(self.app),
            host="127.0.0.1",
            port=self.port,
            log_level="warning",
            lifespan="on",
            http=GatewayHttpProtocol,
        )
        self.server = uvicorn.Server(self.config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def __enter__(self) -> GatewayServer:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("gateway did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def run(coro: Any) -> Any:
    return asyncio.run(coro)
