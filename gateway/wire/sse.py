"""Server-sent events: split an upstream byte stream into whole events without re-encoding them."""

from __future__ import annotations

from collections.abc import AsyncIterator

DONE = b"data: [DONE]\n\n"


class EventTooLarge(ValueError):
    """An event grew past the splitter's limit without ending."""


# A UTF-8 byte order mark: skipped at the start of a stream (WHATWG's event stream parsing).
BOM = b"\xef\xbb\xbf"


class SSESplitter:
    """Feeds raw bytes, yields complete events (each ending in a blank line), as they complete.

    Lines may end in CRLF, LF or a bare CR, and a stream may start with a UTF-8 BOM (all legal
    SSE): events come out with LF line ends and no BOM. With ``max_event`` set, an unfinished
    event longer than that raises EventTooLarge instead of being buffered without bound.
    """

    __slots__ = ("_buf", "_cr", "_head", "_max")

    def __init__(self, max_event: int | None = None) -> None:
        self._buf = b""
        self._max = max_event
        self._cr = False  # the last byte fed was a CR: an LF first in the next read is its CRLF
        self._head: bytes | None = b""  # the stream's first bytes until a BOM is ruled out

    def _lines(self, data: bytes) -> bytes:
        """New bytes with LF line ends (and no leading BOM); stateful across reads, so a CRLF or
        a BOM cut between two reads is still one line end, or skipped."""
        if self._head is not None:
            if self._head:
                data = self._head + data
            if len(data) < len(BOM) and BOM.startswith(data):
                self._head = data  # a BOM's start, or a stream's very first byte of one
                return b""
            self._head = None
            if data.startswith(BOM):
                data = data[len(BOM) :]
        if self._cr and data:
            self._cr = False
            if data[0] == 0x0A:
                data = data[1:]
        if b"\r" in data:
            self._cr = data[-1] == 0x0D
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        return data

    def feed(self, data: bytes) -> list[bytes]:
        return self._split(self._buf + self._lines(data))

    def _split(self, buf: bytes) -> list[bytes]:
        events: list[bytes] = []
        start = 0
        while True:
            end = buf.find(b"\n\n", start)
            if end < 0:
                break
            events.append(buf[start : end + 2])
            start = end + 2
        rest = buf[start:]
        if self._max is not None and len(rest) > self._max:
            raise EventTooLarge(f"stream event larger than {self._max} bytes")
        self._buf = rest
        return events

    def feed_block(self, data: bytes) -> bytes:
        """Feeds raw bytes; the events completed, as one block (what `feed` returns, joined).

        Their number is `block.count(b"\\n\\n")`; `split_events` lists them.
        """
        if self._head is not None or self._cr or b"\r" in data:
            data = self._lines(data)
        buf = self._buf + data if self._buf else data
        cut = buf.rfind(b"\n\n")
        if cut > 0 and buf[cut - 1] == 0x0A:
            # A run of blank lines: where its events end depends on the run's length.
            return b"".join(self._split(buf))
        end = cut + 2 if cut >= 0 else 0  # after the last complete event
        rest = buf[end:]
        if self._max is not None and len(rest) > self._max:
            raise EventTooLarge(f"stream event larger than {self._max} bytes")
        self._buf = rest
        return buf[:end]

    def tail(self) -> bytes:
        """Bytes of an incomplete last event (non-empty means the stream was cut mid-event)."""
        return self._buf


def lf_lines(buf: bytes) -> bytes:
    """A stream's start (all of it so far) with LF line ends and no leading BOM: a CR last in
    `buf` reads as a line end (if a CRLF's, the LF only repeats that end)."""
    if buf.startswith(BOM):
        buf = buf[len(BOM) :]
    if b"\r" in buf:
        buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    return buf


def split_events(block: bytes) -> list[bytes]:
    """The events of a block of whole events (`SSESplitter.feed_block`)."""
    return SSESplitter().feed(block)


def event_data(event: bytes) -> bytes | None:
    """The payload of an event's `data:` line(s), or None for comments/keep-alives."""
    if event.startswith(b"data: ") and event.find(b"\n") == len(event) - 2:
        return event[6:-2].lstrip()  # one `data: ` line, the usual event: no split
    parts = [line[5:].lstrip() for line in event.split(b"\n") if line.startswith(b"data:")]
    if not parts:
        return None
    return b"\n".join(parts)


def encode_event(payload: bytes) -> bytes:
    return b"data: " + payload + b"\n\n"


async def events_of(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    splitter = SSESplitter()
    async for chunk in chunks:
        for ev in splitter.feed(chunk):
            yield ev
