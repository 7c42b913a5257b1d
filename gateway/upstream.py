"""Talking to one provider: a pooled HTTP client, per-attempt timeouts, failure classification.

Each failure is raised as `UpstreamFailure` with a `kind` string (see `gateway.resilience.failures`)
so that retry, breaker and metrics code can decide without looking at exceptions from httpx.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import httpx

from gateway.policy.schema import Provider, Timeouts

# Response headers that are hop-by-hop or describe the upstream's framing, never forwarded.
_DROP_HEADERS = frozenset(
    {
        "content-length",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "content-encoding",
        "date",
        "server",
        "set-cookie",
    }
)


# A pooled keep-alive connection that the server closed meanwhile (its idle timeout raced our
# reuse) fails like this, before any response byte. The server never handled the request, so one
# immediate resend on a fresh connection is safe, and it says nothing about the provider's health.
_STALE_CONNECTION = (httpx.RemoteProtocolError, httpx.WriteError)


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
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


def forwardable_headers(headers: httpx.Headers) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() not in _DROP_HEADERS}


def _status_failure(resp_status: int, body: bytes, headers: httpx.Headers) -> UpstreamFailure:
    fwd = forwardable_headers(headers)
    if resp_status == 429:
        return UpstreamFailure(
            "rate_limited",
            "provider rate limited the request",
            status=429,
            body=body,
            headers=fwd,
            retry_after=parse_retry_after(headers.get("retry-after")),
        )
    kind = "upstream_5xx" if resp_status >= 500 else "upstream_4xx"
    return UpstreamFailure(
        kind, f"provider answered {resp_status}", status=resp_status, body=body, headers=fwd
    )


@dataclass(slots=True)
class UpstreamResponse:
    status: int
    headers: dict[str, str]
    body: bytes
    ttft_s: float


@dataclass(slots=True)
class UpstreamStream:
    """An open stream whose first chunk has already arrived (so a retry is still possible before)."""

    status: int
    headers: dict[str, str]
    first: bytes
    ttft_s: float
    _response: httpx.Response
    _iter: AsyncIterator[bytes]
    _deadline: float
    _idle_s: float
    closed: bool = field(default=False)

    async def chunks(self) -> AsyncIterator[bytes]:
        """The remaining raw chunks; raises UpstreamFailure(idle_timeout|total_timeout|stream_broken)."""
        it = self._iter
        try:
            while True:
                remaining = self._deadline - time.monotonic()
                if remaining <= 0:
                    raise UpstreamFailure("total_timeout", "stream exceeded the total time limit")
                try:
                    async with asyncio.timeout(min(self._idle_s, remaining)):
                        chunk = await it.__anext__()
                except StopAsyncIteration:
                    return
                except TimeoutError:
                    kind = "idle_timeout" if remaining > self._idle_s else "total_timeout"
                    raise UpstreamFailure(kind, "no stream data in time") from None
                except (httpx.HTTPError, OSError) as e:
                    raise UpstreamFailure("stream_broken", type(e).__name__) from None
                if chunk:
                    yield chunk
        finally:
            await self.aclose()

    async def aclose(self) -> None:
        if not self.closed:
            self.closed = True
            await self._response.aclose()


class UpstreamClient:
    """A pooled client for one provider. Created once per provider, reused across requests."""

    def __init__(self, name: str, config: Provider, api_key: str | None) -> None:
        self.name = name
        self.config = config
        self.stale_resends = 0
        t = config.timeouts
        limits = httpx.Limits(
            max_connections=config.max_inflight or 1000,
            max_keepalive_connections=min(config.max_inflight or 256, 256),
            keepalive_expiry=30.0,
        )
        headers = {"content-type": "application/json", **config.headers}
        if api_key:
            headers["authorization"] = f"Bearer {api_key}"
        self._client = httpx.AsyncClient(
            base_url=config.base_url.rstrip("/"),
            headers=headers,
            limits=limits,
            timeout=httpx.Timeout(
                connect=t.connect_s, read=t.first_byte_s, write=t.connect_s, pool=t.total_s
            ),
            http2=False,
            trust_env=False,
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    def _request(self, path: str, body: bytes, headers: dict[str, str] | None) -> httpx.Request:
        return self._client.build_request("POST", path, content=body, headers=headers)

    async def _send(self, req: httpx.Request, stream: bool) -> httpx.Response:
        """Send, resending once when a reused connection turns out to be closed."""
        try:
            return await self._client.send(req, stream=stream)
        except _STALE_CONNECTION:
            self.stale_resends += 1
            return await self._client.send(req, stream=stream)

    async def send(
        self, path: str, body: bytes, headers: dict[str, str] | None, timeouts: Timeouts
    ) -> UpstreamResponse:
        """A non-streaming call. The whole generation precedes the first byte, so total_s applies."""
        start = time.monotonic()
        req = self._request(path, body, headers)
        req.extensions["timeout"] = httpx.Timeout(
            connect=timeouts.connect_s,
            read=timeouts.total_s,
            write=timeouts.connect_s,
            pool=timeouts.total_s,
        ).as_dict()
        try:
            async with asyncio.timeout(timeouts.total_s):
                resp = await self._send(req, stream=False)
        except TimeoutError:
            raise UpstreamFailure("total_timeout", "no complete answer in time") from None
        except httpx.ConnectTimeout:
            raise UpstreamFailure("connect_timeout", "connect timed out") from None
        except httpx.TimeoutException:
            raise UpstreamFailure("total_timeout", "no complete answer in time") from None
        except (httpx.ConnectError, httpx.RemoteProtocolError, OSError) as e:
            raise UpstreamFailure("connect_error", type(e).__name__) from None
        except httpx.HTTPError as e:
            raise UpstreamFailure("connect_error", type(e).__name__) from None
        elapsed = time.monotonic() - start
        if resp.status_code >= 400:
            raise _status_failure(resp.status_code, resp.content, resp.headers)
        return UpstreamResponse(
            resp.status_code, forwardable_headers(resp.headers), resp.content, elapsed
        )

    async def open_stream(
        self, path: str, body: bytes, headers: dict[str, str] | None, timeouts: Timeouts
    ) -> UpstreamStream:
        """Open a stream and wait for its first chunk (bounded by first_byte_s)."""
        start = time.monotonic()
        deadline = start + timeouts.total_s
        req = self._request(path, body, headers)
        # The first chunk is bounded by first_byte_s (below) and later gaps by idle_s (in
        # UpstreamStream.chunks); the socket read limit must not cut either of them short.
        req.extensions["timeout"] = httpx.Timeout(
            connect=timeouts.connect_s,
            read=max(timeouts.idle_s, timeouts.first_byte_s),
            write=timeouts.connect_s,
            pool=timeouts.total_s,
        ).as_dict()
        resp: httpx.Response | None = None
        try:
            async with asyncio.timeout(min(timeouts.first_byte_s, timeouts.total_s)):
                resp = await self._send(req, stream=True)
                if resp.status_code >= 400:
                    content = await resp.aread()
                    await resp.aclose()
                    raise _status_failure(resp.status_code, content, resp.headers)
                it = resp.aiter_raw()
                first = b""
                while not first:
                    first = await it.__anext__()
        except UpstreamFailure:
            raise
        except TimeoutError:
            if resp is not None:
                await resp.aclose()
            raise UpstreamFailure("first_byte_timeout", "no first chunk in time") from None
        except httpx.ConnectTimeout:
            raise UpstreamFailure("connect_timeout", "connect timed out") from None
        except StopAsyncIteration:
            if resp is not None:
                await resp.aclose()
            raise UpstreamFailure("stream_broken", "stream ended before any data") from None
        except (httpx.ConnectError, OSError) as e:
            raise UpstreamFailure("connect_error", type(e).__name__) from None
        except httpx.HTTPError as e:
            if resp is not None:
                await resp.aclose()
                raise UpstreamFailure("stream_broken", type(e).__name__) from None
            raise UpstreamFailure("connect_error", type(e).__name__) from None
        return UpstreamStream(
            status=resp.status_code,
            headers=forwardable_headers(resp.headers),
            first=first,
            ttft_s=time.monotonic() - start,
            _response=resp,
            _iter=it,
            _deadline=deadline,
            _idle_s=timeouts.idle_s,
        )
