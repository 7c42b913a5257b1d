"""OpenAI-shaped response bodies and SSE chunks, built as bytes.

Per-token chunks are spliced from precomputed pieces (``head + word + tail``) because a streamed
answer is hundreds of chunks; whole bodies go through orjson.
"""

from __future__ import annotations

from typing import Any

import orjson

from .text import WORD_JSON_FIRST, WORD_JSON_NEXT

DONE = b"data: [DONE]\n\n"


def error_body(
    message: str, type_: str, param: str | None = None, code: str | None = None
) -> bytes:
    return orjson.dumps(
        {"error": {"message": message, "type": type_, "param": param, "code": code}}
    )


def usage(prompt: int, completion: int, cached: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


class ChatFormat:
    """Bodies and chunks of ``/v1/chat/completions`` for one response."""

    object_chunk = "chat.completion.chunk"
    # OpenAI's chat chunks carry "usage": null until the last one when usage is requested; the
    # legacy completion schema has no null usage, so those chunks leave the field out.
    null_usage = True

    def __init__(
        self, rid: str, created: int, model: str, fingerprint: str, include_usage: bool
    ) -> None:
        self.base = {
            "id": rid,
            "object": self.object_chunk,
            "created": created,
            "model": model,
            "system_fingerprint": fingerprint,
        }
        self.include_usage = include_usage
        prefix = orjson.dumps(self.base)[:-1]  # drop the closing brace
        self.head = b"data: " + prefix + self._choice_open()
        null_usage = include_usage and self.null_usage
        self.tail = self._choice_close() + (b',"usage":null}\n\n' if null_usage else b"}\n\n")

    def _choice_open(self) -> bytes:
        return b',"choices":[{"index":0,"delta":{"content":'

    def _choice_close(self) -> bytes:
        return b'},"logprobs":null,"finish_reason":null}]'

    def chunk(self, choices: list[dict[str, Any]], usage_: dict[str, Any] | None = None) -> bytes:
        d: dict[str, Any] = {**self.base, "choices": choices}
        if usage_ is not None or (self.include_usage and self.null_usage):
            d["usage"] = usage_
        return b"data: " + orjson.dumps(d) + b"\n\n"

    def role_chunk(self, content: str | None = "") -> bytes:
        delta = {"role": "assistant", "content": content}
        return self.chunk([{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}])

    def words(self, ids: list[int], first: bool) -> bytes:
        """One chunk per word; ``first`` = the very first word of the answer (no space)."""
        head, tail = self.head, self.tail
        out = []
        for i in ids:
            out.append(head + (WORD_JSON_FIRST[i] if first else WORD_JSON_NEXT[i]) + tail)
            first = False
        return b"".join(out)

    def tool_chunk(self, call: dict[str, Any]) -> bytes:
        delta = {"tool_calls": [{"index": 0, **call}]}
        return self.chunk([{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}])

    def final_chunk(self, finish: str) -> bytes:
        return self.chunk([{"index": 0, "delta": {}, "logprobs": None, "finish_reason": finish}])

    def usage_chunk(self, usage_: dict[str, Any]) -> bytes:
        return self.chunk([], usage_)

    def body(
        self,
        text: str | None,
        finish: str,
        usage_: dict[str, Any],
        tool_calls: list[dict[str, Any]] | None = None,
    ) -> bytes:
        message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
        if tool_calls:
            message["tool_calls"] = tool_calls
        return orjson.dumps(
            {
                **self.base,
                "object": "chat.completion",
                "choices": [
                    {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
                ],
                "usage": usage_,
            }
        )


class CompletionFormat(ChatFormat):
    """Bodies and chunks of the legacy ``/v1/completions`` (chunks share the body's shape)."""

    object_chunk = "text_completion"
    null_usage = False

    def _choice_open(self) -> bytes:
        return b',"choices":[{"index":0,"text":'

    def _choice_close(self) -> bytes:
        return b',"logprobs":null,"finish_reason":null}]'

    def role_chunk(self, content: str | None = "") -> bytes:
        return b""

    def final_chunk(self, finish: str) -> bytes:
        return self.chunk([{"index": 0, "text": "", "logprobs": None, "finish_reason": finish}])

    def body(
        self,
        text: str | None,
        finish: str,
        usage_: dict[str, Any],
        tool_calls: list[dict[str, Any]] | None = None,
    ) -> bytes:
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        return orjson.dumps({**self.base, "choices": [choice], "usage": usage_})
