"""The fields of an OpenAI-wire answer that clients branch on or read into typed values, checked
where `answer_checks` stops at the top level: log probabilities, tool calls, roles, indices.

The rule is the same for every field: a value the API types is of that type when present, and
a value a client switches on is one the API names (`role` is "assistant", a tool call's `type`
is "function"). A missing field stays tolerated (OpenAI-compatible servers omit several the
schema lists as required), and so does a `finish_reason` the schema does not list: vendors
have their own (TGI's "eos_token", vLLM's "abort"), and a client reading an unknown reason
still reads the answer. Each function raises InvalidAnswer, the caller's attempt failure.
"""

from __future__ import annotations

import binascii
from typing import Any


class InvalidAnswer(Exception):
    """An answer that must not count as a success. The message names no upstream content."""


def _number(value: Any) -> bool:
    return (type(value) is float or type(value) is int) and value == value  # NaN is not


def _token(entry: Any, top: bool) -> None:
    """One ChatCompletionTokenLogprob (or one of its `top_logprobs`)."""
    if type(entry) is not dict:
        raise InvalidAnswer("a logprobs entry is not an object")
    if type(entry.get("token")) is not str:
        raise InvalidAnswer("a logprobs entry's token is not a string")
    if not _number(entry.get("logprob")):
        raise InvalidAnswer("a logprobs entry's logprob is not a number")
    raw = entry.get("bytes")
    if raw is not None and (
        type(raw) is not list or any(type(b) is not int or not 0 <= b <= 255 for b in raw)
    ):
        raise InvalidAnswer("a logprobs entry's bytes are not byte values")
    if top:
        return
    alternatives = entry.get("top_logprobs")
    if alternatives is None:
        return
    if type(alternatives) is not list:
        raise InvalidAnswer("a logprobs entry's top_logprobs is not a list")
    for alt in alternatives:
        _token(alt, top=True)


def chat_logprobs(value: Any) -> None:
    """A chat choice's `logprobs`: null, or an object whose `content` and `refusal` are null or
    lists of token entries."""
    if value is None:
        return
    if type(value) is not dict:
        raise InvalidAnswer("a choice's logprobs is not an object")
    for key in ("content", "refusal"):
        tokens = value.get(key)
        if tokens is None:
            continue
        if type(tokens) is not list:
            raise InvalidAnswer(f"a choice's logprobs.{key} is not a list")
        for entry in tokens:
            _token(entry, top=False)


def completion_logprobs(value: Any) -> None:
    """A completions choice's `logprobs`: null, or parallel lists of tokens (strings), their
    log probabilities (numbers or null), the alternatives (objects of numbers or null) and
    text offsets (integers)."""
    if value is None:
        return
    if type(value) is not dict:
        raise InvalidAnswer("a choice's logprobs is not an object")
    checks = {
        "tokens": lambda v: type(v) is str,
        "token_logprobs": lambda v: v is None or _number(v),
        "top_logprobs": lambda v: (
            v is None or (type(v) is dict and all(_number(x) for x in v.values()))
        ),
        "text_offset": lambda v: type(v) is int,
    }
    for key, ok in checks.items():
        items = value.get(key)
        if items is None:
            continue
        if type(items) is not list or not all(ok(v) for v in items):
            raise InvalidAnswer(f"a choice's logprobs.{key} holds a value of the wrong type")


def role(value: Any, delta: bool = False) -> None:
    """A message's or delta's `role`: absent, null or "assistant" (an answer in another role is
    not an answer). A delta may also carry an empty one, as some servers send after the first."""
    if value is not None and value != "assistant" and not (delta and value == ""):
        raise InvalidAnswer("a message's role is not 'assistant'")


def index(value: Any) -> None:
    """A choice's `index`: absent or a non-negative integer (a boolean is not one)."""
    if value is not None and (type(value) is not int or value < 0):
        raise InvalidAnswer("a choice's index is not a number")


def tool_call(call: dict[str, Any], complete: bool) -> None:
    """A tool call's `type` is "function" when present. In a whole answer (`complete`) the call
    has an id (the client's tool result must name it) and a function with a name and arguments;
    in a stream they come in pieces, so any may be missing from one chunk."""
    kind = call.get("type")
    if kind is not None and kind != "function":
        raise InvalidAnswer("a tool call's type is not 'function'")
    if not complete:
        return
    if type(call.get("id")) is not str:
        raise InvalidAnswer("a tool call has no id")
    fn = call.get("function")
    if type(fn) is not dict or type(fn.get("name")) is not str:
        raise InvalidAnswer("a tool call has no function name")
    if type(fn.get("arguments")) is not str:
        raise InvalidAnswer("a tool call has no arguments")


def text(obj: dict[str, Any], key: str) -> None:
    """A field the API types as a string: absent, null or a string."""
    value = obj.get(key)
    if value is not None and type(value) is not str:
        raise InvalidAnswer(f"an answer's {key} is not a string")


def base64_floats(value: str) -> bool:
    """Whether a base64 embedding decodes to float32 values (a whole number of 4-byte floats,
    at least one)."""
    try:
        raw = binascii.a2b_base64(value, strict_mode=True)
    except (binascii.Error, ValueError):
        return False
    return len(raw) > 0 and len(raw) % 4 == 0
