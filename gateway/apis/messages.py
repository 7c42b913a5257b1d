"""The Anthropic Messages API (`POST /v1/messages`) on top of the gateway's chat pipeline.

Request: system prompt (string or text blocks), text / image / tool_use / tool_result blocks,
tools and tool_choice, stop_sequences, temperature, top_p, metadata.user_id, stream. Answer: a
`message` object, or Anthropic's event sequence (message_start, content_block_start/delta/stop
with text_delta and input_json_delta, message_delta with stop_reason and usage, message_stop).
Errors use Anthropic's shape and status codes. What a chat-only provider cannot express (thinking,
citations, cache_control, server tools, top_k) is dropped or refused: see README "Inbound APIs".
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

import orjson
from starlette.responses import Response

from gateway.apis.exchange import (
    error_fields,
    is_stream,
    rebuild,
    translate_stream,
)
from gateway.context import Context
from gateway.errors import GatewayError, bad_request, model_not_found
from gateway.wire.request import DEFAULT_MAX_DEPTH, check_depth, is_depth_error, nested
from gateway.wire.request_checks import clip
from gateway.wire.tokens import encoding_for_model, estimate_prompt

NAME = "messages"
# Anthropic's error type per status; other statuses are mapped onto these first (`_status`).
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    # The body did not arrive in time: kept, so that the log and metrics say what was sent.
    408: "timeout_error",
    413: "request_too_large",
    429: "rate_limit_error",
    431: "request_too_large",
    # The client went away: nothing is sent, but the log and metrics must say 499, not 400.
    499: "invalid_request_error",
    500: "api_error",
    # Upstream failures keep the gateway's own status (a 500 would say the gateway itself
    # broke); Anthropic's SDKs read every 5xx as a server error and retry it alike.
    502: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}
STOP_REASONS = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}
# The image types the Messages API takes (`source.media_type` of a base64 image).
IMAGE_MEDIA_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")
# Anthropic's bound on `metadata.user_id`.
MAX_USER_ID = 256
# Server tools run by Anthropic itself (web search, code execution, ...) have a dated `type`;
# a chat provider cannot run them.
_CUSTOM_TOOL_TYPES = (None, "custom")
# Request fields that hand tools to Anthropic's platform (the MCP connector, a code execution
# container with its skills): refused like server tools.
_SERVER_SIDE = {
    "mcp_servers": "MCP servers (Anthropic's MCP connector)",
    "container": "a code execution container",
}


def _status(status: int) -> int:
    """The status an Anthropic client expects for a gateway status."""
    if status in ERROR_TYPES:
        return status
    if status == 503:
        return 529  # no provider available / providers rate limited: "overloaded", retried
    if status >= 500:
        return 500
    return 400 if status >= 400 else status


# A stream's error event (OpenAI-shaped: no status) by its code or type: a stream stopped for a
# revoked key or a spent budget is not an `api_error` (Anthropic's "retry later" for its bugs).
_STREAM_ERROR_CODES = {
    "invalid_api_key": 401,
    "insufficient_quota": 429,
    "rate_limit_exceeded": 429,
    "permission_denied": 403,
}
_STREAM_ERROR_TYPES = {
    "rate_limit": 429,
    "rate_limit_error": 429,
    "insufficient_quota": 429,
    "authentication_error": 401,
    "permission_error": 403,
}


def _stream_error_status(error: Mapping[str, Any]) -> int:
    code, kind = error.get("code"), error.get("type")
    if isinstance(code, str) and code in _STREAM_ERROR_CODES:
        return _STREAM_ERROR_CODES[code]
    if isinstance(kind, str) and kind in _STREAM_ERROR_TYPES:
        return _STREAM_ERROR_TYPES[kind]
    return 500


PATH = "/v1/messages"


def owns_path(path: str) -> bool:
    """Whether `path` belongs to this API (its errors, even the router's, in Anthropic's shape)."""
    return path == PATH or path.startswith(PATH + "/")


def anthropic_error(status: int, message: str) -> tuple[int, bytes]:
    status = _status(status)
    body = {
        "type": "error",
        "error": {"type": ERROR_TYPES.get(status, "api_error"), "message": message},
    }
    return status, orjson.dumps(body)


def _err(message: str, param: str | None = None) -> GatewayError:
    return bad_request(message, param=param, code="invalid_request_error")


# -- request ------------------------------------------------------------------------------------


def _text_of_blocks(content: Any, where: str) -> str:
    """Text of a string or a list of text blocks (system prompt, tool_result content)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _err(f"{where}: expected a string or an array of content blocks.", where)
    parts = []
    for i, b in enumerate(content):
        if not isinstance(b, dict) or b.get("type") != "text" or not isinstance(b.get("text"), str):
            raise _err(f"{where}.{i}: only text blocks are supported here.", f"{where}.{i}")
        parts.append(b["text"])
    return "\n".join(parts) if where == "system" else "".join(parts)


def _image_part(block: dict[str, Any], where: str) -> dict[str, Any]:
    src = block.get("source")
    if not isinstance(src, dict):
        raise _err(f"{where}.source: Field required", f"{where}.source")
    kind = src.get("type")
    if kind == "base64":
        media, data = src.get("media_type"), src.get("data")
        if not isinstance(media, str) or not isinstance(data, str):
            raise _err(f"{where}.source: media_type and data are required.", f"{where}.source")
        if media not in IMAGE_MEDIA_TYPES:
            # As Anthropic answers it (and never spliced into the data URL as it came).
            raise _err(
                f"{where}.source.media_type: Input should be 'image/jpeg', 'image/png', "
                "'image/gif' or 'image/webp'",
                f"{where}.source.media_type",
            )
        return {"type": "image_url", "image_url": {"url": f"data:{media};base64,{data}"}}
    if kind == "url" and isinstance(src.get("url"), str):
        return {"type": "image_url", "image_url": {"url": src["url"]}}
    raise _err(
        f"{where}.source.type: '{clip(kind)}' is not supported (use base64 or url).",
        f"{where}.source",
    )


def _tool_result_text(block: dict[str, Any], where: str) -> str:
    content = block.get("content")
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content
    elif isinstance(content, list):
        parts = []
        for j, b in enumerate(content):
            if isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str):
                parts.append(b["text"])
            elif isinstance(b, dict) and b.get("type") == "image":
                # A chat `tool` message carries text only.
                raise _err(
                    f"{where}.content.{j}: images inside tool_result are not supported by a "
                    "chat provider.",
                    f"{where}.content",
                )
            else:
                raise _err(f"{where}.content.{j}: expected a text block.", f"{where}.content")
        text = "".join(parts)
    else:
        raise _err(f"{where}.content: expected a string or blocks.", f"{where}.content")
    return f"Error: {text}" if block.get("is_error") else text


def _block_text(block: dict[str, Any], where: str) -> str:
    text = block.get("text")
    if not isinstance(text, str):
        raise _err(f"{where}.text: Input should be a valid string.", f"{where}.text")
    return text


def _unsupported_block(kind: Any, where: str) -> GatewayError:
    return _err(f"{where}.type: '{clip(kind)}' blocks are not supported by this gateway.", where)


def _user_message(content: Any, where: str) -> list[dict[str, Any]]:
    """A user turn: tool results become `tool` messages (first), the rest one user message."""
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    if not isinstance(content, list):
        raise _err(f"{where}.content: expected a string or an array.", f"{where}.content")
    tools: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for i, b in enumerate(content):
        w = f"{where}.content.{i}"
        kind = b.get("type") if isinstance(b, dict) else None
        if kind == "text":
            parts.append({"type": "text", "text": _block_text(b, w)})
        elif kind == "image":
            parts.append(_image_part(b, w))
        elif kind == "tool_result":
            tid = b.get("tool_use_id")
            if not isinstance(tid, str):
                raise _err(f"{w}.tool_use_id: Field required", f"{w}.tool_use_id")
            tools.append({"role": "tool", "tool_call_id": tid, "content": _tool_result_text(b, w)})
        elif (
            kind == "document"
            and isinstance(b.get("source"), dict)
            and (b["source"].get("type") == "text" and isinstance(b["source"].get("data"), str))
        ):
            parts.append({"type": "text", "text": b["source"]["data"]})
        else:
            raise _unsupported_block(kind, w)
    out = list(tools)
    if parts:
        if all(p["type"] == "text" for p in parts):
            out.append({"role": "user", "content": "".join(p["text"] for p in parts)})
        else:
            out.append({"role": "user", "content": parts})
    return out


def _assistant_message(content: Any, where: str) -> dict[str, Any]:
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    if not isinstance(content, list):
        raise _err(f"{where}.content: expected a string or an array.", f"{where}.content")
    text: list[str] = []
    calls: list[dict[str, Any]] = []
    for i, b in enumerate(content):
        w = f"{where}.content.{i}"
        kind = b.get("type") if isinstance(b, dict) else None
        if kind == "text":
            text.append(_block_text(b, w))
        elif kind == "tool_use":
            if not isinstance(b.get("id"), str) or not isinstance(b.get("name"), str):
                raise _err(f"{w}: tool_use needs an id and a name.", w)
            tool_input = b.get("input")
            if tool_input is not None and not isinstance(tool_input, dict):
                raise _err(f"{w}.input: Input should be an object.", f"{w}.input")
            calls.append(
                {
                    "id": b["id"],
                    "type": "function",
                    "function": {
                        "name": b["name"],
                        "arguments": orjson.dumps(tool_input or {}).decode(),
                    },
                }
            )
        elif kind in ("thinking", "redacted_thinking"):
            continue  # a chat provider has no reasoning input: dropped
        else:
            raise _unsupported_block(kind, w)
    msg: dict[str, Any] = {"role": "assistant", "content": "".join(text) or None}
    if calls:
        msg["tool_calls"] = calls
    elif msg["content"] is None:
        msg["content"] = ""
    return msg


def _tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise _err("tools: expected an array.", "tools")
    out = []
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or not isinstance(t.get("name"), str):
            raise _err(f"tools.{i}.name: Field required", f"tools.{i}.name")
        if t.get("type") not in _CUSTOM_TOOL_TYPES:
            raise _err(
                f"tools.{i}.type: server tool '{clip(t.get('type'))}' cannot run on a chat "
                "provider; "
                "only custom (client) tools are supported.",
                f"tools.{i}.type",
            )
        schema = t.get("input_schema")
        # Required by Anthropic (a JSON Schema object): a tool without one is a 400 there.
        if not isinstance(schema, dict) or schema.get("type") != "object":
            raise _err(
                f"tools.{i}.input_schema: Field required (a JSON Schema of type object)",
                f"tools.{i}.input_schema",
            )
        fn: dict[str, Any] = {"name": t["name"], "parameters": schema}
        if isinstance(t.get("description"), str):
            fn["description"] = t["description"]
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(choice: Any, body: dict[str, Any]) -> None:
    if not isinstance(choice, dict):
        raise _err("tool_choice: expected an object.", "tool_choice")
    kind = choice.get("type")
    if kind == "auto":
        body["tool_choice"] = "auto"
    elif kind == "any":
        body["tool_choice"] = "required"
    elif kind == "none":
        body["tool_choice"] = "none"
    elif kind == "tool" and isinstance(choice.get("name"), str):
        body["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    else:
        raise _err(f"tool_choice.type: '{clip(kind)}' is not valid.", "tool_choice")
    if choice.get("disable_parallel_tool_use") and "tools" in body:
        body["parallel_tool_calls"] = False


def parse(raw: bytes, max_depth: int = DEFAULT_MAX_DEPTH) -> dict[str, Any]:
    """The client's body as a dict, nested at most `max_depth` deep (checked here, on what the
    client sent: fields dropped by the translation are never seen by the chat checks)."""
    if not raw:
        raise _err("The request body is empty; expected a JSON object.")
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        if is_depth_error(e):
            raise nested(max_depth) from None
        raise _err(f"The request body is not valid JSON: {e}") from None
    if not isinstance(doc, dict):
        raise _err("The request body must be a JSON object.")
    check_depth(raw, doc, max_depth)
    return doc


def to_chat(req: dict[str, Any], *, count_only: bool = False) -> dict[str, Any]:
    """A Messages request as a chat request (raises GatewayError 400 naming the field)."""
    model = req.get("model")
    if not isinstance(model, str) or not model:
        raise _err("model: Field required", "model")
    max_tokens = req.get("max_tokens")
    if not count_only and (
        not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1
    ):
        raise _err("max_tokens: Field required (an integer of at least 1)", "max_tokens")
    messages = req.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _err("messages: Field required (a non-empty array)", "messages")
    chat: list[dict[str, Any]] = []
    system = req.get("system")
    if system is not None and system != "" and system != []:
        chat.append({"role": "system", "content": _text_of_blocks(system, "system")})
    called: set[str] = set()  # the tool_use ids of the last assistant turn
    for i, m in enumerate(messages):
        where = f"messages.{i}"
        if not isinstance(m, dict):
            raise _err(f"{where}: expected an object.", where)
        role = m.get("role")
        if m.get("content") == [] and not (role == "assistant" and i == len(messages) - 1):
            # As Anthropic: only a final assistant turn (a prefill) may be empty.
            raise _err(
                f"{where}.content: all messages must have non-empty content except for the "
                "optional final assistant message",
                f"{where}.content",
            )
        if role == "user":
            turn = _user_message(m.get("content"), where)
            for t in (x for x in turn if x["role"] == "tool"):
                # As Anthropic: a tool_result answers a tool_use of the turn just before it
                # (a chat provider would ignore an orphan result or refuse it its own way).
                if t["tool_call_id"] not in called:
                    raise _err(
                        f"{where}.content: unexpected tool_use_id found in tool_result "
                        f"blocks: {clip(t['tool_call_id'])}. Each tool_result block must have a "
                        "corresponding tool_use block in the previous message.",
                        f"{where}.content",
                    )
            chat += turn
            called = set()
        elif role == "assistant":
            answer = _assistant_message(m.get("content"), where)
            called = {c["id"] for c in answer.get("tool_calls") or []}
            chat.append(answer)
        else:
            raise _err(f"{where}.role: expected 'user' or 'assistant'.", f"{where}.role")
    body: dict[str, Any] = {"model": model, "messages": chat}
    if not count_only:
        body["max_tokens"] = max_tokens
    for name in ("temperature", "top_p"):
        value = req.get(name)
        if value is None:
            continue
        # Anthropic's ranges (0..1 for both; chat's temperature goes to 2): refused here as
        # Anthropic refuses them, not passed on to a provider that would take them.
        if type(value) not in (int, float) or not 0 <= value <= 1:
            raise _err(f"{name}: Input should be a number between 0 and 1.", name)
        body[name] = value
    top_k = req.get("top_k")  # dropped (no chat equivalent), but checked like Anthropic does
    if top_k is not None and (type(top_k) is not int or top_k < 0):
        raise _err("top_k: Input should be a non-negative integer.", "top_k")
    for name in ("thinking", "output_config", "metadata"):
        if req.get(name) is not None and not isinstance(req[name], dict):
            raise _err(f"{name}: Input should be an object.", name)
    for name, what in _SERVER_SIDE.items():
        # Run by Anthropic itself, like server tools: dropped, the answer would lack their tools.
        if req.get(name):
            raise _err(f"{name}: {what} cannot run on a chat provider.", name)
    stops = req.get("stop_sequences")
    if stops is not None:
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise _err("stop_sequences: expected an array of strings.", "stop_sequences")
        if stops:
            body["stop"] = stops
    if req.get("tools"):
        body["tools"] = _tools(req["tools"])
    if req.get("tool_choice") is not None:
        _tool_choice(req["tool_choice"], body)
    fmt = (
        (req.get("output_config") or {}).get("format")
        if isinstance(req.get("output_config"), dict)
        else None
    )
    if fmt is not None:
        if (
            not isinstance(fmt, dict)
            or fmt.get("type") != "json_schema"
            or not isinstance(fmt.get("schema"), dict)
        ):
            raise _err("output_config.format: expected a json_schema format.", "output_config")
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "output", "schema": fmt["schema"], "strict": True},
        }
    extra = sorted(set(req.get("metadata") or {}) - {"user_id"})
    if extra:  # Anthropic's metadata has user_id only; other keys are a 400 there
        raise _err(f"metadata.{clip(extra[0])}: Extra inputs are not permitted", "metadata")
    user = (req.get("metadata") or {}).get("user_id")
    if user is not None:
        if not isinstance(user, str) or len(user) > MAX_USER_ID:
            raise _err(
                f"metadata.user_id: Input should be a string of at most {MAX_USER_ID} characters.",
                "metadata.user_id",
            )
        body["user"] = user
    stream = req.get("stream", False)
    if stream not in (True, False, None):
        raise _err("stream: expected a boolean.", "stream")
    if stream:
        body["stream"] = True
        # The closing message_delta carries usage: ask the provider for it.
        body["stream_options"] = {"include_usage": True}
    return body


# -- answer -------------------------------------------------------------------------------------


def new_message_id() -> str:
    return "msg_" + os.urandom(12).hex()


def _usage(usage: Any, prompt_estimate: int) -> dict[str, int]:
    if not isinstance(usage, dict):
        return {"input_tokens": prompt_estimate, "output_tokens": 0}
    prompt = usage.get("prompt_tokens") or 0
    details = usage.get("prompt_tokens_details") or {}
    cached = details.get("cached_tokens") or 0 if isinstance(details, dict) else 0
    out = {
        "input_tokens": max(0, int(prompt) - int(cached)),
        "output_tokens": int(usage.get("completion_tokens") or 0),
    }
    if cached:
        # Anthropic counts prompt-cache reads apart from input_tokens.
        out["cache_read_input_tokens"] = int(cached)
    return out


def _tool_input(arguments: Any) -> dict[str, Any]:
    if isinstance(arguments, str):
        try:
            parsed = orjson.loads(arguments) if arguments else {}
        except orjson.JSONDecodeError:
            parsed = None
        if isinstance(parsed, dict):
            return parsed
        return {"_raw_arguments": arguments}  # not a JSON object: kept, never lost
    return arguments if isinstance(arguments, dict) else {}


def to_message(completion: dict[str, Any], model: str, prompt_estimate: int) -> dict[str, Any]:
    choices = completion.get("choices") or [{}]
    choice = choices[0] if isinstance(choices[0], dict) else {}
    msg = choice.get("message") or {}
    content: list[dict[str, Any]] = []
    if isinstance(msg.get("content"), str) and msg["content"]:
        content.append({"type": "text", "text": msg["content"]})
    elif isinstance(msg.get("refusal"), str) and msg["refusal"]:
        content.append({"type": "text", "text": msg["refusal"]})
    for tc in msg.get("tool_calls") or []:
        fn = tc.get("function") or {}
        content.append(
            {
                "type": "tool_use",
                "id": tc.get("id") or "toolu_" + os.urandom(12).hex(),
                "name": fn.get("name") or "",
                "input": _tool_input(fn.get("arguments")),
            }
        )
    finish = choice.get("finish_reason") or "stop"
    return {
        "id": new_message_id(),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": STOP_REASONS.get(finish, "end_turn"),
        "stop_sequence": None,
        "usage": _usage(completion.get("usage"), prompt_estimate),
    }


def _event(kind: str, data: dict[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


_TEXT_BLOCK = {"type": "text", "text": ""}
_WS = frozenset(" \t\n\r")
_LITERAL = frozenset("0123456789+-.eEtruefalsn")
# Tool input checked as it streams up to this many characters; past it, relayed unchecked.
_MAX_CHECKED_INPUT = 256 * 1024


class _ObjectPrefix:
    """Whether the text fed so far can begin a JSON object (`{"a": [1, "x`): a pushdown check
    over the new characters only. Anthropic's SDKs parse a tool's `input_json_delta`s as they
    arrive and raise on text that can begin no object, so only such a prefix is streamed."""

    __slots__ = ("closed", "expect", "ok", "size", "stack", "_escape", "_string", "_word")

    def __init__(self) -> None:
        self.stack: list[str] = []
        # start | value (value0: or `]`) | key (key0: or `}`) | colon | next | end
        self.expect = "start"
        self.ok = True
        self.closed = False  # the object is complete
        self.size = 0
        self._string = False
        self._escape = 0  # 1 after a backslash; 2..5 inside \uXXXX
        self._word = ""  # the literal (number, true, false, null) being read

    def feed(self, text: str) -> int:
        """How many characters of `text` continue the prefix (all of them while it holds)."""
        for n, ch in enumerate(text):
            self._char(ch)
            if not self.ok:
                self.size += n
                return n
        self.size += len(text)
        return len(text)

    def _char(self, ch: str) -> None:
        if self._string:
            if self._escape == 1:
                if ch == "u":
                    self._escape = 2
                elif ch in '"\\/bfnrt':
                    self._escape = 0
                else:
                    self.ok = False
            elif self._escape:
                if ch not in "0123456789abcdefABCDEF":
                    self.ok = False
                self._escape = 0 if self._escape == 5 else self._escape + 1
            elif ch == "\\":
                self._escape = 1
            elif ch == '"':
                self._string = False
                self.expect = "colon" if self.expect == "key" else "next"
            elif ch < " ":
                self.ok = False
            return
        if self._word:
            if ch in _LITERAL:
                self._word += ch
                self.ok = _literal_prefix(self._word)
                return
            if not _literal_whole(self._word):
                self.ok = False
                return
            self._word, self.expect = "", "next"
        if ch in _WS:
            return
        expect = self.expect
        if expect == "start":
            self.ok = ch == "{"
            self.stack.append("}")
            self.expect = "key0"
        elif expect == "end":
            self.ok = False
        elif expect == "colon":
            self.ok = ch == ":"
            self.expect = "value"
        elif expect == "key" or expect == "key0":
            if ch == '"':
                self._string = True
                self.expect = "key"
            elif ch == "}" and expect == "key0":
                self._pop()  # an empty object
            else:
                self.ok = False
        elif expect == "next":
            if ch == ",":
                self.expect = "key" if self.stack[-1] == "}" else "value"
            elif ch == self.stack[-1]:
                self._pop()
            else:
                self.ok = False
        elif ch == '"':  # a value
            self._string = True
        elif ch in "{[":
            self.stack.append("}" if ch == "{" else "]")
            self.expect = "key0" if ch == "{" else "value0"
        elif ch == "]" and expect == "value0":
            self._pop()  # an empty array
        elif ch in _LITERAL:
            self._word = ch
            self.ok = _literal_prefix(ch)
        else:
            self.ok = False

    def _pop(self) -> None:
        self.stack.pop()
        self.expect = "next" if self.stack else "end"
        self.closed = not self.stack


class _ToolInput:
    """One streamed tool call's arguments: relayed while they can begin a JSON object; text
    that cannot (and never began one) is kept for the block's end."""

    __slots__ = ("parts", "prefix", "sent")

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.prefix = _ObjectPrefix()
        self.sent = False

    def relay(self, args: str) -> str:
        """What of `args` goes out now: all of it while the arguments can begin a JSON object;
        after a valid start, the part that continues it (the rest cannot follow: dropped)."""
        prefix = self.prefix
        if self.sent and prefix.size >= _MAX_CHECKED_INPUT:
            return args  # long past a valid start: relayed unchecked
        if prefix.ok:
            n = prefix.feed(args)
            if n == len(args) or (n and (self.sent or prefix.closed)):
                self.sent = True
                return args[:n]
        else:
            prefix.size += len(args)
        if not self.sent and prefix.size <= _MAX_CHECKED_INPUT:
            self.parts.append(args)  # kept for the block's end
        return ""


def _literal_prefix(word: str) -> bool:
    if word[0] in "tfn":
        return any(w.startswith(word) for w in ("true", "false", "null"))
    return word[0] in "-0123456789" and all(c in "0123456789+-.eE" for c in word)


def _literal_whole(word: str) -> bool:
    if word in ("true", "false", "null"):
        return True
    try:
        float(word)
    except ValueError:
        return False
    return word[0] in "-0123456789"


class MessageStream:
    """chat.completion.chunk payloads in, Anthropic stream events out (choice 0 only)."""

    def __init__(self, model: str, prompt_estimate: int) -> None:
        self.model = model
        self.prompt_estimate = prompt_estimate
        self.started = False
        self.ended = False
        self.block: int | None = None  # index of the open content block
        self.block_kind = ""
        self.next_block = 0
        self.tools: dict[int, int] = {}  # chat tool_call index -> block index
        # Per tool block: its arguments so far and whether they still begin a JSON object.
        self._inputs: dict[int, _ToolInput] = {}
        self.stop_reason: str | None = None
        self.usage: dict[str, int] | None = None
        self._text_head: bytes | None = None  # the open text block's delta event, up to the text

    def _start(self) -> list[bytes]:
        if self.started:
            return []
        self.started = True
        message: dict[str, Any] = {
            "id": new_message_id(),
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": self.prompt_estimate, "output_tokens": 0},
        }
        return [_event("message_start", {"type": "message_start", "message": message})]

    def _close(self) -> list[bytes]:
        if self.block is None:
            return []
        i, self.block = self.block, None
        self._text_head = None
        out = self._tool_end(i)
        out.append(
            b'event: content_block_stop\ndata: {"type":"content_block_stop","index":%d}\n\n' % i
        )
        return out

    def _tool_end(self, i: int) -> list[bytes]:
        """A tool block's input when its arguments were no JSON object (text, a list): sent
        whole at its end as the unary answer has it (`_raw_arguments`), never streamed as
        they came (an Anthropic SDK fails on them)."""
        state = self._inputs.get(i)  # kept: a call's arguments may go on after its block
        if state is None or state.sent or state.prefix.ok:
            return []
        args = orjson.dumps(_tool_input("".join(state.parts))).decode()
        state.sent, state.parts = True, []  # nothing can follow it
        return [self._delta(i, {"type": "input_json_delta", "partial_json": args})]

    def _open(self, block: dict[str, Any]) -> list[bytes]:
        out = self._close()
        self.block, self.block_kind = self.next_block, block["type"]
        self.next_block += 1
        if block is _TEXT_BLOCK:
            self._text_head = (
                b'event: content_block_delta\ndata: {"type":"content_block_delta","index":%d,'
                b'"delta":{"type":"text_delta","text":' % self.block
            )
            out.append(
                b'event: content_block_start\ndata: {"type":"content_block_start","index":%d,'
                b'"content_block":{"type":"text","text":""}}\n\n' % self.block
            )
            return out
        out.append(
            _event(
                "content_block_start",
                {"type": "content_block_start", "index": self.block, "content_block": block},
            )
        )
        return out

    def _delta(self, index: int, delta: dict[str, Any]) -> bytes:
        return _event(
            "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}
        )

    def text(self, text: str) -> bytes | None:
        return self.text_json(orjson.dumps(text)[1:-1])

    def text_json(self, raw: bytes) -> bytes | None:
        # The most frequent event, encoded from a template (a third of the cost of a dict).
        head = self._text_head
        if head is None:  # what `chunk` sends for it: the message and a text block opened
            out = self._start() if not self.started else []
            out += self._open(_TEXT_BLOCK)
            head = self._text_head
            assert head is not None
            out.append(b'%b"%b"}}\n\n' % (head, raw))
            return b"".join(out)
        return b'%b"%b"}}\n\n' % (head, raw)

    def texts_json(self, raws: list[bytes]) -> bytes | None:
        head = self._text_head
        if head is None:
            return None
        return b'%b"%b"}}\n\n' % (head, (b'"}}\n\n%b"' % head).join(raws))

    def chunk(self, chunk: dict[str, Any]) -> list[bytes]:
        out = self._start() if not self.started else []
        if chunk.get("usage"):
            self.usage = _usage(chunk["usage"], self.prompt_estimate)
        for c in chunk.get("choices") or ():
            if not isinstance(c, dict) or c.get("index", 0) != 0:
                continue
            delta = c.get("delta") or {}
            text = delta.get("content")
            if not (text and isinstance(text, str)):
                # A refusal is the answer's text, as in a unary answer (Messages has no
                # refusal block).
                text = delta.get("refusal")
            if text and isinstance(text, str):
                if self._text_head is None:
                    out += self._open(_TEXT_BLOCK)
                event = self.text_json(orjson.dumps(text)[1:-1])
                assert event is not None
                out.append(event)
            for tc in delta.get("tool_calls") or []:
                out += self._tool_delta(tc)
            if c.get("finish_reason"):
                out += self._close()
                self.stop_reason = STOP_REASONS.get(c["finish_reason"], "end_turn")
        return out

    def _tool_delta(self, tc: dict[str, Any]) -> list[bytes]:
        out: list[bytes] = []
        idx = tc.get("index", 0)
        fn = tc.get("function") or {}
        if idx not in self.tools:
            block: dict[str, Any] = {
                "type": "tool_use",
                "id": tc.get("id") or "toolu_" + os.urandom(12).hex(),
                "name": fn.get("name") or "",
                "input": {},
            }
            out += self._open(block)
            assert self.block is not None
            self.tools[idx] = self.block
        args = fn.get("arguments")
        if isinstance(args, str) and args:
            at = self.tools[idx]
            state = self._inputs.get(at)
            if state is None:
                state = self._inputs[at] = _ToolInput()
            args = state.relay(args)
            if args:
                out.append(self._delta(at, {"type": "input_json_delta", "partial_json": args}))
        return out

    def error(self, error: dict[str, Any]) -> list[bytes]:
        self.ended = True
        text = error.get("message")
        message = text if isinstance(text, str) else "Stream failed."
        _, body = anthropic_error(_stream_error_status(error), message)
        return [b"event: error\ndata: " + body + b"\n\n"]

    async def finish(self) -> list[bytes]:
        if self.ended:
            return []
        self.ended = True
        out = self._start() + self._close()
        usage = self.usage or {"input_tokens": self.prompt_estimate, "output_tokens": 0}
        out.append(
            _event(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": self.stop_reason or "end_turn", "stop_sequence": None},
                    "usage": usage,
                },
            )
        )
        out.append(b'event: message_stop\ndata: {"type":"message_stop"}\n\n')
        return out


class MessagesExchange:
    #: `stop_sequences` Anthropic takes (more than chat's 4); checked again on the chat body.
    max_stop = 64

    def __init__(self, max_depth: int = DEFAULT_MAX_DEPTH) -> None:
        self.model = ""
        self.stream = False
        self.translated = False
        self.max_depth = max_depth

    def authorization(self, headers: Mapping[str, str]) -> str | None:
        """Anthropic clients send `x-api-key`; a bearer token works too."""
        auth = headers.get("authorization")
        if auth:
            return auth
        key = headers.get("x-api-key")
        return f"Bearer {key}" if key else None

    async def request(self, raw: bytes, ctx: Context) -> bytes:
        req = parse(raw, self.max_depth)
        body = to_chat(req)
        self.model, self.stream, self.translated = body["model"], bool(body.get("stream")), True
        return orjson.dumps(body)

    async def respond(self, response: Response, ctx: Context) -> Response:
        status = response.status_code
        if status >= 400:
            err = error_fields(bytes(response.body))
            message = err.get("message") if isinstance(err.get("message"), str) else ""
            code, body = anthropic_error(status, message or "The request failed.")
            return rebuild(response, body, code)
        if not self.translated or status != 200:
            return response  # e.g. a degradation rule's 202: passed on as it is
        if is_stream(response):
            return await translate_stream(response, MessageStream(self.model, ctx.prompt_tokens))
        try:
            completion = orjson.loads(bytes(response.body))
        except orjson.JSONDecodeError:
            completion = None
        if not isinstance(completion, dict):
            code, body = anthropic_error(500, "The provider's answer could not be translated.")
            return rebuild(response, body, code)
        message = to_message(completion, self.model, ctx.prompt_tokens)
        return rebuild(response, orjson.dumps(message))


class MessagesAPI:
    name = NAME

    def __init__(self, max_depth: Callable[[], int] | None = None) -> None:
        # The policy's `server.max_json_depth`, read per request (it changes on reload).
        self.max_depth = max_depth or (lambda: DEFAULT_MAX_DEPTH)

    def begin(self) -> MessagesExchange:
        return MessagesExchange(self.max_depth())


async def count_tokens(
    raw: bytes, models: dict[str, Any], max_depth: int = DEFAULT_MAX_DEPTH
) -> dict[str, Any]:
    """`POST /v1/messages/count_tokens`: the prompt as the gateway would send it, counted with
    tiktoken (the alias's encoding). An estimate: providers tokenize with their own vocabulary."""
    body = to_chat(parse(raw, max_depth), count_only=True)
    alias = models.get(body["model"])
    if alias is None:
        raise model_not_found(clip(body["model"]))
    encoding = alias.encoding or encoding_for_model(body["model"])
    return {"input_tokens": estimate_prompt(body, encoding)}
