"""A stream's start sent in many small reads: checked in time linear in its size.

Before its first data event a provider may send comments and `retry:` fields, and the first
event itself may come in pieces. The start was checked whole on every read, so a flood of tiny
comments (or one long line in small pieces) cost time quadratic in its size: three such streams
held the event loop, and every other request, for seconds. The gateway runs on loopback in front
of a scripted upstream that writes its stream in 61-byte pieces (line ends cut anywhere, CRLF
included); the client is the official `openai` package. What the check is asked to read is
counted: at most a few times the stream's size.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator

import openai
import pytest

from tests.support import GatewayServer, ThreadedRawServer, sse_chunk

FLOOD = 96 * 1024  # bytes before the first data event (under the 1 MiB event limit)
PIECE = 61  # bytes per write: line ends and CRLFs are cut at every place


_END = sse_chunk({}, "stop") + b"data: [DONE]\n\n"
_LONG = "long " * (FLOOD // 5)

# Mode -> (the stream's bytes, the text the client must read; None: the attempt must fail).
STREAMS: dict[str, tuple[bytes, str | None]] = {
    "lf_comments": (
        b": keep-alive\n\n" * (FLOOD // 14) + sse_chunk({"content": "ok"}) + _END,
        "ok",
    ),
    "crlf_comments": (
        b": keep-alive\r\n\r\nretry: 10\r\n\r\n" * (FLOOD // 29)
        + sse_chunk({"content": "ok"})
        + _END,
        "ok",
    ),
    "cr_comments": (b":\r\r" * (FLOOD // 3) + sse_chunk({"content": "ok"}) + _END, "ok"),
    "long_first_event": (sse_chunk({"content": _LONG}) + _END, _LONG),
    "comments_then_done_first": (b":\n\n" * (FLOOD // 3) + b"data: [DONE]\n\n", None),
    "comments_then_error": (
        b":\n\n" * (FLOOD // 3) + b'data: {"error": {"message": "overloaded"}}\n\n',
        None,
    ),
}


class Upstream(ThreadedRawServer):
    """`/<mode>/v1/...` streams STREAMS[mode] in small pieces; `/good/v1/...` answers at once."""

    def url(self, mode: str) -> str:
        return f"http://127.0.0.1:{self.port}/{mode}/v1"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
            mode = head[0].split(" ")[1].split("/")[1]
            length = 0
            for line in head[1:]:
                if line.lower().startswith("content-length:"):
                    length = int(line.split(":", 1)[1])
            await reader.readexactly(length)
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n"
            )
            if mode == "good":
                writer.write(sse_chunk({"content": "good member"}) + _END)
            else:
                data = STREAMS[mode][0]
                for i in range(0, len(data), PIECE):
                    writer.write(data[i : i + PIECE])
                    await writer.drain()
                    if i % (PIECE * 8) == 0:
                        await asyncio.sleep(0.001)  # the gateway reads between writes
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()


def _policy(up: Upstream) -> str:
    lines = ["retry: {max_attempts: 2, base_backoff_ms: 0, max_backoff_ms: 0}", "providers:"]
    lines.append(f"  good: {{base_url: '{up.url('good')}'}}")
    pools = ["pools:", "  good: {members: [good]}"]
    models = ["models:"]
    for mode in STREAMS:
        lines.append(f"  {mode}: {{base_url: '{up.url(mode)}'}}")
        pools.append(f"  p_{mode}: {{members: [{mode}], max_attempts: 1, fallback: [good]}}")
        models.append(f"  {mode}: {{pool: p_{mode}}}")
    return "\n".join(lines + pools + models) + "\n"


@pytest.fixture(scope="module")
def gw() -> Iterator[GatewayServer]:
    with Upstream() as up, GatewayServer(_policy(up)) as g:
        yield g


def _count_scanned(gw: GatewayServer, provider: str) -> list[int]:
    """Bytes the provider's stream-start check was asked to read, call by call."""
    wire = gw.runtime.snapshot.providers[provider].client.adapter
    check: Callable[[bytes], bool] = type(wire).first_event_complete.__get__(wire)
    sizes: list[int] = []

    def counted(buf: bytes) -> bool:
        sizes.append(len(buf))
        return check(buf)

    wire.first_event_complete = counted
    return sizes


@pytest.mark.parametrize("mode", sorted(STREAMS))
def test_a_stream_start_in_small_pieces_is_checked_in_linear_time(
    gw: GatewayServer, mode: str
) -> None:
    data, want = STREAMS[mode]
    scanned = _count_scanned(gw, mode)
    client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0, timeout=30)
    raw = client.chat.completions.with_raw_response.create(
        model=mode, messages=[{"role": "user", "content": "hi"}], stream=True
    )
    text = "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
    # Its own answer, read whole, or (a first event that is no answer) another member's.
    assert text == (want if want is not None else "good member")
    assert raw.headers["x-gateway-provider"] == (mode if want is not None else "good")
    # Quadratic checking read tens of megabytes here (each read re-checked all before it).
    assert scanned, "the start was never checked"
    assert sum(scanned) < 4 * len(data), (len(scanned), sum(scanned), len(data))
