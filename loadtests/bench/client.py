"""One chat-completion request, timed: latency, time to first token, tokens, status.

aiohttp is used because on a 2-core machine it drove ~14.7k req/s against a trivial server where
httpx.AsyncClient drove ~400 req/s at 32 connections (1.7k at one): the generator must not be
the bottleneck it is measuring.
"""

from __future__ import annotations

import ipaddress
import math
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

import aiohttp
import orjson

NAN = math.nan


@dataclass(frozen=True, slots=True)
class Target:
    """An OpenAI-compatible base URL (``.../v1``) with the model and key to use there."""

    name: str
    url: str
    model: str = "default"
    api_key: str | None = None
    extra_headers: tuple[tuple[str, str], ...] = ()

    @property
    def endpoint(self) -> str:
        return self.url.rstrip("/") + "/chat/completions"

    def headers(self) -> dict[str, str]:
        h = {"Content-Type": "application/json"}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        h.update(self.extra_headers)
        return h


def parse_target(spec: str, model: str, api_key: str | None, index: int = 0) -> Target:
    """``"name=http://host/v1"`` or a bare URL (named ``t0``, ``t1``... by position)."""
    name, sep, url = spec.partition("=")
    if not sep or "://" in name:
        name, url = f"t{index}", spec
    return Target(name, url, model, api_key)


def check_url(url: str, allow_remote: bool) -> None:
    """Refuse anything but loopback unless remote targets were explicitly allowed."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {url!r}")
    if allow_remote:
        return
    host = parts.hostname
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if not loopback:
        raise ValueError(f"{url!r} is not loopback; pass --allow-remote to benchmark it")


@dataclass(slots=True)
class Sample:
    """One request. Times are absolute ``time.perf_counter()`` values; NaN when absent."""

    target: str
    tag: str
    scheduled: float  # when it should have left (open loop) or did leave (closed loop)
    sent: float  # when the generator actually started it
    first: float  # first content chunk of a stream
    end: float
    status: int  # HTTP status, 0 when no response
    error: str | None
    out_tokens: int
    in_tokens: int

    @property
    def latency(self) -> float:
        """From the scheduled time: a late send counts its lateness (no coordinated omission)."""
        return self.end - self.scheduled

    @property
    def service(self) -> float:
        return self.end - self.sent

    @property
    def ttft(self) -> float:
        return self.first - self.scheduled

    @property
    def lateness(self) -> float:
        return self.sent - self.scheduled

    def row(self, t0: float) -> dict[str, object]:
        """A JSON-ready record with times relative to ``t0``."""
        return {
            "target": self.target,
            "tag": self.tag,
            "scheduled": self.scheduled - t0,
            "lateness": self.lateness,
            "latency": self.latency,
            "ttft": None if math.isnan(self.first) else self.ttft,
            "status": self.status,
            "error": self.error,
            "out_tokens": self.out_tokens,
            "in_tokens": self.in_tokens,
        }


class Client:
    """A pooled aiohttp session; ``send`` runs one request and never raises."""

    def __init__(self, max_connections: int = 1024, timeout_s: float = 60.0) -> None:
        self.max_connections = max_connections
        self.timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=min(timeout_s, 10.0))
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Client:
        connector = aiohttp.TCPConnector(limit=self.max_connections, limit_per_host=0)
        self._session = aiohttp.ClientSession(connector=connector, timeout=self.timeout)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session:
            await self._session.close()

    async def send(
        self,
        target: Target,
        body: bytes,
        stream: bool,
        scheduled: float | None = None,
        tag: str = "",
    ) -> Sample:
        assert self._session is not None, "use 'async with Client()'"
        sent = time.perf_counter()
        s = Sample(
            target.name,
            tag,
            sent if scheduled is None else scheduled,
            sent,
            NAN,
            NAN,
            0,
            None,
            0,
            0,
        )
        try:
            async with self._session.post(
                target.endpoint, data=body, headers=target.headers()
            ) as resp:
                s.status = resp.status
                if resp.status >= 400:
                    await resp.read()
                    s.error = f"http {resp.status}"
                elif stream:
                    await _read_stream(resp, s)
                else:
                    _read_json(await resp.read(), s)
        except TimeoutError:
            s.error = "timeout"
        except aiohttp.ClientError as exc:
            s.error = type(exc).__name__
        except ValueError as exc:  # malformed JSON from the server
            s.error = f"bad response: {exc}"[:120]
        s.end = time.perf_counter()
        return s


def _read_json(raw: bytes, s: Sample) -> None:
    usage = orjson.loads(raw).get("usage") or {}
    s.out_tokens = int(usage.get("completion_tokens") or 0)
    s.in_tokens = int(usage.get("prompt_tokens") or 0)


async def _read_stream(resp: aiohttp.ClientResponse, s: Sample) -> None:
    """Consume SSE; the first chunk carrying content (text, reasoning or tool call) is TTFT."""
    chunks = 0
    done = False
    async for line in resp.content:
        # Read on to the end of the body after [DONE], as OpenAI's clients do: leaving early
        # would close the connection instead of returning it to the pool.
        if done or not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            done = True
            continue
        event = orjson.loads(data)
        if "error" in event:
            s.error = "error event in stream"
        for choice in event.get("choices") or ():
            delta = choice.get("delta") or {}
            if delta.get("content") or delta.get("reasoning_content") or delta.get("tool_calls"):
                if chunks == 0:
                    s.first = time.perf_counter()
                chunks += 1
        usage = event.get("usage")
        if usage:
            s.out_tokens = int(usage.get("completion_tokens") or 0)
            s.in_tokens = int(usage.get("prompt_tokens") or 0)
    if not s.out_tokens:
        s.out_tokens = chunks
    if not done and s.error is None:
        s.error = "stream ended without [DONE]"
