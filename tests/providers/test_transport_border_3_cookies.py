"""A provider's cookies are never kept, so never sent back with a later request.

The pooled client kept a cookie jar: a `set-cookie` in one answer (a load balancer's affinity
cookie, a bot-check cookie, a hostile proxy's) went back upstream with every later request to
that host, whichever client or tenant made it, and the jar grew with every new name. The
upstream here is reached as `localhost` (cookies of IP-address hosts were never kept), sets new
cookies on each answer (unary, streamed, an error) and records every request's head. The
client is the official `openai` package.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator

import openai
import pytest

from tests.support import GatewayServer, ThreadedRawServer, completion_body, policy, sse_chunk


class CookieUpstream(ThreadedRawServer):
    """Answers on keep-alive connections, each answer setting cookies of new names; the first
    request whose last user message says `fail` gets a 500 (with cookies too)."""

    def __init__(self) -> None:
        super().__init__()
        self.heads: list[str] = []

    @property
    def url(self) -> str:
        return f"http://localhost:{self.port}/v1"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
                self.heads.append(head)
                length = 0
                for line in head.split("\r\n")[1:]:
                    if line.lower().startswith("content-length:"):
                        length = int(line.split(":", 1)[1])
                request = json.loads(await reader.readexactly(length))
                n = len(self.heads)
                cookies = (
                    f"set-cookie: affinity{n}=node-{n}; Path=/; Max-Age=3600\r\n"
                    f"set-cookie: session=s{n}; Domain=localhost; Path=/v1; HttpOnly\r\n"
                ).encode()
                if request["messages"][-1]["content"] == "fail":
                    status, ctype = b"500 E", b"application/json"
                    body = b'{"error": {"message": "overloaded", "type": "server_error"}}'
                elif request.get("stream"):
                    status, ctype = b"200 OK", b"text/event-stream"
                    body = sse_chunk("streamed") + sse_chunk("", "stop") + b"data: [DONE]\n\n"
                else:
                    status, ctype = b"200 OK", b"application/json"
                    body = json.dumps(completion_body("answered")).encode()
                writer.write(
                    b"HTTP/1.1 %s\r\ncontent-type: %s\r\ncontent-length: %d\r\n%s\r\n%s"
                    % (status, ctype, len(body), cookies, body)
                )
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()


@pytest.fixture(scope="module")
def upstream() -> Iterator[CookieUpstream]:
    with CookieUpstream() as u:
        yield u


@pytest.fixture(scope="module")
def gw(upstream: CookieUpstream) -> Iterator[GatewayServer]:
    text = policy({"up": upstream.url}, pool={"max_attempts": 1}, retry={"max_attempts": 1})
    with GatewayServer(text) as g:
        yield g


def test_cookies_a_provider_sets_never_go_back_upstream(
    gw: GatewayServer, upstream: CookieUpstream
) -> None:
    client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0, timeout=20)
    sent = len(upstream.heads)
    for say, stream in [("hi", False), ("hi", True), ("fail", False), ("hi", False)] * 2:
        msgs = [{"role": "user", "content": say}]
        if say == "fail":
            with pytest.raises(openai.APIStatusError):
                client.chat.completions.create(model="chat", messages=msgs)
        elif stream:
            chunks = client.chat.completions.create(model="chat", messages=msgs, stream=True)
            assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        else:
            assert client.chat.completions.create(model="chat", messages=msgs).choices
    heads = upstream.heads[sent:]
    assert len(heads) == 8
    for head in heads:
        names = {line.split(":", 1)[0].lower() for line in head.split("\r\n")[1:] if line}
        assert "cookie" not in names, head
