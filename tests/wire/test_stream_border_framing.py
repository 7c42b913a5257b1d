"""SSE framing as the spec allows it: lines end in CRLF, LF or a bare CR, and a stream may start
with a UTF-8 byte order mark (skipped). Every such stream reaches the official clients whole,
whichever way the bytes are cut between reads (a CRLF or the BOM split in two included).

Official clients -> gateway -> a scripted loopback upstream (tests.wire.test_stream_border_upstream).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from gateway.wire.answer_checks import first_event_complete
from gateway.wire.sse import SSESplitter
from tests.support import GatewayServer, validate_sse
from tests.wire.test_stream_border_upstream import Scripted, chat_chunk, scripted_gateway

MSG = [{"role": "user", "content": "hi"}]
BOM = b"\xef\xbb\xbf"  # UTF-8 byte order mark
WORDS = ["hel", "lo ", "wor", "ld"]


def _events(end: bytes) -> bytes:
    """A whole chat stream with `end` as every line end."""
    chunks = [chat_chunk({"role": "assistant", "content": ""})]
    chunks += [chat_chunk({"content": w}) for w in WORDS] + [chat_chunk({}, "stop")]
    evs = [b"data: " + c + end + end for c in chunks] + [b"data: [DONE]" + end + end]
    return b": hello" + end + end + b"".join(evs)


LINE_ENDS = {"lf": b"\n", "crlf": b"\r\n", "cr": b"\r"}


def _pieces(body: bytes, cut: str) -> list[bytes]:
    if cut == "whole":
        return [body]
    if cut == "bytes":  # one byte per write: every CRLF and the BOM cut in two
        return [body[i : i + 1] for i in range(len(body))]
    return [body[i : i + 7] for i in range(0, len(body), 7)]


MODES: dict[str, list[Any]] = {}
for _name, _end in LINE_ENDS.items():
    for _bom in (False, True):
        for _cut in ("whole", "sevens", "bytes"):
            _body = (BOM if _bom else b"") + _events(_end)
            MODES[f"{_name}-{'bom' if _bom else 'nobom'}-{_cut}"] = _pieces(_body, _cut)


@pytest.fixture(scope="module")
def gw() -> Iterator[GatewayServer]:
    with Scripted(MODES) as up, scripted_gateway(up, list(MODES)) as server:
        yield server


@pytest.mark.parametrize("mode", list(MODES))
def test_the_openai_sdk_reads_every_legal_framing(gw: GatewayServer, mode: str) -> None:
    client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0)
    stream = client.chat.completions.create(model=mode, messages=MSG, stream=True)  # type: ignore[arg-type]
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == "hello world"


@pytest.mark.parametrize("mode", [m for m in MODES if m.endswith("-bytes")])
def test_the_relayed_stream_is_plain_lf_sse(gw: GatewayServer, mode: str) -> None:
    r = httpx.post(
        gw.base_url + "/chat/completions",
        json={"model": mode, "messages": MSG, "stream": True},
        timeout=10,
    )
    assert r.status_code == 200, r.text
    assert b"\r" not in r.content and BOM not in r.content
    chunks = validate_sse(b"\n\n".join(e for e in r.content.split(b"\n\n") if e[:1] != b":"))
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == "hello world"


@pytest.mark.parametrize("end", list(LINE_ENDS.values()), ids=list(LINE_ENDS))
@pytest.mark.parametrize("bom", [b"", BOM], ids=["nobom", "bom"])
def test_splitter_gives_the_same_events_however_the_bytes_are_cut(end: bytes, bom: bytes) -> None:
    body = bom + _events(end)
    want = SSESplitter().feed(_events(b"\n"))
    for size in (1, 2, 3, 5, len(body)):
        one, block = SSESplitter(), SSESplitter()
        got: list[bytes] = []
        blocks = b""
        for i in range(0, len(body), size):
            got += one.feed(body[i : i + size])
            blocks += block.feed_block(body[i : i + size])
        assert got == want, size
        assert blocks == b"".join(want), size
        assert one.tail() == block.tail() == b""


@pytest.mark.parametrize("end", list(LINE_ENDS.values()), ids=list(LINE_ENDS))
def test_first_event_is_found_with_any_line_end_and_a_bom(end: bytes) -> None:
    first = BOM + b"data: " + chat_chunk({"role": "assistant"}) + end + end
    assert first_event_complete(first)
    assert not first_event_complete(first[: -len(end)])
    assert json.loads(SSESplitter().feed(first)[0][6:])["choices"]
