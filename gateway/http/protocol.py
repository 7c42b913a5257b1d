"""uvicorn's httptools protocol, hardened against slow and idle clients.

- Header timeout: a request's headers must arrive within `server.header_timeout_s` of its first
  byte (or of the connection opening); otherwise 408 (partial headers) or a plain close.
- Body timeout: the body must arrive within `server.body_timeout_s` after the headers; otherwise
  408 when no response has started, and the connection is closed. The app sees a disconnect.
- Keep-alive timeout: `server.keepalive_timeout_s`.
- Connection cap: at most `server.max_connections` client connections per worker, and never more
  than half the process's open-file limit; a new connection beyond it closes the connections that
  have been idle longest (no request in progress), and is itself closed when none is idle.

Also one fix for clients that reset their connections: uvicorn (0.54) cancels a connection's
keep-alive timer only when the connection closed cleanly; after a reset the timer kept the
protocol object, its parser and the last request's state alive until it fired. Cancelling it on
every loss frees it at once.

Limits are module state set by `configure_connections` (from the policy, in each worker process,
and again on every reload).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway.context import READ_TIMEOUT_KEY

log = logging.getLogger("gateway.http")

# Scope key set when the body timeout fired: the pipeline then records a 408, not a 499.


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    keepalive_timeout_s: float = 5.0
    max_connections: int = 4096


_limits = ConnectionLimits()
_cap = 4096


def open_file_limit() -> int | None:
    with contextlib.suppress(ValueError, OSError):
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY:
            return int(soft)
    return None


def configure_connections(server: Any) -> ConnectionLimits:
    """Apply the policy's `server:` settings to new and idle connections of this process."""
    global _limits, _cap
    _limits = ConnectionLimits(
        header_timeout_s=server.header_timeout_s,
        body_timeout_s=server.body_timeout_s,
        keepalive_timeout_s=server.keepalive_timeout_s,
        max_connections=server.max_connections,
    )
    files = open_file_limit()
    # Half the descriptors stay for upstream connections, Redis and files.
    _cap = min(_limits.max_connections, max(8, files // 2)) if files else _limits.max_connections
    return _limits


def connection_cap() -> int:
    return _cap


_408 = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
    b"connection: close\r\ncontent-length: %d\r\n\r\n%s"
)
_408_BODY = (
    b'{"error":{"message":"The request was not received in time.",'
    b'"type":"invalid_request_error","param":null,"code":"request_timeout"}}'
)


class GatewayHttpProtocol(HttpToolsProtocol):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._read_timer: asyncio.TimerHandle | None = None
        self._idle_since = 0.0
        self._request_bytes = False  # bytes of a not-yet-complete request head were received
        self._reading_body = False
        self._timer_kind: str | None = None
        self._idle_wait = False  # the header timer armed at connection start (no bytes yet)

    # -- timers ---------------------------------------------------------------------------------

    def _arm(self, delay: float, callback: Any, kind: str) -> None:
        self._disarm()
        self._read_timer = self.loop.call_later(delay, callback)
        self._timer_kind = kind

    def _disarm(self) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None
        self._timer_kind = None

    def _idle(self) -> bool:
        """No request being handled: waiting for (or reading) the next request's head."""
        return (self.cycle is None or self.cycle.response_complete) and not self.pipeline

    def _header_timeout(self) -> None:
        self._read_timer = self._timer_kind = None
        if self.transport.is_closing():
            return
        if self._request_bytes:
            self.transport.write(_408 % (len(_408_BODY), _408_BODY))
        self.transport.close()

    def _body_timeout(self) -> None:
        self._read_timer = self._timer_kind = None
        cycle = self.cycle
        if self.transport.is_closing() or cycle is None:
            return
        cycle.scope[READ_TIMEOUT_KEY] = True  # type: ignore[literal-required]
        if not cycle.response_started:
            self.transport.write(_408 % (len(_408_BODY), _408_BODY))
            cycle.response_started = cycle.response_complete = True
        cycle.disconnected = True
        cycle.message_event.set()
        self.transport.close()

    # -- protocol -------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        limits = _limits
        self.timeout_keep_alive = limits.keepalive_timeout_s  # type: ignore[assignment]
        self._idle_since = self.loop.time()
        self._arm(limits.header_timeout_s, self._header_timeout, "header")
        self._idle_wait = True
        if len(self.connections) > _cap:
            self._make_room()

    def _make_room(self) -> None:
        """Over the cap: close the longest-idle connections; this one when none is idle."""
        excess = len(self.connections) - _cap
        idle = sorted(
            (c for c in self.connections if c is not self and isinstance(c, GatewayHttpProtocol)),
            key=lambda c: c._idle_since,
        )
        for c in idle:
            if excess <= 0:
                break
            if c._idle() and not c.transport.is_closing():
                c._disarm()
                c.transport.close()
                excess -= 1
        if excess > 0:
            log.warning("connection cap (%d) reached with every connection busy", _cap)
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self._disarm()
        unset = getattr(self, "_unset_keepalive_if_required", None)  # absent in other versions
        if unset is not None:
            unset()

    def data_received(self, data: bytes) -> None:
        if not self._request_bytes and not self._reading_body and self._idle():
            # First bytes of a new request on a kept-alive connection: its head must follow soon.
            self._request_bytes = True
        super().data_received(data)
        # Timers only for what is still incomplete after this read: a small request usually
        # arrives whole in one read and then needs none (no timer armed and cancelled per request).
        if self._reading_body:
            if self._timer_kind != "body":
                self._arm(_limits.body_timeout_s, self._body_timeout, "body")
        elif self._request_bytes:
            if self._read_timer is None:
                self._arm(_limits.header_timeout_s, self._header_timeout, "header")
        elif self._timer_kind is not None and not self._idle_wait:
            self._disarm()

    def on_headers_complete(self) -> None:
        self._request_bytes = False
        self._reading_body = True
        self._idle_wait = False
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._reading_body = False
        super().on_message_complete()

    def on_response_complete(self) -> None:
        self._idle_since = self.loop.time()
        super().on_response_complete()
