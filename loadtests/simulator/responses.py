"""OpenAI-shaped response bodies and SSE chunks, built as bytes.

Per-token chunks are spliced from precomputed pieces (``head + word + tail``) because a streamed
answer is hundreds of chunks; whole bodies go through orjson.
"""

from __future__ import annotations

from typing import Any

import orjson

from .behaviour import Choice, Plan, chat_logprobs, completion_logprobs
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

    def final_chunk(self, finish: str) -> bytes:
        return self.chunk([{"index": 0, "delta": {}, "logprobs": None, "finish_reason": finish}])

    def usage_chunk(self, usage_: dict[str, Any]) -> bytes:
        return self.chunk([], usage_)

    def body(self, text: str | None, finish: str, usage_: dict[str, Any]) -> bytes:
        message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
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

    # -- planned answers (n, tools, structured output, logprobs, stop): built per chunk ---------

    def plan_start(self, plan: Plan) -> bytes:
        """The first chunk of each choice: the role (and a tool call's id and name)."""
        out = []
        for c in plan.choices:
            delta: dict[str, Any] = {"role": "assistant", "content": ""}
            if c.calls:
                delta = {"role": "assistant", "content": None, "tool_calls": [_call_head(c, 0)]}
            choice = {"index": c.index, "delta": delta, "logprobs": None, "finish_reason": None}
            out.append(self.chunk([choice]))
        return b"".join(out)

    def _piece(self, c: Choice, j: int, plan: Plan) -> dict[str, Any]:
        p = c.pieces[j]
        if c.calls:
            k = c.piece_call[j]
            if k and c.piece_call[j - 1] != k:  # a later call starts: its id and name first
                call = _call_head(c, k)
                call["function"]["arguments"] = p
            else:
                call = {"index": k, "function": {"arguments": p}}
            delta: dict[str, Any] = {"tool_calls": [call]}
        else:
            delta = {"content": p}
        lp = None
        if c.logprobs is not None:
            lp = {"content": chat_logprobs(c.logprobs[j : j + 1], [p]), "refusal": None}
        return {"index": c.index, "delta": delta, "logprobs": lp, "finish_reason": None}

    def _finish(self, c: Choice) -> dict[str, Any]:
        return {"index": c.index, "delta": {}, "logprobs": None, "finish_reason": c.finish}

    def plan_pieces(self, plan: Plan, lo: int, hi: int) -> bytes:
        """Chunks of tokens ``lo..hi`` of every choice, and the finish of choices ending there."""
        out = []
        for c in plan.choices:
            n = len(c.pieces)
            for j in range(lo, min(hi, n)):
                out.append(self.chunk([self._piece(c, j, plan)]))
            if n <= hi and (n > lo or lo == 0):
                out.append(self.chunk([self._finish(c)]))
        return b"".join(out)

    def plan_body(self, plan: Plan, usage_: dict[str, Any]) -> bytes:
        choices = []
        for c in plan.choices:
            message: dict[str, Any] = {"role": "assistant", "content": None, "refusal": None}
            if c.calls:
                message["tool_calls"] = c.calls
            else:
                message["content"] = c.text
            lp = None
            if c.logprobs is not None:
                lp = {"content": chat_logprobs(c.logprobs, c.pieces), "refusal": None}
            choices.append(
                {"index": c.index, "message": message, "logprobs": lp, "finish_reason": c.finish}
            )
        return orjson.dumps(
            {**self.base, "object": "chat.completion", "choices": choices, "usage": usage_}
        )


def _call_head(c: Choice, k: int) -> dict[str, Any]:
    """The first delta of tool call ``k``: its index, id, type and name."""
    call = c.calls[k]
    head = {"name": call["function"]["name"], "arguments": ""}
    return {"index": k, "id": call["id"], "type": "function", "function": head}


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

    def body(self, text: str | None, finish: str, usage_: dict[str, Any]) -> bytes:
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        return orjson.dumps({**self.base, "choices": [choice], "usage": usage_})

    def plan_start(self, plan: Plan) -> bytes:
        """The echoed prompt of each choice (legacy `echo`), else nothing."""
        return b"".join(
            self.chunk(
                [{"index": c.index, "text": c.echo, "logprobs": None, "finish_reason": None}]
            )
            for c in plan.choices
            if c.echo
        )

    def _piece(self, c: Choice, j: int, plan: Plan) -> dict[str, Any]:
        p = c.pieces[j]
        lp = None
        if c.logprobs is not None:
            offset = len(c.echo) + len("".join(c.pieces[:j]))
            lp = completion_logprobs(c.logprobs[j : j + 1], [p], offset)
        return {"index": c.index, "text": p, "logprobs": lp, "finish_reason": None}

    def _finish(self, c: Choice) -> dict[str, Any]:
        return {"index": c.index, "text": "", "logprobs": None, "finish_reason": c.finish}

    def plan_body(self, plan: Plan, usage_: dict[str, Any]) -> bytes:
        choices = []
        for c in plan.choices:
            lp = None
            if c.logprobs is not None:
                lp = completion_logprobs(c.logprobs, c.pieces, len(c.echo))
            choices.append(
                {"index": c.index, "text": c.text, "logprobs": lp, "finish_reason": c.finish}
            )
        return orjson.dumps({**self.base, "choices": choices, "usage": usage_})
