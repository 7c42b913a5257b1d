"""The stream translation's shortcuts (whole events cut without the splitter, the common text
chunk sliced out of its learned frame without parsing) send exactly what parsing every chunk and
handing it to the translator sends, whatever the chunks look like and however they are cut."""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import re
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson
import pytest
from starlette.responses import StreamingResponse

import gateway.apis.messages as messages
import gateway.apis.responses as responses
from gateway.apis.exchange import StreamTranslator, translate_stream
from gateway.apis.response_store import ResponseStore
from gateway.context import Context
from gateway.infra.shared_state import SharedState
from gateway.wire.sse import SSESplitter, event_data

BASE = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
TEXTS = [
    " w1",
    "zq",
    "qz",
    "é",
    "日本",
    "😀",
    'a"b',
    "a\\b",
    "x\ny",
    "\t",
    "\x7f",
    "\u2028",
    "content",
]


def _reference(body: bytes, tr: StreamTranslator) -> list[bytes]:
    """Every event parsed and handed to `chunk` / `error`: what the client must receive."""
    out: list[bytes] = []
    for ev in SSESplitter().feed(body):
        data = event_data(ev)
        if data is None or data == b"[DONE]":
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
    return out


def _text(rng: random.Random, style: int) -> str:
    text = rng.choice(TEXTS) if rng.random() < 0.3 else f" w{rng.randint(0, 99)}"
    c: dict[str, Any] = {"index": 0, "delta": {"content": text}, "finish_reason": None}
    doc: dict[str, Any] = {**BASE}
    if style == 1:  # OpenAI's own shape
        c["logprobs"] = None
        doc["usage"] = None
    elif style == 2:  # a field that changes with every chunk
        doc["obfuscation"] = "x" * rng.randint(1, 4)
    elif style == 3:  # a decoy after the choices, often the same text under another "content"
        c["delta"]["content"] = text = rng.choice(["zq", "qz", " a"])
        doc["choices"] = [c]
        doc["extra"] = {"content": rng.choice(["zq", "qz", " a"])}
    elif style == 4:
        c["index"] = rng.choice([1, "0", None])
    elif style == 5:
        c["finish_reason"] = "stop"
    elif style == 6:
        doc["usage"] = {"prompt_tokens": 3, "completion_tokens": 2}
    doc["choices"] = [c]
    if style == 7:
        return "data: " + json.dumps(doc)  # spaces between tokens
    return "data: " + orjson.dumps(doc).decode()


def _other(rng: random.Random) -> str:
    return rng.choice(
        [
            "data: " + orjson.dumps({**BASE, "choices": [{"index": 0, "delta": {}}]}).decode(),
            "data: "
            + orjson.dumps(
                {
                    **BASE,
                    "choices": [
                        {
                            "index": 0,
                            "delta": {
                                "tool_calls": [
                                    {
                                        "index": 0,
                                        "id": "c",
                                        "function": {"name": "f", "arguments": "{}"},
                                    }
                                ]
                            },
                        }
                    ],
                }
            ).decode(),
            "data: " + orjson.dumps({"error": {"message": "boom"}}).decode(),
            ": keep-alive",
            'event: x\ndata: {"choices":[{"index":0,"delta":{"content":"multi"}}]}',
            "data: {cut",
            "data: [1]",
        ]
    )


def _stream(seed: int) -> tuple[bytes, list[bytes]]:
    rng = random.Random(seed)
    role = {**BASE, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
    events = ["data: " + orjson.dumps(role).decode()]
    style = rng.choice([0, 1, 2, 3])
    for _ in range(rng.randint(0, 20)):
        if rng.random() < 0.8:
            events.append(_text(rng, style if rng.random() < 0.85 else rng.randrange(8)))
        else:
            events.append(_other(rng))
    end = {**BASE, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    events += ["data: " + orjson.dumps(end).decode(), "data: [DONE]"]
    crlf = rng.random() < 0.1
    body = "".join(e + "\n\n" for e in events).encode()
    if crlf:
        body = body.replace(b"\n", b"\r\n")
    cuts = sorted(rng.sample(range(1, len(body)), rng.randint(0, 4)))
    if rng.random() < 0.5:  # whole events per piece, as the relay sends them
        sep = b"\r\n\r\n" if crlf else b"\n\n"
        ends = [i + len(sep) for i in range(len(body)) if body.startswith(sep, i)]
        cuts = sorted(rng.sample(ends[:-1], min(len(ends) - 1, 3)))
    pieces = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]
    return body, pieces


@pytest.fixture
def fixed_ids(monkeypatch: pytest.MonkeyPatch) -> Callable[[], None]:
    counter = itertools.count()

    def reset() -> None:
        nonlocal counter
        counter = itertools.count()

    monkeypatch.setattr(messages, "new_message_id", lambda: f"msg_{next(counter)}")
    monkeypatch.setattr(responses, "_hex_id", lambda prefix: f"{prefix}{next(counter)}")
    return reset


async def _translated(pieces: list[bytes], tr: StreamTranslator) -> bytes:
    async def body() -> AsyncIterator[bytes]:
        for piece in pieces:
            yield piece

    response = await translate_stream(StreamingResponse(body()), tr)
    assert isinstance(response, StreamingResponse)
    return b"".join([chunk async for chunk in response.body_iterator])


@pytest.mark.parametrize("api", ["messages", "responses"])
def test_the_shortcuts_send_what_parsing_every_chunk_sends(
    api: str, fixed_ids: Callable[[], None]
) -> None:
    ctx = Context("t", 0.0)
    exchange = responses.ResponsesExchange(ResponseStore(SharedState(None)))
    asyncio.run(exchange.request(b'{"model":"m","input":"hi","stream":true,"store":false}', ctx))
    exchange.shape.created_at = 1

    def translator() -> StreamTranslator:
        if api == "messages":
            return messages.MessageStream("m", 3)
        return responses.ResponseEvents(exchange, ctx)

    for seed in range(300):
        body, pieces = _stream(seed)
        fixed_ids()
        tr = translator()
        want = _reference(body, tr) + asyncio.run(tr.finish())
        fixed_ids()
        got = asyncio.run(_translated(pieces, translator()))
        # `completed_at` is the clock's: compared apart from it
        assert _no_clock(got) == _no_clock(b"".join(want)), seed


def _no_clock(body: bytes) -> bytes:
    return re.sub(rb'"completed_at":\d+', b'"completed_at":0', body)


@pytest.mark.parametrize(
    "req",
    [
        {"model": "m", "input": "hi"},
        {
            "model": 'm"o\\del,"output":[]',
            "input": "hi",
            "instructions": 'say "x",\n',
            "metadata": {"status": "x", "output": []},
            "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
            "user": "u",
            "safety_identifier": "s",
            "temperature": 0.5,
            "text": {"format": {"type": "json_object"}},
            "store": False,
        },
    ],
)
@pytest.mark.parametrize("finish", [None, "stop", "length", "content_filter"])
@pytest.mark.parametrize("usage", [None, {"prompt_tokens": 3, "completion_tokens": 2}])
def test_the_completed_response_written_from_pieces_is_its_json(
    req: dict[str, Any], finish: str | None, usage: dict[str, Any] | None
) -> None:
    """A stream's closing response, written around the in-progress response's bytes, is the
    JSON of the response object (clock apart)."""
    shape = responses.ResponseShape(req, "resp_1", req["model"])
    shape.learn(orjson.dumps(shape.response("in_progress", [])))
    output = [
        responses.message_item("msg_1", 'a "b"\n'),
        responses.call_item("fc_1", "call_1", "f", "{}", "completed"),
    ]
    use = responses.usage_of(usage)
    status, incomplete = shape.ending("completed", finish)
    if status == "incomplete":  # as the stream's end does before writing its items
        responses.mark_incomplete(output)
    items = b",".join(orjson.dumps(item) for item in output)
    got = shape.encoded(status, incomplete, items, use)
    want = orjson.dumps(shape.response("completed", output, use, finish))
    assert _no_clock(got) == _no_clock(want)
