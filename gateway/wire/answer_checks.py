"""Upstream answers are checked before they count as a success, reach a client or a cache.

A 200 is a success only when it is what the endpoint promises: a JSON object of the endpoint's
shape (unary), or an SSE stream of JSON events that ends with `[DONE]` (or a chunk that finishes
every choice). Sizes are bounded per answer, per stream and per event, counting decompressed
bytes, so a compression bomb stops at the limit. A failed check is an attempt failure of kind
`bad_response`: retried on another member while nothing was sent, counted by the breaker, never
cached.

The checks are top level only and parse a unary body once (its bytes are relayed as received);
per stream event they are a few byte comparisons, with a slower path only for events that are
not ASCII (UTF-8 check) or that carry a secret.
"""

from __future__ import annotations

import re
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field

from gateway.redact import MASK as REDACTED
from gateway.redact import Redactor
from gateway.wire.sse import DONE

MIB = 1024 * 1024
MASK = REDACTED.encode()


class ResponseLimits(BaseModel):
    """Bounds on what one provider may send back (decompressed bytes)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_response_bytes: int = Field(
        16 * MIB,
        ge=1024,
        le=1024 * MIB,
        description="A non-streamed answer. Large float embedding batches may need more.",
    )
    max_stream_bytes: int = Field(
        256 * MIB, ge=1024, le=16 * 1024 * MIB, description="A whole streamed answer."
    )
    max_event_bytes: int = Field(
        1 * MIB, ge=1024, le=256 * MIB, description="One server-sent event of a stream."
    )


class InvalidAnswer(Exception):
    """An answer that must not count as a success. The message names no upstream content."""


# Endpoint -> (list field, what each item must hold, expected type of that field).
_SHAPES: dict[str, tuple[str, str, tuple[type, ...]]] = {
    "chat": ("choices", "message", (dict,)),
    "completions": ("choices", "text", (str,)),
    "embeddings": ("data", "embedding", (list, str)),
}


def check_unary(endpoint: str, body: bytes) -> dict[str, Any]:
    """The parsed answer when it has the endpoint's shape; raises InvalidAnswer otherwise."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise InvalidAnswer("the answer is not valid JSON") from None
    if not isinstance(doc, dict):
        raise InvalidAnswer("the answer is not a JSON object")
    if doc.get("error"):
        raise InvalidAnswer("the answer is an error object")
    shape = _SHAPES.get(endpoint)
    if shape is None:
        return doc
    field, member, types = shape
    items = doc.get(field)
    if not isinstance(items, list) or not items:
        raise InvalidAnswer(f"the answer has no '{field}' array")
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get(member), types):
            raise InvalidAnswer(f"an item of '{field}' has no valid '{member}'")
    return doc


def completion_tokens(doc: dict[str, Any]) -> int | None:
    usage = doc.get("usage")
    n = usage.get("completion_tokens") if isinstance(usage, dict) else None
    return n if isinstance(n, int) else None


# -- streams ---------------------------------------------------------------------------------

_DATA = re.compile(rb"^data:[ \t]*", re.M)
# An `"error"` member holding an object or a message (not null), outside any JSON string (a quote
# inside a string is escaped).
_ERROR_EVENT = re.compile(rb'(?<!\\)"error"\s*:\s*[{"]')
_FINISH = re.compile(rb'"finish_reason"\s*:\s*"')


# Lines that may precede the first data line: comments (keep-alives) and SSE fields.
_NON_DATA_FIELDS = frozenset({b"", b"event", b"id", b"retry"})


# Where a chunk's text starts: `"content": "` (chat) or `"text": "` (completions).
_TEXT_START = re.compile(rb'"(?:content|text)"\s*:\s*"')


def _utf8_length(lead: int) -> int:
    """Bytes of the UTF-8 sequence a lead byte starts (0 for a byte that cannot start one)."""
    if 0xC2 <= lead <= 0xDF:
        return 2
    if 0xE0 <= lead <= 0xEF:
        return 3
    if 0xF0 <= lead <= 0xF4:
        return 4
    return 0


def is_event_stream(content_type: str | None) -> bool:
    if not content_type:
        return False
    return content_type.split(";", 1)[0].strip().lower() == "text/event-stream"


def first_event_complete(buf: bytes) -> bool:
    """Whether ``buf`` holds a complete first data event (comments and SSE fields skipped).

    Raises InvalidAnswer when that event is not an OpenAI stream event (a JSON object or
    `[DONE]`) or is an error event.
    """
    if b"\r" in buf:
        buf = buf.replace(b"\r\n", b"\n")
    start = 0
    while True:
        end = buf.find(b"\n\n", start)
        if end < 0:
            return False
        event = buf[start : end + 2]
        # The usual first event is one `data: {` line: no regex for it.
        data = 6 if event.startswith(b"data: {") else -1
        if data < 0:
            m = _DATA.search(event)
            data = -1 if m is None else m.end()
        if data >= 0:
            payload = event[data:].lstrip()
            if not (payload.startswith(b"{") or payload.startswith(b"[DONE]")):
                raise InvalidAnswer("the stream's first event is not a JSON chunk")
            if b'"error"' in event and _ERROR_EVENT.search(event):
                raise InvalidAnswer("the stream started with an error event")
            return True
        fields = {line.split(b":", 1)[0] for line in event.split(b"\n") if line}
        if not fields <= _NON_DATA_FIELDS:
            raise InvalidAnswer("the stream does not consist of server-sent events")
        start = end + 2


class StreamCheck:
    """Per upstream stream: size bound, end marker, error events, UTF-8 and secret redaction."""

    __slots__ = ("done", "_carry", "_last", "_limit", "_prev", "_secrets", "_size")

    def __init__(self, limits: ResponseLimits, redact: Redactor | None = None) -> None:
        self._limit = limits.max_stream_bytes
        # The gateway's provider secrets (from a Redactor), replaced wherever they appear.
        self._secrets: tuple[bytes, ...] = redact.secret_bytes if redact is not None else ()
        self._size = 0
        self.done = False  # `[DONE]` seen
        # The last two events: a stream without `[DONE]` is complete when one of them finished
        # the answer (the finish chunk may be followed by a usage chunk). Looked at once, at the end.
        self._prev = self._last = b""
        self._carry = b""  # the start of a character cut at the end of the previous event

    def count(self, n: int) -> None:
        """Count raw bytes received; raises InvalidAnswer past the stream limit."""
        self._size += n
        if self._size > self._limit:
            raise InvalidAnswer(f"the stream is larger than {self._limit} bytes")

    def block(self, block: bytes) -> int:
        """The number of events in a block of whole events (`SSESplitter.feed_block`) that
        passes as it is, or -1: check it event by event (`events`), which may raise.

        The usual read (one-line JSON chunks, ASCII, no error member or secret, perhaps `[DONE]`
        last) is checked as one block: a handful of byte scans per read, not per event.
        """
        done = block.endswith(DONE) and (len(block) == len(DONE) or block[-16:-14] == b"\n\n")
        chunks = block.count(b"}\n\n")
        # Every event ends in a blank line; when all the newlines are those of the chunks' ends
        # (and of `[DONE]`), each event is one line ending like a JSON object: no cut JSON, no
        # comment, no other end marker (`[DONE]` elsewhere would end its own event).
        if (
            block.count(b"\n") != 2 * (chunks + done)
            or self._carry
            or b'"error"' in block
            or not block.isascii()
        ):
            return -1
        for secret in self._secrets:
            if secret in block:
                return -1
        if done:
            self.done = True
        elif chunks == 1:
            self._prev, self._last = self._last, block
        else:
            last = block.rfind(b"\n\n", 0, len(block) - 2) + 2
            prev = block.rfind(b"\n\n", 0, last - 2) + 2
            self._prev, self._last = block[prev:last], block[last:]
        return chunks + done

    def events(self, evs: list[bytes]) -> list[bytes]:
        """The events as they may be relayed (`event` for each), up to the end marker."""
        out: list[bytes] = []
        for ev in evs:
            if self.done:
                break  # nothing after the end marker
            out.append(self.event(ev))
        return out

    def event(self, ev: bytes) -> bytes:
        """One whole event as it may be relayed (redacted, valid UTF-8); raises InvalidAnswer."""
        if b"[DONE]" in ev and ev.rstrip().endswith(b"[DONE]") and _DATA.search(ev):
            self.done = True
            return ev
        if b'"error"' in ev and _ERROR_EVENT.search(ev):
            raise InvalidAnswer("the provider sent an error event")
        if not ev.endswith(b"}\n\n") and not ev.rstrip().endswith(b"}"):
            # A chunk is a JSON object: a data event that does not end like one holds cut JSON,
            # which no client can parse (a byte check, no parse; comment-only events pass).
            m = _DATA.search(ev)
            if m is not None and ev[m.end() :].lstrip().startswith(b"{"):
                raise InvalidAnswer("the provider sent an event with cut JSON")
        if self._carry or not ev.isascii():
            ev = self._utf8(ev)
        for secret in self._secrets:  # the Redactor's loop, inlined: this runs per event
            if secret in ev:
                ev = ev.replace(secret, MASK)
        self._prev, self._last = self._last, ev
        return ev

    def _utf8(self, ev: bytes) -> bytes:
        """The event as valid UTF-8 (slow path: only events that are not ASCII).

        Some servers emit byte-level tokens and cut a multi-byte character between two events
        (`"ok \xe2\x82"` then `"\xac end"`). The cut start is moved to the next event's text,
        so the character arrives whole; anything else invalid becomes U+FFFD (clients' JSON
        parsers reject invalid UTF-8).
        """
        carry, self._carry = self._carry, b""
        if carry:
            m = _TEXT_START.search(ev)
            if m is not None and m.end() < len(ev) and 0x80 <= ev[m.end()] < 0xC0:
                ev = ev[: m.end()] + carry + ev[m.end() :]
        try:
            ev.decode()
            return ev
        except UnicodeDecodeError as e:
            start = e.start
        quote = ev.find(b'"', start)
        need = _utf8_length(ev[start])
        cut = ev[start:quote]
        if quote > start and need > len(cut) and all(0x80 <= b < 0xC0 for b in cut[1:]):
            self._carry = cut
            ev = ev[:start] + ev[quote:]
        try:
            ev.decode()
        except UnicodeDecodeError:
            ev = ev.decode(errors="replace").encode()
        return ev

    @property
    def finished(self) -> bool:
        """Did one of the last events finish the answer (a `finish_reason` that is not null)?"""
        return bool(_FINISH.search(self._last) or _FINISH.search(self._prev))

    def complete(self) -> bool:
        """Did the stream end properly: `[DONE]`, or a finishing chunk (some servers omit DONE)?"""
        return self.done or self.finished
