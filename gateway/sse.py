"""Server-sent events: split an upstream byte stream into whole events without re-encoding them."""

from __future__ import annotations

from collections.abc import AsyncIterator

DONE = b"data: [DONE]\n\n"


class SSESplitter:
    """Feeds raw bytes, yields complete events (each ending in a blank line), as they complete."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = b""

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
        self._buf = buf[start:]
        return events

    def tail(self) -> bytes:
        """Bytes of an incomplete last event (non-empty means the stream was cut mid-event)."""
        return self._buf


def event_data(event: bytes) -> bytes | None:
    """The payload of an event's `data:` line(s), or None for comments/keep-alives."""
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
