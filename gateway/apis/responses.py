"""The OpenAI Responses API (`/v1/responses`) on top of the gateway's chat pipeline.

Request: `instructions`, `input` as a string or items (messages with text / image parts,
function_call, function_call_output), function tools and tool_choice, `text.format` (json_schema,
json_object), `max_output_tokens`, temperature, top_p, `previous_response_id`, `store`, stream.
Answer: a `response` object, or the typed event sequence (response.created, in_progress,
output_item.added, content_part.added, output_text.delta/done, function_call_arguments.delta/done,
content_part.done, output_item.done, response.completed or response.incomplete). Built-in tools
(web search, file search, code interpreter, MCP...), reasoning items, background mode,
conversations and stored prompts cannot run on a chat provider and are refused with a 400.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from typing import Any

import orjson
from starlette.responses import Response

from gateway.apis.exchange import is_stream, rebuild, translate_stream
from gateway.apis.response_store import ResponseStore, new_response_id, valid_response_id
from gateway.context import Context
from gateway.errors import GatewayError, bad_request
from gateway.wire.request import DEFAULT_MAX_DEPTH, check_depth, is_depth_error, nested
from gateway.wire.request_checks import clip, invalid_type, invalid_value

NAME = "responses"
# Fields a client may send that only steer OpenAI's own platform: accepted, not forwarded.
_IGNORED = frozenset(
    {"include", "truncation", "reasoning", "service_tier", "prompt_cache_key", "stream_options"}
)
# OpenAI's bounds on `metadata` (echoed in every answer and stored with the response).
METADATA_KEYS = 16
METADATA_KEY_CHARS = 64
METADATA_VALUE_CHARS = 512
_UNSUPPORTED = {
    "background": "background mode",
    "conversation": "conversations",
    "prompt": "stored prompts",
}


def _err(message: str, param: str | None = None, code: str = "invalid_value") -> GatewayError:
    return bad_request(message, param=param, code=code)


def _hex_id(prefix: str) -> str:
    return prefix + os.urandom(16).hex()


# -- request ------------------------------------------------------------------------------------


def _part(p: Any, where: str) -> dict[str, Any]:
    kind = p.get("type") if isinstance(p, dict) else None
    if kind in ("input_text", "output_text", "text") and isinstance(p.get("text"), str):
        return {"type": "text", "text": p["text"]}
    if kind == "refusal" and isinstance(p.get("refusal"), str):
        return {"type": "text", "text": p["refusal"]}
    if kind == "input_image":
        url = p.get("image_url")
        if not isinstance(url, str):
            raise _err(f"{where}: only image_url images are supported (no file_id).", where)
        image: dict[str, Any] = {"url": url}
        if p.get("detail") in ("low", "high", "auto"):
            image["detail"] = p["detail"]
        return {"type": "image_url", "image_url": image}
    raise _err(f"{where}: content of type '{kind}' is not supported by this gateway.", where)


def _content(content: Any, where: str, text_only: bool) -> Any:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _err(f"{where}: expected a string or an array of content parts.", where)
    parts = [_part(p, f"{where}[{i}]") for i, p in enumerate(content)]
    if text_only or all(p["type"] == "text" for p in parts):
        if any(p["type"] != "text" for p in parts):
            raise _err(f"{where}: only text is supported in this role.", where)
        return "".join(p["text"] for p in parts)
    return parts


def _items(items: list[Any]) -> list[dict[str, Any]]:
    """Input items as chat messages; consecutive function calls join one assistant message."""
    out: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise _err(f"{where}: expected an object.", where)
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise _err(f"{where}.role: '{role}' is not a valid role.", f"{where}.role")
            chat_role = "system" if role == "developer" else role
            content = _content(item.get("content"), f"{where}.content", chat_role != "user")
            out.append({"role": chat_role, "content": content})
        elif kind == "function_call":
            call_id, name = item.get("call_id"), item.get("name")
            args = item.get("arguments", "")
            if not isinstance(call_id, str) or not isinstance(name, str):
                raise _err(f"{where}: function_call needs call_id and name.", where)
            call = {
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": args if isinstance(args, str) else ""},
            }
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant" and "tool_calls" in last:
                last["tool_calls"].append(call)
            elif last is not None and last["role"] == "assistant":
                last["tool_calls"] = [call]
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            call_id, output = item.get("call_id"), item.get("output")
            if not isinstance(call_id, str):
                raise _err(f"{where}.call_id: missing.", f"{where}.call_id")
            text = _content(output, f"{where}.output", True) if output is not None else ""
            out.append({"role": "tool", "tool_call_id": call_id, "content": text})
        elif kind == "reasoning":
            continue  # a chat provider takes no reasoning input: dropped
        else:
            raise _err(
                f"{where}.type: items of type '{kind}' are not supported by this gateway.",
                f"{where}.type",
            )
    return out


def check_call_outputs(messages: list[dict[str, Any]]) -> None:
    """Each function_call_output answers a function call made before it (stored or in this
    input), as OpenAI requires: vendors take an orphan result differently (ignored or a 400)."""
    calls: set[Any] = set()
    for m in messages:
        made = m.get("tool_calls")
        if isinstance(made, list):
            calls.update(c.get("id") for c in made if isinstance(c, dict))
        if m.get("role") == "tool" and m.get("tool_call_id") not in calls:
            raise _err(
                "No tool call found for function call output with call_id "
                f"'{clip(m.get('tool_call_id'))}'.",
                "input",
            )


def _tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise _err("'tools' must be an array.", "tools", "invalid_type")
    out = []
    for i, t in enumerate(tools):
        kind = t.get("type") if isinstance(t, dict) else None
        if kind != "function":
            raise _err(
                f"Tool type '{kind}' is not supported: a chat provider runs function tools only.",
                f"tools[{i}].type",
            )
        if not isinstance(t.get("name"), str):
            raise _err(
                "A function tool needs a name.", f"tools[{i}].name", "missing_required_parameter"
            )
        fn: dict[str, Any] = {"name": t["name"]}
        for k in ("description", "parameters", "strict"):
            if t.get(k) is not None:
                fn[k] = t[k]
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(choice: Any) -> Any:
    if choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and choice.get("name"):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise _err("tool_choice: only auto, none, required or a function.", "tool_choice")


def _response_format(text: Any) -> dict[str, Any] | None:
    if text is None:
        return None
    fmt = text.get("format") if isinstance(text, dict) else None
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        if not isinstance(fmt.get("name"), str) or not isinstance(fmt.get("schema"), dict):
            raise _err("text.format: json_schema needs a name and a schema.", "text.format")
        schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"type": "json_schema", "json_schema": schema}
    raise _err(f"text.format.type: '{kind}' is not supported.", "text.format.type")


def parse(raw: bytes, max_depth: int = DEFAULT_MAX_DEPTH) -> dict[str, Any]:
    """The client's body as a dict, nested at most `max_depth` deep (checked on what the client
    sent: `metadata` and other echoed fields never reach the chat checks)."""
    if not raw:
        raise _err("The request body is empty; expected a JSON object.", code="invalid_json")
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        if is_depth_error(e):
            raise nested(max_depth) from None
        raise _err(f"The request body is not valid JSON: {e}", code="invalid_json") from None
    if not isinstance(doc, dict):
        raise _err("The request body must be a JSON object.", code="invalid_json")
    check_depth(raw, doc, max_depth)
    return doc


def check_metadata(meta: Any) -> None:
    """OpenAI's `metadata`: at most 16 string keys (64 characters) to string values (512)."""
    if meta is None:
        return
    if not isinstance(meta, dict):
        raise _err("Invalid type for 'metadata': expected an object.", "metadata", "invalid_type")
    if len(meta) > METADATA_KEYS:
        raise _err(
            f"Invalid 'metadata': too many properties. Expected an object with at most "
            f"{METADATA_KEYS} properties, but got an object with {len(meta)} properties instead.",
            "metadata",
            "object_above_max_properties",
        )
    for key, value in meta.items():
        if len(key) > METADATA_KEY_CHARS:
            raise _err(
                f"Invalid 'metadata': key too long. Expected a key with maximum length "
                f"{METADATA_KEY_CHARS}, but got a key with length {len(key)} instead.",
                "metadata",
                "string_above_max_length",
            )
        where = f"metadata.{key}"
        if not isinstance(value, str):
            raise _err(f"Invalid type for '{where}': expected a string.", where, "invalid_type")
        if len(value) > METADATA_VALUE_CHARS:
            raise _err(
                f"Invalid '{where}': string too long. Expected a string with maximum length "
                f"{METADATA_VALUE_CHARS}, but got a string with length {len(value)} instead.",
                where,
                "string_above_max_length",
            )


# The `include` value asking for output_text logprobs.
_LOGPROBS_INCLUDE = "message.output_text.logprobs"
MAX_TOP_LOGPROBS = 20


# The values OpenAI takes for fields accepted and ignored here (see _IGNORED).
_IGNORED_CHOICES: dict[str, tuple[str, ...]] = {
    "truncation": ("auto", "disabled"),
    "service_tier": ("auto", "default", "flex", "scale", "priority"),
}


def check_ignored(req: dict[str, Any]) -> None:
    """Fields accepted but not forwarded are still checked as OpenAI checks them: a typo or a
    wrong type is a 400 naming the field, not silently a 200."""
    for name, choices in _IGNORED_CHOICES.items():
        value = req.get(name)
        if value is not None and value not in choices:
            if not isinstance(value, str):
                raise invalid_type(name, "a string", value)
            raise invalid_value(name, value, choices)
    for name in ("reasoning", "stream_options"):
        if req.get(name) is not None and not isinstance(req[name], dict):
            raise invalid_type(name, "an object", req[name])
    if req.get("prompt_cache_key") is not None and not isinstance(req["prompt_cache_key"], str):
        raise invalid_type("prompt_cache_key", "a string", req["prompt_cache_key"])


def check_logprobs(req: dict[str, Any]) -> None:
    """Refuse a request for logprobs: answers carry none (`logprobs: []`), and an empty list
    would read as an answer without tokens, not as a field the gateway cannot fill."""
    top = req.get("top_logprobs")
    if top is not None:
        if type(top) is not int or not 0 <= top <= MAX_TOP_LOGPROBS:
            raise _err(
                f"'top_logprobs' must be an integer between 0 and {MAX_TOP_LOGPROBS}.",
                "top_logprobs",
            )
        if top > 0:
            raise _err("'top_logprobs': logprobs are not returned by this gateway.", "top_logprobs")
    include = req.get("include")
    if include is not None:
        if not isinstance(include, list) or not all(isinstance(x, str) for x in include):
            raise _err(
                "Invalid type for 'include': expected an array of strings.",
                "include",
                "invalid_type",
            )
        if _LOGPROBS_INCLUDE in include:
            raise _err(
                f"'include': '{_LOGPROBS_INCLUDE}' is not returned by this gateway.", "include"
            )


def turn_messages(req: dict[str, Any]) -> list[dict[str, Any]]:
    """This turn's input as chat messages (without instructions or earlier turns)."""
    inp = req.get("input")
    if isinstance(inp, str):
        return [{"role": "user", "content": inp}]
    if isinstance(inp, list):
        return _items(inp)
    if inp is None:
        raise _err("Missing required parameter: 'input'.", "input", "missing_required_parameter")
    raise _err("'input' must be a string or an array of items.", "input", "invalid_type")


def to_chat(
    req: dict[str, Any], history: list[dict[str, Any]], turn: list[dict[str, Any]]
) -> dict[str, Any]:
    """A Responses request as a chat request (raises GatewayError 400 naming the field)."""
    model = req.get("model")
    if not isinstance(model, str) or not model:
        raise _err("Missing required parameter: 'model'.", "model", "missing_required_parameter")
    for field, what in _UNSUPPORTED.items():
        if req.get(field):
            raise _err(f"'{field}': {what} are not supported by this gateway.", field)
    check_metadata(req.get("metadata"))
    for flag in ("store", "stream", "parallel_tool_calls"):
        if req.get(flag) is not None and not isinstance(req[flag], bool):
            raise _err(f"Invalid type for '{flag}': expected a boolean.", flag, "invalid_type")
    messages: list[dict[str, Any]] = []
    instructions = req.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise _err("'instructions' must be a string.", "instructions", "invalid_type")
        if instructions:
            messages.append({"role": "system", "content": instructions})
    messages += history
    messages += turn
    if not messages:
        raise _err("'input' must not be empty.", "input")
    body: dict[str, Any] = {"model": model, "messages": messages}
    mot = req.get("max_output_tokens")
    if mot is not None:
        if not isinstance(mot, int) or isinstance(mot, bool) or mot < 1:
            raise _err("'max_output_tokens' must be a positive integer.", "max_output_tokens")
        body["max_tokens"] = mot
    for name in ("temperature", "top_p", "parallel_tool_calls", "user"):
        if req.get(name) is not None:
            body[name] = req[name]
    if req.get("safety_identifier") and "user" not in body:
        body["user"] = req["safety_identifier"]
    if req.get("tools"):
        body["tools"] = _tools(req["tools"])
    if req.get("tool_choice") is not None and "tools" in body:
        body["tool_choice"] = _tool_choice(req["tool_choice"])
    fmt = _response_format(req.get("text"))
    if fmt is not None:
        body["response_format"] = fmt
    stream = req.get("stream", False)
    if stream not in (True, False, None):
        raise _err("'stream' must be a boolean.", "stream", "invalid_type")
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}  # response.completed carries usage
    return body


# -- answer -------------------------------------------------------------------------------------


def usage_of(usage: Any) -> dict[str, Any] | None:
    if not isinstance(usage, dict):
        return None
    pd = usage.get("prompt_tokens_details")
    cd = usage.get("completion_tokens_details")
    cached = pd.get("cached_tokens") if isinstance(pd, dict) else 0
    reasoning = cd.get("reasoning_tokens") if isinstance(cd, dict) else 0
    inp = int(usage.get("prompt_tokens") or 0)
    out = int(usage.get("completion_tokens") or 0)
    return {
        "input_tokens": inp,
        "input_tokens_details": {"cached_tokens": int(cached or 0), "cache_write_tokens": 0},
        "output_tokens": out,
        "output_tokens_details": {"reasoning_tokens": int(reasoning or 0)},
        "total_tokens": int(usage.get("total_tokens") or inp + out),
    }


def message_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
    return {
        "id": item_id,
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": content,
    }


def mark_incomplete(output: list[dict[str, Any]]) -> list[int]:
    """An answer cut short (max_output_tokens, a content filter): its messages are incomplete
    too, as OpenAI marks them. Returns the indexes changed."""
    changed = []
    for i, item in enumerate(output):
        if item.get("type") == "message" and item.get("status") == "completed":
            item["status"] = "incomplete"
            changed.append(i)
    return changed


def refusal_item(item_id: str, refusal: str) -> dict[str, Any]:
    """A message whose content is the model's refusal (chat's `message.refusal`)."""
    return {
        "id": item_id,
        "type": "message",
        "status": "completed",
        "role": "assistant",
        "content": [{"type": "refusal", "refusal": refusal}],
    }


def call_item(item_id: str, call_id: str, name: str, args: str, status: str) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "function_call",
        "status": status,
        "call_id": call_id,
        "name": name,
        "arguments": args,
    }


class ResponseShape:
    """The request-derived fields of a Response object (echoed as OpenAI echoes them)."""

    def __init__(self, req: dict[str, Any], response_id: str, model: str) -> None:
        self.id = response_id
        self.model = model
        self.created_at = int(time.time())
        self.store = req.get("store") is not False
        text = req.get("text") if isinstance(req.get("text"), dict) else None
        given = req.get("tools")
        tools = [
            {"strict": None, "parameters": None, **t}
            for t in (given if isinstance(given, list) else [])
            if isinstance(t, dict)
        ]
        self.echo: dict[str, Any] = {
            "instructions": req.get("instructions"),
            "max_output_tokens": req.get("max_output_tokens"),
            "metadata": req.get("metadata") if isinstance(req.get("metadata"), dict) else {},
            "parallel_tool_calls": req.get("parallel_tool_calls") is not False,
            "previous_response_id": req.get("previous_response_id"),
            "reasoning": None,
            "store": self.store,
            "temperature": req.get("temperature", 1.0),
            "text": text or {"format": {"type": "text"}},
            "tool_choice": req.get("tool_choice") or "auto",
            "tools": tools,
            "top_p": req.get("top_p", 1.0),
            "truncation": "disabled",
        }
        for name in ("user", "safety_identifier"):
            if isinstance(req.get(name), str):
                self.echo[name] = req[name]

    @staticmethod
    def ending(status: str, finish: str | None) -> tuple[str, dict[str, str] | None]:
        """The response's status and incomplete_details for the answer's finish reason."""
        if finish == "length":
            return "incomplete", {"reason": "max_output_tokens"}
        if finish == "content_filter":
            return "incomplete", {"reason": "content_filter"}
        return status, None

    def learn(self, in_progress: bytes) -> None:
        """Keep the pieces of this response's JSON that do not change (from the in-progress
        response as encoded: `output` is empty): what is before `status`, the model, and the
        echoed request fields after `output`. No string holds `,"` unescaped, so the first
        `,"model":` and `,"output":[]` are the keys."""
        at = in_progress.index(_OUTPUT_EMPTY)
        self._head = in_progress[: in_progress.index(b'"status":')]
        self._model = in_progress[in_progress.index(b',"model":') : at]
        self._echo = in_progress[at + len(_OUTPUT_EMPTY) : -1]

    def encoded(
        self,
        status: str,
        incomplete: dict[str, str] | None,
        items: bytes,
        usage: dict[str, Any] | None,
    ) -> bytes:
        """`orjson.dumps(self.response(...))` for a finished response whose output items are
        `items` (their JSON, comma-separated), written from the pieces `learn` kept."""
        usage_json = b',"usage":%b' % orjson.dumps(usage) if usage is not None else b""
        return (
            b'%b"status":"%b","error":null,"incomplete_details":%b%b,"output":[%b]%b%b,"completed_at":%d}'
            % (
                self._head,
                status.encode(),
                orjson.dumps(incomplete),
                self._model,
                items,
                self._echo,
                usage_json,
                int(time.time()),
            )
        )

    def response(
        self,
        status: str,
        output: list[dict[str, Any]],
        usage: dict[str, Any] | None = None,
        finish: str | None = None,
    ) -> dict[str, Any]:
        status, incomplete = self.ending(status, finish)
        if status == "incomplete":
            mark_incomplete(output)
        doc: dict[str, Any] = {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": None,
            "incomplete_details": incomplete,
            "model": self.model,
            "output": output,
            **self.echo,
        }
        if usage is not None:
            doc["usage"] = usage
        if status in ("completed", "incomplete"):
            doc["completed_at"] = int(time.time())
        return doc


def output_of(completion: dict[str, Any]) -> tuple[list[dict[str, Any]], str | None]:
    choices = completion.get("choices") or [{}]
    choice = choices[0] if isinstance(choices[0], dict) else {}
    msg = choice.get("message") or {}
    items: list[dict[str, Any]] = []
    text = msg.get("content") if isinstance(msg.get("content"), str) else None
    if text:
        items.append(message_item(_hex_id("msg_"), text))
    elif isinstance(msg.get("refusal"), str) and msg["refusal"]:
        items.append(refusal_item(_hex_id("msg_"), msg["refusal"]))
    for tc in msg.get("tool_calls") or []:
        fn = tc.get("function") or {}
        items.append(
            call_item(
                _hex_id("fc_"),
                tc.get("id") or _hex_id("call_"),
                fn.get("name") or "",
                fn.get("arguments") or "",
                "completed",
            )
        )
    if not items:
        items.append(message_item(_hex_id("msg_"), ""))
    return items, choice.get("finish_reason")


def assistant_turn(output: list[dict[str, Any]]) -> dict[str, Any]:
    """The answer as a chat assistant message (what a continuation sends back)."""
    text = "".join(
        c.get("text") or c.get("refusal") or ""
        for it in output
        if it["type"] == "message"
        for c in it["content"]
    )
    calls = [
        {
            "id": it["call_id"],
            "type": "function",
            "function": {"name": it["name"], "arguments": it["arguments"]},
        }
        for it in output
        if it["type"] == "function_call"
    ]
    msg: dict[str, Any] = {"role": "assistant", "content": text or (None if calls else "")}
    if calls:
        msg["tool_calls"] = calls
    return msg


def _event(n: int, kind: str, data: dict[str, Any]) -> bytes:
    """`{"type": kind, "sequence_number": n, **data}` as an event (`data` is never empty and
    holds neither key), written without building that dict."""
    k = kind.encode()
    return b'event: %b\ndata: {"type":"%b","sequence_number":%d,%b\n\n' % (
        k,
        k,
        n,
        orjson.dumps(data)[1:],
    )


_DELTA_EVENT = (
    b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta",'
    b'"sequence_number":%d'
)
_DELTA_END = b'"%b","logprobs":[]}\n\n'
_OUTPUT_EMPTY = b',"output":[]'


class ResponseEvents:
    """chat.completion.chunk payloads in, the Responses API's typed events out (choice 0)."""

    def __init__(self, exchange: ResponsesExchange, ctx: Context) -> None:
        self.x, self.ctx = exchange, ctx
        self.seq = 0  # the next event's sequence_number
        self.started = False
        self.ended = False
        self.output: list[dict[str, Any]] = []
        self.open: dict[str, Any] | None = None  # the item being streamed
        self.tools: dict[int, dict[str, Any]] = {}  # chat tool_call index -> item
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None
        # The open message's text delta event as a format (sequence number, text as JSON
        # without quotes), and its text so far as JSON (joined into the item when it closes).
        self._delta: bytes | None = None
        self._texts: list[bytes] = []
        self._refusals: list[str] = []  # a refusal's pieces, sent whole when the answer ends
        # Each output item as JSON once it is done (the completed response is written from them).
        self._done: dict[int, bytes] = {}

    def _ev(self, kind: str, **data: Any) -> bytes:
        n = self.seq
        self.seq = n + 1
        return _event(n, kind, data)

    def _start(self) -> list[bytes]:
        if self.started:
            return []
        self.started = True
        doc = orjson.dumps(self.x.shape.response("in_progress", []))  # encoded once, sent twice
        self.x.shape.learn(doc)
        seq = self.seq
        self.seq = seq + 2
        return [
            b'event: response.created\ndata: {"type":"response.created","sequence_number":%d,'
            b'"response":%s}\n\n' % (seq, doc),
            b'event: response.in_progress\ndata: {"type":"response.in_progress",'
            b'"sequence_number":%d,"response":%s}\n\n' % (seq + 1, doc),
        ]

    def _add(self, item: dict[str, Any]) -> list[bytes]:
        out = self._close()
        self.open = item
        self.output.append(item)
        index = len(self.output) - 1
        out.append(self._ev("response.output_item.added", output_index=index, item=dict(item)))
        return out

    def _open_message(self) -> list[bytes]:
        """A new message item: its output_item.added and content_part.added events (from
        templates: the id is hex, the rest constant)."""
        out = self._close()
        item_id = _hex_id("msg_")
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        item = message_item(item_id, "", "in_progress")
        item["content"] = [part]
        self.open = item
        self.output.append(item)
        index = len(self.output) - 1
        seq = self.seq
        self.seq = seq + 2
        ident = item_id.encode()
        out.append(
            b'event: response.output_item.added\ndata: {"type":"response.output_item.added",'
            b'"sequence_number":%d,"output_index":%d,"item":{"id":"%b","type":"message",'
            b'"status":"in_progress","role":"assistant","content":[]}}\n\n' % (seq, index, ident)
        )
        out.append(
            b'event: response.content_part.added\ndata: {"type":"response.content_part.added",'
            b'"sequence_number":%d,"item_id":"%b","output_index":%d,"content_index":0,"part":'
            b'{"type":"output_text","text":"","annotations":[],"logprobs":[]}}\n\n'
            % (seq + 1, ident, index)
        )
        head = b',"item_id":"%b","output_index":%d,"content_index":0,"delta":' % (ident, index)
        self._delta = _DELTA_EVENT + head.replace(b"%", b"%%") + _DELTA_END
        return out

    def _close(self) -> list[bytes]:
        item, self.open = self.open, None
        if item is None:
            return []
        self._delta = None
        index = self.output.index(item)
        if item["type"] == "message":  # made by _open_message: encoded from templates
            item["status"] = "completed"
            part0 = item["content"][0]
            if part0["text"]:  # text flushed before (an error): encoded again
                self._flush_text(item)
                text = orjson.dumps(part0["text"])
            else:  # the deltas' JSON joined is the text's JSON
                text = b'"%b"' % b"".join(self._texts)
                self._texts = []
                part0["text"] = orjson.loads(text)
            part = b'{"type":"output_text","text":%b,"annotations":[],"logprobs":[]}' % text
            ident = item["id"].encode()
            seq = self.seq
            self.seq = seq + 3
            return [
                b'event: response.output_text.done\ndata: {"type":"response.output_text.done",'
                b'"sequence_number":%d,"item_id":"%b","output_index":%d,"content_index":0,'
                b'"text":%b,"logprobs":[]}\n\n' % (seq, ident, index, text),
                b'event: response.content_part.done\ndata: {"type":"response.content_part.done",'
                b'"sequence_number":%d,"item_id":"%b","output_index":%d,"content_index":0,'
                b'"part":%b}\n\n' % (seq + 1, ident, index, part),
                b'event: response.output_item.done\ndata: {"type":"response.output_item.done",'
                b'"sequence_number":%d,"output_index":%d,"item":{"id":"%b","type":"message",'
                b'"status":"completed","role":"assistant","content":[%b]}}\n\n'
                % (seq + 2, index, ident, part),
            ]
            self._done[index] = (
                b'{"id":"%b","type":"message","status":"completed","role":"assistant",'
                b'"content":[%b]}' % (ident, part)
            )
        out = [
            self._ev(
                "response.function_call_arguments.done",
                item_id=item["id"],
                output_index=index,
                name=item["name"],
                arguments=item["arguments"],
            )
        ]
        item["status"] = "completed"
        out.append(self._ev("response.output_item.done", output_index=index, item=item))
        return out

    def _flush_text(self, item: dict[str, Any]) -> None:
        """The open message's text so far into its item (before the item is sent)."""
        if self._texts:
            item["content"][0]["text"] += orjson.loads(b'"%b"' % b"".join(self._texts))
            self._texts = []

    def text(self, text: str) -> bytes | None:
        return self.text_json(orjson.dumps(text)[1:-1])

    def texts_json(self, raws: list[bytes]) -> bytes | None:
        fmt = self._delta
        if fmt is None:
            return None
        self._texts += raws
        seq = self.seq
        self.seq = seq + len(raws)
        return b"".join(map(fmt.__mod__, zip(range(seq, seq + len(raws)), raws, strict=True)))

    def _first_text(self, raw: bytes) -> bytes:
        """A common chunk's event when no message is open: what `chunk` sends for it."""
        out = self._start() if not self.started else []
        out += self._open_message()
        out.append(self.text_json(raw) or b"")
        return b"".join(out)

    def text_json(self, raw: bytes) -> bytes | None:
        # The most frequent event, written from the open message's format.
        fmt = self._delta
        if fmt is None:
            return self._first_text(raw)
        self._texts.append(raw)
        seq = self.seq
        self.seq = seq + 1
        return fmt % (seq, raw)

    def chunk(self, chunk: dict[str, Any]) -> list[bytes]:
        out = self._start() if not self.started else []
        if chunk.get("usage"):
            self.usage = usage_of(chunk["usage"])
        for c in chunk.get("choices") or []:
            if not isinstance(c, dict) or c.get("index", 0) != 0:
                continue
            delta = c.get("delta") or {}
            text = delta.get("content")
            if isinstance(text, str) and text:
                if self._delta is None:
                    out += self._open_message()
                event = self.text_json(orjson.dumps(text)[1:-1])
                assert event is not None
                out.append(event)
            refusal = delta.get("refusal")
            if isinstance(refusal, str) and refusal:
                self._refusals.append(refusal)
            for tc in delta.get("tool_calls") or []:
                out += self._tool(tc)
            if c.get("finish_reason"):
                out += self._refusal_events() + self._close()
                self.finish_reason = c["finish_reason"]
        return out

    def _refusal_events(self) -> list[bytes]:
        """The refusal gathered from the chunks, as one message item with a refusal part
        (sent whole when the answer finishes: a refusal is short and arrives at once)."""
        if not self._refusals:
            return []
        text, self._refusals = "".join(self._refusals), []
        out = self._close()
        item = refusal_item(_hex_id("msg_"), "")
        item["status"], item["content"] = "in_progress", []
        self.output.append(item)
        at = {"item_id": item["id"], "output_index": len(self.output) - 1, "content_index": 0}
        out.append(
            self._ev("response.output_item.added", output_index=at["output_index"], item=dict(item))
        )
        part = {"type": "refusal", "refusal": ""}
        out.append(self._ev("response.content_part.added", **at, part=part))
        out.append(self._ev("response.refusal.delta", **at, delta=text))
        out.append(self._ev("response.refusal.done", **at, refusal=text))
        part = {"type": "refusal", "refusal": text}
        out.append(self._ev("response.content_part.done", **at, part=part))
        item["status"], item["content"] = "completed", [part]
        out.append(
            self._ev("response.output_item.done", output_index=at["output_index"], item=item)
        )
        return out

    def _tool(self, tc: dict[str, Any]) -> list[bytes]:
        out: list[bytes] = []
        idx = tc.get("index", 0)
        fn = tc.get("function") or {}
        item = self.tools.get(idx)
        if item is None:
            call_id = tc.get("id") or _hex_id("call_")
            item = call_item(_hex_id("fc_"), call_id, fn.get("name") or "", "", "in_progress")
            self.tools[idx] = item
            out += self._add(item)
        args = fn.get("arguments")
        if isinstance(args, str) and args:
            item["arguments"] += args
            out.append(
                self._ev(
                    "response.function_call_arguments.delta",
                    item_id=item["id"],
                    output_index=self.output.index(item),
                    delta=args,
                )
            )
        return out

    def error(self, error: dict[str, Any]) -> list[bytes]:
        self.ended = True
        out = self._start()
        if self.open is not None:
            self._flush_text(self.open)
        message = error.get("message") if isinstance(error.get("message"), str) else "failed"
        code = error.get("code") if isinstance(error.get("code"), str) else "server_error"
        out.append(self._ev("error", code=code, message=message, param=None))
        doc = self.x.shape.response("failed", self.output, self.usage)
        doc["error"] = {"code": "server_error", "message": message}
        out.append(self._ev("response.failed", response=doc))
        return out

    async def finish(self) -> list[bytes]:
        if self.ended:
            return []
        self.ended = True
        out = self._start() + self._refusal_events() + self._close()
        if not self.output:
            # An empty answer is still one (empty) message, as for a unary answer.
            item = message_item(_hex_id("msg_"), "")
            self.output.append(item)
        shape = self.x.shape
        status, incomplete = shape.ending("completed", self.finish_reason)
        done = self._done
        if status == "incomplete":
            for i in mark_incomplete(self.output):
                if i in done:
                    done[i] = done[i].replace(b'"status":"completed"', b'"status":"incomplete"', 1)
        items = b",".join([done.get(i) or orjson.dumps(item) for i, item in enumerate(self.output)])
        doc = shape.encoded(status, incomplete, items, self.usage)
        # Stored before the client hears "completed": it may chain from it at once.
        await self.x.save_encoded(shape.id, doc, self.output, self.ctx)
        kind = b"response.incomplete" if status == "incomplete" else b"response.completed"
        seq = self.seq
        self.seq = seq + 1
        out.append(
            b'event: %b\ndata: {"type":"%b","sequence_number":%d,"response":%b}\n\n'
            % (kind, kind, seq, doc)
        )
        return out


class ResponsesExchange:
    def __init__(self, store: ResponseStore, max_depth: int = DEFAULT_MAX_DEPTH) -> None:
        self.store = store
        self.max_depth = max_depth
        self.translated = False
        self.shape: ResponseShape
        self.history: list[dict[str, Any]] = []  # earlier turns and this turn's input

    def authorization(self, headers: Mapping[str, str]) -> str | None:
        return headers.get("authorization")

    async def request(self, raw: bytes, ctx: Context) -> bytes:
        req = parse(raw, self.max_depth)
        check_logprobs(req)  # before `include` is dropped with the other ignored fields
        check_ignored(req)
        for k in _IGNORED.intersection(req):
            del req[k]
        history: list[dict[str, Any]] = []
        prev = req.get("previous_response_id")
        if prev is not None:
            ok = isinstance(prev, str) and valid_response_id(prev)
            record = await self.store.get(ctx.tenant, prev) if ok else None
            # A record read back from Redis is data from across a border: one without a list
            # of messages (corrupted, written by something else) continues nothing.
            stored: Any = record.get("messages") if record is not None else None
            if not isinstance(stored, list) or not all(isinstance(m, dict) for m in stored):
                raise GatewayError(
                    400,
                    f"Previous response with id '{clip(prev)}' not found.",
                    param="previous_response_id",
                    code="previous_response_not_found",
                )
            history = list(stored)
        turn = turn_messages(req)
        check_call_outputs(history + turn)
        body = to_chat(req, history, turn)
        self.history = history + turn
        self.shape = ResponseShape(req, new_response_id(), body["model"])
        self.translated = True
        return orjson.dumps(body)

    async def save(self, doc: dict[str, Any], ctx: Context) -> None:
        if not self.shape.store:
            return
        messages = [*self.history, assistant_turn(doc["output"])]
        record = {"tenant": ctx.tenant, "response": doc, "messages": messages}
        await self.store.put(ctx.tenant, doc["id"], record)

    async def save_encoded(
        self, response_id: str, doc: bytes, output: list[dict[str, Any]], ctx: Context
    ) -> None:
        """`save` for a response already encoded (a stream's): stored as it was sent."""
        if not self.shape.store:
            return
        messages = [*self.history, assistant_turn(output)]
        record = {"tenant": ctx.tenant, "response": orjson.Fragment(doc), "messages": messages}
        await self.store.put(ctx.tenant, response_id, record)

    async def respond(self, response: Response, ctx: Context) -> Response:
        status = response.status_code
        if status >= 400:
            return response  # the gateway's errors already have the OpenAI shape
        if not self.translated or status != 200:
            return response
        if is_stream(response):
            return await translate_stream(response, ResponseEvents(self, ctx))
        try:
            completion = orjson.loads(bytes(response.body))
        except orjson.JSONDecodeError:
            completion = None
        if not isinstance(completion, dict):
            err = GatewayError(
                502, "The provider's answer could not be translated.", type="upstream_error"
            )
            return rebuild(response, err.to_bytes(), 502)
        output, finish = output_of(completion)
        doc = self.shape.response("completed", output, usage_of(completion.get("usage")), finish)
        await self.save(doc, ctx)
        return rebuild(response, orjson.dumps(doc))


class ResponsesAPI:
    name = NAME

    def __init__(self, store: ResponseStore, max_depth: Callable[[], int] | None = None) -> None:
        self.store = store
        # The policy's `server.max_json_depth`, read per request (it changes on reload).
        self.max_depth = max_depth or (lambda: DEFAULT_MAX_DEPTH)

    def begin(self) -> ResponsesExchange:
        return ResponsesExchange(self.store, self.max_depth())


def not_found(response_id: str) -> GatewayError:
    return GatewayError(
        404,
        f"No response found with id '{clip(response_id)}'.",
        param="response_id",
        code="response_not_found",
    )


async def retrieve(store: ResponseStore, tenant: str, response_id: str) -> dict[str, Any]:
    record = await store.get(tenant, response_id) if valid_response_id(response_id) else None
    doc = record.get("response") if record is not None else None
    if not isinstance(doc, dict) or doc.get("id") != response_id:
        raise not_found(response_id)  # none, or not the response of this id (a bad record)
    return doc


async def delete(store: ResponseStore, tenant: str, response_id: str) -> dict[str, Any]:
    if not await store.delete(tenant, response_id):
        raise not_found(response_id)
    return {"id": response_id, "object": "response", "deleted": True}
