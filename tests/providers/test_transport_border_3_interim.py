"""Interim (1xx) answers from a provider: a few are skipped, an endless run is a broken answer.

HTTP lets a server send interim answers (100 Continue, 103 Early Hints, any 1xx but 101) before
its final one. The reader skipped them one by one without a bound, so a provider sending them
without end held the attempt until its time ran out while every parsed one was queued (a few
hundred MB for one request). Past a handful (Go's client allows 5) the attempt now fails as a
`bad_response` at once and another member answers. Gateway on loopback, scripted raw upstream,
the official `openai` client.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Iterator

import openai
import pytest

from tests.support import GatewayServer, ThreadedRawServer, completion_body, poll, sse_chunk

INTERIM = {
    "continue": b"HTTP/1.1 100 Continue\r\n\r\n",
    "hints": b"HTTP/1.1 103 Early Hints\r\nlink: </style.css>; rel=preload\r\n\r\n",
    "unnamed": b"HTTP/1.1 150 Whatever\r\nx-a: b\r\n\r\n",
}


def _final(stream: bool, text: str) -> bytes:
    if stream:
        body, ctype = (
            sse_chunk(text) + sse_chunk("", "stop") + b"data: [DONE]\n\n",
            b"text/event-stream",
        )
    else:
        body, ctype = json.dumps(completion_body(text)).encode(), b"application/json"
    return b"HTTP/1.1 200 OK\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n%s" % (
        ctype,
        len(body),
        body,
    )


class Upstream(ThreadedRawServer):
    """`/few-<kind>/v1`: three interim answers of that kind, then the answer (keep-alive);
    `/flood-<kind>/v1`: interim answers without end; `/good/v1`: the answer at once."""

    def url(self, mode: str) -> str:
        return f"http://127.0.0.1:{self.port}/{mode}/v1"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
                mode = head[0].split(" ")[1].split("/")[1]
                length = 0
                for line in head[1:]:
                    if line.lower().startswith("content-length:"):
                        length = int(line.split(":", 1)[1])
                stream = bool(json.loads(await reader.readexactly(length)).get("stream"))
                how, _, kind = mode.partition("-")
                if how == "flood":
                    block = INTERIM[kind] * 500
                    while True:  # until the gateway hangs up
                        writer.write(block)
                        await writer.drain()
                if how == "few":
                    writer.write(INTERIM[kind] * 3)
                writer.write(_final(stream, mode))
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()


MODES = [f"{how}-{kind}" for how in ("few", "flood") for kind in sorted(INTERIM)]


def _policy(up: Upstream) -> str:
    lines = ["retry: {max_attempts: 2, base_backoff_ms: 0, max_backoff_ms: 0}", "providers:"]
    lines.append(f"  good: {{base_url: '{up.url('good')}'}}")
    pools = ["pools:", "  good: {members: [good]}"]
    models = ["models:"]
    for mode in MODES:
        name = mode.replace("-", "_")
        lines.append(
            f"  {name}: {{base_url: '{up.url(mode)}', "
            "timeouts: {connect_s: 2, first_byte_s: 8, idle_s: 8, total_s: 8}}"
        )
        pools.append(f"  p_{name}: {{members: [{name}], max_attempts: 1, fallback: [good]}}")
        models.append(f"  {name}: {{pool: p_{name}}}")
    return "\n".join(lines + pools + models) + "\n"


@pytest.fixture(scope="module")
def gw() -> Iterator[GatewayServer]:
    with Upstream() as up, GatewayServer(_policy(up)) as g:
        yield g


def _ask(gw: GatewayServer, model: str, stream: bool) -> tuple[str, str]:
    """The answer's text and the provider that gave it."""
    client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0, timeout=30)
    msgs = [{"role": "user", "content": "hi"}]
    raw = client.chat.completions.with_raw_response.create(
        model=model, messages=msgs, stream=stream
    )
    if stream:
        text = "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
    else:
        text = raw.parse().choices[0].message.content or ""
    return text, raw.headers["x-gateway-provider"]


@pytest.mark.parametrize("stream", [False, True], ids=["unary", "stream"])
@pytest.mark.parametrize("kind", sorted(INTERIM))
def test_a_few_interim_answers_are_skipped(gw: GatewayServer, kind: str, stream: bool) -> None:
    name = f"few_{kind}"
    for _ in range(2):  # the second on the pooled connection
        assert _ask(gw, name, stream) == (f"few-{kind}", name)


@pytest.mark.parametrize("stream", [False, True], ids=["unary", "stream"])
@pytest.mark.parametrize("kind", sorted(INTERIM))
def test_endless_interim_answers_are_a_broken_answer_at_once(
    gw: GatewayServer, kind: str, stream: bool
) -> None:
    name = f"flood_{kind}"
    seen = len(gw.seen)
    start = time.monotonic()
    assert _ask(gw, name, stream) == ("good", "good")
    # Well before the member's 8 s limit (it used to take all of it).
    assert time.monotonic() - start < 6
    failures = poll(lambda: [c.failures for c in gw.seen[seen:] if c.failures[0:1]])[0]
    assert failures == [f"{name}:bad_response"]
