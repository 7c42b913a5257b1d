"""Test support: run the gateway as a real HTTP server on loopback, validate OpenAI shapes."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import math
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from functools import cache
from pathlib import Path
from typing import Any, Self

import httpx
import jsonschema
import orjson
import pytest
import uvicorn
import yaml

from gateway.cli import _http_protocol
from gateway.http.server import build_app

# Shared with the load tests (which never import tests/).
from loadtests.processes import free_port as free_port
from loadtests.processes import gateway_process as gateway_process
from loadtests.processes import gateway_processes as gateway_processes
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


MSG = [{"role": "user", "content": "Tell me about resilient systems"}]

# An `auth` section: tenants t1 and t2 with the API keys "key-1" and "key-2".
TWO_TENANTS = {
    "keys": [
        {"tenant": f"t{i}", "key_sha256": hashlib.sha256(f"key-{i}".encode()).hexdigest()}
        for i in (1, 2)
    ]
}
# A `retry` section: retries at once (no backoff).
NO_BACKOFF = {"base_backoff_ms": 0, "max_backoff_ms": 0}
# An alias's `cache` fields: the semantic cache only.
SEMANTIC_ONLY = {"cache": {"exact": {"enabled": False}, "semantic": {"enabled": True}}}


@contextlib.contextmanager
def environment(**values: str | None) -> Iterator[None]:
    """Set (a str) or unset (None) environment variables for the block, then restore them."""
    old = {k: os.environ.get(k) for k in values}
    try:
        for k, v in values.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class GatewayServer:
    """The gateway as `gateway serve` runs it, in a background thread (its own event loop).

    The policy text is written to a file and the app built by `gateway.http.server.build_app` (the
    uvicorn factory of `gateway serve`) from GATEWAY_POLICY, REDIS_URL and GATEWAY_REDIS_PREFIX, then
    served with the CLI's HTTP protocol (`http=` overrides it, e.g. "auto" for uvicorn's own).
    Every finished request's context is kept in `seen`.
    """

    def __init__(
        self,
        policy_yaml: str,
        redis_url: str | None = None,
        env: dict[str, str] | None = None,
        prefix: str | None = None,
        http: Any = None,
    ) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="gateway-policy-"))
        self.policy_path = self.folder / "policy.yaml"
        self.policy_path.write_text(policy_yaml)
        self.prefix = prefix or os.environ.get("GATEWAY_REDIS_PREFIX", "gw:")
        with environment(
            GATEWAY_POLICY=str(self.policy_path),
            REDIS_URL=redis_url,
            GATEWAY_REDIS_PREFIX=self.prefix,
            **(env or {}),
        ):
            self.entry = build_app()
        self.app = self.entry.app
        self.policy = self.runtime.snapshot.policy
        self.seen: list[Any] = []
        self.pipeline.observers.append(self.seen.append)
        self.port = free_port()
        self.config = uvicorn.Config(
            self.entry,
            host="127.0.0.1",
            port=self.port,
            log_level="warning",
            access_log=False,
            lifespan="on",
            http=http or _http_protocol("httptools"),
            timeout_keep_alive=max(1, math.ceil(self.policy.server.keepalive_timeout_s)),
        )
        self.server = uvicorn.Server(self.config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    @property
    def runtime(self) -> Any:
        return self.app.state.runtime

    @property
    def pipeline(self) -> Any:
        return self.app.state.pipeline

    def breaker(self, provider: str) -> dict[str, Any]:
        return self.runtime.breakers.snapshot()[provider]

    def chat(self, timeout: float = 15.0, **body: Any) -> httpx.Response:
        """POST a chat completion (alias `chat`, MSG, 8 tokens unless given); waits for its record."""
        payload = {"model": "chat", "messages": MSG, "max_tokens": 8, **body}
        n = len(self.seen)
        r = httpx.post(self.base_url + "/chat/completions", json=payload, timeout=timeout)
        # The gateway records a request just after its last byte is sent: wait for that record.
        deadline = time.monotonic() + 2.0
        while len(self.seen) == n and time.monotonic() < deadline:
            time.sleep(0.002)
        return r

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
        shutil.rmtree(self.folder, ignore_errors=True)


def policy(
    upstreams: Any = None,
    *names: str,
    provider: Mapping[str, Any] | None = None,
    providers: Mapping[str, Mapping[str, Any]] | None = None,
    pool: Mapping[str, Any] | None = None,
    pools: Mapping[str, Mapping[str, Any]] | None = None,
    alias: Mapping[str, Any] | None = None,
    models: Mapping[str, Mapping[str, Any]] | None = None,
    extra: str = "",
    **sections: Any,
) -> str:
    """A policy's YAML text: one provider per upstream, one pool `main` of them, the alias `chat`.

    ``upstreams`` maps provider names to base URLs, or is a simulated fleet whose instances
    ``names`` (default: all) become providers of the same names. Each provider gets the
    ``provider`` fields; ``providers`` merges fields into providers by name (or adds providers).
    ``pool`` adds fields to `main` (its members: the upstreams, in order), ``pools`` adds pools;
    ``alias`` adds fields to `chat`, ``models`` adds aliases. Other top-level sections (retry,
    auth, degradation, ...) are keyword arguments; ``extra`` is YAML text appended as it is.
    """
    if upstreams is None:
        urls: dict[str, str] = {}
    elif isinstance(upstreams, Mapping):
        urls = dict(upstreams)
    else:
        urls = {n: upstreams.url(n) for n in names or upstreams.names}
    provs: dict[str, Any] = {n: {"base_url": u, **(provider or {})} for n, u in urls.items()}
    for n, fields in (providers or {}).items():
        provs[n] = {**provs.get(n, {}), **fields}
    doc = {
        **sections,
        "providers": provs,
        "pools": {"main": {"members": list(urls), **(pool or {})}, **(pools or {})},
        "models": {"chat": {"pool": "main", **(alias or {})}, **(models or {})},
    }
    return yaml.safe_dump(doc, sort_keys=False) + extra


class FakeClock:
    """A monotonic clock the test moves: call it for the time, `advance` it (or set `t`)."""

    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, s: float) -> None:
        self.t += s


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
    for _ in range(4):
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


def run(coro: Any) -> Any:
    return asyncio.run(coro)


class AccessLines(logging.Handler):
    """The access log's lines, as the operator would read them."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(orjson.loads(record.getMessage()))

    def wait_for(
        self, request_id: str, within_s: float = 3.0, status: int | None = None
    ) -> dict[str, Any]:
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            for line in self.lines:
                if line["request_id"] == request_id and status in (None, line["status"]):
                    return line
            time.sleep(0.01)
        raise AssertionError(f"no access-log line for {request_id}")


class ThreadedUpstream:
    """An aiohttp app on loopback in a thread of its own (a scripted upstream for tests that
    drive the gateway synchronously); subclasses add their routes in `routes`."""

    def __init__(self) -> None:
        self.port = free_port()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.runner: Any = None

    def routes(self, app: Any) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        from aiohttp import web

        self.thread.start()
        app = web.Application()
        self.routes(app)

        async def start() -> None:
            self.runner = web.AppRunner(app, access_log=None)
            await self.runner.setup()
            await web.TCPSite(self.runner, "127.0.0.1", self.port).start()

        asyncio.run_coroutine_threadsafe(start(), self.loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.runner is not None:
            asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


class ThreadedRawServer:
    """A raw asyncio TCP server on loopback in a thread of its own, for upstreams scripted byte
    by byte; subclasses implement `_serve(reader, writer)`."""

    def __init__(self) -> None:
        self.port = free_port()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self._thread.start()
        start = asyncio.start_server(self._serve, "127.0.0.1", self.port)
        self._server = asyncio.run_coroutine_threadsafe(start, self._loop).result(5)
        return self

    def __exit__(self, *exc: object) -> None:
        async def stop() -> None:
            if self._server is not None:
                self._server.close()

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)


def completion_body(content: str, model: str = "m", **extra: Any) -> dict[str, Any]:
    """A minimal chat completion an upstream answers with."""
    return {
        "id": "chatcmpl-s",
        "object": "chat.completion",
        "created": 1,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": "stop",
            }
        ],
        **extra,
    }


class JsonRawServer(ThreadedRawServer):
    """A raw upstream that reads one JSON request per connection and writes one JSON answer
    (`connection: close`); subclasses implement `answer(request) -> (status, body)` and may sleep
    in it. A client that leaves early is ignored."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def answer(self, request: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        raise NotImplementedError

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
            length = 0
            for line in head[1:]:
                if line.lower().startswith("content-length:"):
                    length = int(line.split(":", 1)[1])
            status, body = await self.answer(json.loads(await reader.readexactly(length)))
            data = json.dumps(body).encode()
            writer.write(
                b"HTTP/1.1 %d X\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
                b"connection: close\r\n\r\n%s" % (status, len(data), data)
            )
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()


def sse_chunk(delta: dict[str, Any] | str, finish: str | None = None, model: str = "m") -> bytes:
    """One chat completion chunk as an upstream streams it (`delta` text: its content)."""
    doc = {
        "id": "chatcmpl-s",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": model,
        "choices": [
            {
                "index": 0,
                "delta": {"content": delta} if isinstance(delta, str) else delta,
                "finish_reason": finish,
            }
        ],
    }
    return b"data: " + json.dumps(doc).encode() + b"\n\n"
