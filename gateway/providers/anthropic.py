"""`type: anthropic`: Anthropic's native Messages API (`POST {base_url}/v1/messages`).

Request: system and developer messages become `system`; user parts become text and image blocks
(data URLs as base64 sources, other URLs as url sources); assistant `tool_calls` become
`tool_use` blocks and `tool` messages `tool_result` blocks in a user turn (consecutive turns of
one role merged); tools, tool_choice, parallel_tool_calls, stop, user and JSON output
(`response_format` -> `output_config.format`) are mapped; `max_tokens` is required, from the
request or the provider's `anthropic.max_tokens`. Sampling fields (temperature, top_p), seed,
penalties and logit_bias have no counterpart in the Messages API and are not sent; `n` > 1,
logprobs, audio (parts and output), web search options and file parts cannot be served (another member may serve them).

Answer and stream: text and tool_use blocks, stop reasons and usage (cache reads counted in
`prompt_tokens` and shown as `prompt_tokens_details.cached_tokens`) in OpenAI's shapes; thinking
blocks are not relayed. Errors: Anthropic's error body rewritten into OpenAI's, a prompt over the
window as `context_length_exceeded`; 529 overloaded is a 5xx.

With `anthropic.cache_prefix: true` the shared prefix (the last tool, the system prompt and the
first user turn) is marked with `cache_control` for Anthropic's prompt cache, unless the request
marks its own blocks.
"""

from __future__ import annotations

import base64
import binascii
import re
import time
from collections.abc import Mapping
from typing import Any, ClassVar

import orjson

from gateway.policy.schema import Provider
from gateway.providers.base import Adapter, UnsupportedEndpoint, UpstreamRequest, register
from gateway.providers.common import (
    ChunkWriter,
    error_body,
    is_context_overflow,
    usage,
    wants_usage,
)
from gateway.providers.settings import AnthropicSettings
from gateway.providers.upstream import UpstreamFailure, _status_failure, parse_retry_after
from gateway.wire.answer_checks import InvalidAnswer, first_event_complete
from gateway.wire.request_checks import (
    assistant_text_parts,
    chat_only_output,
    narrowed_to_allowed_tools,
)
from gateway.wire.sse import SSESplitter, event_data

PATH = "/v1/messages"
STOP_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
}
IMAGE_TYPES = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})
_DATA_URL = re.compile(r"^data:(image/[a-z0-9.+-]+);base64,(.*)$", re.S | re.I)
EPHEMERAL = {"type": "ephemeral"}
# Anthropic error types in a stream's error event -> failure kinds.
_STREAM_ERRORS = {
    "overloaded_error": "upstream_5xx",
    "api_error": "upstream_5xx",
    "rate_limit_error": "rate_limited",
    "authentication_error": "upstream_auth",
    "permission_error": "upstream_auth",
}


class BadRequest(UpstreamFailure):
    """The client's request cannot be expressed (malformed where the mapping must read it):
    a 400 in OpenAI's shape, like a provider's own 4xx, without a wasted upstream call."""

    def __init__(self, message: str, param: str) -> None:
        body = error_body(message, "invalid_request_error", "invalid_value", param)
        super().__init__("upstream_4xx", message, status=400, body=body)


def _unsupported(what: str) -> UnsupportedEndpoint:
    return UnsupportedEndpoint("anthropic", what)


@register
class AnthropicAdapter(Adapter):
    type: ClassVar[str] = "anthropic"
    endpoints: ClassVar[frozenset[str]] = frozenset({"chat"})

    def __init__(self, config: Provider, api_key: str | None) -> None:
        super().__init__(config, api_key)
        self.settings: AnthropicSettings = config.anthropic or AnthropicSettings()

    def auth_headers(self) -> dict[str, str]:
        headers = {"anthropic-version": self.settings.version}
        if self.settings.beta:
            headers["anthropic-beta"] = ",".join(self.settings.beta)
        if self.api_key:
            headers["x-api-key"] = self.api_key
        return headers

    # -- request ----------------------------------------------------------------------------

    def request(
        self, endpoint: str, body: dict[str, Any], model: str, stream: bool
    ) -> UpstreamRequest:
        if endpoint != "chat":
            raise _unsupported(endpoint)
        return UpstreamRequest(PATH, orjson.dumps(self.message_params(body, model, stream)))

    def message_params(self, body: dict[str, Any], model: str, stream: bool) -> dict[str, Any]:
        """The Messages API request for an OpenAI chat request."""
        body = dict(narrowed_to_allowed_tools(body))
        n = body.get("n")
        if n is not None and n != 1:
            raise _unsupported("n > 1")
        wanted = chat_only_output(body)
        if wanted:
            raise _unsupported(wanted)
        system, messages = _messages(body["messages"])
        out: dict[str, Any] = {
            "model": model,
            "max_tokens": body.get("max_completion_tokens")
            or body.get("max_tokens")
            or self.settings.max_tokens,
            "messages": messages,
        }
        if system:
            out["system"] = system
        stop = body.get("stop")
        if stop:
            stops = [stop] if isinstance(stop, str) else stop
            if not isinstance(stops, list) or not all(isinstance(x, str) for x in stops):
                raise BadRequest("'stop' must be a string or an array of strings.", "stop")
            # Anthropic refuses empty and whitespace-only stop sequences. An empty one stops
            # nothing and is left out; one of whitespace ("\n") cannot be asked of Anthropic,
            # and leaving it out would run past it: another member may serve it.
            stops = [x for x in stops if x]
            if any(not x.strip() for x in stops):
                raise _unsupported("whitespace-only stop sequences")
            if stops:
                out["stop_sequences"] = stops
        tools = body.get("tools")
        if tools:
            out["tools"] = [_tool(t, i) for i, t in enumerate(tools)]
            choice = _tool_choice(body.get("tool_choice"), body.get("parallel_tool_calls"))
            if choice is not None:
                out["tool_choice"] = choice
        fmt = _output_format(body.get("response_format"))
        if fmt is not None:
            out["output_config"] = {"format": fmt}
        user = body.get("user")
        if isinstance(user, str) and user:
            out["metadata"] = {"user_id": user}
        if stream:
            out["stream"] = True
        if self.settings.cache_prefix and not _has_cache_control(out):
            _mark_prefix(out)
        return out

    # -- answers ----------------------------------------------------------------------------

    def response(self, endpoint: str, body: bytes, model: str) -> bytes:
        try:
            msg = orjson.loads(body)
        except orjson.JSONDecodeError:
            raise InvalidAnswer("the answer is not valid JSON") from None
        if not isinstance(msg, dict) or msg.get("type") != "message":
            raise InvalidAnswer("the answer is not an Anthropic message")
        blocks = msg.get("content")
        if not isinstance(blocks, list):
            raise InvalidAnswer("the answer has no content array")
        text: list[str] = []
        calls: list[dict[str, Any]] = []
        for block in blocks:
            kind = block.get("type") if isinstance(block, dict) else None
            if kind == "text" and isinstance(block.get("text"), str):
                text.append(block["text"])
            elif kind == "tool_use":
                calls.append(_tool_call(block))
        message: dict[str, Any] = {
            "role": "assistant",
            "content": "".join(text) if text or not calls else None,
            "refusal": None,
        }
        if calls:
            message["tool_calls"] = calls
        completion = {
            "id": _str(msg.get("id")) or "msg",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": _str(msg.get("model")) or model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": STOP_REASONS.get(msg.get("stop_reason") or "", "stop"),
                }
            ],
            "usage": _usage(msg.get("usage")),
        }
        return orjson.dumps(completion)

    def stream(self, endpoint: str, body: dict[str, Any], model: str) -> _StreamTranslator:
        limits = self.config.limits
        return _StreamTranslator(
            wants_usage(body), model, limits.max_event_bytes, limits.max_stream_bytes
        )

    # -- errors -----------------------------------------------------------------------------

    def first_event_complete(self, buf: bytes) -> bool:
        try:
            return first_event_complete(buf)
        except InvalidAnswer:
            # A stream that opens with an error event (overloaded, rate limited) fails with that
            # error's kind, so a rate limit cools the member down instead of feeding its breaker.
            kind = _first_error_kind(buf)
            if kind is None:
                raise
            raise UpstreamFailure(kind, "the stream started with an error event") from None

    def failure(
        self, status: int, body: bytes, headers: Mapping[str, str], ratelimit: bool
    ) -> UpstreamFailure:
        err = _error_of(body)
        if err is not None:
            kind, message = err
            code = None
            if status in (400, 413) and is_context_overflow(message):
                kind, code = "invalid_request_error", "context_length_exceeded"
            body = error_body(message, kind, code)
        f = _status_failure(status, body, headers, ratelimit)
        if status == 529 and f.retry_after is None:  # overloaded: honour its retry-after too
            f.retry_after = parse_retry_after(headers.get("retry-after"))
        return f


# -- request mapping ------------------------------------------------------------------------


def _messages(messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(system blocks, Anthropic messages) for OpenAI chat messages."""
    system: list[dict[str, Any]] = []
    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        role = m["role"]
        content = m.get("content")
        if role in ("system", "developer"):
            system.extend(_text_blocks(content, f"messages[{i}].content"))
        elif role == "user":
            _append(out, "user", _user_blocks(content, i))
        elif role == "assistant":
            blocks = _text_blocks(assistant_text_parts(content), f"messages[{i}].content")
            calls = m.get("tool_calls") or []
            if not isinstance(calls, list):
                raise BadRequest("'tool_calls' must be an array.", f"messages[{i}].tool_calls")
            blocks.extend(
                _tool_use(c, f"messages[{i}].tool_calls[{j}]") for j, c in enumerate(calls)
            )
            if blocks:
                _append(out, "assistant", blocks)
        elif role == "tool":
            call_id = m.get("tool_call_id")
            if not isinstance(call_id, str) or not call_id:
                raise BadRequest(
                    "A tool message needs 'tool_call_id'.", f"messages[{i}].tool_call_id"
                )
            result: dict[str, Any] = {"type": "tool_result", "tool_use_id": call_id}
            blocks = _text_blocks(content, f"messages[{i}].content")
            if blocks:
                result["content"] = blocks
            _append(out, "user", [result])
        else:
            raise _unsupported(f"messages with role '{role}'")
    last = out[-1] if out else None
    if last is not None and last["role"] == "assistant" and last["content"][-1]["type"] == "text":
        # A final assistant turn is a prefill (a resumed stream's partial answer): the API refuses
        # one ending in whitespace.
        block = last["content"][-1]
        block["text"] = block["text"].rstrip()
        if not block["text"]:
            last["content"].pop()
            if not last["content"]:
                out.pop()
    return system, out


def _append(out: list[dict[str, Any]], role: str, blocks: list[dict[str, Any]]) -> None:
    # The Messages API alternates roles: consecutive turns of one role become one turn.
    if out and out[-1]["role"] == role:
        out[-1]["content"].extend(blocks)
    else:
        out.append({"role": role, "content": blocks})


def _text_blocks(content: Any, param: str) -> list[dict[str, Any]]:
    if content is None or content == "":
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise BadRequest("'content' must be a string or an array of parts.", param)
    blocks = []
    for j, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") != "text":
            raise BadRequest("Only text parts are accepted here.", f"{param}[{j}]")
        blocks.append(_text(part, f"{param}[{j}]"))
    return [b for b in blocks if b["text"]]


def _text(part: dict[str, Any], param: str) -> dict[str, Any]:
    text = part.get("text")
    if not isinstance(text, str):
        raise BadRequest("A text part needs a string 'text'.", f"{param}.text")
    block: dict[str, Any] = {"type": "text", "text": text}
    if isinstance(part.get("cache_control"), dict):
        block["cache_control"] = EPHEMERAL  # the client marks its own prefix
    return block


def _user_blocks(content: Any, i: int) -> list[dict[str, Any]]:
    param = f"messages[{i}].content"
    if not isinstance(content, list):
        return _text_blocks(content, param)
    blocks: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":
            block = _text(part, f"{param}[{j}]")
            if block["text"]:
                blocks.append(block)
        elif kind == "image_url":
            blocks.append(_image(part, f"{param}[{j}]"))
        else:
            raise _unsupported(f"'{kind}' content parts")
    return blocks


def _image(part: dict[str, Any], param: str) -> dict[str, Any]:
    spec = part.get("image_url")
    url = spec.get("url") if isinstance(spec, dict) else spec
    if not isinstance(url, str) or not url:
        raise BadRequest("An image_url part needs a 'url'.", f"{param}.image_url.url")
    if url[:5].lower() == "data:":
        # Read as the Gemini and Bedrock mappings read it (scheme and type in any case,
        # `image/jpg` for JPEG), and the data checked here: Anthropic refuses bad base64.
        m = _DATA_URL.match(url)
        media_type = m.group(1).lower().replace("/jpg", "/jpeg") if m else ""
        if m is None or media_type not in IMAGE_TYPES:
            raise BadRequest(
                "An image data URL must be base64 JPEG, PNG, GIF or WebP.", f"{param}.image_url.url"
            )
        data = m.group(2).strip()
        try:
            valid = bool(base64.b64decode(data, validate=True))
        except (binascii.Error, ValueError):
            valid = False
        if not valid:
            raise BadRequest(
                "An image data URL must carry non-empty base64 data.", f"{param}.image_url.url"
            )
        source: dict[str, Any] = {"type": "base64", "media_type": media_type, "data": data}
    elif url.startswith(("https://", "http://")):
        source = {"type": "url", "url": url}
    else:
        raise BadRequest("An image URL must be https:// or a data URL.", f"{param}.image_url.url")
    return {"type": "image", "source": source}


def _tool_use(call: Any, param: str) -> dict[str, Any]:
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise BadRequest("A tool call needs 'function.name'.", f"{param}.function")
    args = fn.get("arguments") or "{}"
    try:
        parsed = orjson.loads(args) if isinstance(args, str) else args
    except orjson.JSONDecodeError:
        parsed = None
    if not isinstance(parsed, dict):
        raise BadRequest(
            "Tool call arguments must be a JSON object.", f"{param}.function.arguments"
        )
    call_id = call.get("id")
    if not isinstance(call_id, str) or not call_id:
        raise BadRequest("A tool call needs an 'id'.", f"{param}.id")
    return {"type": "tool_use", "id": call_id, "name": fn["name"], "input": parsed}


def _tool(tool: Any, i: int) -> dict[str, Any]:
    fn = tool.get("function") if isinstance(tool, dict) else None
    if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(fn, dict):
        raise _unsupported("tools other than functions")
    name = fn.get("name")
    if not isinstance(name, str) or not name:
        raise BadRequest("A function tool needs a 'name'.", f"tools[{i}].function.name")
    params = fn.get("parameters")
    out: dict[str, Any] = {
        "name": name,
        "input_schema": params
        if isinstance(params, dict) and params
        else {"type": "object", "properties": {}},
    }
    if isinstance(fn.get("description"), str):
        out["description"] = fn["description"]
    if isinstance(fn.get("strict"), bool):
        out["strict"] = fn["strict"]
    return out


def _tool_choice(choice: Any, parallel: Any) -> dict[str, Any] | None:
    if choice is None or choice == "auto":
        out: dict[str, Any] = {"type": "auto"}
    elif choice == "none":
        return {"type": "none"}
    elif choice == "required":
        out = {"type": "any"}
    elif isinstance(choice, dict) and isinstance((choice.get("function") or {}).get("name"), str):
        out = {"type": "tool", "name": choice["function"]["name"]}
    else:
        raise BadRequest("'tool_choice' is not one Anthropic can follow.", "tool_choice")
    if parallel is False:
        out["disable_parallel_tool_use"] = True
    elif choice is None:
        return None  # nothing to say: Anthropic's default is auto
    return out


def _output_format(fmt: Any) -> dict[str, Any] | None:
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "json_schema":
        schema = (fmt.get("json_schema") or {}).get("schema")
        if not isinstance(schema, dict):
            raise BadRequest("'response_format.json_schema.schema' is required.", "response_format")
        return {"type": "json_schema", "schema": schema}
    if kind == "json_object":
        return {"type": "json_schema", "schema": {"type": "object"}}
    return None


def _has_cache_control(params: dict[str, Any]) -> bool:
    for m in params["messages"]:
        if any("cache_control" in b for b in m["content"]):
            return True
    return any("cache_control" in b for b in params.get("system", ()))


def _mark_prefix(params: dict[str, Any]) -> None:
    """Cache breakpoints at the end of the tools, of the system prompt and of the first user
    turn: what a conversation's requests share (three of the four breakpoints allowed)."""
    tools = params.get("tools")
    if tools:
        tools[-1] = {**tools[-1], "cache_control": EPHEMERAL}
    system = params.get("system")
    if system:
        system[-1] = {**system[-1], "cache_control": EPHEMERAL}
    first = params["messages"][0] if params["messages"] else None
    if first is not None and first["role"] == "user" and first["content"]:
        first["content"][-1] = {**first["content"][-1], "cache_control": EPHEMERAL}


# -- answer mapping -------------------------------------------------------------------------


def _str(v: Any) -> str | None:
    return v if isinstance(v, str) else None


def _int(v: Any) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) else 0


def _usage(u: Any) -> dict[str, Any]:
    """OpenAI usage: cache reads and writes are prompt tokens too (Anthropic counts them apart)."""
    u = u if isinstance(u, dict) else {}
    read = _int(u.get("cache_read_input_tokens"))
    prompt = _int(u.get("input_tokens")) + read + _int(u.get("cache_creation_input_tokens"))
    return usage(prompt, _int(u.get("output_tokens")), read)


def _tool_call(block: dict[str, Any]) -> dict[str, Any]:
    args = block.get("input")
    return {
        "id": _str(block.get("id")) or "",
        "type": "function",
        "function": {
            "name": _str(block.get("name")) or "",
            "arguments": orjson.dumps(args if isinstance(args, dict) else {}).decode(),
        },
    }


def _error_of(body: bytes) -> tuple[str, str] | None:
    """(type, message) of an Anthropic error body, else None."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    err = doc.get("error") if isinstance(doc, dict) else None
    if not isinstance(err, dict):
        return None
    kind, message = err.get("type"), err.get("message")
    return (
        kind if isinstance(kind, str) else "api_error",
        message if isinstance(message, str) else "",
    )


def _first_error_kind(buf: bytes) -> str | None:
    """The failure kind of an Anthropic error event at the start of `buf`, if it is one."""
    for ev in SSESplitter().feed(buf.replace(b"\r\n", b"\n")):
        data = event_data(ev)
        if data is None:
            continue
        try:
            e = orjson.loads(data)
        except orjson.JSONDecodeError:
            return None
        err = e.get("error") if isinstance(e, dict) and e.get("type") == "error" else None
        etype = err.get("type") if isinstance(err, dict) else None
        return _STREAM_ERRORS.get(etype) if isinstance(etype, str) else None
    return None


class _StreamTranslator:
    """Anthropic stream events -> OpenAI chunks, one stream's worth of state."""

    __slots__ = (
        "_created",
        "_input",
        "_left",
        "_model",
        "_output",
        "_splitter",
        "_tools",
        "_usage",
        "_with_args",
        "_w",
    )

    def __init__(self, include_usage: bool, model: str, max_event: int, max_stream: int) -> None:
        self._splitter = SSESplitter(max_event)
        # Raw bytes still allowed: events dropped here (pings, thinking) count against the bound
        # that the relay applies to what it forwards.
        self._left = max_stream
        self._usage = include_usage
        self._model = model
        self._created = int(time.time())
        self._w: ChunkWriter | None = None
        self._tools: dict[int, int] = {}  # content block index -> tool call index
        self._with_args: set[int] = set()  # tool calls that streamed some JSON
        self._input: dict[str, Any] = {}
        self._output = 0

    def __call__(self, raw: bytes) -> bytes:
        self._left -= len(raw)
        if self._left < 0:
            raise InvalidAnswer("the stream is larger than its limit")
        out: list[bytes] = []
        for ev in self._splitter.feed(raw):
            data = event_data(ev)
            if data is None:
                continue
            try:
                e = orjson.loads(data)
            except orjson.JSONDecodeError:
                raise InvalidAnswer("a stream event is not valid JSON") from None
            if not isinstance(e, dict):
                raise InvalidAnswer("a stream event is not a JSON object")
            self._event(e, out)
        return out[0] if len(out) == 1 else b"".join(out)

    def _event(self, e: dict[str, Any], out: list[bytes]) -> None:
        kind = e.get("type")
        w = self._w
        if kind == "content_block_delta" and w is not None:
            d = e.get("delta") or {}
            if d.get("type") == "text_delta":
                out.append(w.delta({"content": d.get("text") or ""}))
            elif d.get("type") == "input_json_delta" and d.get("partial_json"):
                index = self._tools.get(e.get("index", -1))
                if index is not None:
                    self._with_args.add(index)
                    fn = {"arguments": d["partial_json"]}
                    out.append(w.delta({"tool_calls": [{"index": index, "function": fn}]}))
        elif kind == "content_block_stop" and w is not None:
            index = self._tools.get(e.get("index", -1))
            if index is not None and index not in self._with_args:
                # A tool without input streams no JSON at all: its arguments are "{}", as in
                # the unary answer, never "" (which no client can parse).
                fn = {"arguments": "{}"}
                out.append(w.delta({"tool_calls": [{"index": index, "function": fn}]}))
        elif kind == "message_start":
            msg = e.get("message") or {}
            model = _str(msg.get("model")) or self._model
            self._w = ChunkWriter(_str(msg.get("id")) or "msg", self._created, model)
            self._input = msg.get("usage") or {}
            out.append(self._w.delta({"role": "assistant", "content": ""}))
        elif kind == "content_block_start" and w is not None:
            block = e.get("content_block") or {}
            if block.get("type") == "tool_use":
                index = self._tools[e.get("index", -1)] = len(self._tools)
                call = {
                    "index": index,
                    "id": _str(block.get("id")) or "",
                    "type": "function",
                    "function": {"name": _str(block.get("name")) or "", "arguments": ""},
                }
                out.append(w.delta({"tool_calls": [call]}))
            elif block.get("type") == "text" and block.get("text"):
                out.append(w.delta({"content": block["text"]}))
        elif kind == "message_delta" and w is not None:
            u = e.get("usage") or {}
            self._output = _int(u.get("output_tokens")) or self._output
            for k in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"):
                if isinstance(u.get(k), int):  # newer API versions report these at the end
                    self._input[k] = u[k]
            reason = (e.get("delta") or {}).get("stop_reason")
            out.append(w.delta({}, STOP_REASONS.get(reason or "", "stop")))
        elif kind == "message_stop" and w is not None:
            if self._usage:
                out.append(w.usage(_usage({**self._input, "output_tokens": self._output})))
            out.append(ChunkWriter.done)
        elif kind == "error":
            err = e.get("error") or {}
            etype = err.get("type") if isinstance(err, dict) else None
            raise UpstreamFailure(
                _STREAM_ERRORS.get(etype or "", "bad_response"), f"stream error event: {etype}"
            )
        elif w is None and kind != "ping":
            raise InvalidAnswer("the stream did not start with message_start")
