"""uvicorn's httptools protocol, hardened against slow and idle clients.

- Header timeout: a request's headers must arrive within `server.header_timeout_s` of its first
  byte (or of the connection opening); otherwise 408 (partial headers) or a plain close.
- Body timeout: the body must arrive within `server.body_timeout_s` after the headers; otherwise
  the app reads a disconnect (READ_TIMEOUT_KEY set in the scope) and answers the 408 itself, in
  its API's shape, with its request id and its access-log line; the connection then closes. An app
  that has not answered within LATE_ANSWER_S gets a plain 408 written for it.
- Head size: the request line and headers may take at most MAX_HEAD_BYTES (64 KiB, as h11);
  beyond that 431, and the connection is closed before more is buffered.
- Keep-alive timeout: `server.keepalive_timeout_s`.
- Connection cap: at most `server.max_connections` client connections per worker, and never more
  than half the process's open-file limit; a new connection beyond it closes the connections that
  have been idle longest (no request in progress), and is itself closed when none is idle.

- A body the parser refuses (a malformed chunk, trailer fields beyond MAX_HEAD_BYTES) is raised
  to the app's read as a GatewayError (400, 431): answered in its API's shape, recorded once.
- A bad request pipelined behind good ones is answered after them (they were lost).
- A client that half-closes after a complete request still gets its answer (see eof_received).

Also one fix for clients that reset their connections: uvicorn (0.54) cancels a connection's
keep-alive timer only when the connection closed cleanly; after a reset the timer kept the
protocol object, its parser and the last request's state alive until it fired. Cancelling it on
every loss frees it at once.

Limits are module state set by `configure_connections` (from the policy, in each worker process,
and again on every reload). What the protocol answers itself (431, a 408 for a head that never
ended, 400 for an unparsable request) is recorded through the app's RECORD_KEY hook, found in the
lifespan state: one access-log line and one metrics count, like every request.
"""

from __future__ import annotations

import asyncio
import contextlib
import http
import logging
import resource
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import httptools
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from gateway.apis.messages import anthropic_error, owns_path
from gateway.context import READ_TIMEOUT_KEY, REFUSED_KEY
from gateway.errors import GatewayError

if TYPE_CHECKING:
    from uvicorn._types import ASGIReceiveEvent

log = logging.getLogger("gateway.http")

# Largest request head (request line and headers), as h11's default: a larger one gets a 431.
MAX_HEAD_BYTES = 64 * 1024
# How long the app has to answer a body timeout's 408 itself before a plain one is written.
LATE_ANSWER_S = 1.0
# Lifespan-state key of the app's hook that records a request the protocol answered itself:
# called with (status, path), returns the request id it was recorded under.
RECORD_KEY = "gateway.record_refused"
# Scope key of a callable the app sets while a request waits for its answer: called when the
# client's connection is lost before the response completed.
GONE_KEY = "gateway.client_gone"
RecordRefused = Callable[[int, str], str]


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


_TIMEOUT = ("The request was not received in time.", "request_timeout")
_DISCONNECT: ASGIReceiveEvent = {"type": "http.disconnect"}


def _path_of(url: bytes) -> str:
    """The path of a (possibly partial) request target, for the error's shape and the log."""
    path = url.split(b"?", 1)[0][:1024].decode("latin-1")
    return path if path.startswith("/") else ""


def error_response(
    status: int, path: str, message: str, code: str, request_id: str | None = None
) -> bytes:
    """A whole error response that closes the connection, in the shape of the path's API."""
    if owns_path(path):
        _, body = anthropic_error(status, message)
    else:
        body = GatewayError(status, message, code=code).to_bytes()
    head = b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\nconnection: close\r\n" % (
        status,
        http.HTTPStatus(status).phrase.encode(),
    )
    if request_id:
        head += b"x-request-id: %s\r\n" % request_id.encode()
    return head + b"content-length: %d\r\n\r\n%s" % (len(body), body)


class _Cycle(RequestResponseCycle):
    """uvicorn's request cycle, except that once the body timeout fired the app reads a
    disconnect while its answer can still be sent (uvicorn's own disconnect drops it), and that
    a body the parser refused (a malformed chunk, trailers too large) is a GatewayError raised
    to the app's read: the app answers it in its API's shape and records it once."""

    async def receive(self) -> ASGIReceiveEvent:
        refused = self.scope.get(REFUSED_KEY)  # type: ignore[call-overload]
        if refused is None:
            message = await super().receive()
            refused = self.scope.get(REFUSED_KEY)  # type: ignore[call-overload]
            if refused is None:
                if READ_TIMEOUT_KEY in self.scope:
                    return _DISCONNECT
                return message
        status, text, code = cast("tuple[int, str, str]", refused)
        raise GatewayError(status, text, code=code)


class _Cycle10(_Cycle):
    """An HTTP/1.0 request's cycle. HTTP/1.0 has no chunked encoding, yet uvicorn sent an answer
    without a length (a stream) chunked, which an HTTP/1.0 client reads as part of the body
    (chunk sizes inside the events). Such an answer is sent as is instead, and ends with the
    connection, as HTTP/1.0 defines (its connection closes after the answer anyway)."""

    close_delimited = False

    async def send(self, message: Any) -> None:
        kind = message["type"]
        if kind == "http.response.start" and not self.response_started:
            status = message["status"]
            names = {name.lower() for name, _ in message.get("headers", ())}
            if (
                status >= 200
                and status not in (204, 304)
                and self.scope["method"] != "HEAD"
                and b"content-length" not in names
                and b"transfer-encoding" not in names
            ):
                self.close_delimited = True
                self.chunked_encoding = False  # uvicorn then writes no transfer-encoding
                self.expected_content_length = 1 << 62  # whatever comes, up to the last part
        elif (
            kind == "http.response.body"
            and self.close_delimited
            and not message.get("more_body", False)
        ):
            self.expected_content_length = len(message.get("body", b""))
        await super().send(message)


class GatewayHttpProtocol(HttpToolsProtocol):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._read_timer: asyncio.TimerHandle | None = None
        self._idle_since = 0.0
        self._request_bytes = False  # bytes of a not-yet-complete request head were received
        self._reading_body = False
        self._timer_kind: str | None = None
        self._idle_wait = False  # the header timer armed at connection start (no bytes yet)
        self._head_open = False  # a request head began and has not ended
        self._head_bytes = 0  # bytes of that head received in earlier reads
        self._heads = 0  # request heads begun on this connection
        self._read_len = 0  # bytes of the read being parsed
        self._head_too_large = False
        self._trailers_too_large = False
        self._trailer_bytes = 0  # trailer fields of the request being read
        self._running: RequestResponseCycle | None = None  # the request being answered
        self._refused = False  # a refusal was decided: nothing more is read or parsed
        # A refusal waiting for the requests before it to be answered: (status, path, message,
        # code), answered once the connection is idle.
        self._deferred: tuple[int, str, str, str] | None = None
        self._eof = False  # the client half-closed (or closed) its side
        self._liveness: asyncio.TimerHandle | None = None
        self._liveness_checks = 0
        # The head of a request that asked for a protocol upgrade, rebuilt without the request
        # (the gateway upgrades to nothing: the request is served over HTTP/1.1).
        self._plain_head: bytes | None = None
        # Chunked framing without data: bytes of whole reads in a body that brought no body byte
        # (chunk lines, extensions, trailers), and where in the chunks the parser is.
        self._framing_bytes = 0
        self._body_progress = False  # this read brought body bytes
        self._chunk_open = False  # a chunk header was read and its chunk has not ended
        self._chunk_data = False  # ... and it had data (the last chunk has none: trailers)

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
        if self.transport.is_closing() or self._refused:
            return
        if self._request_bytes:
            self._refuse(408, *_TIMEOUT)
        else:
            self.transport.close()

    def _refuse(self, status: int, message: str, code: str) -> None:
        """Answer a request that never reached the app (its head too large, too slow,
        unparsable or cut short), recorded through the app's hook, and close the connection.
        Behind requests still being answered (pipelined), it waits for them: they are answered
        first, then it (closing the connection under them lost complete requests)."""
        self._disarm()
        self._refused = True
        # The refused request's target, once its head began (else `url` is an earlier one's).
        path = _path_of(self.url) if self._head_open else ""
        if not self._idle():
            self._deferred = (status, path, message, code)
            return
        self._answer_refusal(status, path, message, code)

    def _answer_refusal(self, status: int, path: str, message: str, code: str) -> None:
        self._deferred = None
        if self.transport.is_closing():
            return
        request_id = self._record(status, path)
        self.transport.write(error_response(status, path, message, code, request_id))
        self.transport.close()

    def _record(self, status: int, path: str) -> str | None:
        """Record a request the app never saw, through the app's hook: its request id."""
        record: RecordRefused | None = self.app_state.get(RECORD_KEY)
        if record is not None:
            try:
                return record(status, path)
            except Exception as exc:  # noqa: BLE001 - an answer must still go out
                log.exception("recording a refused request failed", exc_info=exc)
        return None

    def _body_timeout(self) -> None:
        self._read_timer = self._timer_kind = None
        cycle = self.cycle
        if self.transport.is_closing() or cycle is None:
            return
        cycle.scope[READ_TIMEOUT_KEY] = True  # type: ignore[literal-required]
        if cycle.response_started or not isinstance(cycle, _Cycle):
            self._late_answer()
            return
        # The app reads a disconnect now and answers the 408 (read_body); then the connection
        # closes (keep_alive off). Nothing read after this counts.
        cycle.keep_alive = False
        self._reading_body = False
        cycle.message_event.set()
        self._arm(LATE_ANSWER_S, self._late_answer, "late")

    def _late_answer(self) -> None:
        """The plain 408 for an app that did not answer in time, then close."""
        self._read_timer = self._timer_kind = None
        cycle = self.cycle
        if self.transport.is_closing() or cycle is None:
            return
        if not cycle.response_started:
            path = cycle.scope.get("path", "")
            self.transport.write(error_response(408, path, *_TIMEOUT))
            cycle.response_started = cycle.response_complete = True
        cycle.disconnected = True
        cycle.message_event.set()
        self.transport.close()

    def send_400_response(self, msg: str) -> None:
        """An unparsable request: uvicorn answers it in plain text, unrecorded; here in the
        API's shape, recorded. Also where a head (or trailers) found too large ends up.

        In a body (a malformed chunk, trailers too large) the request's app is already running
        (or queued behind a pipelined one): its next read raises the error (REFUSED_KEY), so it
        answers in its API's shape with its request id and records the request once (closing
        the connection recorded a 499 and answered nothing)."""
        cycle = self.cycle
        if self._refused:
            return
        if self._head_open or cycle is None:
            if self._head_too_large:
                self._refuse_head()
            else:
                self._refuse(400, msg, "invalid_http_request")
            return
        if self._trailers_too_large:
            refusal = (
                431,
                f"The request's trailer fields are larger than {MAX_HEAD_BYTES} bytes.",
                "request_header_fields_too_large",
            )
        else:
            refusal = (
                400,
                "The request body is not valid HTTP/1.1 (malformed chunked encoding).",
                "invalid_http_request",
            )
        self._disarm()
        self._refused = True
        self._reading_body = False
        if cycle.response_complete or cycle.response_started:
            # Answered already (without reading its body): nothing more can be said.
            cycle.keep_alive = False
            if cycle.response_complete and self._idle():
                self.transport.close()
            return
        cycle.scope[REFUSED_KEY] = refusal  # type: ignore[literal-required]
        cycle.keep_alive = False
        cycle.message_event.set()

    def _refuse_head(self) -> None:
        self._refuse(
            431,
            f"The request line and headers are larger than {MAX_HEAD_BYTES} bytes.",
            "request_header_fields_too_large",
        )

    def _head_size(self) -> int:
        """The parsed head's size (request line and header lines; line ends counted as CRLF)."""
        return len(self.url) + 16 + sum(len(n) + len(v) + 4 for n, v in self.headers)

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

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        self._running = cycle  # with pipelining, `self.cycle` may be a request still queued
        super()._start_asgi_task(cycle, app)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._head_open and not self._refused and exc is not None:
            # Reset inside a request's head: recorded as the 400 a closed one is answered
            # (eof_received), not lost without a line.
            self._refused = True
            self._record(400, _path_of(self.url))
        cycles = {id(c): c for c in (self._running, self.cycle) if c is not None}
        for cycle in cycles.values():
            if not cycle.response_complete:
                # uvicorn marks only the last request read; the one being answered (pipelined)
                # was not, so its app's silent end was taken for a bug: an error logged and a
                # 500 written to the closed transport (an exception in its task).
                cycle.disconnected = True
                cycle.message_event.set()
        super().connection_lost(exc)
        self._disarm()
        self._stop_liveness()
        self._deferred = None
        for cycle in cycles.values():
            if not cycle.response_complete:
                # The app's hook for a client gone while its request waits (gateway.http.server):
                # called here, so no task per request has to listen for the disconnect.
                gone = cycle.scope.get(GONE_KEY)  # type: ignore[call-overload]
                if callable(gone):
                    gone()
        unset = getattr(self, "_unset_keepalive_if_required", None)  # absent in other versions
        if unset is not None:
            unset()

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # refused: the rest of the connection is not read (and never buffered)
        if not self._request_bytes and not self._reading_body and self._idle():
            # First bytes of a new request on a kept-alive connection: its head must follow soon.
            self._request_bytes = True
        in_head, in_body, heads = self._head_open, self._reading_body, self._heads
        self._read_len = len(data)
        self._body_progress = False
        self._feed(data)
        if self.transport.is_closing() or self._refused:
            return  # answered (an unparsable request), refused or closed
        if in_body and self._reading_body:
            # Reads that bring no body byte can only be chunk lines, extensions or trailers: the
            # parser reads them without a bound (a trailer line of 100 MB was buffered and
            # copied over and over, quadratic), so they are bounded like a head.
            if self._body_progress:
                self._framing_bytes = 0
            else:
                self._framing_bytes += len(data)
                if self._framing_bytes > MAX_HEAD_BYTES:
                    self._trailers_too_large = self._chunk_open and not self._chunk_data
                    self.send_400_response("chunked framing too large")
                    return
        if self._head_open:
            # A head is still incomplete after this read: count its bytes, whole reads only (a
            # head ends in the read that completes it, so a complete request costs nothing).
            if self._heads == heads:
                self._head_bytes += len(data)
            elif self._heads == heads + 1 and not in_head and not in_body:
                self._head_bytes = len(data)  # it began this read
            # Else it began after another request in this read: counted from the next read on.
            if self._head_bytes > MAX_HEAD_BYTES:
                self._refuse_head()
                return
        if self._timer_kind == "late":
            return  # a body timeout's 408 is being answered
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

    def on_message_begin(self) -> None:
        self._head_open = True
        self._head_bytes = 0
        self._trailer_bytes = 0
        self._framing_bytes = 0
        self._chunk_open = self._chunk_data = False
        self._heads += 1
        super().on_message_begin()

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._head_open:
            super().on_header(name, value)
            return
        # A trailer field (after a chunked body): nothing here reads them, so they are dropped,
        # not kept with the request's headers (200 MiB of trailers were), and bounded like a head.
        self._trailer_bytes += len(name) + len(value) + 4
        if self._trailer_bytes > MAX_HEAD_BYTES:
            self._trailers_too_large = True
            raise ValueError("request trailers too large")

    def _feed(self, data: bytes) -> None:
        """uvicorn's data_received, and a request asking for an upgrade served as a plain one."""
        self._unset_keepalive_if_required()
        while True:
            try:
                self.parser.feed_data(data)
            except httptools.HttpParserError:
                self.send_400_response("Invalid HTTP request received.")
            except httptools.HttpParserUpgrade as exc:
                rest = self._without_upgrade(data, exc)
                if rest is not None:
                    data = rest
                    continue
            return

    def _without_upgrade(self, data: bytes, exc: Exception) -> bytes | None:
        """The parser stopped at a request asking for an upgrade (`Upgrade` with `Connection:
        upgrade`, e.g. WebSocket, h2c): what follows its head would be the new protocol, so a
        body was lost (the request ran empty) and a WebSocket handshake went to uvicorn's
        WebSocket layer (a bare 403, unrecorded). The gateway upgrades to nothing; as HTTP
        allows, the request is served as a plain one: a new parser reads its head without the
        upgrade, then the rest of the read (returned, to be fed)."""
        head, self._plain_head = self._plain_head, None
        offset = exc.args[0] if exc.args and isinstance(exc.args[0], int) else None
        if head is None or offset is None:
            self._refuse(400, "Protocol upgrades and CONNECT are not supported.", "unsupported")
            return None
        self.parser = httptools.HttpRequestParser(self)
        with contextlib.suppress(AttributeError):
            self.parser.set_dangerous_leniencies(lenient_data_after_close=True)
        return head + data[offset:]

    def _head_without_upgrade(self) -> bytes | None:
        """The request's head without `Upgrade` (and its `Connection` token); None for CONNECT."""
        method = self.parser.get_method()
        if method == b"CONNECT":
            return None
        version = self.parser.get_http_version().encode()
        lines = [b"%s %s HTTP/%s\r\n" % (method, self.url, version)]
        for name, value in self.headers:
            if name in (b"upgrade", b"http2-settings"):
                continue
            if name == b"connection":
                tokens = [t.strip() for t in value.split(b",")]
                tokens = [
                    t for t in tokens if t and t.lower() not in (b"upgrade", b"http2-settings")
                ]
                if not tokens:
                    continue
                value = b", ".join(tokens)
            lines.append(b"%s: %s\r\n" % (name, value))
        return b"".join(lines) + b"\r\n"

    def on_headers_complete(self) -> None:
        # A head that ended in a read larger than what it had left may be over the limit: its
        # exact size then (rare: a read that size is a large body arriving with its head).
        if (
            self._head_bytes + self._read_len > MAX_HEAD_BYTES
            and self._head_size() > MAX_HEAD_BYTES
        ):
            self._head_too_large = True
            # Stops the parser: uvicorn answers through send_400_response, the 431 here.
            raise ValueError("request head too large")
        if self.parser.should_upgrade():
            # Not served from this parse: the parser stops after this head (_feed).
            self._plain_head = self._head_without_upgrade()
            return
        self._request_bytes = False
        self._reading_body = True
        self._idle_wait = False
        self._head_open = False
        super().on_headers_complete()
        cycle = self.cycle
        if type(cycle) is RequestResponseCycle:
            # Same object, the body-timeout aware receive (no allocation, no reference cycle).
            cycle.__class__ = _Cycle10 if self.scope.get("http_version") == "1.0" else _Cycle

    def on_chunk_header(self) -> None:
        self._chunk_open, self._chunk_data = True, False

    def on_chunk_complete(self) -> None:
        self._chunk_open = False

    def on_body(self, body: bytes) -> None:
        self._body_progress = self._chunk_data = True
        super().on_body(body)

    def on_message_complete(self) -> None:
        if self._plain_head is not None:
            return  # the end of a head asking for an upgrade: served from its plain parse
        self._reading_body = False
        super().on_message_complete()

    def on_response_complete(self) -> None:
        self._idle_since = self.loop.time()
        super().on_response_complete()
        if self._idle():
            self._stop_liveness()
            deferred = self._deferred
            if deferred is not None:
                self._unset_keepalive_if_required()
                self._answer_refusal(*deferred)
            elif self._eof and not self.transport.is_closing():
                self.transport.close()
        elif self._eof:
            # The next pipelined request of a half-closed connection: watched in its turn.
            self._stop_liveness()
            self._liveness_checks = 0
            self._check_liveness(probe=True)

    # -- a client that half-closes --------------------------------------------------------------

    def eof_received(self) -> bool | None:  # type: ignore[override]
        """The client shut its sending side. A complete request still gets its answer (a client
        may half-close after its request, as `nc -N` and some proxies do); an incomplete one
        cannot complete: a partial head is answered 400 (recorded), a partial body is the
        client gone (the app reads a disconnect: 499), and an idle connection closes.

        A client that closed its socket altogether sends the same end of file. While the
        answer has not begun, an interim `100 Continue` (which HTTP/1.1 clients skip) goes
        out: a socket closed altogether answers it with a reset, seen in the TCP state, and
        the request is then cancelled as a client gone (499), as before."""
        if self._eof:
            return True if not self.transport.is_closing() else None
        self._eof = True
        if self._refused:
            return None if self._idle() else True  # what was refused is still answered
        if self._reading_body:
            return None  # cut short: the app reads a disconnect
        if self._head_open:
            self._refuse(
                400,
                "The connection ended before the request head was complete.",
                "incomplete_request",
            )
            return True if self._deferred is not None else None
        if self._idle():
            return None
        if _tcp_state(self.transport) is None:
            return None  # no way to tell a half-close from a client gone: treated as gone
        self.cycle.keep_alive = False  # the last request read: the connection closes after it
        self._check_liveness(probe=True)
        return True

    def _check_liveness(self, probe: bool = False) -> None:
        """After a half-close: a reset client is gone (abort: connection_lost records the 499);
        one still there gets an interim response now and then (a reset answers it if it left)."""
        self._liveness = None
        if self.transport.is_closing() or self._idle():
            return
        running = self._running
        if running is None or running.response_started:
            return  # an answer is being written: a client gone fails its writes
        if running.scope.get("http_version") == "1.0":
            return  # no interim response to an HTTP/1.0 client: a client gone is seen when answered
        n = self._liveness_checks
        if not probe:
            if _tcp_state(self.transport) == _TCP_CLOSE:
                self.transport.abort()
                return
            # Past the first checks: a probe every PROBE_EVERY_S, its reset looked for soon after.
            probe = n >= len(_LIVENESS_DELAYS) and (n - len(_LIVENESS_DELAYS)) % 2 == 0
        if probe:
            self.transport.write(_PROBE)
        self._liveness_checks = n + 1
        if n < len(_LIVENESS_DELAYS):
            delay = _LIVENESS_DELAYS[n]
        else:
            delay = _RESET_WAIT_S if probe else PROBE_EVERY_S - _RESET_WAIT_S
        self._liveness = self.loop.call_later(delay, self._check_liveness)

    def _stop_liveness(self) -> None:
        if self._liveness is not None:
            self._liveness.cancel()
            self._liveness = None


_TCP_CLOSE = 7  # Linux's TCP_CLOSE: the connection was reset
_PROBE = b"HTTP/1.1 100 Continue\r\n\r\n"
# When a half-closed connection's TCP state is looked at again (seconds): soon after the first
# probe (a reset comes back within a round trip); then a probe every PROBE_EVERY_S while the
# answer is awaited, each looked after _RESET_WAIT_S later (a client that half-closed and left
# later is noticed within about a second).
_LIVENESS_DELAYS = (0.01, 0.05, 0.25, 0.7)
PROBE_EVERY_S = 1.0
_RESET_WAIT_S = 0.05


def _tcp_state(transport: asyncio.BaseTransport) -> int | None:
    """The connection's TCP state (Linux's TCP_INFO), or None where it cannot be read."""
    sock = transport.get_extra_info("socket")
    tcp_info = getattr(socket, "TCP_INFO", None)
    if sock is None or tcp_info is None:
        return None
    try:
        return int(sock.getsockopt(socket.IPPROTO_TCP, tcp_info, 8)[0])
    except (OSError, TypeError, ValueError, IndexError):
        return None


class GatewayH11Protocol(H11Protocol):
    """uvicorn's h11 protocol (`--http h11`), answering what it cannot parse like the httptools
    one: a 400 in the API's error shape, recorded through the app's hook (one access-log line,
    one metrics count). uvicorn's own answer was a bare text/plain line that nothing recorded."""

    def send_400_response(self, msg: str) -> None:
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            # A malformed body: the running request is recorded when it ends (as 499).
            super().send_400_response(msg)
            return
        # The refused request's target is unknown once h11 gave up on its head: OpenAI's shape.
        record: RecordRefused | None = self.app_state.get(RECORD_KEY)
        request_id = None
        if record is not None:
            try:
                request_id = record(400, "")
            except Exception as exc:  # noqa: BLE001 - an answer must still go out
                log.exception("recording a refused request failed", exc_info=exc)
        if not self.transport.is_closing():
            self.transport.write(error_response(400, "", _INVALID[0], _INVALID[1], request_id))
            self.transport.close()


_INVALID = ("Invalid HTTP request received.", "invalid_http_request")
