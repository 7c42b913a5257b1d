"""Structure-aware mutation of JSON documents for border tests: every field of a valid document
(every key and list item, at any depth) replaced by values of the wrong type or size, or
removed. Seeded, so a failing case is the same on every run."""

from __future__ import annotations

import asyncio
import copy
import json
import random
from collections.abc import Iterator
from typing import Any

from tests.support import ThreadedRawServer, _validator

Path = tuple[str | int, ...]

#: Values no field of the OpenAI, Anthropic, Gemini or Bedrock schemas expects everywhere:
#: other JSON types, boundary numbers, empty and huge strings, control and bidi characters.
HOSTILE: list[Any] = [
    None,
    True,
    False,
    0,
    -1,
    1.5,
    2**63,
    -(2**63),
    10**30,
    1e308,
    -1e308,
    "",
    "x" * 5000,
    [],
    {},
    [None],
    [{}],
    {"a": {}},
    [[[]]],
    "\u0000",
    "é\u202e",
    {"type": None},
    [1, "a", None],
    "1e999",
]
REMOVED = object()
"""A mutation that deletes the field instead of replacing it."""


def paths(doc: Any, at: Path = ()) -> Iterator[Path]:
    """Every location in `doc`, the root first."""
    yield at
    if isinstance(doc, dict):
        for key, value in doc.items():
            yield from paths(value, (*at, key))
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            yield from paths(value, (*at, i))


def mutated(doc: Any, at: Path, value: Any) -> Any:
    """A copy of `doc` with the field at `at` replaced by `value` (or removed: REMOVED)."""
    if not at:
        return value
    out = copy.deepcopy(doc)
    parent = out
    for key in at[:-1]:
        parent = parent[key]
    if value is REMOVED:
        del parent[at[-1]]
    else:
        parent[at[-1]] = value
    return out


def mutations(doc: Any, per_path: int, seed: int = 0) -> Iterator[tuple[Path, Any]]:
    """(path, mutated document) pairs: at every path, `per_path` hostile values drawn with a
    fixed seed, and the field removed."""
    rng = random.Random(seed)
    for at in paths(doc):
        for value in rng.sample(HOSTILE, min(per_path, len(HOSTILE))):
            yield at, mutated(doc, at, value)
        if at:
            yield at, mutated(doc, at, REMOVED)


# What the gateway relays from an upstream as it came, by design (gateway/wire/answer_fields.py):
# fields missing or null (servers omit several the schema requires) and the values of `object`
# (Azure's first stream chunk has an empty one) and `finish_reason` (vendors have their own),
# and an empty `role` in a stream's delta.
_OPEN_VALUES = frozenset({"object", "finish_reason"})


def _tolerated(error: Any) -> bool:
    if error.validator == "required" or error.instance is None:
        return True
    if error.validator == "enum" and error.path and error.path[-1] in _OPEN_VALUES:
        return True
    if error.validator == "enum" and list(error.path)[-2:] == ["delta", "role"]:
        return error.instance == ""  # some servers send an empty role after the first chunk
    if error.validator in ("anyOf", "oneOf") and error.context:
        branches: dict[Any, list[Any]] = {}
        for sub in error.context:
            branches.setdefault(sub.schema_path[0], []).append(sub)
        return any(all(_tolerated(s) for s in subs) for subs in branches.values())
    return False


def schema_problems(schema: str, instance: Any) -> list[str]:
    """Where `instance` breaks the official OpenAI schema `schema`, beyond what is tolerated."""
    return [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message[:120]}"
        for e in _validator(schema).iter_errors(instance)
        if not _tolerated(e)
    ]


# -- a scripted upstream and valid OpenAI-wire answers to mutate ------------------------------


class Scripted(ThreadedRawServer):
    """Answers every request (keep-alive) with `answer`: a JSON document, or SSE bytes."""

    answer: Any = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
                length = next(
                    (
                        int(h.split(":", 1)[1])
                        for h in head
                        if h.lower().startswith("content-length:")
                    ),
                    0,
                )
                await reader.readexactly(length)
                if isinstance(self.answer, bytes):
                    data, kind = self.answer, b"text/event-stream"
                else:
                    data, kind = json.dumps(self.answer).encode(), b"application/json"
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n%s"
                    % (kind, len(data), data)
                )
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


OPENAI = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1700000000,
    "model": "m",
    "system_fingerprint": "fp",
    "choices": [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": "hello",
                "refusal": None,
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                ],
            },
            "logprobs": {
                "content": [
                    {
                        "token": "he",
                        "logprob": -0.1,
                        "bytes": [104, 101],
                        "top_logprobs": [{"token": "he", "logprob": -0.1, "bytes": [104, 101]}],
                    }
                ],
                "refusal": None,
            },
            "finish_reason": "tool_calls",
        }
    ],
    "usage": {
        "prompt_tokens": 3,
        "completion_tokens": 2,
        "total_tokens": 5,
        "prompt_tokens_details": {"cached_tokens": 0},
    },
}


def _chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


OPENAI_STREAM = [
    _chunk({"role": "assistant", "content": ""}),
    _chunk({"content": "hel"}),
    _chunk(
        {
            "tool_calls": [
                {
                    "index": 0,
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "f", "arguments": "{}"},
                }
            ]
        }
    ),
    _chunk({}, "stop"),
]


def _event_name(event: Any) -> bytes:
    kind = event.get("type") if isinstance(event, dict) else None
    return kind.encode()[:40] if isinstance(kind, str) and kind.isidentifier() else b"x"


def sse(wire: str, events: list[dict[str, Any]]) -> bytes:
    if wire == "anthropic":
        return b"".join(
            b"event: %s\ndata: %s\n\n" % (_event_name(e), json.dumps(e).encode()) for e in events
        )
    tail = b"data: [DONE]\n\n" if wire == "openai" else b""
    return b"".join(b"data: %s\n\n" % json.dumps(e).encode() for e in events) + tail
