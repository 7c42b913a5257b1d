"""The seam between the pipeline and an inbound API: one `Exchange` per request.

The pipeline calls `authorization` (which header carries the key), `request` (the client's body
translated to a chat body, after authentication so that stored state is looked up per tenant) and
`respond` (whatever the pipeline answered, translated back: an error, a chat completion, a cached
or degraded SSE body, or a live stream). Stream translation wraps the relay's body iterator, so
the relay keeps settling attempts, resuming and recording exactly as for a chat stream.
"""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterable, AsyncIterator, Mapping
from itertools import repeat
from typing import Any, Protocol

import orjson
from starlette.responses import Response, StreamingResponse

from gateway.context import Context
from gateway.errors import GatewayError, internal_error
from gateway.wire.sse import SSESplitter, event_data

log = logging.getLogger("gateway.apis")
_DROP = frozenset({"content-length", "content-type"})
JSON = "application/json"


class StreamTranslator(Protocol):
    """Turns chat.completion.chunk payloads into another API's SSE events."""

    def text(self, text: str) -> bytes | None:
        """The event of the common chunk (one choice, a non-empty text delta, nothing else that
        `chunk` would act on), or None when `chunk` must take it (e.g. no text block open)."""
        ...

    def text_json(self, raw: bytes) -> bytes | None:
        """`text` for the text as JSON writes it, without its quotes (valid UTF-8, nothing
        escaped): the event is written around these bytes, the text is never decoded."""
        ...

    def texts_json(self, raws: list[bytes]) -> bytes | None:
        """The events of consecutive common chunks (`text_json` of each, in order, joined), or
        None when each must go to `text_json`."""
        ...

    def chunk(self, chunk: dict[str, Any]) -> list[bytes]: ...
    def error(self, error: dict[str, Any]) -> list[bytes]: ...
    async def finish(self) -> list[bytes]: ...


class Exchange(Protocol):
    def authorization(self, headers: Mapping[str, str]) -> str | None: ...
    async def request(self, raw: bytes, ctx: Context) -> bytes: ...
    async def respond(self, response: Response, ctx: Context) -> Response: ...


class InboundAPI(Protocol):
    name: str  # the access log's `endpoint`

    def begin(self) -> Exchange: ...


def error_fields(body: bytes) -> dict[str, Any]:
    """The `error` object of a gateway (OpenAI-shaped) error body; a generic one if unparsable."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        doc = None
    err = doc.get("error") if isinstance(doc, dict) else None
    if isinstance(err, dict):
        return err
    return {"message": "The request failed.", "type": "api_error"}


def rebuild(
    response: Response, body: bytes, status: int | None = None, media_type: str = JSON
) -> Response:
    """A new response with `body`, keeping the gateway's headers (request id, cache, pool...)
    and what is to run once it has been sent (the stages' `on_finish` hooks)."""
    headers = {k: v for k, v in response.headers.items() if k not in _DROP}
    return Response(
        body,
        status_code=response.status_code if status is None else status,
        headers=headers,
        media_type=media_type,
        background=response.background,
    )


def translate_events(
    events: list[bytes], tr: StreamTranslator, out: list[bytes] | None = None
) -> bool:
    """Chat SSE events in (each ending in its blank line), the translator's events appended to
    `out`; True once `[DONE]` came ([DONE] and comments are consumed)."""
    bare = [ev[:-2] if ev.endswith(b"\n\n") else ev for ev in events]
    return ChatEvents(tr).feed(bare, [] if out is None else out)


# What a JSON string written without escapes cannot hold (orjson escapes exactly these).
_ESCAPED = re.compile(rb'["\\\x00-\x1f]')
_PROBES = ("zq", "qz")  # another text than the chunk's
_LEARN_TRIES = 3


def _utf8(raw: bytes) -> bool:
    try:
        raw.decode()
    except UnicodeDecodeError:
        return False
    return True


class ChatEvents:
    """One stream's chat events (bare: without their blank line) through a translator.

    The common chunk (one choice, a non-empty text delta, nothing else) goes straight to the
    translator's `text`. Once such a chunk was parsed, the bytes around its text (the frame) are
    kept: a later event with the same frame and an escape-free text is that same chunk with
    another text, so its text is sliced out without parsing it.
    """

    __slots__ = ("tr", "pre", "suf", "n_pre", "n_suf", "tries", "end")

    def __init__(self, tr: StreamTranslator) -> None:
        self.tr = tr
        self.pre = self.suf = b""  # the frame: the event before and after the text
        self.n_pre = self.n_suf = 0
        self.tries = _LEARN_TRIES
        self.end = b""  # the frame's suffix and the blank line: where a framed event ends

    def feed_piece(self, piece: bytes, out: list[bytes]) -> bool:
        """`feed` for whole events as they came (each ending in its blank line, no CR). A run of
        events that all have the learned frame is cut with one `split` at the frame's end and
        handed to the translator at once; the events around it go through `feed`."""
        end = self.end
        if not end:
            events = piece[:-2].split(b"\n\n")
            if not self.tries:
                return self.feed(events, out)
            # One by one until the frame is learned, then the rest as a piece.
            done = False
            for i, ev in enumerate(events):
                done = self.feed([ev], out) or done
                if self.end:
                    if i + 1 < len(events):
                        rest = b"\n\n".join(events[i + 1 :]) + b"\n\n"
                        done = self.feed_piece(rest, out) or done
                    break
            return done
        # Each part but the last ends where an event with the frame's suffix ends: when each
        # is one event that starts with the frame's prefix and holds an escape-free text (no
        # line end: not several events), they are a run of framed events.
        parts = piece.split(end)
        if len(parts) < 3:
            return self.feed(piece[:-2].split(b"\n\n"), out)
        rest = parts.pop()  # the events after the run (each with its blank line)
        first = parts[0]
        cut = first.rfind(b"\n\n") + 2  # where the run starts in the first part
        if cut > 1:
            parts[0] = first[cut:]
        else:
            cut = 0
        pre, n_pre = self.pre, self.n_pre
        if all(map(bytes.startswith, parts, repeat(pre))):
            texts = [p[n_pre:] for p in parts]
            joined = b"".join(texts)
            if (
                b"" not in texts
                and _ESCAPED.search(joined) is None
                and (joined.isascii() or all(map(_utf8, texts)))
            ):
                done = self.feed(first[: cut - 2].split(b"\n\n"), out) if cut else False
                written = self.tr.texts_json(texts)
                if written is None:
                    suf = self.suf
                    done = self.feed([p + suf for p in parts], out) or done
                else:
                    out.append(written)
                if rest:
                    done = self.feed(rest[:-2].split(b"\n\n"), out) or done
                return done
        return self.feed(piece[:-2].split(b"\n\n"), out)

    def feed(self, events: list[bytes], out: list[bytes]) -> bool:
        """True once `[DONE]` came ([DONE] and comments are consumed)."""
        done = False
        tr = self.tr
        text_event = tr.text
        pre, suf, n_pre, n_suf = self.pre, self.suf, self.n_pre, self.n_suf
        framed = n_pre + n_suf
        loads = orjson.loads
        text_json = tr.text_json
        escaped = _ESCAPED.search
        for ev in events:
            if framed and ev.startswith(pre) and ev.endswith(suf) and len(ev) > framed:
                # The text's bytes are its JSON as they stand: passed on without decoding when
                # nothing in them is escaped and they are valid UTF-8 (what a parse would check).
                raw = ev[n_pre : len(ev) - n_suf]
                if escaped(raw) is None and (raw.isascii() or _utf8(raw)):
                    event = text_json(raw)
                    if event is not None:
                        out.append(event)
                        continue
            # The relay's events are single `data:` lines: sliced without splitting.
            single = ev[:6] == b"data: " and b"\n" not in ev
            data = ev[6:] if single else event_data(ev)
            if data is None:
                continue
            if data == b"[DONE]":
                done = True
                continue
            try:
                doc = loads(data)
            except orjson.JSONDecodeError:
                continue
            if type(doc) is not dict:
                continue
            choices = doc.get("choices")
            if type(choices) is list and len(choices) == 1 and not doc.get("usage"):
                c = choices[0]
                if type(c) is dict:
                    delta = c.get("delta")
                    if type(delta) is dict:
                        text: Any = delta.get("content")
                        if (
                            type(text) is str
                            and text
                            and not c.get("finish_reason")
                            and not delta.get("tool_calls")
                            and c.get("index", 0) == 0
                        ):
                            if single and self.tries and self._learn(ev, text, doc):
                                pre, suf, n_pre, n_suf = self.pre, self.suf, self.n_pre, self.n_suf
                                framed = n_pre + n_suf
                            event = text_event(text)
                            if event is not None:
                                out.append(event)
                                continue
            if choices is None and "error" in doc and "choices" not in doc:
                err = doc["error"]
                out += tr.error(err if isinstance(err, dict) else {"message": str(err)})
            else:
                out += tr.chunk(doc)
        return done

    def _learn(self, ev: bytes, text: str, doc: dict[str, Any]) -> bool:
        """Keep the frame of `ev`, a single-line common chunk whose text is `text`, when it is
        sure: nothing escaped in the event (every quote delimits a string), and the same event
        with another text parses to the same chunk with that text as its delta."""
        self.tries -= 1
        if b"\\" in ev:
            return False
        key = b'"content":' + orjson.dumps(text)
        at = ev.rfind(key)
        if at < 0:
            return False
        start, end = at + 11, at + len(key) - 1  # the text, between its quotes
        pre, suf = ev[:start], ev[end:]
        other = _PROBES[text == _PROBES[0]]
        try:
            probe = orjson.loads(pre[6:] + other.encode() + suf)
            delta = probe["choices"][0]["delta"]
            if delta["content"] != other:
                return False
            delta["content"] = text
        except (orjson.JSONDecodeError, LookupError, TypeError):
            return False
        if probe != doc:
            return False
        self.pre, self.suf, self.n_pre, self.n_suf = pre, suf, len(pre), len(suf)
        self.end = suf + b"\n\n"
        return True


def _feed(piece: bytes, splitter: SSESplitter, events: ChatEvents, out: list[bytes]) -> bool:
    """`piece`'s whole events through `events`. The relay sends whole events, so a piece that
    ends one (and nothing is pending) is cut without the splitter, else the splitter takes it
    (an event across pieces, CRLF line ends)."""
    if (
        piece.endswith(b"\n\n")
        and not piece.endswith(b"\n\n\n")
        and b"\r" not in piece
        and not splitter.tail()
    ):
        return events.feed_piece(piece, out)
    return events.feed([ev[:-2] for ev in splitter.feed(piece)], out)


async def translate_body(body: bytes, tr: StreamTranslator) -> bytes:
    """A whole SSE body (a cached or degraded answer replayed as a stream)."""
    out: list[bytes] = []
    # A body that ends its last event is cut like a relay's piece; else the splitter takes it
    # (with a blank line added: a last event without one still counts).
    splitter, events = SSESplitter(), ChatEvents(tr)
    if body.endswith(b"\n\n"):
        _feed(body, splitter, events, out)
        events.feed([ev[:-2] for ev in splitter.feed(b"\n\n")], out)
    else:
        events.feed([ev[:-2] for ev in splitter.feed(body + b"\n\n")], out)
    out += await tr.finish()
    return b"".join(out)


async def _wrap(inner: AsyncIterable[Any], tr: StreamTranslator) -> AsyncIterator[bytes]:
    splitter = SSESplitter()
    events = ChatEvents(tr)
    feed = events.feed
    try:
        tail: list[bytes] = []
        try:
            finished = False
            async for piece in inner:
                if type(piece) is not bytes:
                    piece = piece.encode() if isinstance(piece, str) else bytes(piece)
                out: list[bytes] = []
                at = piece.find(b"\n\n")
                if at == len(piece) - 2 and b"\r" not in piece and not splitter.tail():
                    done = feed([piece[:at]], out)  # one whole event: the common piece
                else:
                    done = _feed(piece, splitter, events, out)
                if done and not finished:
                    # The closing events leave with the last chunk: one write, not two.
                    finished = True
                    out += await tr.finish()
                if out:
                    yield out[0] if len(out) == 1 else b"".join(out)
            if not finished:
                tail = await tr.finish()
        except Exception as exc:  # a translation bug: the stream still ends in the API's shape
            log.exception("inbound stream translation failed", exc_info=exc)
            tail = tr.error({"message": "The gateway hit an internal error.", "code": "internal"})
        if tail:
            yield b"".join(tail)
    finally:
        aclose = getattr(inner, "aclose", None)
        if aclose is not None:
            await aclose()  # the relay's own clean-up: settles the attempt, records the request


async def translate_stream(response: Response, tr: StreamTranslator) -> Response:
    """The same response object (the relay's clean-up hooks stay attached), its events translated."""
    if isinstance(response, StreamingResponse):
        response.body_iterator = _wrap(response.body_iterator, tr)
        return response
    return rebuild(
        response, await translate_body(bytes(response.body), tr), 200, "text/event-stream"
    )


def is_stream(response: Response) -> bool:
    return isinstance(response, StreamingResponse) or (
        response.media_type or response.headers.get("content-type", "")
    ).startswith("text/event-stream")


async def safe_respond(
    exchange: Exchange, response: Response, ctx: Context, fallback: GatewayError | None = None
) -> Response:
    """`exchange.respond`, never raising: a translation bug is a 500 in the API's shape."""
    try:
        return await exchange.respond(response, ctx)
    except Exception as exc:  # noqa: BLE001 - a bug must still answer in shape, and be recorded
        log.exception("inbound translation failed", exc_info=exc)
        abandon = getattr(response, "abandon", None)
        if abandon is not None:  # a relay never sent: settle its attempt and record
            await abandon()
        err = (fallback or internal_error()).to_response(ctx.headers())
        try:
            return await exchange.respond(err, ctx)
        except Exception:  # noqa: BLE001
            return err
