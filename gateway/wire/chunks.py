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
    """Accumulates chat.completion.chunk events into one chat.completion (choices by index), or
    a completions stream's text_completion events into one text_completion (``endpoint``).

    The answer is what was streamed: every text a delta carries (content, refusal, a provider's
    reasoning text, tool-call and function-call arguments) joined, other delta fields kept.

    Relaying an event only keeps it; the events are parsed when the answer is read (at the end of
    the stream, or when a broken stream is resumed), all of them in one parse. A chunk that is not
    what OpenAI sends (not an object, an error, a field of the wrong type) marks the answer as not
    complete rather than raising.
    """

    def __init__(self, endpoint: str = "chat") -> None:
        self._text = endpoint == "completions"  # `choices[].text`, not deltas
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
                "refusal": [],
                "finish_reason": None,
                "tool_calls": {},
                "logprobs": [],
                "refusal_logprobs": [],
                "other": {},
            }
        if self._text:
            text = c.get("text")
            if text:
                if type(text) is not str:
                    raise TypeError("text")
                slot["content"].append(text)
        delta = None if self._text else c.get("delta")
        if delta:
            for key, value in delta.items():
                if value is None:
                    continue
                if key == "content" or key == "refusal":
                    if type(value) is not str:
                        raise TypeError(key)
                    if value:
                        slot[key].append(value)
                elif key == "role":
                    if value:
                        slot["role"] = value
                elif key == "tool_calls":
                    if value:
                        self._feed_calls(slot["tool_calls"], value)
                elif key == "function_call":
                    self._feed_function(slot["other"], value)
                else:  # a provider's reasoning text joined; other fields as last sent
                    other = slot["other"]
                    prev = other.get(key)
                    if type(value) is str and type(prev) is str:
                        other[key] = prev + value
                    else:
                        other[key] = value
        lp = c.get("logprobs")
        if lp and isinstance(lp, dict):
            if self._text:
                self._feed_text_logprobs(slot, lp)
            else:
                # Kept, so a replayed answer still has them.
                if isinstance(lp.get("content"), list):
                    slot["logprobs"].extend(lp["content"])
                if isinstance(lp.get("refusal"), list):
                    slot["refusal_logprobs"].extend(lp["refusal"])
        finish = c.get("finish_reason")
        if finish:
            slot["finish_reason"] = finish

    @staticmethod
    def _feed_text_logprobs(slot: dict[str, Any], lp: dict[str, Any]) -> None:
        """A completions chunk's logprobs: its lists appended to the answer's."""
        have = slot["other"].setdefault("logprobs", {})
        for key, value in lp.items():
            if isinstance(value, list):
                have.setdefault(key, []).extend(value)

    @staticmethod
    def _feed_function(other: dict[str, Any], fn: Any) -> None:
        """A legacy `function_call` delta: its name and arguments joined."""
        if type(fn) is not dict:
            raise TypeError("function_call")
        cur = other.setdefault("function_call", {"name": "", "arguments": ""})
        cur["name"] += fn.get("name") or ""
        cur["arguments"] += fn.get("arguments") or ""

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
        if self._text:
            return self._to_text_completion()
        choices = []
        for i in sorted(self.choices):
            s = self.choices[i]
            content = "".join(s["content"]) or None
            refusal = "".join(s["refusal"]) or None
            msg: dict[str, Any] = {"role": s["role"], "content": content, "refusal": refusal}
            if s["tool_calls"]:
                msg["tool_calls"] = [s["tool_calls"][k] for k in sorted(s["tool_calls"])]
            elif content is None and refusal is None and "function_call" not in s["other"]:
                msg["content"] = ""  # an empty answer is an empty text, as OpenAI sends it
            for key, value in s["other"].items():
                msg.setdefault(key, value)
            lp = None
            if s["logprobs"] or s["refusal_logprobs"]:
                lp = {"content": s["logprobs"] or None, "refusal": s["refusal_logprobs"] or None}
            choices.append(
                {"index": i, "message": msg, "finish_reason": s["finish_reason"], "logprobs": lp}
            )
        return self._answer("chat.completion", "chatcmpl-gateway", choices)

    def _to_text_completion(self) -> dict[str, Any]:
        choices = []
        for i in sorted(self.choices):
            s = self.choices[i]
            choices.append(
                {
                    "index": i,
                    "text": "".join(s["content"]),
                    "finish_reason": s["finish_reason"],
                    "logprobs": s["other"].get("logprobs"),
                }
            )
        return self._answer("text_completion", "cmpl-gateway", choices)

    def _answer(self, obj: str, default_id: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.meta.get("id") or default_id,
            "object": obj,
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
