"""Server-sent events: split an upstream byte stream into whole events without re-encoding them."""

from __future__ import annotations

from collections.abc import AsyncIterator

DONE = b"data: [DONE]\n\n"


class EventTooLarge(ValueError):
    """An event grew past the splitter's limit without ending."""


class SSESplitter:
    """Feeds raw bytes, yields complete events (each ending in a blank line), as they complete.

    With ``max_event`` set, an unfinished event longer than that raises EventTooLarge instead of
    being buffered without bound.
    """

    __slots__ = ("_buf", "_max")

    def __init__(self, max_event: int | None = None) -> None:
        self._buf = b""
        self._max = max_event

    def feed(self, data: bytes) -> list[bytes]:
        buf = self._buf + data
        if b"\r" in buf:
            buf = buf.replace(b"\r\n", b"\n")
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
        buf = self._buf + data if self._buf else data
        if b"\r" in buf:
            buf = buf.replace(b"\r\n", b"\n")
        cut = buf.rfind(b"\n\n")
        if cut > 0 and buf[cut - 1] == 0x0A:
            # A run of blank lines: where its events end depends on the run's length.
            self._buf = b""
            return b"".join(self.feed(buf))
        end = cut + 2 if cut >= 0 else 0  # after the last complete event
        rest = buf[end:]
        if self._max is not None and len(rest) > self._max:
            raise EventTooLarge(f"stream event larger than {self._max} bytes")
        self._buf = rest
        return buf[:end]

    def tail(self) -> bytes:
        """Bytes of an incomplete last event (non-empty means the stream was cut mid-event)."""
        return self._buf


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
