"""OpenAI shapes that mapping adapters build (chunks, completions, usage, error bodies) and what
they share when reading a chat request (messages, turns, function tools)."""

from __future__ import annotations

import re
from collections.abc import Iterator
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


class TranslationError(ValueError):
    """A chat request that the provider's API cannot express; `param` names the offending field."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def chat_messages(messages: Any) -> Iterator[tuple[str, Any, dict[str, Any]]]:
    """(param, role, message) for each message of a chat request, each checked to be an object."""
    if not isinstance(messages, list) or not messages:
        raise TranslationError("messages must be a non-empty list", "messages")
    for i, msg in enumerate(messages):
        param = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise TranslationError(f"{param} must be an object", param)
        yield param, msg.get("role"), msg


def unsupported_role(param: str, role: Any) -> TranslationError:
    return TranslationError(f"{param}: role {role!r} is not supported", f"{param}.role")


def add_turn(turns: list[dict[str, Any]], role: str, key: str, items: list[Any]) -> None:
    """Append a turn holding `items` under `key`; consecutive turns of one role become one (the
    providers want user and assistant turns to alternate). No items: no turn."""
    if not items:
        return
    if turns and turns[-1]["role"] == role:
        turns[-1][key].extend(items)
    else:
        turns.append({"role": role, key: items})


def require_turns(turns: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if not turns:
        raise TranslationError("messages hold no user or assistant content", "messages")
    return turns


def function_tools(tools: Any) -> list[dict[str, Any]]:
    """The `function` objects of a request's `tools` (only function tools can be mapped)."""
    if not isinstance(tools, list):
        raise TranslationError("tools must be a list", "tools")
    out = []
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or tool.get("type", "function") != "function":
            raise TranslationError(f"tools[{i}]: only function tools are supported", "tools")
        out.append(fn)
    return out


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


def one_tool_call(body: dict[str, Any]) -> bool:
    """Did the (OpenAI) request ask for at most one tool call (`parallel_tool_calls: false`)?
    Vendors without such a switch (Gemini, Bedrock's Converse) have their answers cut to it."""
    return body.get("parallel_tool_calls") is False and bool(body.get("tools"))


def first_tool_call_only(answer: bytes) -> bytes:
    """A chat.completion with each choice's tool calls cut to the first: what a client that
    set `parallel_tool_calls: false` may get. The finish reason stays `tool_calls` (one call is
    left) and the usage stays the vendor's (it generated, and bills, every call)."""
    if answer.count(b'"type":"function"') < 2:  # the mappings' own encoding: one call or none
        return answer
    doc = orjson.loads(answer)
    for choice in doc.get("choices") or ():
        msg = choice.get("message") or {}
        if len(msg.get("tool_calls") or ()) > 1:
            msg["tool_calls"] = msg["tool_calls"][:1]
    return orjson.dumps(doc)


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
