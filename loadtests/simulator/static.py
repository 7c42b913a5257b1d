"""The zero-latency fast path: a fixed answer, built from precomputed bytes, with no task.

Used while a zero-latency instance has no faults set: the request is answered straight from the
connection's ``data_received`` call. Only ``model``, ``stream``, the prompt length (for usage) and
``stream_options.include_usage`` are read; the answer text is the same every time.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import orjson

from .behaviour import needs_plan
from .http import Request, head
from .responses import DONE, ChatFormat, CompletionFormat, usage
from .text import count_tokens, join_words, render_messages, word_ids

if TYPE_CHECKING:
    from .server import Instance


class StaticAnswers:
    def __init__(self, inst: Instance) -> None:
        self.inst = inst
        self.n = inst.profile.static_output_tokens
        self.ids = word_ids(0, 0, self.n)
        self.text = join_words(self.ids, True)
        self.default_model = inst.profile.models[0]
        fp = inst.fingerprint
        # Chat body = A + id + B + created + C + model + D + usage numbers + E.
        self.a = b'{"id":"chatcmpl-'
        self.b = b'","object":"chat.completion","created":'
        self.c = b',"model":'
        self.d = (
            b',"system_fingerprint":"' + fp.encode() + b'","choices":[{"index":0,"message":'
            b'{"role":"assistant","content":' + orjson.dumps(self.text) + b',"refusal":null},'
            b'"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":'
        )
        self.e = b',"prompt_tokens_details":{"cached_tokens":0}}}'
        self.head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n" + inst.extra
        self.sse_head = head(
            200, inst.extra + b"cache-control: no-cache\r\n", b"text/event-stream", None
        )
        self.counter = 0

    def answer(self, req: Request, chat: bool) -> bytes | None:
        """The whole HTTP response, or None to let the general path handle (and reject) it."""
        try:
            body = orjson.loads(req.body)
        except orjson.JSONDecodeError:
            return None
        if not isinstance(body, dict) or needs_plan(body):
            return None  # n, tools, structured output...: the general path
        model = body.get("model", self.default_model)
        if not isinstance(model, str):
            return None
        prompt = _prompt_tokens(body, chat)
        if prompt is None:
            return None
        stats = self.inst.stats
        stats.count_request("chat" if chat else "completions")
        stats.count_status(200)
        stats.prompt_tokens += prompt
        stats.completion_tokens += self.n
        self.counter += 1
        if body.get("stream") is True:
            return self._stream(body, model, prompt, chat)
        if not chat:
            return self._completion(model, prompt)
        out = b"".join(
            (
                self.a,
                self.inst.name.encode(),
                b"-%d" % self.counter,
                self.b,
                b"%d" % int(time.time()),
                self.c,
                orjson.dumps(model),
                self.d,
                b'%d,"completion_tokens":%d,"total_tokens":%d' % (prompt, self.n, prompt + self.n),
                self.e,
            )
        )
        length = b"content-length: %d\r\n" % len(out)
        tail = b"\r\n" if req.keep_alive else b"connection: close\r\n\r\n"
        return self.head + length + tail + out

    def _fmt(self, chat: bool, model: str, include_usage: bool) -> ChatFormat:
        kind, prefix = (ChatFormat, "chatcmpl-") if chat else (CompletionFormat, "cmpl-")
        rid = f"{prefix}{self.inst.name}-{self.counter}"
        return kind(rid, int(time.time()), model, self.inst.fingerprint, include_usage)

    def _completion(self, model: str, prompt: int) -> bytes:
        fmt = self._fmt(False, model, False)
        body = fmt.body(self.text, "stop", usage(prompt, self.n, 0))
        return self.inst.response(200, body)

    def _stream(self, body: dict[str, Any], model: str, prompt: int, chat: bool) -> bytes:
        opts = body.get("stream_options")
        include_usage = isinstance(opts, dict) and bool(opts.get("include_usage"))
        fmt = self._fmt(chat, model, include_usage)
        payload = fmt.role_chunk("") + fmt.words(self.ids, True) + fmt.final_chunk("stop")
        if include_usage:
            payload += fmt.usage_chunk(usage(prompt, self.n, 0))
        payload += DONE
        return self.sse_head + b"%x\r\n%s\r\n0\r\n\r\n" % (len(payload), payload)


def _prompt_tokens(body: dict[str, Any], chat: bool) -> int | None:
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return None
        if not all(isinstance(m, dict) for m in messages):
            return None
        return count_tokens(render_messages(messages))
    prompt = body.get("prompt", "")
    return count_tokens(prompt) if isinstance(prompt, str) else None
