"""Convert between a chat completion and its stream of chunks.

Used to cache a streamed answer once it is complete, and to replay a cached (or degraded) answer
as a proper SSE stream: a role chunk, content, a finish chunk, usage when asked for, `[DONE]`.
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.wire.sse import DONE, encode_event, event_data, split_events

_META = ("id", "created", "model", "system_fingerprint")


class StreamAssembler:
    """Accumulates chat.completion.chunk events into one chat.completion (choices by index).

    Relaying an event only keeps it; the events are parsed when the answer is read (at the end of
    the stream, or when a broken stream is resumed), all of them in one parse. A chunk that is not
    what OpenAI sends (not an object, an error, a field of the wrong type) marks the answer as not
    complete rather than raising.
    """

    def __init__(self) -> None:
        self._pending: list[bytes] = []
        self._meta: dict[str, Any] = {}
        self._choices: dict[int, dict[str, Any]] = {}
        self._usage: dict[str, Any] | None = None
        self._done = False
        self._ok = True

    def feed_event(self, event: bytes) -> None:
        self._pending.append(event)

    def feed(self, events: bytes | list[bytes]) -> None:
        """Keep whole events: a list of them, or a block of them (`SSESplitter.feed_block`)."""
        if isinstance(events, bytes):
            self._pending.append(events)
        else:
            self._pending.extend(events)

    @property
    def meta(self) -> dict[str, Any]:
        self._settle()
        return self._meta

    @property
    def choices(self) -> dict[int, dict[str, Any]]:
        self._settle()
        return self._choices

    @property
    def usage(self) -> dict[str, Any] | None:
        self._settle()
        return self._usage

    @property
    def done(self) -> bool:
        self._settle()
        return self._done

    @property
    def ok(self) -> bool:
        self._settle()
        return self._ok

    def _settle(self) -> None:
        if not self._pending:
            return
        body = b"".join(self._pending)
        self._pending = []
        feed = self._feed_choice
        try:
            for chunk in self._parse(body):
                if type(chunk) is not dict or "error" in chunk:
                    self._ok = False
                    continue
                if not self._meta:
                    self._meta = {k: chunk.get(k) for k in _META}
                usage = chunk.get("usage")
                if usage:
                    self._usage = usage
                choices = chunk.get("choices")
                if choices:
                    for c in choices:
                        feed(c)
        except (AttributeError, TypeError, KeyError):
            self._ok = False  # a field of the wrong type somewhere in a chunk

    def _parse(self, body: bytes) -> list[Any]:
        """The chunks that whole events carry; `[DONE]` noted, comments skipped."""
        # The usual stream, every event one `data: ` line: its payloads joined into one JSON
        # array, one parse. JSON text holds no raw newline, so the separator only occurs between
        # events; anything else fails to parse or gives another count, and takes the slow path.
        ended = body.endswith(DONE)
        head = body[: -len(DONE)] if ended else body
        n = head.count(b"\n\n")
        if n and head.startswith(b"data: "):
            try:
                chunks = orjson.loads(b"[" + head[6:-2].replace(b"\n\ndata: ", b",") + b"]")
            except orjson.JSONDecodeError:
                chunks = None
            if isinstance(chunks, list) and len(chunks) == n:
                self._done = self._done or ended
                return chunks
        out: list[Any] = []
        for ev in split_events(body):
            data = event_data(ev)
            if data is None:
                continue
            if data == b"[DONE]":
                self._done = True
                continue
            try:
                out.append(orjson.loads(data))
            except orjson.JSONDecodeError:
                self._ok = False
        return out

    def _feed_choice(self, c: dict[str, Any]) -> None:
        index = c.get("index", 0)
        if type(index) is not int:
            raise TypeError("choice index")
        slot = self._choices.get(index)
        if slot is None:
            slot = self._choices[index] = {
                "role": "assistant",
                "content": [],
                "finish_reason": None,
                "tool_calls": {},
                "logprobs": [],
            }
        delta = c.get("delta")
        if delta:
            text = delta.get("content")
            if text:
                if type(text) is not str:
                    raise TypeError("content")
                slot["content"].append(text)
            role = delta.get("role")
            if role:
                slot["role"] = role
            calls = delta.get("tool_calls")
            if calls:
                self._feed_calls(slot["tool_calls"], calls)
        lp = c.get("logprobs")
        if lp and isinstance(lp, dict) and isinstance(lp.get("content"), list):
            slot["logprobs"].extend(lp["content"])  # kept, so a replayed answer still has them
        finish = c.get("finish_reason")
        if finish:
            slot["finish_reason"] = finish

    @staticmethod
    def _feed_calls(calls: dict[int, dict[str, Any]], deltas: list[Any]) -> None:
        for tc in deltas:
            index = tc.get("index", 0)
            if type(index) is not int:
                raise TypeError("tool call index")
            cur = calls.get(index)
            if cur is None:
                cur = calls[index] = {
                    "id": None,
                    "type": "function",
                    "function": {"name": "", "arguments": ""},
                }
            if tc.get("id"):
                cur["id"] = tc["id"]
            fn = tc.get("function") or {}
            cur["function"]["name"] += fn.get("name") or ""
            cur["function"]["arguments"] += fn.get("arguments") or ""

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
