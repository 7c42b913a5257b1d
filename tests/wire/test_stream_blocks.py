"""A stream read is handled as one block of whole events; event by event gives the same result.

The relay checks, renames and keeps a read's events at once when they are the usual ones, and
falls back to one event at a time otherwise. These seeded random streams (JSON chunks, comments,
CRLF, multi-line data, runs of blank lines, error events, cut JSON, cut UTF-8, secrets, `[DONE]`
anywhere), cut at random byte positions, check that both ways agree.
"""

from __future__ import annotations

import random

import orjson
import pytest

from gateway.redact import Redactor
from gateway.wire.answer_checks import InvalidAnswer, ResponseLimits, StreamCheck
from gateway.wire.chunks import StreamAssembler
from gateway.wire.response_model import ModelName
from gateway.wire.sse import DONE, SSESplitter, split_events

SECRET = "sk-provider-secret-0123456789"
LIMITS = ResponseLimits()


def _chunk(
    rng: random.Random, text: str, *, finish: str | None = None, model: str = "m-1"
) -> bytes:
    doc = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": model,
        "choices": [
            {"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": finish}
        ],
        "usage": None,
    }
    sep = rng.choice([b"data: ", b"data: ", b"data: ", b"data:"])
    return sep + orjson.dumps(doc) + b"\n\n"


def _event(rng: random.Random, hostile: bool) -> bytes:
    word = rng.choice(["a", "b c", "déjà", "[DONE]", "x\ny", '"q"', "error"])
    if not hostile:
        return _chunk(rng, word.replace("é", "e"))
    kind = rng.randrange(12)
    if kind == 0:
        return b": keep-alive\n\n"
    if kind == 1:
        return b'data: {"error": {"message": "boom"}}\n\n'
    if kind == 2:
        return b'data: {"choices": [{"delta": {"content": "cut\n\n'
    if kind == 3:
        return _chunk(rng, f"key {SECRET} here")
    if kind == 4:
        return 'data: {"c": "€"}\n\n'.encode()[:-6] + b'"}\n\n'  # a cut character
    if kind == 5:
        return DONE
    if kind == 6:
        return b"event: note\ndata: {}\n\n"
    if kind == 7:
        return b"\n"  # with the blank line before it, a run of blank lines
    if kind == 8:
        return _chunk(rng, word).replace(b"\n\n", b"\r\n\r\n")
    if kind == 9:
        return _chunk(rng, word, finish="stop")
    return _chunk(rng, word)


def _stream(rng: random.Random, hostile: bool) -> bytes:
    evs = [_event(rng, hostile) for _ in range(rng.randrange(1, 12))]
    if rng.random() < 0.7:
        evs.append(DONE)
    return b"".join(evs)


def _cuts(rng: random.Random, data: bytes) -> list[bytes]:
    points = sorted(rng.sample(range(1, len(data)), min(len(data) - 1, rng.randrange(0, 5))))
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]


@pytest.mark.parametrize("hostile", [False, True])
def test_blocks_are_the_events_joined(hostile: bool) -> None:
    rng = random.Random(11 + hostile)
    for _ in range(400):
        pieces = _cuts(rng, _stream(rng, hostile))
        by_event, by_block = SSESplitter(), SSESplitter()
        for piece in pieces:
            evs = by_event.feed(piece)
            block = by_block.feed_block(piece)
            assert block == b"".join(evs)
            assert block.count(b"\n\n") == len(evs)
            assert split_events(block) == evs
        assert by_block.tail() == by_event.tail()


def _per_event(evs: list[bytes]) -> tuple[bytes | type[Exception], bool, bool]:
    check = StreamCheck(LIMITS, Redactor([SECRET]))
    try:
        out = b"".join(check.events(evs))
    except InvalidAnswer as e:
        return type(e), check.done, False
    return out, check.done, check.finished


@pytest.mark.parametrize("hostile", [False, True])
def test_a_block_passes_only_where_each_event_would_pass_unchanged(hostile: bool) -> None:
    rng = random.Random(21 + hostile)
    passed = 0
    for _ in range(600):
        block = SSESplitter().feed_block(_stream(rng, hostile))
        if not block:
            continue
        evs = split_events(block)
        check = StreamCheck(LIMITS, Redactor([SECRET]))
        n = check.block(block)
        expected = _per_event(evs)
        if n < 0:
            continue  # the relay checks these one by one: that is `expected`
        passed += 1
        # `finished` only counts for a stream that ended without `[DONE]`.
        if check.done:
            expected = (expected[0], expected[1], False)
        assert expected == (block, check.done, check.finished and not check.done)
        assert n == len(evs)
    assert passed > (10 if hostile else 50)


def test_the_last_two_events_decide_a_stream_without_done() -> None:
    rng = random.Random(3)
    finish = _chunk(rng, "end", finish="stop")
    content = _chunk(rng, "more")
    for evs, finished in (
        ([content, finish], True),
        ([finish, content], True),  # the finish chunk, then the usage chunk
        ([finish, content, content], False),
        ([content], False),
    ):
        check = StreamCheck(LIMITS)
        block = b"".join(evs)
        assert check.block(block) == len(evs)
        assert check.finished is finished
    check = StreamCheck(LIMITS)  # one event per read
    for ev in (finish, content):
        assert check.block(ev) == 1
    assert check.finished


def test_a_rename_of_a_block_is_the_rename_of_each_event() -> None:
    rng = random.Random(5)
    for _ in range(300):
        models = [rng.choice(["m-1", "m-2", "alias"]) for _ in range(rng.randrange(1, 6))]
        evs = [_chunk(rng, "t", model=m) for m in models]
        primer = _chunk(rng, "p", model=rng.choice(["m-1", "m-2"]))
        by_block, by_event = ModelName("alias"), ModelName("alias")
        by_block(primer)
        by_event(primer)
        renamed = by_block.block(b"".join(evs), len(evs))
        expected = b"".join(map(by_event, evs))
        if renamed is not None:
            assert renamed == expected
        assert all(b'"model":"alias"' in ev for ev in split_events(expected))


def _reference(events: list[bytes]) -> dict[str, object] | None:
    """One parse per event, as the assembler did before it parsed blocks."""
    asm = StreamAssembler()
    asm.feed([b": force the slow path\n\n", *events])
    return asm.to_completion() if asm.complete() else None


@pytest.mark.parametrize("hostile", [False, True])
def test_assembling_blocks_equals_assembling_each_event(hostile: bool) -> None:
    rng = random.Random(31 + hostile)
    complete = 0
    for _ in range(400):
        evs = split_events(SSESplitter().feed_block(_stream(rng, hostile)))
        evs = [ev for ev in evs if ev != b"event: note\ndata: {}\n\n"]  # no choices: no answer
        if rng.random() < 0.5:
            evs.append(_chunk(rng, "", finish="stop"))
            evs.append(DONE)
        asm = StreamAssembler()
        rest = list(evs)
        while rest:  # whole events, as the relay keeps them: blocks or lists
            n = rng.randrange(1, len(rest) + 1)
            group, rest = rest[:n], rest[n:]
            asm.feed(b"".join(group)) if rng.random() < 0.5 else asm.feed(group)
        got = asm.to_completion() if asm.complete() else None
        assert got == _reference(evs)
        complete += got is not None
    assert complete > 20


def test_chunks_of_the_wrong_shape_make_an_answer_incomplete_not_an_error() -> None:
    good = b'data: {"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":"stop"}]}\n\n'
    for bad in (
        b'data: {"choices":[{"index":"0","delta":{"content":"a"}}]}\n\n',
        b'data: {"choices":[{"index":0,"delta":{"content":["a"]}}]}\n\n',
        b'data: {"choices":[{"index":0,"delta":"a"}]}\n\n',
        b'data: {"choices":[7]}\n\n',
        b'data: {"choices":[{"delta":{"tool_calls":[{"index":"x"}]}}]}\n\n',
        b'data: {"choices":[{"delta":{"tool_calls":[{"function":{"name":1}}]}}]}\n\n',
        b"data: [1, 2]\n\n",
        b'data: {"a":1},{"b":2}\n\n',
    ):
        asm = StreamAssembler()
        asm.feed(good + bad + DONE)
        assert not asm.complete(), bad
