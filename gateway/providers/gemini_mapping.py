"""OpenAI chat <-> Google Gemini generateContent: pure translation, no I/O.

Requests: system and developer messages become `systemInstruction`; user, assistant and tool
messages become `contents` (roles `user` and `model`, consecutive turns of one role merged) with
text, inlineData (images as `data:` URLs), functionCall and functionResponse parts; `tools` become
`functionDeclarations` (JSON Schema as `parametersJsonSchema`), `tool_choice` the
`functionCallingConfig` mode (auto AUTO, required ANY, none NONE, a named function ANY with
`allowedFunctionNames`); `max_tokens`, `temperature`, `top_p`, `stop`, `n`, `seed`,
`presence_penalty`, `frequency_penalty` and `response_format` (JSON mime type, with
`responseJsonSchema` for a schema) become `generationConfig`. Answers: each candidate is a choice;
`finishReason` -> `finish_reason`; `usageMetadata` -> usage (cached content tokens as
`cached_tokens`, thinking tokens counted as completion tokens); a `streamGenerateContent?alt=sse`
stream -> chat chunks ending with `[DONE]`; error answers -> the gateway's failure kinds.

What does not translate: image URLs other than `data:` URLs (Gemini reads uploaded files only);
logprobs, audio output and web search options are refused (another member may serve them);
`logit_bias` and `user` are dropped. Gemini gives function calls no ids: the chat
side gets generated ones, and a tool result is matched to its call's function name by id.
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
    ChunkWriter,
    TranslationError,
    add_turn,
    chat_messages,
    error_body,
    function_tools,
    is_context_overflow,
    require_turns,
    unsupported_role,
    usage,
)
from gateway.providers.upstream import TRANSIENT_4XX
from gateway.resilience.failures import member_caused
from gateway.wire.request_checks import (
    assistant_text_parts,
    chat_only_output,
    narrowed_to_allowed_tools,
)
from gateway.wire.sse import SSESplitter, event_data

_DATA_URL = re.compile(
    r"^data:(image/(?:png|jpeg|jpg|gif|webp|heic|heif));base64,(.*)$", re.S | re.I
)


class BadAnswer(ValueError):
    """A Gemini answer without the shape the API promises."""


class StreamError(Exception):
    def __init__(self, kind: str, detail: str, body: bytes = b"") -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind, self.detail, self.body = kind, detail, body


# ---------------------------------------------------------------------------- requests


def _text(content: Any, param: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for i, part in enumerate(content):
            if not (isinstance(part, dict) and part.get("type") == "text"):
                raise TranslationError(f"{param}[{i}]: only text parts are allowed here", param)
            out.append(str(part.get("text") or ""))
        return "".join(out)
    raise TranslationError(f"{param} must be a string or a list of parts", param)


def _user_parts(content: Any, param: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"text": content}] if content else []
    if not isinstance(content, list):
        raise TranslationError(f"{param} must be a string or a list of parts", param)
    parts: list[dict[str, Any]] = []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":
            if part.get("text"):
                parts.append({"text": str(part["text"])})
        elif kind == "image_url":
            image = part.get("image_url")
            url = image.get("url") if isinstance(image, dict) else image
            m = _DATA_URL.match(url) if isinstance(url, str) else None
            if m is None:
                raise TranslationError(
                    f"{param}[{i}]: Gemini takes images as data: URLs only", param
                )
            data = m.group(2).strip()
            try:
                valid = bool(base64.b64decode(data, validate=True))  # empty is no image
            except (binascii.Error, ValueError):
                valid = False
            if not valid:
                raise TranslationError(f"{param}[{i}]: not valid base64", param)
            mime = m.group(1).lower().replace("jpg", "jpeg")
            parts.append({"inlineData": {"mimeType": mime, "data": data}})
        else:
            raise TranslationError(f"{param}[{i}]: part type {kind!r} is not supported", param)
    return parts


def _args(raw: Any, param: str) -> dict[str, Any]:
    try:
        args = orjson.loads(raw) if isinstance(raw, str) else (raw or {})
    except orjson.JSONDecodeError:
        raise TranslationError(f"{param}: function.arguments is not JSON", param) from None
    return args if isinstance(args, dict) else {"value": args}


def _contents(messages: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(system parts, contents)."""
    system: list[dict[str, Any]] = []
    contents: list[dict[str, Any]] = []
    call_names: dict[str, str] = {}  # tool call id -> function name
    for param, role, msg in chat_messages(messages):
        if role in ("system", "developer"):
            text = _text(msg.get("content"), f"{param}.content")
            if text:
                system.append({"text": text})
            continue
        if role == "user":
            g_role, parts = "user", _user_parts(msg.get("content"), f"{param}.content")
        elif role == "assistant":
            g_role = "model"
            content = assistant_text_parts(msg.get("content") or "")
            parts = [p for p in _user_parts(content, param) if "text" in p]
            for j, call in enumerate(msg.get("tool_calls") or []):
                fn = call.get("function") if isinstance(call, dict) else None
                if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                    raise TranslationError(f"{param}.tool_calls[{j}] needs function.name", param)
                call_names[str(call.get("id"))] = fn["name"]
                args = _args(fn.get("arguments"), f"{param}.tool_calls[{j}]")
                parts.append({"functionCall": {"name": fn["name"], "args": args}})
        elif role == "tool":
            call_id = msg.get("tool_call_id")
            name = call_names.get(str(call_id))
            if name is None:
                raise TranslationError(
                    f"{param}: tool_call_id matches no earlier tool call", f"{param}.tool_call_id"
                )
            text = _text(msg.get("content"), f"{param}.content")
            g_role = "user"
            parts = [{"functionResponse": {"name": name, "response": {"content": text}}}]
        else:
            raise unsupported_role(param, role)
        add_turn(contents, g_role, "parts", parts)
    return system, require_turns(contents)


def _tools(body: Mapping[str, Any]) -> tuple[list[dict[str, Any]] | None, dict[str, Any] | None]:
    tools = body.get("tools")
    if not tools:
        return None, None
    decls = []
    for fn in function_tools(tools):
        decl: dict[str, Any] = {"name": fn.get("name")}
        if fn.get("description"):
            decl["description"] = fn["description"]
        if fn.get("parameters"):
            decl["parametersJsonSchema"] = fn["parameters"]
        decls.append(decl)
    choice = body.get("tool_choice")
    mode: dict[str, Any] | None
    if choice is None or choice == "auto":
        mode = None
    elif choice == "required":
        mode = {"mode": "ANY"}
    elif choice == "none":
        mode = {"mode": "NONE"}
    elif isinstance(choice, dict) and isinstance((choice.get("function") or {}).get("name"), str):
        mode = {"mode": "ANY", "allowedFunctionNames": [choice["function"]["name"]]}
    else:
        raise TranslationError("tool_choice is not one Gemini can express", "tool_choice")
    config = {"functionCallingConfig": mode} if mode else None
    return [{"functionDeclarations": decls}], config


def chat_to_gemini(body: Mapping[str, Any]) -> dict[str, Any]:
    """The generateContent request body for an OpenAI chat request (the model is in the URL)."""
    body = narrowed_to_allowed_tools(body)
    wanted = chat_only_output(body)
    if wanted:  # the answer could not carry it: refused, never silently dropped
        raise TranslationError(f"{wanted} is not translated for Gemini", wanted)
    system, contents = _contents(body.get("messages"))
    out: dict[str, Any] = {"contents": contents}
    if system:
        out["systemInstruction"] = {"parts": system}
    tools, tool_config = _tools(body)
    if tools:
        out["tools"] = tools
    if tool_config:
        out["toolConfig"] = tool_config
    gen: dict[str, Any] = {}
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
    if isinstance(max_tokens, int):
        gen["maxOutputTokens"] = max_tokens
    for src, dst in (
        ("temperature", "temperature"),
        ("top_p", "topP"),
        ("presence_penalty", "presencePenalty"),
        ("frequency_penalty", "frequencyPenalty"),
    ):
        if isinstance(body.get(src), int | float) and not isinstance(body.get(src), bool):
            gen[dst] = float(body[src])
    if isinstance(body.get("seed"), int):
        gen["seed"] = body["seed"]
    n = body.get("n")
    if isinstance(n, int) and n > 1:
        gen["candidateCount"] = n
    stop = body.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if isinstance(stop, list) and stop:
        gen["stopSequences"] = [s for s in stop if isinstance(s, str) and s]
    fmt = body.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") in ("json_object", "json_schema"):
        gen["responseMimeType"] = "application/json"
        schema = (fmt.get("json_schema") or {}).get("schema")
        if fmt["type"] == "json_schema" and isinstance(schema, dict):
            gen["responseJsonSchema"] = schema
    if gen:
        out["generationConfig"] = gen
    return out


# ---------------------------------------------------------------------------- answers

FINISH_REASONS = {
    "STOP": "stop",
    "MAX_TOKENS": "length",
    "SAFETY": "content_filter",
    "RECITATION": "content_filter",
    "BLOCKLIST": "content_filter",
    "PROHIBITED_CONTENT": "content_filter",
    "SPII": "content_filter",
    "IMAGE_SAFETY": "content_filter",
}


def _finish(reason: Any, has_calls: bool) -> str:
    if has_calls and reason in (None, "STOP"):
        return "tool_calls"
    return FINISH_REASONS.get(reason, "stop") if isinstance(reason, str) else "stop"


def chat_usage(meta: Any) -> dict[str, Any] | None:
    if not isinstance(meta, dict):
        return None

    def num(key: str) -> int:
        v = meta.get(key)
        return v if isinstance(v, int) and v >= 0 else 0

    # promptTokenCount includes cached content; thinking tokens are billed as output.
    completion = num("candidatesTokenCount") + num("thoughtsTokenCount")
    return usage(num("promptTokenCount"), completion, num("cachedContentTokenCount"))


def _call(part: dict[str, Any]) -> dict[str, Any]:
    fc = part["functionCall"]
    return {
        "id": str(fc.get("id") or f"call_{uuid.uuid4().hex[:24]}"),
        "type": "function",
        "function": {
            "name": str(fc.get("name") or ""),
            "arguments": orjson.dumps(fc.get("args") or {}).decode(),
        },
    }


def _parts(candidate: Any) -> list[dict[str, Any]]:
    if not isinstance(candidate, dict):
        raise BadAnswer("a candidate is not an object")
    content = candidate.get("content") or {}
    parts = content.get("parts") if isinstance(content, dict) else None
    if parts is None:
        return []
    if not isinstance(parts, list) or not all(isinstance(p, dict) for p in parts):
        raise BadAnswer("candidate.content.parts is not a list of objects")
    return parts


def gemini_to_chat(answer: Any, model: str, created: int | None = None) -> dict[str, Any]:
    if not isinstance(answer, dict) or not isinstance(answer.get("candidates", []), list):
        raise BadAnswer("answer is not a GenerateContentResponse")
    candidates = answer.get("candidates") or []
    if not candidates and not answer.get("promptFeedback"):
        raise BadAnswer("answer has no candidates")
    choices = []
    for i, cand in enumerate(candidates):
        parts = _parts(cand)
        text = "".join(
            p["text"] for p in parts if isinstance(p.get("text"), str) and not p.get("thought")
        )
        calls = [_call(p) for p in parts if isinstance(p.get("functionCall"), dict)]
        msg: dict[str, Any] = {
            "role": "assistant",
            "content": text or (None if calls else ""),
            "refusal": None,
        }
        if calls:
            msg["tool_calls"] = calls
        index = cand.get("index")
        choices.append(
            {
                "index": index if isinstance(index, int) else i,
                "message": msg,
                "finish_reason": _finish(cand.get("finishReason"), bool(calls)),
                "logprobs": None,
            }
        )
    if not choices:  # the prompt itself was blocked
        msg = {"role": "assistant", "content": "", "refusal": None}
        choices.append(
            {"index": 0, "message": msg, "finish_reason": "content_filter", "logprobs": None}
        )
    out: dict[str, Any] = {
        "id": f"chatcmpl-{answer.get('responseId') or uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()) if created is None else created,
        "model": model or str(answer.get("modelVersion") or ""),
        "choices": choices,
    }
    u = chat_usage(answer.get("usageMetadata"))
    if u is not None:
        out["usage"] = u
    return out


# ---------------------------------------------------------------------------- errors


@dataclass(slots=True)
class MappedError:
    kind: str
    status: int
    body: bytes


_AUTH_REASONS = re.compile(
    r"API_KEY_INVALID|API key not valid|API_KEY_SERVICE_BLOCKED|model .{0,60}not found", re.I
)


def map_error(status: int, body: bytes) -> MappedError:
    """A Gemini error answer ({"error": {code, message, status, details}}) as a failure kind."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        doc = None
    err: dict[str, Any] = (
        doc["error"] if isinstance(doc, dict) and isinstance(doc.get("error"), dict) else {}
    )
    message: str = err["message"] if isinstance(err.get("message"), str) else ""
    g_status: str = err["status"] if isinstance(err.get("status"), str) else ""
    said = message + " " + orjson.dumps(err.get("details") or []).decode()
    if member_caused(status) or (status == 400 and _AUTH_REASONS.search(said)):
        kind = "upstream_auth"
    elif status == 429:
        kind = "rate_limited"
    elif status >= 500 or status in TRANSIENT_4XX:
        kind = "upstream_5xx"
    else:
        kind = "upstream_4xx"
    code = g_status or "upstream_rejected"
    err_type = "invalid_request_error"
    if kind == "upstream_4xx" and (
        is_context_overflow(message)
        or re.search(r"(?i)exceeds the maximum number of tokens", message)
    ):
        return MappedError(
            kind,
            400,
            error_body(
                "The request exceeds this model's maximum context length.",
                err_type,
                "context_length_exceeded",
                "messages",
            ),
        )
    if kind == "rate_limited":
        err_type = "rate_limit_error"
    elif kind != "upstream_4xx":
        err_type = "upstream_error"
    return MappedError(kind, status, error_body(message or code, err_type, code))


# ---------------------------------------------------------------------------- streams


@dataclass(slots=True)
class GeminiStream:
    """streamGenerateContent?alt=sse bytes -> chat.completion.chunk SSE events.

    Each SSE event is a partial GenerateContentResponse; the stream is over when every expected
    candidate has a finishReason (the usage chunk, when asked for, and `[DONE]` follow then).
    """

    model: str
    include_usage: bool = False
    candidates: int = 1
    max_event: int | None = None
    # `parallel_tool_calls: false`: Gemini has no switch for it (its function calling modes
    # are AUTO, ANY, NONE and VALIDATED), so a candidate's calls after its first are dropped.
    single_call: bool = False
    created: int = field(default_factory=lambda: int(time.time()))
    done: bool = False
    _writer: ChunkWriter | None = None
    _splitter: SSESplitter | None = None
    _started: set[int] = field(default_factory=set)
    _finished: set[int] = field(default_factory=set)
    _calls: dict[int, int] = field(default_factory=dict)  # candidate -> tool calls so far
    _usage: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        self._writer = ChunkWriter(f"chatcmpl-{uuid.uuid4().hex}", self.created, self.model)
        self._splitter = SSESplitter(self.max_event)

    def feed(self, data: bytes) -> bytes:
        assert self._splitter is not None
        out: list[bytes] = []
        for event in self._splitter.feed(data):
            payload = event_data(event)
            if payload is None:
                continue
            try:
                doc = orjson.loads(payload)
            except orjson.JSONDecodeError:
                raise StreamError("bad_response", "a stream event is not JSON") from None
            out.extend(self._event(doc))
        return b"".join(out)

    def _delta(self, index: int, delta: dict[str, Any], finish: str | None = None) -> bytes:
        assert self._writer is not None
        chunk = self._writer.delta(delta, finish)
        if index:  # ChunkWriter writes choice 0; other candidates get their own index
            chunk = chunk.replace(b'"choices":[{"index":0,', b'"choices":[{"index":%d,' % index, 1)
        return chunk

    def _event(self, doc: Any) -> list[bytes]:
        if self.done:
            # Every candidate finished and `[DONE]` went out: a later event (a usage-only one)
            # cannot change the answer, and failing here would turn a complete answer into an
            # error after its end.
            return []
        if not isinstance(doc, dict):
            raise StreamError("bad_response", "a stream event is not an object")
        if isinstance(doc.get("error"), dict):  # an error reported inside the stream
            mapped = map_error(int(doc["error"].get("code") or 500), orjson.dumps(doc))
            raise StreamError(mapped.kind, "error event in the stream", mapped.body)
        out: list[bytes] = []
        if doc.get("usageMetadata") is not None:
            self._usage = chat_usage(doc["usageMetadata"])
        cands = doc.get("candidates") or []
        if not isinstance(cands, list):
            raise StreamError("bad_response", "candidates is not a list")
        for i, cand in enumerate(cands):
            try:
                parts = _parts(cand)
            except BadAnswer as e:
                raise StreamError("bad_response", str(e)) from None
            index = cand.get("index") if isinstance(cand.get("index"), int) else i
            if index not in self._started:
                self._started.add(index)
                out.append(self._delta(index, {"role": "assistant", "content": ""}))
            for p in parts:
                if isinstance(p.get("text"), str) and p["text"] and not p.get("thought"):
                    out.append(self._delta(index, {"content": p["text"]}))
                elif isinstance(p.get("functionCall"), dict):
                    k = self._calls.get(index, 0)
                    if k and self.single_call:
                        continue
                    self._calls[index] = k + 1
                    out.append(self._delta(index, {"tool_calls": [{"index": k, **_call(p)}]}))
            reason = cand.get("finishReason")
            if reason and index not in self._finished:
                self._finished.add(index)
                out.append(self._delta(index, {}, _finish(reason, index in self._calls)))
        feedback = doc.get("promptFeedback")
        if not cands and isinstance(feedback, dict) and feedback.get("blockReason"):
            out.append(self._delta(0, {"role": "assistant", "content": ""}, "content_filter"))
            self._finished = set(range(self.candidates))
        if len(self._finished) >= self.candidates:
            assert self._writer is not None
            if self.include_usage and self._usage is not None:
                out.append(self._writer.usage(self._usage))
            out.append(self._writer.done)
            self.done = True
        return out
