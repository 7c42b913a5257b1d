"""Answers broken at the HTTP level (the head): a provider's failure, the same for both calls.

A status line no parser takes, a header line of 1 MB, 10,000 headers, both Transfer-Encoding
and Content-Length, a final status under 200 (000, 099, 101): the provider answered, so the attempt is a `bad_response` (another member
is tried, the client is told the answer was invalid), whether the request was streamed or not;
never a `connect_error` ("the provider could not be reached"). Gateway on loopback, scripted
raw upstream, the official `openai` client.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator

import openai
import pytest

from tests.support import GatewayServer, ThreadedRawServer, completion_body, poll, sse_chunk

_BODY = json.dumps(completion_body("broken member")).encode()

HEADS = {
    "bad_status_line": b"HTTP/1.1 2OO OK\r\ncontent-length: 0\r\n\r\n",
    "header_of_1mb": b"HTTP/1.1 200 OK\r\nx-big: " + b"a" * (1 << 20) + b"\r\n\r\n",
    "ten_thousand_headers": b"HTTP/1.1 200 OK\r\n"
    + b"".join(b"x-h%d: v\r\n" % i for i in range(10_000))
    + b"\r\n",
    "te_and_cl": b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 5\r\n"
    b"transfer-encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(_BODY), _BODY),
    "nul_in_header": b"HTTP/1.1 200 OK\r\nx-a: b\x00c\r\ncontent-length: 0\r\n\r\n",
}


# Status lines outside HTTP's final statuses over a well-formed answer (the parser takes any
# three digits; 101 switches protocols nobody asked for): not an answer, whatever the body.
STATUS_LINES = {
    "status_000": b"HTTP/1.1 000 OK",
    "status_099": b"HTTP/1.1 099 OK",
    "status_101": b"HTTP/1.1 101 Switching Protocols\r\nupgrade: h2c\r\nconnection: upgrade",
}


class Upstream(ThreadedRawServer):
    """`/<head>/v1/...` answers with that broken head, `/<status>/v1/...` with that status line
    over a well-formed answer; `/good/v1/...` answers normally (its text: the mode)."""

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
            request = json.loads(await reader.readexactly(length))
            if mode in HEADS:
                writer.write(HEADS[mode])
            else:
                status = STATUS_LINES.get(mode, b"HTTP/1.1 200 OK")
                if request.get("stream"):
                    body = sse_chunk(mode) + sse_chunk("", "stop") + b"data: [DONE]\n\n"
                    ctype = b"text/event-stream"
                else:
                    body, ctype = json.dumps(completion_body(mode)).encode(), b"application/json"
                writer.write(
                    b"%s\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n%s"
                    % (status, ctype, len(body), body)
                )
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
    for mode in [*HEADS, *STATUS_LINES]:
        # Breakers of their own, open for the module after the failures: no effect here, the
        # solo alias is asked before the one with a fallback.
        for name, extra in ((f"{mode}_solo", ""), (mode, ", fallback: [good]")):
            lines.append(f"  {name}: {{base_url: '{up.url(mode)}'}}")
            pools.append(f"  p_{name}: {{members: [{name}], max_attempts: 1{extra}}}")
            models.append(f"  {name}: {{pool: p_{name}}}")
    return "\n".join(lines + pools + models) + "\n"


@pytest.fixture(scope="module")
def gw() -> Iterator[GatewayServer]:
    with Upstream() as up, GatewayServer(_policy(up)) as g:
        yield g


def _ask(gw: GatewayServer, model: str, stream: bool) -> str:
    client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0, timeout=20)
    msgs = [{"role": "user", "content": "hi"}]
    if stream:
        chunks = client.chat.completions.create(model=model, messages=msgs, stream=True)
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    answer = client.chat.completions.create(model=model, messages=msgs)
    return answer.choices[0].message.content or ""


@pytest.mark.parametrize("stream", [False, True], ids=["unary", "stream"])
@pytest.mark.parametrize("head", sorted([*HEADS, *STATUS_LINES]))
def test_a_broken_head_is_a_bad_response_and_another_member_answers(
    gw: GatewayServer, head: str, stream: bool
) -> None:
    seen = len(gw.seen)
    with pytest.raises(openai.APIStatusError) as caught:
        _ask(gw, f"{head}_solo", stream)
    assert caught.value.status_code == 502
    assert caught.value.response.json()["error"]["code"] == "upstream_bad_response"
    # The request's record is kept just after its last byte was sent: wait for it.
    solo = f"{head}_solo:"
    failures = poll(
        lambda: [
            c.failures for c in gw.seen[seen:] if c.failures[0:1] and c.failures[0].startswith(solo)
        ]
    )[0]
    assert failures == [f"{head}_solo:bad_response"]
    assert _ask(gw, head, stream) == "good"
