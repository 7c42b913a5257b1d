"""A scripted OpenAI-compatible upstream for the stream border tests: each mode (the first path
segment of the provider's base URL) answers with its script, step by step.

A step is bytes (written and flushed as one piece), a float (a pause of that many seconds), a
dict (the whole answer as a JSON body, status 200) or STALL (the connection is held open, silent,
until the test ends). Every request is counted per mode in `hits`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator, Mapping
from typing import Any

from aiohttp import web

from tests.support import GatewayServer, ThreadedUpstream

STALL = "stall"


def chat_chunk(delta: dict[str, Any], finish: str | None = None, **top: Any) -> bytes:
    """One chat.completion.chunk's JSON text."""
    doc = {
        "id": "chatcmpl-up",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        **top,
    }
    return json.dumps(doc).encode()


def sse(*payloads: bytes) -> bytes:
    return b"".join(b"data: " + p + b"\n\n" for p in payloads)


class Scripted(ThreadedUpstream):
    def __init__(self, scripts: Mapping[str, list[Any]]) -> None:
        super().__init__()
        self.scripts = dict(scripts)
        self.hits: dict[str, int] = {}
        self.bodies: dict[str, list[dict[str, Any]]] = {}
        self._stop: asyncio.Event | None = None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        mode = request.match_info["mode"]
        self.hits[mode] = self.hits.get(mode, 0) + 1
        self.bodies.setdefault(mode, []).append(await request.json())
        script = self.scripts[mode]
        if script and isinstance(script[0], dict):
            return web.json_response(script[0])
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        for step in script:
            if isinstance(step, bytes):
                await resp.write(step)
            elif isinstance(step, float):
                await asyncio.sleep(step)
            elif step == STALL:
                await self._stalled()
        with contextlib.suppress(ConnectionError):
            await resp.write_eof()
        return resp

    async def _stalled(self) -> None:
        if self._stop is None:
            self._stop = asyncio.Event()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), 30)

    def __exit__(self, *exc: object) -> None:
        async def stop() -> None:
            if self._stop is not None:
                self._stop.set()

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(5)
        super().__exit__(*exc)

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/{mode}/v1/chat/completions", self._handle)
        app.router.add_post("/{mode}/v1/completions", self._handle)
        app.router.add_post("/{mode}/v1/messages", self._handle)


def scripted_policy(
    up: Scripted,
    modes: list[str],
    pools: Mapping[str, list[str]] | None = None,
    provider: str = "",
    alias: str = "",
    extra: str = "",
) -> str:
    """One provider, pool and alias per mode (or the given pools of modes, aliased by pool)."""
    lines = ["providers:"]
    lines += [f"  {m}: {{base_url: 'http://127.0.0.1:{up.port}/{m}/v1'{provider}}}" for m in modes]
    groups = dict(pools) if pools is not None else {m: [m] for m in modes}
    lines += ["pools:"]
    lines += [
        f"  p_{g}: {{members: [{', '.join(ms)}], balancer: {{strategy: round_robin}}}}"
        for g, ms in groups.items()
    ]
    lines += ["models:"] + [f"  {g}: {{pool: p_{g}{alias}}}" for g in groups]
    return "\n".join(lines) + "\n" + extra


@contextlib.contextmanager
def scripted_gateway(up: Scripted, modes: list[str], **kw: Any) -> Iterator[GatewayServer]:
    with GatewayServer(scripted_policy(up, modes, **kw)) as server:
        yield server
