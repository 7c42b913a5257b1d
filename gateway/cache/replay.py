"""A cached answer replayed as the stream a client asked for.

Entries are complete unary answers (a stream's is stored once it has ended), so a streaming
request that hits gets the answer rendered as its endpoint's SSE events: chat.completion.chunk
events for chat (with the message's content, refusal, tool calls and any other fields it
carries), text_completion events for completions. Every event has the answer's id, created
time, model and system fingerprint; usage comes as its own last event when
`stream_options.include_usage` asks; `[DONE]` ends the stream.
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.wire.sse import DONE, encode_event

_FIRST = frozenset({"role", "content", "refusal", "tool_calls"})


def _base(completion: dict[str, Any], obj: str, default_id: str) -> dict[str, Any]:
    base = {
        "id": completion.get("id", default_id),
        "object": obj,
        "created": completion.get("created", 0),
        "model": completion.get("model", ""),
    }
    if completion.get("system_fingerprint"):
        base["system_fingerprint"] = completion["system_fingerprint"]
    return base


def _event(base: dict[str, Any], choices: list[dict[str, Any]], **more: Any) -> bytes:
    return encode_event(orjson.dumps({**base, "choices": choices, **more}))


def _usage(base: dict[str, Any], completion: dict[str, Any], include_usage: bool) -> list[bytes]:
    if include_usage and completion.get("usage"):
        return [_event(base, [], usage=completion["usage"])]
    return []


def chat_events(completion: dict[str, Any], include_usage: bool) -> list[bytes]:
    """A chat.completion as chat.completion.chunk events that the OpenAI SDKs accept.

    A refusal is streamed as `refusal` deltas (content null), as OpenAI streams one: rendering
    only `content` replayed a refused answer as an empty one.
    """
    base = _base(completion, "chat.completion.chunk", "chatcmpl-gateway")
    events: list[bytes] = []
    for ch in completion.get("choices", []):
        i = ch.get("index", 0)
        msg = ch.get("message") or {}
        refused = msg.get("content") is None and isinstance(msg.get("refusal"), str)
        first: dict[str, Any] = {"role": msg.get("role") or "assistant"}
        first.update({"content": None, "refusal": ""} if refused else {"content": ""})
        events.append(_event(base, [{"index": i, "delta": first, "finish_reason": None}]))
        delta: dict[str, Any] = {}
        if msg.get("content"):
            delta["content"] = msg["content"]
        if msg.get("refusal"):
            delta["refusal"] = msg["refusal"]
        if msg.get("tool_calls"):
            delta["tool_calls"] = [{"index": k, **tc} for k, tc in enumerate(msg["tool_calls"])]
        # Other fields of the message (annotations, audio, a provider's reasoning text) ride
        # along with the text, as in a live stream's deltas.
        delta.update({k: v for k, v in msg.items() if k not in _FIRST and v is not None})
        if delta or ch.get("logprobs"):
            choice: dict[str, Any] = {"index": i, "delta": delta, "finish_reason": None}
            if ch.get("logprobs"):
                choice["logprobs"] = ch["logprobs"]
            events.append(_event(base, [choice]))
        finish = ch.get("finish_reason") or "stop"
        events.append(_event(base, [{"index": i, "delta": {}, "finish_reason": finish}]))
    events.extend(_usage(base, completion, include_usage))
    events.append(DONE)
    return events


def completion_events(completion: dict[str, Any], include_usage: bool) -> list[bytes]:
    """A text_completion as the legacy completions stream: each choice's text in a
    text_completion event, then its finish_reason with empty text (a chat rendering of it
    lost the text and was not a completions stream)."""
    base = _base(completion, "text_completion", "cmpl-gateway")
    events: list[bytes] = []
    for ch in completion.get("choices", []):
        i = ch.get("index", 0)
        text = ch.get("text") or ""
        if text or ch.get("logprobs"):
            choice = {
                "index": i,
                "text": text,
                "logprobs": ch.get("logprobs"),
                "finish_reason": None,
            }
            events.append(_event(base, [choice]))
        finish = ch.get("finish_reason") or "stop"
        choice = {"index": i, "text": "", "logprobs": None, "finish_reason": finish}
        events.append(_event(base, [choice]))
    events.extend(_usage(base, completion, include_usage))
    events.append(DONE)
    return events


def replay_events(endpoint: str, completion: dict[str, Any], include_usage: bool) -> list[bytes]:
    """The SSE events of a cached answer of `endpoint` (chat or completions)."""
    if endpoint == "completions":
        return completion_events(completion, include_usage)
    return chat_events(completion, include_usage)
