"""The seam between the pipeline and an inbound API: one `Exchange` per request.

The pipeline calls `authorization` (which header carries the key), `request` (the client's body
translated to a chat body, after authentication so that stored state is looked up per tenant) and
`respond` (whatever the pipeline answered, translated back: an error, a chat completion, a cached
or degraded SSE body, or a live stream). Stream translation wraps the relay's body iterator, so
the relay keeps settling attempts, resuming and recording exactly as for a chat stream.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterable, AsyncIterator
from typing import Any, Protocol

import orjson
from starlette.datastructures import Headers
from starlette.responses import Response, StreamingResponse

from gateway.context import Context
from gateway.errors import GatewayError, internal_error
from gateway.wire.sse import SSESplitter, event_data

log = logging.getLogger("gateway.apis")
_DROP = frozenset({"content-length", "content-type"})
JSON = "application/json"


class StreamTranslator(Protocol):
    """Turns chat.completion.chunk payloads into another API's SSE events."""

    def chunk(self, chunk: dict[str, Any]) -> list[bytes]: ...
    def error(self, error: dict[str, Any]) -> list[bytes]: ...
    async def finish(self) -> list[bytes]: ...


class Exchange(Protocol):
    def authorization(self, headers: Headers) -> str | None: ...
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
    """Chat SSE events in, the translator's events appended to `out`; True once `[DONE]` came
    ([DONE] and comments are consumed)."""
    out = [] if out is None else out
    done = False
    for ev in events:
        # The relay's events are single `data:` lines: sliced without splitting.
        if ev.startswith(b"data: ") and ev.find(b"\n") == len(ev) - 2:
            data: bytes | None = ev[6:-2]
        else:
            data = event_data(ev)
        if data is None:
            continue
        if data == b"[DONE]":
            done = True
            continue
        try:
            doc = orjson.loads(data)
        except orjson.JSONDecodeError:
            continue
        if not isinstance(doc, dict):
            continue
        if "error" in doc and "choices" not in doc:
            err = doc["error"]
            out += tr.error(err if isinstance(err, dict) else {"message": str(err)})
        else:
            out += tr.chunk(doc)
    return done


async def translate_body(body: bytes, tr: StreamTranslator) -> bytes:
    """A whole SSE body (a cached or degraded answer replayed as a stream)."""
    out: list[bytes] = []
    translate_events(SSESplitter().feed(body + b"\n\n"), tr, out)
    out += await tr.finish()
    return b"".join(out)


async def _wrap(inner: AsyncIterable[Any], tr: StreamTranslator) -> AsyncIterator[bytes]:
    splitter = SSESplitter()
    try:
        tail: list[bytes] = []
        try:
            finished = False
            async for piece in inner:
                if not isinstance(piece, bytes):
                    piece = piece.encode() if isinstance(piece, str) else bytes(piece)
                out: list[bytes] = []
                if translate_events(splitter.feed(piece), tr, out) and not finished:
                    # The closing events leave with the last chunk: one write, not two.
                    finished = True
                    out += await tr.finish()
                if out:
                    yield b"".join(out)
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
