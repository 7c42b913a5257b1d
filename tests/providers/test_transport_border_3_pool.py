"""Pool hygiene at the upstream border: bytes a provider sends on an idle keep-alive connection.

Nothing was asked on a pooled connection, so whatever arrives there (a late duplicate answer, a
desynchronised proxy, a half-written head) must never be read as the answer to the next request
sent on it: that request may be another client's. The gateway runs on loopback in front of a
scripted keep-alive upstream; the client is the official `openai` package.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Iterator

import openai
import pytest

from tests.support import GatewayServer, ThreadedRawServer, completion_body, policy, sse_chunk


def _response(body: bytes, ctype: bytes = b"application/json") -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n%s" % (
        ctype,
        len(body),
        body,
    )


# What arrives on the idle connection after an answer.
UNSOLICITED = {
    # A whole forged answer: read as the next request's answer.
    "answer": _response(json.dumps(completion_body("FORGED")).encode()),
    # Half a head: the next answer's status line becomes a header value, its answer garbled.
    "half_head": b"HTTP/1.1 200 OK\r\nx-late: ",
    # Bytes that are no HTTP at all.
    "garbage": b"\x00\x01junk\r\n\r\n",
}


class KeepAliveUpstream(ThreadedRawServer):
    """Answers every request on a keep-alive connection with `answer-<n>` (n counts requests);
    after an answer, writes `self.late` on the same connection once the gateway is done with it."""

    def __init__(self) -> None:
        super().__init__()
        self.late = b""
        self.requests = 0
        self.connections = 0
        self.late_sent = threading.Event()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
                length = 0
                for line in head[1:]:
                    if line.lower().startswith("content-length:"):
                        length = int(line.split(":", 1)[1])
                request = json.loads(await reader.readexactly(length))
                self.requests += 1
                text = f"answer-{self.requests}"
                if request.get("stream"):
                    body = sse_chunk(text) + sse_chunk("", "stop") + b"data: [DONE]\n\n"
                    writer.write(_response(body, b"text/event-stream"))
                else:
                    writer.write(_response(json.dumps(completion_body(text)).encode()))
                await writer.drain()
                if self.late:
                    # After the gateway read the answer and pooled the connection.
                    await asyncio.sleep(0.1)
                    writer.write(self.late)
                    await writer.drain()
                    self.late_sent.set()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()


@pytest.fixture(scope="module")
def upstream() -> Iterator[KeepAliveUpstream]:
    with KeepAliveUpstream() as u:
        yield u


@pytest.fixture(scope="module")
def gw(upstream: KeepAliveUpstream) -> Iterator[GatewayServer]:
    # One member, one attempt: a garbled answer would be the client's error.
    text = policy({"up": upstream.url}, pool={"max_attempts": 1}, retry={"max_attempts": 1})
    with GatewayServer(text) as g:
        yield g


def _ask(client: openai.OpenAI, stream: bool) -> str:
    msgs = [{"role": "user", "content": "hi"}]
    if stream:
        chunks = client.chat.completions.create(model="chat", messages=msgs, stream=True)
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    answer = client.chat.completions.create(model="chat", messages=msgs)
    return answer.choices[0].message.content or ""


@pytest.mark.parametrize("first_stream", [False, True], ids=["after_unary", "after_stream"])
@pytest.mark.parametrize("late", sorted(UNSOLICITED))
def test_bytes_on_an_idle_pooled_connection_never_answer_the_next_request(
    gw: GatewayServer, upstream: KeepAliveUpstream, late: str, first_stream: bool
) -> None:
    client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0, timeout=20)
    upstream.late = UNSOLICITED[late]
    upstream.late_sent.clear()
    first = _ask(client, first_stream)
    assert first == f"answer-{upstream.requests}"
    assert upstream.late_sent.wait(5)
    upstream.late = b""
    conns = upstream.connections
    # The late bytes reached the gateway's idle connection a moment ago: the next request, to
    # the same member, is answered by its own answer, on a fresh connection.
    for stream in (False, True):
        assert _ask(client, stream) == f"answer-{upstream.requests}"
    assert upstream.connections == conns + 1


def test_a_quiet_pooled_connection_is_still_reused(
    gw: GatewayServer, upstream: KeepAliveUpstream
) -> None:
    client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0, timeout=20)
    upstream.late = b""
    _ask(client, False)
    conns = upstream.connections
    for stream in (False, True, False):
        assert _ask(client, stream) == f"answer-{upstream.requests}"
    assert upstream.connections == conns
