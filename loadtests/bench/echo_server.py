"""A tiny, fast OpenAI-shaped HTTP server on raw asyncio, to calibrate the generator and for tests.

It answers ``POST .../chat/completions`` (JSON or SSE, ``max_tokens`` chunks of one token each) and
``GET .../models``. It costs the server as little CPU as possible so that, on a small machine, a
benchmark of the generator measures the generator. ``stall()`` makes the server hold every request
that arrives during the next ``seconds`` until that window ends: a controlled hiccup for testing
coordinated omission.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time

import orjson

_JSON_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
_SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
)
_NOT_FOUND = b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"
_MODELS = orjson.dumps({"object": "list", "data": [{"id": "echo", "object": "model"}]})


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _completion(max_tokens: int, prompt_tokens: int) -> bytes:
    return orjson.dumps(
        {
            "id": "cmpl-echo",
            "object": "chat.completion",
            "model": "echo",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "x " * max_tokens},
                    "finish_reason": "length",
                }
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": max_tokens,
                "total_tokens": prompt_tokens + max_tokens,
            },
        }
    )


_DELTA = b'data: {"id":"cmpl-echo","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"x "}}]}\n\n'  # noqa: E501
_DONE = b"data: [DONE]\n\n"


class EchoState:
    """Settings shared by all connections of one server."""

    def __init__(self, delay_s: float = 0.0, token_interval_s: float = 0.0) -> None:
        self.delay_s = delay_s
        self.token_interval_s = token_interval_s
        self.stall_until = 0.0
        self.requests = 0

    def stall(self, seconds: float) -> None:
        """Hold every request arriving in the next ``seconds`` until that window ends."""
        self.stall_until = time.monotonic() + seconds


class _Conn(asyncio.Protocol):
    def __init__(self, state: EchoState) -> None:
        self.state = state
        self.buf = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[:end]
            length = 0
            for line in head.split(b"\r\n")[1:]:
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            if len(self.buf) < end + 4 + length:
                return
            body = self.buf[end + 4 : end + 4 + length]
            self.buf = self.buf[end + 4 + length :]
            self._handle(head.split(b" ", 2), body)

    def _handle(self, request_line: list[bytes], body: bytes) -> None:
        assert self.transport is not None
        self.state.requests += 1
        path = request_line[1] if len(request_line) > 1 else b""
        if path.endswith(b"/models"):
            self.transport.write(_JSON_HEAD % len(_MODELS) + _MODELS)
            return
        if not path.endswith(b"/chat/completions"):
            self.transport.write(_NOT_FOUND)
            return
        req = orjson.loads(body) if body else {}
        max_tokens = int(req.get("max_tokens") or 16)
        prompt_tokens = sum(len(str(m.get("content", "")).split()) for m in req.get("messages", []))
        wait = max(self.state.stall_until - time.monotonic(), 0.0) + self.state.delay_s
        slow = wait > 0 or (req.get("stream") and self.state.token_interval_s > 0)
        if not slow:
            self._reply(bool(req.get("stream")), max_tokens, prompt_tokens)
            return
        asyncio.get_running_loop().create_task(
            self._reply_later(wait, bool(req.get("stream")), max_tokens, prompt_tokens)
        )

    def _reply(self, stream: bool, max_tokens: int, prompt_tokens: int) -> None:
        assert self.transport is not None
        if stream:
            self.transport.write(_SSE_HEAD + _chunk(_DELTA * max_tokens + _DONE) + b"0\r\n\r\n")
        else:
            payload = _completion(max_tokens, prompt_tokens)
            self.transport.write(_JSON_HEAD % len(payload) + payload)

    async def _reply_later(self, wait: float, stream: bool, max_tokens: int, prompt: int) -> None:
        # Replies on one connection stay in order because a client pipelines nothing.
        assert self.transport is not None
        if wait > 0:
            await asyncio.sleep(wait)
        if not stream or self.state.token_interval_s <= 0:
            self._reply(stream, max_tokens, prompt)
            return
        self.transport.write(_SSE_HEAD)
        for _ in range(max_tokens):
            if self.transport.is_closing():
                return
            self.transport.write(_chunk(_DELTA))
            await asyncio.sleep(self.state.token_interval_s)
        self.transport.write(_chunk(_DONE) + b"0\r\n\r\n")


async def serve(state: EchoState, host: str = "127.0.0.1", port: int = 0) -> asyncio.Server:
    """Start listening; returns the asyncio server (its port is in ``sockets[0]``)."""
    loop = asyncio.get_running_loop()
    return await loop.create_server(lambda: _Conn(state), host, port, backlog=4096)


class EchoServerThread:
    """Run the echo server on its own event loop in a daemon thread (for tests)."""

    def __init__(self, delay_s: float = 0.0, token_interval_s: float = 0.0) -> None:
        self.state = EchoState(delay_s, token_interval_s)
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(serve(self.state))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()
        server.close()

    def start(self) -> EchoServerThread:
        self._thread.start()
        self._ready.wait(5)
        return self

    def stall(self, seconds: float) -> None:
        self._loop.call_soon_threadsafe(self.state.stall, seconds)

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)


def main(port: int = 8099, delay_s: float = 0.0, token_interval_s: float = 0.0) -> None:
    """Serve forever on 127.0.0.1 (uvloop when installed)."""
    with contextlib.suppress(ImportError):
        import uvloop

        uvloop.install()

    async def run() -> None:
        server = await serve(EchoState(delay_s, token_interval_s), port=port)
        print(f"echo server on http://127.0.0.1:{port}/v1", flush=True)
        await server.serve_forever()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run())


if __name__ == "__main__":
    import sys

    main(int(sys.argv[1]) if len(sys.argv) > 1 else 8099)
