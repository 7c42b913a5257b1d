"""The SSE splitter: whole events, however the bytes were cut, bounded in size."""

from __future__ import annotations

import pytest

from gateway.wire.sse import DONE, EventTooLarge, SSESplitter, encode_event, event_data, events_of

STREAM = b'data: {"a":1}\n\n: keep-alive\n\ndata: {"b":2}\n\n' + DONE


@pytest.mark.parametrize("cut", [1, 2, 3, 7, 13, len(STREAM)])
def test_events_come_whole_wherever_the_reads_were_cut(cut: int) -> None:
    splitter = SSESplitter()
    events: list[bytes] = []
    for i in range(0, len(STREAM), cut):
        events += splitter.feed(STREAM[i : i + cut])
    assert events == [b'data: {"a":1}\n\n', b": keep-alive\n\n", b'data: {"b":2}\n\n', DONE]
    assert splitter.tail() == b""


def test_crlf_lines_are_events_too_and_a_cut_tail_is_kept() -> None:
    splitter = SSESplitter()
    assert splitter.feed(b'data: {"a":1}\r\n\r\ndata: {"b"') == [b'data: {"a":1}\n\n']
    assert splitter.tail() == b'data: {"b"'


def test_an_event_past_the_limit_is_refused_instead_of_buffered() -> None:
    splitter = SSESplitter(max_event=16)
    assert splitter.feed(b"data: 123456789\n\n") == [b"data: 123456789\n\n"]
    with pytest.raises(EventTooLarge):
        splitter.feed(b"data: " + b"x" * 32)


def test_data_of_events() -> None:
    assert event_data(b'data: {"a":1}\n\n') == b'{"a":1}'
    assert event_data(b"data:[DONE]\n\n") == b"[DONE]"
    assert event_data(b"data: a\ndata: b\n\n") == b"a\nb"
    assert event_data(b": comment\n\n") is None
    assert encode_event(b"x") == b"data: x\n\n"


async def test_events_of_an_async_byte_stream() -> None:
    async def chunks():  # type: ignore[no-untyped-def]
        for i in range(0, len(STREAM), 5):
            yield STREAM[i : i + 5]

    assert [ev async for ev in events_of(chunks())][-1] == DONE
