"""Upstream answers are checked before they count as a success, reach a client or a cache.

A 200 is a success only when it is what the endpoint promises: a JSON object of the endpoint's
shape (unary), or an SSE stream of JSON events that ends with `[DONE]` (or a chunk that finishes
every choice). Sizes are bounded per answer, per stream and per event, counting decompressed
bytes, so a compression bomb stops at the limit. A failed check is an attempt failure of kind
`bad_response`: retried on another member while nothing was sent, counted by the breaker, never
cached.

The checks are top level only and parse a unary body once (its bytes are relayed as received);
per stream event they are a few byte comparisons, with a slower path only for events that are
not ASCII (UTF-8 check) or that carry a secret.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field

from gateway.redact import MASK as REDACTED
from gateway.redact import Redactor, ascii_lower, has_escapes, public_prefix_len
from gateway.wire import answer_fields as fields
from gateway.wire.answer_fields import InvalidAnswer
from gateway.wire.sse import DONE, event_data, lf_lines

MIB = 1024 * 1024
MASK = REDACTED.encode()


class ResponseLimits(BaseModel):
    """Bounds on what one provider may send back (decompressed bytes)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_response_bytes: int = Field(
        16 * MIB,
        ge=1024,
        le=1024 * MIB,
        description="A non-streamed answer. Large float embedding batches may need more.",
    )
    max_stream_bytes: int = Field(
        256 * MIB, ge=1024, le=16 * 1024 * MIB, description="A whole streamed answer."
    )
    max_event_bytes: int = Field(
        1 * MIB, ge=1024, le=256 * MIB, description="One server-sent event of a stream."
    )


# Endpoint -> (list field, what each item must hold, expected type of that field).
_SHAPES: dict[str, tuple[str, str, tuple[type, ...]]] = {
    "chat": ("choices", "message", (dict,)),
    "completions": ("choices", "text", (str,)),
    "embeddings": ("data", "embedding", (list, str)),
}


def check_unary(endpoint: str, body: bytes) -> dict[str, Any]:
    """The parsed answer when it has the endpoint's shape; raises InvalidAnswer otherwise.

    Deep enough that whatever reads the answer next (the client's SDK, the Messages and
    Responses translations, usage accounting) finds the types the API promises: a chat
    message's content is a string or null, its tool calls a list of functions with string
    names and arguments, token counts non-negative integers.
    """
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise InvalidAnswer("the answer is not valid JSON") from None
    if not isinstance(doc, dict):
        raise InvalidAnswer("the answer is not a JSON object")
    if doc.get("error"):
        raise InvalidAnswer("the answer is an error object")
    if _check_meta(doc):  # relayed as received: a float must have been made an int before
        raise InvalidAnswer("the answer's created is not an integer")
    _check_usage(doc.get("usage"))
    shape = _SHAPES.get(endpoint)
    if shape is None:
        return doc
    field, member, types = shape
    items = doc.get(field)
    if not isinstance(items, list) or not items:
        raise InvalidAnswer(f"the answer has no '{field}' array")
    # A boolean is a number to `sum`: the exact check runs only when the body holds a JSON
    # boolean at all (an embeddings answer has no free text to hold the word). Looked for once:
    # per item, a batch of 64 vectors (1 MB) took 60 ms of scans.
    exact = endpoint == "embeddings" and (b"true" in body or b"false" in body)
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get(member), types):
            raise InvalidAnswer(f"an item of '{field}' has no valid '{member}'")
        fields.index(item.get("index"))
        if endpoint == "chat":
            _check_finish(item)
            _check_message(item["message"], item.get("finish_reason"))
            fields.chat_logprobs(item.get("logprobs"))
        elif endpoint == "completions":
            _check_finish(item)
            fields.completion_logprobs(item.get("logprobs"))
        elif endpoint == "embeddings":
            fields.text(item, "object")
            if not _numbers(item["embedding"], exact):
                raise InvalidAnswer("an embedding holds something other than numbers")
    return doc


def _numbers(embedding: list[Any] | str, exact: bool = False) -> bool:
    """A float embedding holds numbers only; a base64 one is the bytes of float32 values.
    `sum` is the cheapest full check: 4 us per 1,536 floats, and a TypeError on anything else
    but booleans, which `exact` looks for item by item."""
    if isinstance(embedding, str):
        return fields.base64_floats(embedding)
    try:
        sum(embedding)
    except TypeError:
        return False
    return not exact or all(type(x) is float or type(x) is int for x in embedding)


# An answer's (or chunk's) identity: what every SDK parses into typed fields (`id: str`,
# `created: int`...). A value of another type (`"created": "yesterday"`, `"id": 42`) is a
# broken answer, like any other field of the wrong type: retried, never relayed or cached.
_META_TEXTS = ("id", "model", "object", "system_fingerprint")


def _check_meta(doc: dict[str, Any]) -> bool:
    """Raises InvalidAnswer for an identity of the wrong types; True when `created` was a
    float and is now its whole seconds (the chunk must then be relayed re-encoded)."""
    for key in _META_TEXTS:
        value = doc.get(key)
        if value is not None and type(value) is not str:
            raise InvalidAnswer(f"the answer's {key} is not a string")
    created = doc.get("created")
    if created is None or (type(created) is int and 0 <= created < MAX_CREATED):
        return False
    if type(created) is float:  # `1733500000.0` (some OpenAI-compatible servers)
        doc["created"] = created = _whole_seconds(created)
        return True
    raise InvalidAnswer("the answer's created is not a timestamp")


# The end of year 9999: a later timestamp is a broken or hostile provider.
MAX_CREATED = 253402300800


def _whole_seconds(created: float) -> int:
    """A float timestamp floored to the integer the API promises; raises InvalidAnswer when it
    is not a finite time from 1970 to year 9999 (NaN fails both comparisons)."""
    if not 0 <= created < MAX_CREATED:
        raise InvalidAnswer("the answer's created is not a timestamp")
    return math.floor(created)


# `"created": <a number with a fraction or exponent>` somewhere in a body (a false hit inside a
# string costs one parse).
_FLOAT_CREATED = re.compile(rb'"created"\s*:\s*-?[0-9]*[.eE]')


def int_created(body: bytes) -> bytes:
    """A unary answer whose top-level `created` is a float, with it floored to an int (the
    body is relayed as received, so it is rewritten here); any other body as it is. A float
    out of range stays, for `check_unary` to refuse."""
    if _FLOAT_CREATED.search(body) is None:
        return body
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body
    if type(doc) is not dict or type(doc.get("created")) is not float:
        return body
    try:
        doc["created"] = _whole_seconds(doc["created"])
    except InvalidAnswer:
        return body
    return orjson.dumps(doc)


# A token count no real answer reaches: larger (or negative) ones are a broken or hostile
# provider, and would lift budgets or wrap counters if believed.
MAX_TOKENS = 1 << 31
_USAGE_COUNTS = ("prompt_tokens", "completion_tokens", "total_tokens")
_USAGE_DETAILS = ("prompt_tokens_details", "completion_tokens_details")


def _count(value: Any) -> bool:
    return type(value) is int and 0 <= value < MAX_TOKENS


def _check_usage(usage: Any) -> None:
    if usage is None:
        return
    if not isinstance(usage, dict):
        raise InvalidAnswer("the answer's usage is not an object")
    for key in _USAGE_COUNTS:
        if key in usage and not _count(usage[key]) and usage[key] is not None:
            raise InvalidAnswer(f"the answer's usage.{key} is not a token count")
    for key in _USAGE_DETAILS:
        details = usage.get(key)
        if details is None:
            continue
        if not isinstance(details, dict):
            raise InvalidAnswer(f"the answer's usage.{key} is not an object")
        for v in details.values():
            if v is not None and not _count(v):
                raise InvalidAnswer(f"the answer's usage.{key} holds something not a count")


def usage_counts(usage: Any) -> tuple[int | None, int | None]:
    """(prompt, completion) tokens of a usage object, each None unless a valid count."""
    if not isinstance(usage, dict):
        return None, None
    p, c = usage.get("prompt_tokens"), usage.get("completion_tokens")
    return (p if _count(p) else None, c if _count(c) else None)


_MESSAGE_PARTS = ("content", "tool_calls", "function_call", "refusal", "audio")


# -- content-part lists ----------------------------------------------------------------------
# OpenAI-compatible vendors (Mistral's Magistral, some vLLM reasoning parsers) answer a message's
# or a delta's `content` as a list of parts: text parts, thinking parts (their own list of text
# parts, or a string) and reference parts (citation ids). Clients of the chat API read a string:
# the text parts are joined into one, thinking and references are dropped (the chat API has no
# field of its own for them). A part of any other shape or type is a bad answer, as before.
_TEXT_PARTS = frozenset({"text", "output_text"})
_DROPPED_PARTS = frozenset({"thinking", "reasoning", "reference"})
# A body that may hold such a list: `"content": [` (a false hit, inside a string, costs a parse).
_CONTENT_LIST = re.compile(rb'"content"\s*:\s*\[')


def flatten_parts(parts: list[Any]) -> str | None:
    """The text of a content-part list (None when it holds no text part); raises InvalidAnswer
    for a part that is not one of the known kinds."""
    texts: list[str] = []
    seen_text = False
    for part in parts:
        if type(part) is not dict or type(part.get("type")) is not str:
            raise InvalidAnswer("a content part is not a typed object")
        kind = part["type"]
        if kind in _TEXT_PARTS:
            if type(part.get("text")) is not str:
                raise InvalidAnswer("a text part has no text")
            texts.append(part["text"])
            seen_text = True
        elif kind in _DROPPED_PARTS:
            inner = part.get(kind)
            if kind != "reference" and inner is not None and type(inner) is not str:
                if type(inner) is not list:
                    raise InvalidAnswer("a thinking part holds neither text nor parts")
                for sub in inner:
                    if type(sub) is not dict or type(sub.get("text", "")) is not str:
                        raise InvalidAnswer("a thinking part holds something not text")
        else:
            raise InvalidAnswer("a content part is of an unknown type")
    return "".join(texts) if seen_text else None


def flatten_content(endpoint: str, body: bytes) -> bytes:
    """A unary chat answer whose messages' `content` is a part list, with each list replaced
    by its text (`flatten_parts`); any other body as it is. A list that is not valid content
    stays a list, for `check_unary` to refuse. A float `created` becomes an int (`int_created`)."""
    body = int_created(body)
    if endpoint != "chat" or _CONTENT_LIST.search(body) is None:
        return body
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body
    choices = doc.get("choices") if type(doc) is dict else None
    if type(choices) is not list:
        return body
    changed = False
    for choice in choices:
        msg = choice.get("message") if type(choice) is dict else None
        if type(msg) is dict and type(msg.get("content")) is list:
            try:
                msg["content"] = flatten_parts(msg["content"])
            except InvalidAnswer:
                return body
            changed = True
    return orjson.dumps(doc) if changed else body


def _flatten_delta(delta: dict[str, Any]) -> None:
    """A delta's content-part list as its text, in place (no text: no content)."""
    text = flatten_parts(delta["content"])
    if text is None:
        del delta["content"]
    else:
        delta["content"] = text


def _check_message(msg: dict[str, Any], finish: Any = None) -> None:
    # A filtered answer (Azure's content filters, finish_reason `content_filter`) may hold no
    # content at all: that is the provider's answer, not a broken one.
    if not any(k in msg for k in _MESSAGE_PARTS) and finish != "content_filter":
        raise InvalidAnswer("a message holds no content")
    _check_text(msg, "content")
    _check_text(msg, "refusal")
    fields.role(msg.get("role"))
    _check_calls(msg, complete=True)


def _check_delta(delta: Any) -> None:
    if delta is None:
        return
    if not isinstance(delta, dict):
        raise InvalidAnswer("a chunk's delta is not an object")
    _check_text(delta, "content")
    _check_text(delta, "refusal")
    fields.role(delta.get("role"), delta=True)
    _check_calls(delta, complete=False)


def _check_text(obj: dict[str, Any], key: str) -> None:
    value = obj.get(key)
    if value is not None and not isinstance(value, str):
        raise InvalidAnswer(f"a message's {key} is not a string")


def _check_finish(choice: dict[str, Any]) -> None:
    reason = choice.get("finish_reason")
    if reason is not None and not isinstance(reason, str):
        raise InvalidAnswer("a choice's finish_reason is not a string")


def _check_calls(msg: dict[str, Any], complete: bool) -> None:
    """Tool calls: a list of objects with string ids and types and a function; in a whole
    answer (`complete`) each call has all of them (`answer_fields.tool_call`)."""
    calls = msg.get("tool_calls")
    if calls is not None:
        if not isinstance(calls, list):
            raise InvalidAnswer("a message's tool_calls is not a list")
        for call in calls:
            if not isinstance(call, dict):
                raise InvalidAnswer("a tool call is not an object")
            for key in ("id", "type"):
                if call.get(key) is not None and not isinstance(call[key], str):
                    raise InvalidAnswer(f"a tool call's {key} is not a string")
            if call.get("index") is not None and not _count(call["index"]):
                raise InvalidAnswer("a tool call's index is not a number")
            _check_function(call.get("function"))
            fields.tool_call(call, complete)
    if msg.get("function_call") is not None:
        _check_function(msg["function_call"])


def _check_function(fn: Any) -> None:
    """A call's function: an object whose name and arguments, when present, are strings (a
    stream sends them in pieces, so either may be missing from one chunk)."""
    if fn is None:
        return
    if not isinstance(fn, dict):
        raise InvalidAnswer("a tool call's function is not an object")
    for key in ("name", "arguments"):
        if fn.get(key) is not None and not isinstance(fn[key], str):
            raise InvalidAnswer(f"a tool call's function {key} is not a string")


def check_chunk(endpoint: str, payload: bytes) -> dict[str, Any]:
    """One stream event's data: a JSON object of the endpoint's chunk shape, not an error.

    Per event on the hot path (about a microsecond): the usual chat delta (`role`, `content`)
    is checked inline, anything else by the same checks as a unary message. A delta whose
    content is a part list has it replaced by its text (`flatten_parts`).
    """
    return _check_chunk(endpoint, payload)[0]


def _check_chunk(endpoint: str, payload: bytes) -> tuple[dict[str, Any], bool]:
    """`check_chunk`, and whether the chunk was changed (a content-part list flattened): then
    it must be relayed re-encoded."""
    try:
        doc = orjson.loads(payload)
    except orjson.JSONDecodeError:
        raise InvalidAnswer("the provider sent an event that is not JSON") from None
    if type(doc) is not dict:
        raise InvalidAnswer("the provider sent an event that is not a JSON object")
    err = doc.get("error")
    if err is not None and err is not False:
        raise InvalidAnswer("the provider sent an error event")
    changed = _check_meta(doc)  # a float `created` made an int: re-encoded
    usage = doc.get("usage")
    if usage is not None:
        _check_usage(usage)
    if endpoint != "chat" and endpoint != "completions":
        return doc, changed
    choices = doc.get("choices")
    if type(choices) is not list:
        if choices is None and type(usage) is dict:
            return doc, changed  # a usage-only chunk
        raise InvalidAnswer("a chunk has no 'choices' array")
    chat = endpoint == "chat"
    for choice in choices:
        if type(choice) is not dict:
            raise InvalidAnswer("a chunk's choice is not an object")
        index = choice.get("index", 0)
        if type(index) is not int or not 0 <= index < MAX_CHOICES:
            raise InvalidAnswer("a chunk's choice index is not a small number")
        reason = choice.get("finish_reason")
        if reason is not None and type(reason) is not str:
            raise InvalidAnswer("a choice's finish_reason is not a string")
        logprobs = choice.get("logprobs")
        if logprobs is not None:
            (fields.chat_logprobs if chat else fields.completion_logprobs)(logprobs)
        if not chat:
            _check_text(choice, "text")
            continue
        if "delta" not in choice:
            continue  # Azure's filter annotations: offsets and results, no delta
        delta = choice["delta"]
        if type(delta) is not dict:  # `null`: every SDK reads `choices[0].delta.content`
            raise InvalidAnswer("a chunk's choice has a delta that is not an object")
        if len(delta) <= 2 and delta.keys() <= _PLAIN_DELTA:
            text, role = delta.get("content"), delta.get("role")
            if (text is None or type(text) is str) and (role is None or role == "assistant"):
                continue
        if type(delta.get("content")) is list:
            _flatten_delta(delta)
            changed = True
        _check_delta(delta)
    return doc, changed


_PLAIN_DELTA = frozenset({"role", "content"})
# Choices a stream may number: far above any `n` a request may ask (`max_n`).
MAX_CHOICES = 1024


def completion_tokens(doc: dict[str, Any]) -> int | None:
    return usage_counts(doc.get("usage"))[1]


# -- streams ---------------------------------------------------------------------------------

_DATA = re.compile(rb"^data:[ \t]*", re.M)
# An `"error"` member holding an object or a message (not null), outside any JSON string (a quote
# inside a string is escaped).
_ERROR_EVENT = re.compile(rb'(?<!\\)"error"\s*:\s*(?!null|false)[^\s]')
# An SSE `event: error` field (Anthropic's and others' error events, whatever their data).
_ERROR_FIELD = re.compile(rb"(?m)^event:[ \t]*error[ \t]*$")
_FINISH = re.compile(rb'"finish_reason"\s*:\s*"')


# Lines that may precede the first data line: comments (keep-alives) and SSE fields.
_NON_DATA_FIELDS = frozenset({b"", b"event", b"id", b"retry"})


# Where a chunk's text starts: `"content": "` (chat) or `"text": "` (completions).
_TEXT_START = re.compile(rb'"(?:content|text)"\s*:\s*"')


def _utf8_length(lead: int) -> int:
    """Bytes of the UTF-8 sequence a lead byte starts (0 for a byte that cannot start one)."""
    if 0xC2 <= lead <= 0xDF:
        return 2
    if 0xE0 <= lead <= 0xEF:
        return 3
    if 0xF0 <= lead <= 0xF4:
        return 4
    return 0


def is_event_stream(content_type: str | None) -> bool:
    if not content_type:
        return False
    return content_type.split(";", 1)[0].strip().lower() == "text/event-stream"


def first_event_complete(buf: bytes) -> bool:
    """Whether ``buf`` holds a complete first data event (comments and SSE fields skipped).

    Raises InvalidAnswer when that event is not an OpenAI stream event (a JSON object or
    `[DONE]`) or is an error event.
    """
    buf = lf_lines(buf)
    start = 0
    while True:
        end = buf.find(b"\n\n", start)
        if end < 0:
            return False
        event = buf[start : end + 2]
        # The usual first event is one `data: {` line: no regex for it.
        data = 6 if event.startswith(b"data: {") else -1
        if data < 0:
            m = _DATA.search(event)
            data = -1 if m is None else m.end()
        if data >= 0:
            payload = event[data:].lstrip()
            if not payload.startswith(b"{"):  # `[DONE]` first: a stream that answered nothing
                raise InvalidAnswer("the stream's first event is not a JSON chunk")
            if _ERROR_FIELD.search(event):
                raise InvalidAnswer("the stream started with an error event")
            if b'"error"' in event and _ERROR_EVENT.search(event):
                # Only a top-level `error` member is an error (Azure's filter results may carry
                # one of their own): the event is parsed to tell.
                try:
                    doc = orjson.loads(event_data(event) or b"")
                except orjson.JSONDecodeError:
                    raise InvalidAnswer("the stream's first event is not a JSON chunk") from None
                if isinstance(doc, dict) and doc.get("error") not in (None, False):
                    raise InvalidAnswer("the stream started with an error event")
            return True
        fields = {line.split(b":", 1)[0] for line in event.split(b"\n") if line}
        if not fields <= _NON_DATA_FIELDS:
            raise InvalidAnswer("the stream does not consist of server-sent events")
        start = end + 2


def commits(event: bytes) -> bool:
    """Whether a whole stream event carries part of the answer: text, a refusal, reasoning, a
    tool call, a finish, usage or the end marker. A role-only chunk, an empty delta, a filter
    annotation or a comment does not: a stream may still fail over to another member after it
    (nothing of the answer was relayed yet). Raises InvalidAnswer for an error event or one that
    is not a JSON object; other shapes count as content (the relay's checks say what they are).
    """
    if b"event:" in event and _ERROR_FIELD.search(event):
        raise InvalidAnswer("the provider sent an error event")
    data = event_data(event)
    if data is None:
        return False
    if data == b"[DONE]":
        return True
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError:
        if not data.isascii():
            return True  # a character cut between two events: the relay mends it
        raise InvalidAnswer("the provider sent an event that is not JSON") from None
    if type(doc) is not dict:
        raise InvalidAnswer("the provider sent an event that is not a JSON object")
    err = doc.get("error")
    if err is not None and err is not False:
        raise InvalidAnswer("the provider sent an error event")
    _check_meta(doc)  # before anything is relayed: a chunk of the wrong types is retried
    choices = doc.get("choices")
    if doc.get("usage") or type(choices) is not list:
        return True
    for choice in choices:
        if type(choice) is not dict or choice.get("finish_reason") or choice.get("text"):
            return True
        delta = choice.get("delta")
        if delta is None:
            continue  # a filter annotation
        if type(delta) is not dict:
            return True
        for key, value in delta.items():
            if key != "role" and value is not None and value != "" and value != [] and value != {}:
                return True
    return False


Key = tuple[int, str, int]


class TextGuard:
    """The provider's secrets masked in the text a stream's chunks carry, wherever the stream
    cuts them: a key relayed a few characters per event matches no byte string in any event.

    Per text (every string field of a choice's delta: content, refusal, reasoning_content...;
    a tool or function call's arguments; a completion's text):
    the last characters relayed are kept, so a secret that began in earlier events is found
    and its rest masked; and a text ending in the first `HOLD_MIN` or more characters of a
    secret is held back until the next piece says whether the secret follows (at most 3 of a
    key's characters, its public prefix, can reach a client). Text held when its choice
    finishes goes out with the finishing chunk, masked if it is 8 or more of a key's first
    characters.
    """

    HOLD_MIN = 4

    def __init__(self, secrets: tuple[str, ...]) -> None:
        # Lower-cased, and looked for in lower-cased text: a key in any case is found.
        self.secrets = tuple({x.lower(): None for x in secrets})
        # A secret's first HOLD_MIN characters: a text whose window holds none of them can
        # neither hold a secret nor end in the start of one (one scan each, the usual case).
        self.heads = tuple({x[: self.HOLD_MIN] for x in self.secrets})
        # What is kept of the text relayed: a secret begun there has fewer than HOLD_MIN of its
        # characters in it (a longer start is held back), so HOLD_MIN - 1 are enough.
        self.keep = self.HOLD_MIN - 1
        self.tails: dict[Key, str] = {}
        self.held: dict[Key, str] = {}
        self.last: dict[str, Any] = {}  # the last chunk (its id, created, model: a flush chunk)

    @staticmethod
    def _texts(doc: dict[str, Any], endpoint: str) -> list[tuple[dict[str, Any], str, Key]]:
        choices = doc.get("choices")
        if not choices:
            return []
        if endpoint == "chat" and len(choices) == 1:  # the usual chunk: one plain delta
            choice = choices[0]
            delta = choice.get("delta") or {}
            if len(delta) <= 2 and delta.keys() <= _PLAIN_DELTA:
                text = delta.get("content")
                if type(text) is not str:
                    return []
                return [(delta, "content", (choice.get("index", 0), "content", 0))]
        return list(TextGuard._all_texts(choices, endpoint))

    @staticmethod
    def _all_texts(
        choices: list[dict[str, Any]], endpoint: str
    ) -> Iterator[tuple[dict[str, Any], str, Key]]:
        for choice in choices:
            i = choice.get("index", 0)
            if endpoint != "chat":
                if type(choice.get("text")) is str:
                    yield choice, "text", (i, "text", 0)
                continue
            delta = choice.get("delta") or {}
            # Every text the delta carries: content, refusal, a provider's reasoning text
            # (`reasoning_content`, `reasoning`) or any other string field a client shows.
            for name, value in delta.items():
                if type(value) is str and name != "role":
                    yield delta, name, (i, name, 0)
            for call in delta.get("tool_calls") or ():
                fn = call.get("function")
                if type(fn) is dict and type(fn.get("arguments")) is str:
                    yield fn, "arguments", (i, "tool_calls", call.get("index", 0))
            fn = delta.get("function_call")
            if type(fn) is dict and type(fn.get("arguments")) is str:
                yield fn, "arguments", (i, "function_call", 0)

    def _hold(self, text: str) -> int:
        """How many of `text`'s last characters may begin a secret (0 when fewer than HOLD_MIN)."""
        text = ascii_lower(text)
        best = 0
        for secret in self.secrets:
            first, start = secret[0], max(0, len(text) - len(secret) + 1)
            p = text.find(first, start)
            while p >= 0 and len(text) - p >= self.HOLD_MIN:
                if secret.startswith(text[p:]):
                    best = max(best, len(text) - p)
                    break  # the earliest start is the longest
                p = text.find(first, p + 1)
        return best

    def step(self, doc: dict[str, Any], endpoint: str) -> bool:
        """Note a chunk's text as relayed and return True when `apply` would leave it as it
        is (no secret, no text ending in one's start; the caller makes sure nothing is held).
        On False the caller restores `tails` (saved before its first step) and calls `apply`.
        """
        tails, keep = self.tails, self.keep
        for container, name, key in self._texts(doc, endpoint):
            text = container[name]
            if not text:
                continue
            window = tails.get(key, "") + text
            low = ascii_lower(window)
            for head in self.heads:
                if head in low and (any(x in low for x in self.secrets) or self._hold(low)):
                    return False
            tails[key] = window[-keep:]
        self.last = doc
        return True

    def apply(self, doc: dict[str, Any], endpoint: str) -> bool:
        """Mask and hold back in place; True when the chunk changed."""
        changed = False
        masked_choices: set[int] = set()
        texts = [t for t in self._texts(doc, endpoint) if t[0][t[1]]]
        if self.held:
            # Text held for a choice whose next content is in another text (a tool call after
            # the words, a second call): it goes out now, ahead of that content.
            moving = {key for _, _, key in texts}
            for choice in doc.get("choices") or ():
                for call in (choice.get("delta") or {}).get("tool_calls") or ():
                    moving.add((choice.get("index", 0), "tool_calls", call.get("index", 0)))
            for choice in doc.get("choices") or ():
                i = choice.get("index", 0)
                stale = [k for k in self.held if k[0] == i and k not in moving]
                if stale and any(k[0] == i for k in moving):
                    changed = self._flush_into(choice, i, endpoint, stale) or changed
        for container, name, key in texts:
            text = self.held.pop(key, "") + container[name]
            tail = self.tails.get(key, "")
            masked = self._mask(tail, text)
            # A secret's start may begin in what went out already (fewer than HOLD_MIN of its
            # characters): the rest, here, is held all the same.
            hold = min(self._hold(tail + masked), len(masked))
            out = masked[: len(masked) - hold]
            if hold:
                self.held[key] = masked[len(masked) - hold :]
            if masked != text:
                masked_choices.add(key[0])
            if out != container[name]:
                container[name] = out
                changed = True
            if out:
                self.tails[key] = (tail + out)[-self.keep :]
        for choice in doc.get("choices") or ():
            i = choice.get("index", 0)
            if i in masked_choices and choice.get("logprobs") is not None:
                choice["logprobs"] = None  # its tokens spell the masked text
                changed = True
            if choice.get("finish_reason") is not None:
                changed = self._flush_into(choice, i, endpoint) or changed
        self.last = doc
        return changed

    def _mask(self, tail: str, text: str) -> str:
        """`text` with every part of a secret found in `tail + text` masked (the part in
        `tail` has gone already)."""
        window, off = ascii_lower(tail + text), len(tail)
        spans = []
        for secret in self.secrets:
            p = window.find(secret)
            while p >= 0:
                if p + len(secret) > off:
                    spans.append((max(0, p - off), p + len(secret) - off))
                p = window.find(secret, p + 1)
        if not spans:
            return text
        spans.sort()
        out, last = [], 0
        for a, b in spans:
            if a < last:
                a = last
            if b <= a:
                continue
            out += [text[last:a], REDACTED]
            last = b
        return "".join(out) + text[last:]

    def _flushed(self, key: Key) -> str:
        """Held text that never became a key: masked when it holds 4 or more of a key's
        characters past its public prefix ("sk-proj-" alone, as documentation writes it,
        goes out as it is)."""
        text = self.held.pop(key, "")
        low = ascii_lower(text)
        for secret in self.secrets:
            if secret.startswith(low) and len(text) >= public_prefix_len(secret) + 4:
                return REDACTED
        return text

    def _flush_into(
        self, choice: dict[str, Any], i: int, endpoint: str, keys: list[Key] | None = None
    ) -> bool:
        """A finishing choice takes what is still held for it (or for `keys` of it)."""
        if keys is None:
            keys = [k for k in self.held if k[0] == i]
        if not keys:
            return False
        for key in keys:
            text = self._flushed(key)
            if endpoint != "chat":
                choice["text"] = (choice.get("text") or "") + text
                continue
            delta = choice.setdefault("delta", {})
            if key[1] == "tool_calls":  # ahead of any call this chunk starts or continues
                calls = delta.get("tool_calls") or []
                delta["tool_calls"] = [{"index": key[2], "function": {"arguments": text}}, *calls]
            elif key[1] == "function_call":
                fn = delta.get("function_call")
                if type(fn) is not dict:
                    fn = delta["function_call"] = {}
                fn["arguments"] = text + (fn.get("arguments") or "")
            else:
                delta[key[1]] = (delta.get(key[1]) or "") + text
        return True

    def flush(self, endpoint: str) -> list[dict[str, Any]]:
        """Chunks for what is still held when the stream ends without finishing its choices."""
        out = []
        for i in sorted({k[0] for k in self.held}):
            choice: dict[str, Any] = (
                {"index": i, "delta": {}} if endpoint == "chat" else {"index": i}
            )
            self._flush_into(choice, i, endpoint)
            choice["finish_reason"] = None
            meta: dict[str, Any] = {
                k: self.last[k] for k in ("id", "object", "created", "model") if k in self.last
            }
            out.append({**meta, "choices": [choice]})
        return out


class StreamCheck:
    """Per upstream stream: size bound, end marker, chunk shapes, error events, UTF-8 and
    secret redaction."""

    __slots__ = (
        "chunks",
        "done",
        "_carry",
        "_endpoint",
        "_guard",
        "_last",
        "_limit",
        "_prev",
        "_redact",
        "_size",
    )

    def __init__(
        self, limits: ResponseLimits, redact: Redactor | None = None, endpoint: str = "chat"
    ) -> None:
        self._limit = limits.max_stream_bytes
        self._endpoint = endpoint
        # The gateway's provider secrets (from a Redactor), replaced wherever they appear.
        self._redact = redact if redact else None
        # The text guard looks for the same spellings as a unary answer's redaction: plain,
        # URL-quoted, upper and lower case, hexadecimal and base64 (standard and URL-safe,
        # each alignment).
        texts = (*redact.secret_texts, *redact.encoded_texts) if redact is not None else ()
        self._guard = TextGuard(texts) if texts and endpoint in ("chat", "completions") else None
        self._size = 0
        self.chunks = 0  # JSON chunks seen: a stream of `[DONE]` alone answered nothing
        self.done = False  # `[DONE]` seen
        # The last two events: a stream without `[DONE]` is complete when one of them finished
        # the answer (the finish chunk may be followed by a usage chunk). Looked at once, at the end.
        self._prev = self._last = b""
        self._carry = b""  # the start of a character cut at the end of the previous event

    def count(self, n: int) -> None:
        """Count raw bytes received; raises InvalidAnswer past the stream limit."""
        self._size += n
        if self._size > self._limit:
            raise InvalidAnswer(f"the stream is larger than {self._limit} bytes")

    def block(self, block: bytes) -> int:
        """The number of events in a block of whole events (`SSESplitter.feed_block`) that
        passes as it is, or -1: check it event by event (`events`), which may raise.

        The usual read (one-line JSON chunks, ASCII, no error member or secret, perhaps `[DONE]`
        last) is checked as one block: a handful of byte scans per read and one parse per
        chunk (under a microsecond: its shape is checked, not trusted), not per-event work.
        """
        done = block.endswith(DONE) and (len(block) == len(DONE) or block[-16:-14] == b"\n\n")
        chunks = block.count(b"}\n\n")
        # Every event ends in a blank line; when all the newlines are those of the chunks' ends
        # (and of `[DONE]`), each event is one line ending like a JSON object: no cut JSON, no
        # comment, no other end marker (`[DONE]` elsewhere would end its own event).
        if (
            block.count(b"\n") != 2 * (chunks + done)
            or self._carry
            or b'"error"' in block
            or not block.isascii()
        ):
            return -1
        if self._redact is not None:
            # A secret's first and last bytes: a block holding either may hold the secret, or
            # the part of it a stream cut between two events (`Redactor.fragments`); and its
            # base64 spellings, whole (cut ones are in texts: the text guard's).
            if self._redact.may_hold(block):
                return -1
            if has_escapes(block):
                return -1  # an escaped secret is found only once decoded
        guard = self._guard
        if guard is not None and guard.held:
            return -1  # text held back goes out with the next event: the slow path
        pos = 0
        docs = []
        for _ in range(chunks):
            end = block.index(b"}\n\n", pos) + 1
            if not block.startswith(b"data: {", pos):
                return -1  # another field or layout: the slow path says what it is
            doc, changed = _check_chunk(self._endpoint, block[pos + 6 : end])
            if changed:
                return -1  # re-encoded one by one
            docs.append(doc)
            pos = end + 2
        if guard is not None:
            endpoint, saved = self._endpoint, dict(guard.tails)
            for doc in docs:
                if not guard.step(doc, endpoint):
                    guard.tails = saved  # the slow path goes over these events again
                    return -1
        self.chunks += chunks
        if done:
            self.done = True
        elif chunks == 1:
            self._prev, self._last = self._last, block
        else:
            last = block.rfind(b"\n\n", 0, len(block) - 2) + 2
            prev = block.rfind(b"\n\n", 0, last - 2) + 2
            self._prev, self._last = block[prev:last], block[last:]
        return chunks + done

    def events(self, evs: list[bytes]) -> list[bytes]:
        """The events as they may be relayed (`event` for each), up to the end marker."""
        out: list[bytes] = []
        for ev in evs:
            if self.done:
                break  # nothing after the end marker
            ev = self.event(ev)
            if ev:
                out.append(ev)
        return out

    def event(self, ev: bytes) -> bytes:
        """One whole event as it may be relayed (redacted, valid UTF-8); raises InvalidAnswer."""
        if b"[DONE]" in ev and ev.rstrip().endswith(b"[DONE]") and _DATA.search(ev):
            self.done = True
            if self._guard is not None and self._guard.held:
                flushed = self._guard.flush(self._endpoint)
                return b"".join(b"data: " + orjson.dumps(d) + b"\n\n" for d in flushed) + DONE
            return DONE
        if b"event:" in ev and _ERROR_FIELD.search(ev):
            raise InvalidAnswer("the provider sent an error event")
        if self._carry or not ev.isascii():
            ev = self._utf8(ev)
        data = event_data(ev)
        if data is not None:
            # A chunk is a JSON object of the endpoint's shape: anything else (cut JSON, text,
            # a list, an error) is what no client can use.
            doc, changed = _check_chunk(self._endpoint, data)
            if changed:  # a content-part list, now its text
                data = orjson.dumps(doc)
                ev = b"data: " + data + b"\n\n"
            elif not ev.startswith(b"data: ") or ev.find(b"\n") != len(ev) - 2:
                # `event: message`, `id:` or `data:` without its space: the OpenAI SDKs read
                # an event with a name as something else than a chunk, so each goes out as the
                # one `data:` line an OpenAI stream is made of.
                ev = b"data: " + data + b"\n\n"
            self.chunks += 1
            guard = self._guard
            if guard is not None:
                saved = dict(guard.tails) if not guard.held else None
                if saved is None or not guard.step(doc, self._endpoint):
                    if saved is not None:
                        guard.tails = saved  # step noted part of it: apply goes over it all
                    if guard.apply(doc, self._endpoint):
                        data = orjson.dumps(doc)
                        ev = b"data: " + data + b"\n\n"
            if self._redact is not None:
                ev = self._redacted(ev, data)
        else:  # comments (keep-alives) and SSE fields pass; a line of anything else does not
            fields = {line.split(b":", 1)[0] for line in ev.split(b"\n") if line}
            if not fields <= _NON_DATA_FIELDS:
                raise InvalidAnswer("the provider sent something that is not an event")
            if fields != {b""}:
                # An event of fields alone (`retry: 100`, `id: 3`): an OpenAI SDK reads it as a
                # chunk of empty data and fails to parse it. Its comments, if any, stay (they
                # keep idle connections open); nothing else goes out.
                comments = [line for line in ev.split(b"\n") if line.startswith(b":")]
                ev = b"\n".join(comments) + b"\n\n" if comments else b""
        if ev:
            self._prev, self._last = self._last, ev
        return ev

    def flush_held(self) -> bytes:
        """Events for text held back when the stream breaks (it is not the start of a key, or
        it is masked): what the client and a resumed answer must still get."""
        if self._guard is None or not self._guard.held:
            return b""
        return b"".join(
            b"data: " + orjson.dumps(d) + b"\n\n" for d in self._guard.flush(self._endpoint)
        )

    def _redacted(self, ev: bytes, data: bytes) -> bytes:
        """The event with every secret, escaped secret and cut-off part of one masked."""
        redact = self._redact
        assert redact is not None
        if has_escapes(data):
            plain = orjson.dumps(orjson.loads(data))
            masked = redact.mask(plain)
            if masked != plain:
                return b"data: " + masked + b"\n\n"
        if redact.may_hold(ev):  # a secret holds its edges: no edge, no secret (nor part)
            return redact.mask(ev)
        return ev

    def _utf8(self, ev: bytes) -> bytes:
        """The event as valid UTF-8 (slow path: only events that are not ASCII).

        Some servers emit byte-level tokens and cut a multi-byte character between two events
        (`"ok \xe2\x82"` then `"\xac end"`). The cut start is moved to the next event's text,
        so the character arrives whole; anything else invalid becomes U+FFFD (clients' JSON
        parsers reject invalid UTF-8).
        """
        carry, self._carry = self._carry, b""
        if carry:
            m = _TEXT_START.search(ev)
            if m is not None and m.end() < len(ev) and 0x80 <= ev[m.end()] < 0xC0:
                ev = ev[: m.end()] + carry + ev[m.end() :]
        try:
            ev.decode()
            return ev
        except UnicodeDecodeError as e:
            start = e.start
        quote = ev.find(b'"', start)
        need = _utf8_length(ev[start])
        cut = ev[start:quote]
        if quote > start and need > len(cut) and all(0x80 <= b < 0xC0 for b in cut[1:]):
            self._carry = cut
            ev = ev[:start] + ev[quote:]
        try:
            ev.decode()
        except UnicodeDecodeError:
            ev = ev.decode(errors="replace").encode()
        return ev

    @property
    def finished(self) -> bool:
        """Did one of the last events finish the answer (a `finish_reason` that is not null)?"""
        return bool(_FINISH.search(self._last) or _FINISH.search(self._prev))

    def complete(self) -> bool:
        """Did the stream end properly: `[DONE]`, or a finishing chunk (some servers omit DONE)?"""
        return self.done or self.finished
