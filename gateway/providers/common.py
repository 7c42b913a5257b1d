"""OpenAI shapes that mapping adapters build: chunks, completions, usage, error bodies."""

from __future__ import annotations

import re
from typing import Any

import orjson

from gateway.wire.sse import DONE, encode_event

# A provider's words for a prompt longer than the model's window (Anthropic: "prompt is too
# long: 210000 tokens > 200000 maximum", "input length and `max_tokens` exceed context limit";
# Bedrock: "Input is too long for requested model").
_CONTEXT_OVERFLOW = re.compile(
    r"(?i)prompt is too long|exceed(s|ed)? (the )?context (limit|window)|context window|"
    r"input is too long|too many (input )?tokens"
)


def is_context_overflow(message: str) -> bool:
    return bool(_CONTEXT_OVERFLOW.search(message))


def error_body(
    message: str, type_: str, code: str | None = None, param: str | None = None
) -> bytes:
    """An OpenAI error body (what the dispatcher's 4xx pass-through reads)."""
    err: dict[str, Any] = {"message": message, "type": type_, "param": param, "code": code}
    return orjson.dumps({"error": err})


def usage(prompt: int, completion: int, cached: int | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    if cached is not None:
        out["prompt_tokens_details"] = {"cached_tokens": cached}
    return out


def wants_usage(body: dict[str, Any]) -> bool:
    """Did the (OpenAI) request ask for the usage chunk at the end of a stream?"""
    opts = body.get("stream_options")
    return isinstance(opts, dict) and bool(opts.get("include_usage"))


class ChunkWriter:
    """`chat.completion.chunk` events of one stream (same id, created and model on each)."""

    __slots__ = ("_head",)

    def __init__(self, id_: str, created: int, model: str) -> None:
        # The fixed start of every chunk, serialised once.
        self._head = orjson.dumps(
            {"id": id_, "object": "chat.completion.chunk", "created": created, "model": model}
        )[:-1]

    def delta(self, delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return self._event(b',"choices":[' + orjson.dumps(choice) + b"]}")

    def usage(self, u: dict[str, Any]) -> bytes:
        return self._event(b',"choices":[],"usage":' + orjson.dumps(u) + b"}")

    def _event(self, tail: bytes) -> bytes:
        return encode_event(self._head + tail)

    done = DONE
