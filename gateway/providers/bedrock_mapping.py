"""OpenAI chat <-> Amazon Bedrock Converse: pure translation, no I/O.

Requests: system and developer messages become Converse `system` blocks; user, assistant and tool
messages become `messages` with text, image, toolUse and toolResult blocks (consecutive messages
of one role merged, as Converse requires alternating roles); `tools`/`tool_choice` become
`toolConfig`; `max_tokens`/`temperature`/`top_p`/`stop` become `inferenceConfig`;
`response_format` becomes `outputConfig.textFormat` (a JSON schema; `json_object` asks for any
object). Answers: `stopReason` -> `finish_reason`, `usage` with cache reads as
`prompt_tokens_details.cached_tokens`; a ConverseStream event sequence -> chat.completion.chunk
events ending with `[DONE]`; error answers -> the gateway's failure kinds with an OpenAI-shaped
error body.

What does not translate: `n` > 1 is refused (Converse answers one choice); image URLs must be
`data:` URLs (Bedrock does not fetch); logprobs, audio output and web search options are
refused (another member may serve them); `seed`, `presence_penalty`, `frequency_penalty`,
`logit_bias` and `user` are dropped; `tool_choice: "none"` sends no tool
choice (the tools stay when the conversation already holds tool calls, which Converse requires).
"""

from __future__ import annotations

import base64
import binascii
import re
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway.providers.common import (
    TranslationError,
    add_turn,
    chat_messages,
    function_tools,
    require_turns,
    unsupported_role,
)
from gateway.resilience.failures import member_caused
from gateway.wire.request_checks import (
    assistant_text_parts,
    chat_only_output,
    narrowed_to_allowed_tools,
)
from gateway.wire.sse import DONE, encode_event

# ---------------------------------------------------------------------------- requests

_DATA_URL = re.compile(r"^data:image/(png|jpeg|jpg|gif|webp);base64,(.*)$", re.S | re.I)


def _text_of(content: Any, param: str) -> str:
    """The text of a system/tool message (a string or a list of text parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for i, part in enumerate(content):
            if isinstance(part, dict) and part.get("type") == "text":
                out.append(str(part.get("text") or ""))
            else:
                raise TranslationError(f"{param}[{i}]: only text parts are allowed here", param)
        return "".join(out)
    raise TranslationError(f"{param} must be a string or a list of parts", param)


def _image_block(part: Mapping[str, Any], param: str) -> dict[str, Any]:
    image = part.get("image_url")
    url = image.get("url") if isinstance(image, dict) else image
    m = _DATA_URL.match(url) if isinstance(url, str) else None
    if m is None:
        raise TranslationError(
            f"{param}: Bedrock takes images as data: URLs (png, jpeg, gif, webp) only", param
        )
    fmt = m.group(1).lower()
    data = m.group(2).strip()
    try:
        valid = bool(base64.b64decode(data, validate=True))  # empty is no image
    except (binascii.Error, ValueError):
        valid = False
    if not valid:
        raise TranslationError(f"{param}: the data: URL is not valid base64", param)
    # JSON protocol: a blob travels as its base64 text.
    return {"image": {"format": "jpeg" if fmt == "jpg" else fmt, "source": {"bytes": data}}}


def _user_blocks(content: Any, param: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"text": content}] if content else []
    if not isinstance(content, list):
        raise TranslationError(f"{param} must be a string or a list of parts", param)
    blocks: list[dict[str, Any]] = []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":
            text = part.get("text")
            if isinstance(text, str) and text:
                blocks.append({"text": text})
        elif kind == "image_url":
            blocks.append(_image_block(part, f"{param}[{i}]"))
        else:
            raise TranslationError(f"{param}[{i}]: part type {kind!r} is not supported", param)
    return blocks


def _tool_use_block(call: Any, param: str) -> dict[str, Any]:
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise TranslationError(f"{param}: a tool call needs function.name", param)
    raw = fn.get("arguments") or "{}"
    try:
        args = orjson.loads(raw) if isinstance(raw, str) else raw
    except orjson.JSONDecodeError:
        raise TranslationError(f"{param}: function.arguments is not JSON", param) from None
    if not isinstance(args, dict):  # toolUse.input is a JSON object
        args = {"value": args}
    call_id = call.get("id") or f"call_{uuid.uuid4().hex[:24]}"
    return {"toolUse": {"toolUseId": str(call_id), "name": fn["name"], "input": args}}


def _tool_result_block(msg: Mapping[str, Any], param: str) -> dict[str, Any]:
    call_id = msg.get("tool_call_id")
    if not isinstance(call_id, str) or not call_id:
        raise TranslationError(f"{param}: a tool message needs tool_call_id", param)
    text = _text_of(msg.get("content"), f"{param}.content")
    return {"toolResult": {"toolUseId": call_id, "content": [{"text": text or " "}]}}


def _messages(
    messages: Any,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], bool]:
    """(system blocks, Converse messages, whether any tool block is present)."""
    system: list[dict[str, Any]] = []
    out: list[dict[str, Any]] = []
    has_tools = False
    for param, role, msg in chat_messages(messages):
        if role in ("system", "developer"):
            text = _text_of(msg.get("content"), f"{param}.content")
            if text.strip():  # Converse refuses blank system text
                system.append({"text": text})
            continue
        if role == "user":
            conv_role, blocks = "user", _user_blocks(msg.get("content"), f"{param}.content")
        elif role == "assistant":
            conv_role = "assistant"
            blocks = []
            content = assistant_text_parts(msg.get("content"))
            if content:
                blocks = [
                    b
                    for b in _user_blocks(content, f"{param}.content")
                    if "text" in b  # an assistant turn holds no images
                ]
            for j, call in enumerate(msg.get("tool_calls") or []):
                blocks.append(_tool_use_block(call, f"{param}.tool_calls[{j}]"))
                has_tools = True
        elif role == "tool":
            conv_role, blocks = "user", [_tool_result_block(msg, param)]
            has_tools = True
        else:
            raise unsupported_role(param, role)
        add_turn(out, conv_role, "content", blocks)
    return system, require_turns(out), has_tools


def _tool_config(body: Mapping[str, Any], history_has_tools: bool) -> dict[str, Any] | None:
    tools = body.get("tools")
    choice = body.get("tool_choice")
    if not tools:
        return None
    specs = []
    for fn in function_tools(tools):
        spec: dict[str, Any] = {
            "name": fn.get("name"),
            "inputSchema": {"json": fn.get("parameters") or {"type": "object", "properties": {}}},
        }
        if fn.get("description"):
            spec["description"] = fn["description"]
        if fn.get("strict") is True:
            spec["strict"] = True
        specs.append({"toolSpec": spec})
    config: dict[str, Any] = {"tools": specs}
    if choice is None or choice == "auto":
        pass  # Converse's default is auto; omitted like OpenAI's
    elif choice == "required":
        config["toolChoice"] = {"any": {}}
    elif choice == "none":
        # No "none" in Converse: without tool history the tools are simply not offered.
        return config if history_has_tools else None
    elif isinstance(choice, dict) and isinstance((choice.get("function") or {}).get("name"), str):
        config["toolChoice"] = {"tool": {"name": choice["function"]["name"]}}
    else:
        raise TranslationError("tool_choice is not one Bedrock can express", "tool_choice")
    return config


def _output_config(fmt: Any) -> dict[str, Any] | None:
    if not isinstance(fmt, dict) or fmt.get("type") in (None, "text"):
        return None
    if fmt["type"] == "json_object":
        schema: Any = {"type": "object"}
        name = "json_object"
        description = None
    elif fmt["type"] == "json_schema":
        spec = fmt.get("json_schema") or {}
        schema = spec.get("schema") or {"type": "object"}
        name = spec.get("name") or "response"
        description = spec.get("description")
    else:
        raise TranslationError("response_format type is not supported", "response_format")
    definition: dict[str, Any] = {"schema": orjson.dumps(schema).decode(), "name": name}
    if description:
        definition["description"] = description
    return {"textFormat": {"type": "json_schema", "structure": {"jsonSchema": definition}}}


def chat_to_converse(body: Mapping[str, Any]) -> dict[str, Any]:
    """The Converse (or ConverseStream) request body for an OpenAI chat request.

    The model id is not part of the body: it goes in the URL path.
    """
    body = narrowed_to_allowed_tools(body)
    n = body.get("n")
    if isinstance(n, int) and n > 1:
        raise TranslationError("Bedrock answers one choice per request: n must be 1", "n")
    wanted = chat_only_output(body)
    if wanted:  # Converse answers text and tool calls only: refused, never silently dropped
        raise TranslationError(f"Bedrock cannot answer with {wanted}", wanted)
    system, messages, has_tools = _messages(body.get("messages"))
    out: dict[str, Any] = {"messages": messages}
    if system:
        out["system"] = system
    inference: dict[str, Any] = {}
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
    if isinstance(max_tokens, int):
        inference["maxTokens"] = max_tokens
    if isinstance(body.get("temperature"), int | float):
        inference["temperature"] = float(body["temperature"])
    if isinstance(body.get("top_p"), int | float):
        inference["topP"] = float(body["top_p"])
    stop = body.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if isinstance(stop, list) and stop:
        inference["stopSequences"] = [s for s in stop if isinstance(s, str) and s]
    if inference:
        out["inferenceConfig"] = inference
    tools = _tool_config(body, has_tools)
    if tools is not None:
        out["toolConfig"] = tools
    output = _output_config(body.get("response_format"))
    if output is not None:
        out["outputConfig"] = output
    return out


# ---------------------------------------------------------------------------- answers

FINISH_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_calls",
    "guardrail_intervened": "content_filter",
    "content_filtered": "content_filter",
}


def finish_reason(stop_reason: Any) -> str:
    return FINISH_REASONS.get(stop_reason, "stop") if isinstance(stop_reason, str) else "stop"


def chat_usage(usage: Any) -> dict[str, Any] | None:
    """OpenAI usage from Converse's TokenUsage: cache reads and writes count as prompt tokens
    (Converse's inputTokens excludes them), cache reads are also the `cached_tokens`."""
    if not isinstance(usage, dict):
        return None

    def num(key: str) -> int:
        v = usage.get(key)
        return v if isinstance(v, int) and v >= 0 else 0

    cached = num("cacheReadInputTokens")
    prompt = num("inputTokens") + cached + num("cacheWriteInputTokens")
    completion = num("outputTokens")
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


class BadAnswer(ValueError):
    """A Converse answer without the shape the API promises."""


def converse_to_chat(
    answer: Any, model: str, request_id: str | None = None, created: int | None = None
) -> dict[str, Any]:
    """The chat.completion for a Converse answer; BadAnswer when it is not one."""
    if not isinstance(answer, dict):
        raise BadAnswer("answer is not a JSON object")
    message = (
        (answer.get("output") or {}).get("message")
        if isinstance(answer.get("output"), dict)
        else None
    )
    if not isinstance(message, dict) or not isinstance(message.get("content"), list):
        raise BadAnswer("answer has no output.message.content")
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for block in message["content"]:
        if not isinstance(block, dict):
            raise BadAnswer("a content block is not an object")
        if isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif isinstance(block.get("toolUse"), dict):
            use = block["toolUse"]
            calls.append(
                {
                    "id": str(use.get("toolUseId") or f"call_{uuid.uuid4().hex[:24]}"),
                    "type": "function",
                    "function": {
                        "name": str(use.get("name") or ""),
                        "arguments": orjson.dumps(use.get("input") or {}).decode(),
                    },
                }
            )
        # reasoningContent, citations and other blocks have no chat equivalent
    msg: dict[str, Any] = {
        "role": "assistant",
        "content": "".join(texts) if texts else None,
        "refusal": None,
    }
    if calls:
        msg["tool_calls"] = calls
    if not texts and not calls:
        msg["content"] = ""
    out: dict[str, Any] = {
        "id": f"chatcmpl-{request_id or uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()) if created is None else created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": msg,
                "finish_reason": finish_reason(answer.get("stopReason")),
                "logprobs": None,
            }
        ],
    }
    usage = chat_usage(answer.get("usage"))
    if usage is not None:
        out["usage"] = usage
    return out


# ---------------------------------------------------------------------------- errors

# The failure kind and OpenAI error code of each Bedrock exception (x-amzn-ErrorType / __type).
_ERROR_KINDS: dict[str, str] = {
    "UnrecognizedClientException": "upstream_auth",
    "InvalidSignatureException": "upstream_auth",
    "AccessDeniedException": "upstream_auth",
    "ExpiredTokenException": "upstream_auth",
    "IncompleteSignatureException": "upstream_auth",
    "MissingAuthenticationTokenException": "upstream_auth",
    "ResourceNotFoundException": "upstream_auth",  # the mapped model does not exist there
    "ThrottlingException": "rate_limited",
    "ServiceQuotaExceededException": "rate_limited",
    "ModelNotReadyException": "rate_limited",
    "ModelTimeoutException": "upstream_5xx",
    "ModelErrorException": "upstream_5xx",
    "ModelStreamErrorException": "upstream_5xx",
    "InternalServerException": "upstream_5xx",
    "ServiceUnavailableException": "upstream_5xx",
    "ValidationException": "upstream_4xx",
}
# Stream exception events name the same exceptions in camel case.
_STREAM_EXCEPTIONS = {k[0].lower() + k[1:]: k for k in _ERROR_KINDS}
# How Bedrock words a prompt over the model's context window (it has no dedicated code).
_TOO_LONG = re.compile(
    r"(?i)too long|too many (input )?tokens|context (length|window)|maximum context|"
    r"exceeds? the (maximum|max)"
)
# A model id the region does not serve is the member's misconfiguration, not the client's fault.
_BAD_MODEL = re.compile(r"(?i)model identifier is invalid|model .{0,40}(not found|does not exist)")


@dataclass(slots=True)
class MappedError:
    kind: str
    status: int
    body: bytes  # an OpenAI-shaped error object
    exception: str


def error_type(headers: Mapping[str, str], body: bytes) -> str:
    """The Bedrock exception name of an error answer ("" when unknown)."""
    raw = headers.get("x-amzn-errortype") or ""
    if not raw:  # a plain dict (aiohttp's headers are case-insensitive already)
        raw = next((v for k, v in headers.items() if k.lower() == "x-amzn-errortype"), "")
    if not raw:
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError:
            doc = None
        if isinstance(doc, dict):
            raw = str(doc.get("__type") or doc.get("code") or "")
    # "ValidationException:http://internal.amazon.com/coral/..." or "com.amazon...#Name"
    return raw.split(":", 1)[0].rsplit("#", 1)[-1].strip()


def _message(body: bytes) -> str:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return ""
    if isinstance(doc, dict):
        msg = doc.get("message") or doc.get("Message")
        return msg if isinstance(msg, str) else ""
    return ""


def map_error(status: int, headers: Mapping[str, str], body: bytes) -> MappedError:
    """Classify a Bedrock error answer; the body is rewritten to OpenAI's error shape."""
    name = error_type(headers, body)
    message = _message(body)
    kind = _ERROR_KINDS.get(name)
    if kind == "upstream_4xx" and _BAD_MODEL.search(message):
        kind = "upstream_auth"
    if kind is None:
        if member_caused(status):
            kind = "upstream_auth"
        elif status == 429:
            kind = "rate_limited"
        elif status >= 500 or status in (408, 424):
            kind = "upstream_5xx"
        else:
            kind = "upstream_4xx"
    code = name or "upstream_rejected"
    err_type = "invalid_request_error"
    if kind == "upstream_4xx" and _TOO_LONG.search(message):
        code = "context_length_exceeded"
        message = "The request exceeds this model's maximum context length."
    elif kind == "rate_limited":
        err_type = "rate_limit_error"
    elif kind != "upstream_4xx":
        err_type = "upstream_error"
    out_status = status if kind != "upstream_4xx" or 400 <= status < 500 else 400
    doc = {"error": {"message": message or name or "error", "type": err_type, "code": code}}
    if code == "context_length_exceeded":
        doc["error"]["param"] = "messages"
    return MappedError(kind, out_status, orjson.dumps(doc), name)


# ---------------------------------------------------------------------------- streams


class StreamError(Exception):
    """An exception event in a ConverseStream, or a stream without Converse's shape."""

    def __init__(self, kind: str, detail: str, body: bytes = b"") -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind
        self.detail = detail
        self.body = body


@dataclass(slots=True)
class StreamTranslator:
    """ConverseStream events -> chat.completion.chunk SSE events.

    Feed each decoded event (its `:event-type`, or `:exception-type` for an exception message,
    and its JSON payload); it returns the SSE events to relay. `messageStop` gives the finishing
    chunk; the `metadata` event after it gives the usage chunk (when the client asked for
    include_usage) and `[DONE]`. `finish()` at the end of the byte stream adds `[DONE]` when no
    metadata came, or raises StreamError when the message never stopped.
    """

    model: str
    include_usage: bool = False
    request_id: str | None = None
    # `parallel_tool_calls: false`: Converse has no switch for it, so toolUse blocks after the
    # first are dropped (their start, input deltas and stop).
    single_call: bool = False
    created: int = field(default_factory=lambda: int(time.time()))
    done: bool = False
    _stopped: bool = False
    _started: bool = False
    _tool_index: dict[int, int] = field(default_factory=dict)  # block index -> tool call index
    _with_args: set[int] = field(default_factory=set)  # tool calls that streamed some input
    _dropped: set[Any] = field(default_factory=set)  # block indices of calls cut (single_call)
    _base: bytes = b""

    def __post_init__(self) -> None:
        head = {
            "id": f"chatcmpl-{self.request_id or uuid.uuid4().hex}",
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
        }
        # Every chunk shares id/created/model: render that prefix once.
        self._base = orjson.dumps(head)[:-1] + b","

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return encode_event(self._base + b'"choices":' + orjson.dumps([choice]) + b"}")

    def _role(self) -> list[bytes]:
        if self._started:
            return []
        self._started = True
        return [self._chunk({"role": "assistant", "content": ""})]

    def feed(self, event_type: str, payload: Any, exception: bool = False) -> list[bytes]:
        if exception:
            name = _STREAM_EXCEPTIONS.get(event_type, event_type)
            msg = payload.get("message") if isinstance(payload, dict) else None
            mapped = map_error(
                500 if name not in _ERROR_KINDS else 400,
                {"x-amzn-errortype": name},
                orjson.dumps({"message": msg or name}),
            )
            raise StreamError(mapped.kind, f"stream exception {name}", mapped.body)
        if self.done:
            raise StreamError("bad_response", "event after the end of the stream")
        if not isinstance(payload, dict):
            raise StreamError("bad_response", f"{event_type} payload is not an object")
        if event_type == "messageStart":
            return self._role()
        if event_type == "contentBlockStart":
            start = payload.get("start") or {}
            use = start.get("toolUse") if isinstance(start, dict) else None
            if not isinstance(use, dict):
                return self._role()
            index = payload.get("contentBlockIndex")
            k = len(self._tool_index)
            if k and self.single_call:
                self._dropped.add(index)
                return self._role()
            self._tool_index[index if isinstance(index, int) else -1 - k] = k
            call = {
                "index": k,
                "id": str(use.get("toolUseId") or f"call_{uuid.uuid4().hex[:24]}"),
                "type": "function",
                "function": {"name": str(use.get("name") or ""), "arguments": ""},
            }
            return [*self._role(), self._chunk({"tool_calls": [call]})]
        if event_type == "contentBlockDelta":
            delta = payload.get("delta")
            if not isinstance(delta, dict):
                raise StreamError("bad_response", "contentBlockDelta without delta")
            out = self._role()
            if self._dropped and payload.get("contentBlockIndex") in self._dropped:
                return out
            if isinstance(delta.get("text"), str):
                if delta["text"]:
                    out.append(self._chunk({"content": delta["text"]}))
            elif isinstance(delta.get("toolUse"), dict):
                at = self._tool_index.get(payload.get("contentBlockIndex"))  # type: ignore[arg-type]
                if at is None:
                    raise StreamError("bad_response", "tool input delta before its block start")
                part = delta["toolUse"].get("input")
                if isinstance(part, str) and part:
                    self._with_args.add(at)
                    out.append(
                        self._chunk(
                            {"tool_calls": [{"index": at, "function": {"arguments": part}}]}
                        )
                    )
            return out
        if event_type == "contentBlockStop":
            at = self._tool_index.get(payload.get("contentBlockIndex"))  # type: ignore[arg-type]
            if at is not None and at not in self._with_args:
                # A tool without input streams no JSON: its arguments are "{}", never "".
                self._with_args.add(at)
                return [
                    self._chunk({"tool_calls": [{"index": at, "function": {"arguments": "{}"}}]})
                ]
            return []
        if event_type == "messageStop":
            self._stopped = True
            reason = finish_reason(payload.get("stopReason"))
            return [*self._role(), self._chunk({}, reason)]
        if event_type == "metadata":
            out = []
            usage = chat_usage(payload.get("usage"))
            if self.include_usage and usage is not None:
                out.append(
                    encode_event(self._base + b'"choices":[],"usage":' + orjson.dumps(usage) + b"}")
                )
            if self._stopped:
                self.done = True
                out.append(DONE)
            return out
        return []  # event types added later carry nothing a chat client reads

    def finish(self) -> list[bytes]:
        """At the end of the byte stream: `[DONE]` if still due; StreamError if it was cut."""
        if self.done:
            return []
        if not self._stopped:
            raise StreamError("stream_broken", "stream ended before messageStop")
        self.done = True
        return [DONE]
