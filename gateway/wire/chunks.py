"""Convert between a chat completion and its stream of chunks.

Used to cache a streamed answer once it is complete, and to replay a cached (or degraded) answer
as a proper SSE stream: a role chunk, content, a finish chunk, usage when asked for, `[DONE]`.
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.wire.sse import DONE, encode_event, event_data


class StreamAssembler:
    """Accumulates chat.completion.chunk events into one chat.completion (choices by index)."""

    def __init__(self) -> None:
        self.meta: dict[str, Any] = {}
        self.choices: dict[int, dict[str, Any]] = {}
        self.usage: dict[str, Any] | None = None
        self.done = False
        self.ok = True

    def feed_event(self, event: bytes) -> None:
        data = event_data(event)
        if data is None:
            return
        if data == b"[DONE]":
            self.done = True
            return
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError:
            self.ok = False
            return
        if not isinstance(chunk, dict) or "error" in chunk:
            self.ok = False
            return
        if not self.meta:
            self.meta = {k: chunk.get(k) for k in ("id", "created", "model", "system_fingerprint")}
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for c in chunk.get("choices") or []:
            self._feed_choice(c)

    def _feed_choice(self, c: dict[str, Any]) -> None:
        slot = self.choices.setdefault(
            c.get("index", 0),
            {
                "role": "assistant",
                "content": [],
                "finish_reason": None,
                "tool_calls": {},
                "logprobs": [],
            },
        )
        lp = c.get("logprobs")
        if isinstance(lp, dict) and isinstance(lp.get("content"), list):
            slot["logprobs"].extend(lp["content"])  # kept, so a replayed answer still has them
        delta = c.get("delta") or {}
        if delta.get("role"):
            slot["role"] = delta["role"]
        if delta.get("content"):
            slot["content"].append(delta["content"])
        for tc in delta.get("tool_calls") or []:
            cur = slot["tool_calls"].setdefault(
                tc.get("index", 0),
                {"id": None, "type": "function", "function": {"name": "", "arguments": ""}},
            )
            if tc.get("id"):
                cur["id"] = tc["id"]
            fn = tc.get("function") or {}
            cur["function"]["name"] += fn.get("name") or ""
            cur["function"]["arguments"] += fn.get("arguments") or ""
        if c.get("finish_reason"):
            slot["finish_reason"] = c["finish_reason"]

    def content(self, index: int = 0) -> str:
        slot = self.choices.get(index)
        return "".join(slot["content"]) if slot else ""

    def complete(self) -> bool:
        return (
            self.ok
            and self.done
            and bool(self.choices)
            and all(s["finish_reason"] for s in self.choices.values())
        )

    def to_completion(self) -> dict[str, Any]:
        choices = []
        for i in sorted(self.choices):
            s = self.choices[i]
            msg: dict[str, Any] = {
                "role": s["role"],
                "content": "".join(s["content"]) or None,
                "refusal": None,
            }
            if s["tool_calls"]:
                msg["tool_calls"] = [s["tool_calls"][k] for k in sorted(s["tool_calls"])]
            else:
                msg["content"] = msg["content"] or ""
            lp = {"content": s["logprobs"], "refusal": None} if s["logprobs"] else None
            choices.append(
                {"index": i, "message": msg, "finish_reason": s["finish_reason"], "logprobs": lp}
            )
        out: dict[str, Any] = {
            "id": self.meta.get("id") or "chatcmpl-gateway",
            "object": "chat.completion",
            "created": self.meta.get("created") or 0,
            "model": self.meta.get("model") or "",
            "choices": choices,
        }
        if self.meta.get("system_fingerprint"):
            out["system_fingerprint"] = self.meta["system_fingerprint"]
        if self.usage:
            out["usage"] = self.usage
        return out


def completion_to_events(completion: dict[str, Any], include_usage: bool) -> list[bytes]:
    """Render a chat.completion as SSE events that the OpenAI SDKs accept."""
    base = {
        "id": completion.get("id", "chatcmpl-gateway"),
        "object": "chat.completion.chunk",
        "created": completion.get("created", 0),
        "model": completion.get("model", ""),
    }
    if completion.get("system_fingerprint"):
        base["system_fingerprint"] = completion["system_fingerprint"]
    events: list[bytes] = []
    for ch in completion.get("choices", []):
        i = ch.get("index", 0)
        msg = ch.get("message") or {}
        first: dict[str, Any] = {"role": msg.get("role", "assistant"), "content": ""}
        events.append(
            encode_event(
                orjson.dumps(
                    {**base, "choices": [{"index": i, "delta": first, "finish_reason": None}]}
                )
            )
        )
        delta: dict[str, Any] = {}
        if msg.get("content"):
            delta["content"] = msg["content"]
        if msg.get("tool_calls"):
            delta["tool_calls"] = [{"index": k, **tc} for k, tc in enumerate(msg["tool_calls"])]
        if delta:
            choice: dict[str, Any] = {"index": i, "delta": delta, "finish_reason": None}
            if ch.get("logprobs"):
                choice["logprobs"] = ch["logprobs"]
            events.append(encode_event(orjson.dumps({**base, "choices": [choice]})))
        events.append(
            encode_event(
                orjson.dumps(
                    {
                        **base,
                        "choices": [
                            {
                                "index": i,
                                "delta": {},
                                "finish_reason": ch.get("finish_reason") or "stop",
                            }
                        ],
                    }
                )
            )
        )
    if include_usage and completion.get("usage"):
        events.append(
            encode_event(orjson.dumps({**base, "choices": [], "usage": completion["usage"]}))
        )
    events.append(DONE)
    return events
