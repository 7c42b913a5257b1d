"""Talking to one provider: a pooled HTTP client, per-attempt timeouts, failure classification.

Each failure is raised as `UpstreamFailure` with a `kind` string (see `gateway.resilience.failures`)
so that retry, breaker and metrics code can decide without looking at exceptions from the HTTP
library.

The client is aiohttp: under concurrency its connection pool costs a fraction of httpx's per
request (httpx/httpcore walks every pooled connection, with a socket check each, on every request;
measured: ~400 req/s with httpx vs thousands with aiohttp at 32 concurrent connections on 2 cores).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import re
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, cast

import aiohttp
import yarl
from aiohttp.client_proto import ResponseHandler
from aiohttp.http_exceptions import HttpProcessingError

from gateway.policy.schema import Provider, Timeouts
from gateway.resilience import failures
from gateway.wire.answer_checks import (
    InvalidAnswer,
    commits,
    first_event_complete,
    is_event_stream,
)
from gateway.wire.sse import EventTooLarge, SSESplitter

# Response headers are never forwarded wholesale: a provider or its proxy adds organisation ids,
# internal host names, cookies, CORS and `www-authenticate` headers. The gateway sets its own
# content type and request id; `x-ratelimit-*` passes only where the provider's policy says so.
_RATELIMIT_PREFIX = "x-ratelimit-"
# A provider answering 400/422 that it does not know the (mapped) model: the member's fault.
_MODEL_NOT_FOUND = re.compile(rb"(?i)model_not_found|model\W[^.]{0,120}?(does not exist|not found)")
# 4xx statuses that say the provider (or a proxy before it) failed for now, not that the request
# is wrong: 408 Request Timeout, 409 Conflict, 425 Too Early (what the OpenAI SDKs retry too).
# Another member, or the same one later, answers the same request: retried, never relayed.
TRANSIENT_4XX = frozenset({408, 409, 425})
# Kept pooled connections are closed after this long unused.
KEEPALIVE_S = 30.0

# Interim (1xx) answers accepted before a final one: a provider sends one or two (Go's client
# allows 5 too).
MAX_INTERIM = 5

# Set by the connector when the current task's request got a pooled (reused) connection.
_reused: contextvars.ContextVar[bool] = contextvars.ContextVar("upstream_reused", default=False)


class UpstreamFailure(Exception):
    """One failed attempt. `status`/`body` are set when the provider answered with an error."""

    def __init__(
        self,
        kind: str,
        detail: str = "",
        *,
        status: int | None = None,
        body: bytes = b"",
        headers: dict[str, str] | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(f"{kind}: {detail}" if detail else kind)
        self.kind = kind
        self.detail = detail
        self.status = status
        self.body = body
        self.headers = headers or {}
        self.retry_after = retry_after


def parse_retry_after(value: str | None) -> float | None:
    """A provider's Retry-After in seconds: finite, bounded, never negative (or None)."""
    return failures.parse_retry_after(value)


# What a rate-limit header holds: a count, a duration (`6m0s`, `20ms`, `1.5`) or a timestamp. A
# value of any other form (text quoting a key, a debug blob) is not forwarded.
_RATELIMIT_VALUE = re.compile(
    r"(?:\d{1,19}(?:\.\d{1,9})?(?:ms|s|m|h|d)?)+"
    r"|\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d{1,9})?(?:Z|[+-]\d{2}:\d{2})?"
)
_MAX_RATELIMIT_HEADERS = 16


def forwardable_headers(headers: Mapping[str, str], ratelimit: bool = False) -> dict[str, str]:
    """The upstream headers a client may see: `x-ratelimit-*` when allowed, nothing else, and
    only values shaped like counts, durations or times (at most 16 of them)."""
    if not ratelimit:
        return {}
    out: dict[str, str] = {}
    for k, v in headers.items():
        k = k.lower()
        if k.startswith(_RATELIMIT_PREFIX) and len(v) <= 64 and _RATELIMIT_VALUE.fullmatch(v):
            out[k] = v
            if len(out) >= _MAX_RATELIMIT_HEADERS:
                break
    return out


def _status_failure(
    resp_status: int, body: bytes, headers: Mapping[str, str], ratelimit: bool = False
) -> UpstreamFailure:
    fwd = forwardable_headers(headers, ratelimit)
    if resp_status == 429:
        return UpstreamFailure(
            "rate_limited",
            "provider rate limited the request",
            status=429,
            body=body,
            headers=fwd,
            retry_after=parse_retry_after(headers.get("retry-after")),
        )
    if failures.member_caused(resp_status) or (
        resp_status in (400, 422) and _MODEL_NOT_FOUND.search(body[:4096])
    ):
        # The gateway's own key was refused, or the mapped model or path does not exist there:
        # another member may answer, the client's request is not at fault.
        return UpstreamFailure(
            "upstream_auth", f"provider answered {resp_status}", status=resp_status, body=body
        )
    kind = "upstream_5xx" if resp_status >= 500 or resp_status in TRANSIENT_4XX else "upstream_4xx"
    return UpstreamFailure(
        kind, f"provider answered {resp_status}", status=resp_status, body=body, headers=fwd
    )


async def _read_bounded(
    resp: aiohttp.ClientResponse, limit: int, gap_s: float | None = None
) -> bytes:
    """The whole (decompressed) body, or UpstreamFailure(bad_response) past ``limit`` bytes;
    TimeoutError when ``gap_s`` passes with no data.

    aiohttp inflates a compressed body chunk by chunk under flow control, so stopping here keeps
    a compression bomb from ever being held whole.
    """
    declared = resp.content_length
    if declared is not None and declared > limit:
        raise UpstreamFailure("bad_response", f"answer larger than {limit} bytes")
    parts: list[bytes] = []
    size = 0
    content = resp.content
    while not content.at_eof():
        # What is already buffered needs no wait (a small answer usually is, whole): no timer.
        chunk = content.read_nowait()
        if not chunk:
            if gap_s is None:
                chunk = await content.readany()
            else:
                async with asyncio.timeout(gap_s):
                    chunk = await content.readany()
            if not chunk:
                break
        size += len(chunk)
        if size > limit:
            raise UpstreamFailure("bad_response", f"answer larger than {limit} bytes")
        parts.append(chunk)
    exc = content.exception()
    if exc is not None:
        raise exc
    return parts[0] if len(parts) == 1 else b"".join(parts)


class _Protocol(ResponseHandler):
    """A connection that is closed when bytes arrive while it waits in the pool.

    Nothing was asked on an idle connection, so whatever arrives there (a late or duplicated
    answer, a desynchronised proxy) would be read as the answer to the next request sent on it,
    another caller's, perhaps another tenant's. Go's client does the same ("Unsolicited response
    received on idle HTTP channel").
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop)
        self.idle = False  # waiting in the pool, no request on it
        self.interim = 0  # 1xx answers since the last final one

    def data_received(self, data: bytes) -> None:
        if self.idle and data:
            transport = self.transport
            if transport is not None:
                transport.close()  # not connected any more: the pool discards it
            return
        super().data_received(data)

    def feed_data(self, data: Any, size: int = 0) -> None:
        """One parsed answer head (and its body reader) for the waiting request.

        Interim answers (100 Continue, 103 Early Hints) are skipped by the reader one by one, so
        an endless stream of them was parsed and queued until the attempt's time ran out (a
        few hundred MB held for a single request): past MAX_INTERIM the answer is broken.
        """
        code = data[0].code
        if 100 <= code < 200 and code != 101:
            self.interim += 1
            if self.interim > MAX_INTERIM:
                if self.interim == MAX_INTERIM + 1:
                    self.set_exception(
                        HttpProcessingError(message=f"more than {MAX_INTERIM} 1xx answers")
                    )
                    transport = self.transport
                    if transport is not None:
                        transport.close()
                return
        else:
            self.interim = 0
        super().feed_data(data, size)


class _Connector(aiohttp.TCPConnector):
    """Notes whether a request got a pooled connection, for the stale keep-alive retry, and
    never hands out a pooled connection that received bytes while idle (see _Protocol)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # aiohttp builds every connection's protocol with this factory.
        self._factory = cast(
            "functools.partial[ResponseHandler]", functools.partial(_Protocol, loop=self._loop)
        )

    async def _get(self, *args: Any, **kwargs: Any) -> Any:
        conn = await super()._get(*args, **kwargs)
        if conn is not None:
            _reused.set(True)
            protocol = conn.protocol
            if isinstance(protocol, _Protocol):
                protocol.idle = False
        return conn

    def _release(self, key: Any, protocol: Any, *, should_close: bool = False) -> None:
        super()._release(key, protocol, should_close=should_close)
        if isinstance(protocol, _Protocol) and protocol.is_connected():
            protocol.idle = True  # pooled (a closed one is never handed out again)


def _stale(e: BaseException) -> bool:
    """A reused connection the provider had closed: it never read the request, so resend once.

    The same rule as Go's HTTP client: only on a pooled connection, and only when it ended
    before any byte of the response (a disconnect or a reset on write).
    """
    if not _reused.get():
        return False
    if isinstance(e, aiohttp.ServerDisconnectedError):
        return True
    return isinstance(e, aiohttp.ClientOSError) and not isinstance(e, aiohttp.ClientConnectorError)


@dataclass(slots=True)
class UpstreamResponse:
    status: int
    headers: dict[str, str]
    body: bytes
    ttft_s: float


@dataclass(slots=True)
class UpstreamStream:
    """An open stream whose first chunk with part of the answer has already arrived (`first`:
    every byte up to it), so a retry was still possible before."""

    status: int
    headers: dict[str, str]
    first: bytes
    ttft_s: float
    _response: aiohttp.ClientResponse
    _deadline: float
    _idle_s: float
    closed: bool = field(default=False)
    _release: Callable[[], None] | None = None  # gives the client's pool back (once)
    # The adapter's stream mapping (provider events -> OpenAI chunks); None: relayed as they are.
    _translate: Callable[[bytes], bytes] | None = None

    async def chunks(self) -> AsyncIterator[bytes]:
        """The remaining raw chunks; raises UpstreamFailure(idle_timeout|total_timeout|stream_broken)."""
        content = self._response.content
        try:
            while True:
                remaining = self._deadline - time.monotonic()
                if remaining <= 0:
                    raise UpstreamFailure("total_timeout", "stream exceeded the total time limit")
                try:
                    chunk = content.read_nowait(-1)  # whatever already arrived, without a timer
                    if not chunk and not content.at_eof():
                        async with asyncio.timeout(min(self._idle_s, remaining)):
                            chunk = await content.readany()
                except TimeoutError:
                    kind = "idle_timeout" if remaining > self._idle_s else "total_timeout"
                    raise UpstreamFailure(kind, "no stream data in time") from None
                except (aiohttp.ClientError, OSError) as e:
                    # aiohttp keeps the error on the response: its frames would hold ours.
                    e.__traceback__ = None
                    raise UpstreamFailure("stream_broken", type(e).__name__) from None
                if not chunk:
                    if content.at_eof():
                        self._check_complete()
                        return
                    continue
                if self._translate is not None:
                    chunk = self._translate(chunk)
                    if not chunk:
                        continue
                yield chunk
        finally:
            await self.aclose()

    def _check_complete(self) -> None:
        """EOF before the declared end (a cut chunked body) is a broken stream, not an end."""
        exc = self._response.content.exception()
        if exc is not None:
            raise UpstreamFailure("stream_broken", type(exc).__name__)

    async def aclose(self) -> None:
        if not self.closed:
            self.closed = True
            if self._response.content.at_eof():
                self._response.release()  # the connection goes back to the pool
            else:
                self._response.close()
            release, self._release = self._release, None
            if release is not None:
                release()


class OpenAIWire:
    """The transport's view of a provider: auth and session headers, error classification and
    the stream-start check, for OpenAI's wire format (a bearer key, SSE, OpenAI errors).

    Provider adapters (gateway.providers.base.Adapter) extend it with request, answer and stream
    mapping and override what their wire format does differently.
    """

    # Speaks OpenAI as it is: the dispatcher relays requests and answers without mapping.
    passthrough: ClassVar[bool] = True

    def __init__(self, config: Provider, api_key: str | None) -> None:
        self.config = config
        self.api_key = api_key

    def session_headers(self) -> dict[str, str]:
        """Headers on every request: content type, the policy's `headers`, then auth (the
        provider key wins over a header of the same name)."""
        return {"content-type": "application/json", **self.config.headers, **self.auth_headers()}

    def auth_headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def failure(
        self, status: int, body: bytes, headers: Mapping[str, str], ratelimit: bool
    ) -> UpstreamFailure:
        """A provider's error status as an attempt failure (body in OpenAI's error shape)."""
        return _status_failure(status, body, headers, ratelimit)

    def is_stream(self, content_type: str | None) -> bool:
        return is_event_stream(content_type)

    def first_event_complete(self, buf: bytes) -> bool:
        """Whether `buf` holds the stream's first complete event; raises InvalidAnswer."""
        return first_event_complete(buf)


class UpstreamClient:
    """A pooled client for one provider. Created once per provider, reused across requests.

    The aiohttp session belongs to an event loop, so it is created on first use in the running
    loop (the policy and this client may be built before the server's loop starts).

    Its lifetime follows the requests using it: every call (and every open stream) holds a
    reference; a client a reload replaced is `retire`d and its connection pool closes when the
    last reference is given back, never under a request still using it, however many reloads
    come in between.
    """

    def __init__(
        self,
        name: str,
        config: Provider,
        api_key: str | None,
        adapter: OpenAIWire | None = None,
    ) -> None:
        self.name = name
        self.config = config
        self._base = config.base_url.rstrip("/")
        self.stale_resends = 0  # requests re-sent because a pooled connection had been closed
        # The provider type's adapter (runtime passes the one of config.type): auth headers,
        # error mapping, stream checks, and (in the dispatcher) request, answer and stream mapping.
        self.adapter: Any = adapter if adapter is not None else OpenAIWire(config, api_key)
        self._wire: OpenAIWire = self.adapter
        self._headers = self.adapter.session_headers()
        # Paths the adapter percent-encoded itself (and signed as such) are sent as they are.
        self._encoded = bool(getattr(self.adapter, "encoded_paths", False))
        self._limits = config.limits
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timeouts: tuple[Timeouts, aiohttp.ClientTimeout] | None = None
        self.users = 0  # calls and open streams holding the connection pool
        self.retired = False
        self._closing: set[asyncio.Task[None]] = set()

    def _hold(self) -> None:
        self.users += 1

    def _give_back(self) -> None:
        self.users -= 1
        if self.users <= 0 and self.retired:
            self._close_soon()

    def retire(self) -> None:
        """No new request will choose this client: close its pool once the last user is done."""
        self.retired = True
        if self.users <= 0:
            self._close_soon()

    @property
    def open(self) -> bool:
        """A connection pool exists and is not closed."""
        return self._session is not None and not self._session.closed

    def _close_soon(self) -> None:
        if self._session is None or self._session.closed:
            return
        with contextlib.suppress(RuntimeError):  # no running loop: Runtime.aclose closes it
            task = asyncio.get_running_loop().create_task(self.aclose())
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    def _client(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        session = self._session
        if session is None or self._loop is not loop or session.closed:
            connector = _Connector(
                limit=self.config.max_inflight or 0,  # 0: no limit (admission control caps it)
                limit_per_host=0,
                keepalive_timeout=KEEPALIVE_S,
                ttl_dns_cache=60,
            )
            session = aiohttp.ClientSession(
                headers=self._headers,
                connector=connector,
                timeout=aiohttp.ClientTimeout(total=None),
                trust_env=False,
                skip_auto_headers=("User-Agent",),
                # A provider's (or its proxy's) cookies are never kept: sent back, they would tie
                # every later request, whoever's, to what one answer set, and a jar of them grows
                # without bound.
                cookie_jar=aiohttp.DummyCookieJar(),
                auto_decompress=True,
                raise_for_status=False,
            )
            self._session, self._loop = session, loop
        return session

    def _client_timeout(self, t: Timeouts) -> aiohttp.ClientTimeout:
        """Connect limit only: first-byte, idle and total limits are enforced around the calls."""
        cached = self._timeouts
        if cached is not None and cached[0] is t:
            return cached[1]
        ct = aiohttp.ClientTimeout(total=None, sock_connect=t.connect_s)
        self._timeouts = (t, ct)
        return ct

    async def aclose(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None

    async def _post(
        self, path: str, body: bytes, headers: dict[str, str] | None, timeouts: Timeouts
    ) -> aiohttp.ClientResponse:
        """POST, resending once on a stale pooled connection; raises aiohttp/OS errors, or
        UpstreamFailure(bad_response) for a final status under 200."""
        session = self._client()
        url: str | yarl.URL = self._base + path
        if self._encoded:
            url = yarl.URL(url, encoded=True)
        timeout = self._client_timeout(timeouts)
        for attempt in (0, 1):
            _reused.set(False)
            try:
                resp = await session.post(
                    url, data=body, headers=headers, timeout=timeout, allow_redirects=False
                )
            except (aiohttp.ClientError, OSError) as e:
                if attempt or not _stale(e):
                    raise
                self.stale_resends += 1
                continue
            if resp.status < 200:
                # No HTTP status (0-99: the parser takes any three digits) or a protocol switch
                # nobody asked for (101): not an answer, whatever its body holds.
                resp.close()
                raise UpstreamFailure(
                    "bad_response", f"provider answered {resp.status}", status=resp.status
                )
            return resp
        raise AssertionError("unreachable")

    async def send(
        self,
        path: str,
        body: bytes,
        headers: dict[str, str] | None,
        timeouts: Timeouts,
        max_tokens: int | None = None,
    ) -> UpstreamResponse:
        """A non-streaming call.

        The whole generation precedes the headers, so they are due within
        `timeouts.unary_headers_s(max_tokens)` (first_byte_timeout); the body then arrives with
        gaps under idle_s and is complete by that limit or idle_s after the headers, whichever
        is later (idle_timeout: a stall or a slow trickle); total_s bounds the whole.
        """
        self._hold()
        try:
            return await self._send(path, body, headers, timeouts, max_tokens)
        finally:
            self._give_back()

    async def _send(
        self,
        path: str,
        body: bytes,
        headers: dict[str, str] | None,
        timeouts: Timeouts,
        max_tokens: int | None,
    ) -> UpstreamResponse:
        start = time.monotonic()
        head_s = timeouts.unary_headers_s(max_tokens)
        try:
            async with asyncio.timeout(head_s):
                resp = await self._post(path, body, headers, timeouts)
        except aiohttp.ConnectionTimeoutError:
            raise UpstreamFailure("connect_timeout", "connect timed out") from None
        except TimeoutError:
            kind = "first_byte_timeout" if head_s < timeouts.total_s else "total_timeout"
            raise UpstreamFailure(kind, "no answer headers in time") from None
        except aiohttp.ClientResponseError as e:
            # The provider answered, but not in HTTP (a bad status line, broken headers): its
            # answer is what failed, not the connection.
            e.__traceback__ = None
            raise UpstreamFailure("bad_response", type(e).__name__) from None
        except (aiohttp.ClientError, OSError) as e:
            e.__traceback__ = None
            raise UpstreamFailure("connect_error", type(e).__name__) from None
        # The answer is ready upstream once its headers are here: its body comes in gaps under
        # idle_s, complete by the headers' own limit or idle_s after them, whichever is later
        # (a stall or a slow trickle fails over in seconds).
        total_end = start + timeouts.total_s
        end = min(total_end, max(start + head_s, time.monotonic() + timeouts.idle_s))
        ok = False
        limit = self._limits.max_response_bytes
        try:
            if resp.status < 300 and resp.content.is_eof():
                # The whole answer arrived with its headers (usual for small ones): no timer.
                content = await _read_bounded(resp, limit, None)
            else:
                async with asyncio.timeout(max(0.0, end - time.monotonic())):
                    if resp.status >= 300:
                        content = await _read_error(resp)
                    else:
                        content = await _read_bounded(resp, limit, timeouts.idle_s)
            ok = True
        except TimeoutError:
            kind = "total_timeout" if time.monotonic() >= total_end - 0.001 else "idle_timeout"
            raise UpstreamFailure(kind, "answer body not complete in time") from None
        except aiohttp.ClientPayloadError as e:
            # A body that does not match its framing (a short Content-Length, broken gzip or
            # chunks): the answer is broken, whatever happened to the connection.
            e.__traceback__ = None
            raise UpstreamFailure("bad_response", type(e).__name__) from None
        except (aiohttp.ClientError, OSError) as e:
            e.__traceback__ = None
            raise UpstreamFailure("connect_error", type(e).__name__) from None
        finally:
            if ok:
                resp.release()
            else:
                resp.close()  # an unread rest must not go back to the pool
        elapsed = time.monotonic() - start
        if resp.status >= 300:
            raise self._failure(resp.status, content, resp.headers)
        return UpstreamResponse(resp.status, self._forward(resp.headers), content, elapsed)

    def _forward(self, headers: Mapping[str, str]) -> dict[str, str]:
        return forwardable_headers(headers, self.config.forward_ratelimit_headers)

    def _failure(self, status: int, body: bytes, headers: Mapping[str, str]) -> UpstreamFailure:
        if status < 400:  # a redirect (never followed) or another non-answer
            return UpstreamFailure("bad_response", f"provider answered {status}", status=status)
        return self._wire.failure(status, body, headers, self.config.forward_ratelimit_headers)

    async def open_stream(
        self,
        path: str,
        body: bytes,
        headers: dict[str, str] | None,
        timeouts: Timeouts,
        translate: Callable[[bytes], bytes] | None = None,
    ) -> UpstreamStream:
        """Open a stream and wait for its first complete event (bounded by first_byte_s), then
        for its first event with part of the answer (`commits`: not a role-only chunk).

        Until then nothing was sent to the client, so an answer that is no event stream (HTML, a
        JSON body, an error event, a stream that ends or stalls first) is an attempt failure that
        can still be retried on another member.
        """
        self._hold()
        try:
            stream = await self._open_stream(path, body, headers, timeouts, translate)
        except BaseException:
            self._give_back()
            raise
        stream._release = self._give_back  # held until the stream is closed
        return stream

    async def _open_stream(
        self,
        path: str,
        body: bytes,
        headers: dict[str, str] | None,
        timeouts: Timeouts,
        translate: Callable[[bytes], bytes] | None,
    ) -> UpstreamStream:
        start = time.monotonic()
        deadline = start + timeouts.total_s
        resp: aiohttp.ClientResponse | None = None
        try:
            async with asyncio.timeout(min(timeouts.first_byte_s, timeouts.total_s)):
                resp = await self._post(path, body, headers, timeouts)
                if resp.status >= 300:
                    try:
                        content = await _read_error(resp)
                    finally:
                        resp.close()
                    raise self._failure(resp.status, content, resp.headers)
                if not self._wire.is_stream(resp.headers.get("content-type")):
                    raise UpstreamFailure("bad_response", "answer to a stream is not an SSE stream")
                first = await self._first_event(resp)
            # Nothing goes to the client before an event with part of the answer: a role-only
            # chunk and then a stall still fails over (gaps bounded by idle_s, as later ones).
            first = await self._until_answer(resp, first, translate, deadline, timeouts.idle_s)
        except (UpstreamFailure, InvalidAnswer, EventTooLarge) as e:
            if resp is not None:
                resp.close()
            if not isinstance(e, UpstreamFailure):
                raise UpstreamFailure("bad_response", str(e)) from None
            raise
        except aiohttp.ConnectionTimeoutError:
            raise UpstreamFailure("connect_timeout", "connect timed out") from None
        except TimeoutError:
            if resp is not None:
                resp.close()
            raise UpstreamFailure("first_byte_timeout", "no first chunk in time") from None
        except aiohttp.ClientResponseError as e:
            # The provider answered, but not in HTTP (a bad status line, broken or oversized
            # headers): its answer failed, not the connection (as for a unary call).
            e.__traceback__ = None
            if resp is not None:
                resp.close()
            raise UpstreamFailure("bad_response", type(e).__name__) from None
        except (aiohttp.ClientError, OSError) as e:
            e.__traceback__ = None
            if resp is not None:
                resp.close()
                raise UpstreamFailure("stream_broken", type(e).__name__) from None
            raise UpstreamFailure("connect_error", type(e).__name__) from None
        except BaseException:
            if resp is not None:  # cancelled (client gone, hedge lost): free the connection
                resp.close()
            raise
        return UpstreamStream(
            status=resp.status,
            headers=self._forward(resp.headers),
            first=first,
            ttft_s=time.monotonic() - start,
            _response=resp,
            _deadline=deadline,
            _idle_s=timeouts.idle_s,
            _translate=translate,
        )

    async def _until_answer(
        self,
        resp: aiohttp.ClientResponse,
        raw: bytes,
        translate: Callable[[bytes], bytes] | None,
        deadline: float,
        idle_s: float,
    ) -> bytes:
        """The stream's (translated) bytes up to and including its first event that `commits`;
        raises UpstreamFailure when the stream stalls, ends or errs before it."""
        limit = self._limits.max_event_bytes
        splitter = SSESplitter(limit)
        content = resp.content
        out = translate(raw) if translate is not None else raw
        parts, size = [out], len(out)
        while True:
            for ev in splitter.feed(out):
                if commits(ev):
                    return parts[0] if len(parts) == 1 else b"".join(parts)
            if size > limit:
                raise UpstreamFailure("bad_response", f"no answer in the first {limit} bytes")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise UpstreamFailure("total_timeout", "stream exceeded the total time limit")
            try:
                async with asyncio.timeout(min(idle_s, remaining)):
                    chunk = await content.readany()
            except TimeoutError:
                kind = "idle_timeout" if remaining > idle_s else "total_timeout"
                raise UpstreamFailure(kind, "no answer in the stream in time") from None
            if not chunk:
                if content.at_eof():
                    raise UpstreamFailure("bad_response", "stream ended before any answer")
                continue
            out = translate(chunk) if translate is not None else chunk
            parts.append(out)
            size += len(out)

    async def _first_event(self, resp: aiohttp.ClientResponse) -> bytes:
        """Bytes up to (at least) the first complete data event; raises UpstreamFailure."""
        limit = self._limits.max_event_bytes
        # In an SSE stream an event ends only at a line end, and whole events without data
        # (comments, `retry:` fields) need checking once: each check sees only the bytes after
        # them, and only when a line end came. Checking everything on every read made a flood of
        # tiny comments (or a long line sent in small pieces) cost time quadratic in its size,
        # stalling every other request for seconds.
        sse = is_event_stream(resp.headers.get("content-type"))
        parts: list[bytes] = []
        size = 0
        rest = b""  # SSE: the bytes after the whole data-less events already checked
        while True:
            chunk = await resp.content.readany()
            if not chunk:
                if resp.content.at_eof():
                    raise UpstreamFailure("bad_response", "stream ended before its first event")
                continue
            parts.append(chunk)
            size += len(chunk)
            if sse:
                rest += chunk
            # Without a line end no SSE event completed.
            if not sse or b"\n" in chunk or b"\r" in chunk:
                try:
                    if self._wire.first_event_complete(rest if sse else b"".join(parts)):
                        return parts[0] if len(parts) == 1 else b"".join(parts)
                except InvalidAnswer as e:
                    raise UpstreamFailure("bad_response", str(e)) from None
                if sse:
                    rest = rest[_events_end(rest) :]
            if size > limit:
                raise UpstreamFailure("bad_response", f"stream event larger than {limit} bytes")


def _events_end(buf: bytes) -> int:
    """Where the last whole event of an SSE stream's bytes ends (0: none), at a point where
    cutting keeps the rest's reading: the blank line ends in LF, or in a CR followed by a byte
    that is not LF (a CR last might be half a CRLF)."""
    end = 0
    for pattern in (b"\n\n", b"\n\r\n"):
        i = buf.rfind(pattern)
        if i >= 0:
            end = max(end, i + len(pattern))
    for pattern in (b"\r\r", b"\n\r"):
        i = buf.rfind(pattern, 0, len(buf) - 1)
        if i >= 0 and buf[i + 2] != 0x0A:
            end = max(end, i + 2)
    return end


# Error bodies are read only for their message: the rest is never needed.
_ERROR_BODY_LIMIT = 64 * 1024


async def _read_error(resp: aiohttp.ClientResponse) -> bytes:
    parts: list[bytes] = []
    size = 0
    while size < _ERROR_BODY_LIMIT:
        chunk = await resp.content.readany()
        if not chunk:
            break
        parts.append(chunk)
        size += len(chunk)
    return b"".join(parts)[:_ERROR_BODY_LIMIT]
