"""A small HTTP/1.1 server on asyncio + httptools.

Why not uvicorn: the simulator must do things an ASGI server hides on purpose: cut a response
mid-body at the TCP level, stop accepting connections and accept again on the same port, and
answer the cheapest requests straight from ``data_received`` without a task. Keep-alive and
pipelining are handled; requests on one connection are answered in order. A client that goes
away cancels the task serving it, which frees its batch slot.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from dataclasses import dataclass
from http import HTTPStatus

import httptools

log = logging.getLogger("loadtests.simulator")

REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}


@dataclass(slots=True)
class Request:
    method: bytes
    path: bytes
    headers: dict[bytes, bytes]
    body: bytes
    keep_alive: bool
    query: bytes = b""


class App:
    """What a server runs: a cheap synchronous path and the general async one."""

    def handle_fast(self, req: Request) -> bytes | None:
        """A whole response (status line included) when it needs no waiting, else None."""
        return None

    async def handle(self, req: Request, conn: Connection) -> None:
        raise NotImplementedError


def head(status: int, extra: bytes, content_type: bytes, length: int | None) -> bytes:
    """Status line and headers; ``length`` None means chunked transfer encoding."""
    framing = (
        b"transfer-encoding: chunked\r\n" if length is None else b"content-length: %d\r\n" % length
    )
    return b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\n%s%s\r\n" % (
        status,
        REASONS.get(status, b"Unknown"),
        content_type,
        framing,
        extra,
    )


class Connection(asyncio.Protocol):
    """One client connection; also the response writer handed to the app."""

    def __init__(self, app: App, registry: set[Connection], extra_headers: bytes) -> None:
        self.app = app
        self.registry = registry
        self.extra = extra_headers
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.pending: deque[Request] = deque()
        self.task: asyncio.Task[None] | None = None
        self.closed = False
        self.finished = True  # the current response is complete
        self.head_sent = False  # a streamed response has started
        self._url = b""
        self._headers: dict[bytes, bytes] = {}
        self._body: list[bytes] = []

    # -- asyncio.Protocol ------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.registry.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.registry.discard(self)
        if self.task is not None:
            self.task.cancel()

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.send(
                400,
                b'{"error":{"message":"malformed HTTP request","type":"invalid_request_'
                b'error","param":null,"code":null}}',
                keep_alive=False,
            )
        except httptools.HttpParserUpgrade:
            self.send(
                400,
                b'{"error":{"message":"upgrade not supported","type":"invalid_request_'
                b'error","param":null,"code":null}}',
                keep_alive=False,
            )

    # -- httptools callbacks ---------------------------------------------------------------
    def on_message_begin(self) -> None:
        self._url, self._headers, self._body = b"", {}, []

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.lower()] = value

    def on_headers_complete(self) -> None:
        # curl sends "Expect: 100-continue" for larger bodies and waits a second without this.
        if self._headers.get(b"expect", b"").lower() == b"100-continue":
            self._write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        path, _, query = self._url.partition(b"?")
        req = Request(
            self.parser.get_method(),
            path,
            self._headers,
            b"".join(self._body),
            self.parser.should_keep_alive(),
            query,
        )
        if self.task is None and not self.pending:
            self._dispatch(req)
        else:
            self.pending.append(req)

    # -- dispatch ----------------------------------------------------------------------------
    def _dispatch(self, req: Request) -> None:
        while True:
            fast = self.app.handle_fast(req)
            if fast is None:
                self.task = asyncio.get_running_loop().create_task(self._run(req))
                return
            self._write(fast)
            if not req.keep_alive:
                self.close()
                return
            if not self.pending:
                return
            req = self.pending.popleft()

    async def _run(self, req: Request) -> None:
        self.finished = False
        self.head_sent = False
        try:
            await self.app.handle(req, self)
        except asyncio.CancelledError:
            pass
        except Exception:
            log.exception("simulator handler failed")
            if not self.closed and not self.finished and not self.head_sent:
                self.send(
                    500,
                    b'{"error":{"message":"internal simulator error","type":"server_'
                    b'error","param":null,"code":null}}',
                )
        self.task = None
        if self.closed:
            return
        if not self.finished or not req.keep_alive:
            self.close()
        elif self.pending:
            self._dispatch(self.pending.popleft())

    # -- response writing (used by the app) ---------------------------------------------------
    def _write(self, data: bytes) -> None:
        if not self.closed and self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def send(
        self,
        status: int,
        body: bytes,
        *,
        headers: bytes = b"",
        content_type: bytes = b"application/json",
        keep_alive: bool = True,
    ) -> None:
        """A complete response with a body."""
        extra = self.extra + headers + (b"" if keep_alive else b"connection: close\r\n")
        self._write(head(status, extra, content_type, len(body)) + body)
        self.finished = True
        if not keep_alive:
            self.close()

    def send_partial(self, status: int, body: bytes, sent: int) -> None:
        """Announce the full length but send only ``sent`` bytes, then close: a cut body."""
        self._write(head(status, self.extra, b"application/json", len(body)) + body[:sent])
        self.close()

    def send_head(
        self, status: int, length: int, content_type: bytes = b"application/json"
    ) -> None:
        """Status line and headers announcing ``length`` body bytes; the body is written later."""
        self.head_sent = True
        self._write(head(status, self.extra, content_type, length))

    def write_raw(self, data: bytes) -> None:
        """Body bytes of a response whose head was sent with ``send_head``."""
        self._write(data)

    def finish(self) -> None:
        """The body announced by ``send_head`` is complete."""
        self.finished = True

    def start_stream(self, status: int = 200, content_type: bytes = b"text/event-stream") -> None:
        self.head_sent = True
        self._write(head(status, self.extra + b"cache-control: no-cache\r\n", content_type, None))

    def write_chunk(self, data: bytes) -> None:
        if data:
            self._write(b"%x\r\n%s\r\n" % (len(data), data))

    def end_stream(self) -> None:
        self._write(b"0\r\n\r\n")
        self.finished = True

    def close(self) -> None:
        """Close after flushing what was written (a cut stream looks like this to the client)."""
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()


async def listen(
    app: App, host: str, port: int, registry: set[Connection], extra_headers: bytes = b""
) -> asyncio.Server:
    """Start accepting connections for ``app``."""
    loop = asyncio.get_running_loop()
    return await loop.create_server(
        lambda: Connection(app, registry, extra_headers),
        host,
        port,
        reuse_address=True,
        backlog=1024,
    )
