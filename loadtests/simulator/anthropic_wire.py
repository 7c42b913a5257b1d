"""An instance that speaks Anthropic's Messages API (`POST /v1/messages`), for adapter tests.

Every request is checked against the provider's published shape before it is answered: the
headers (`x-api-key`, `anthropic-version`) and the JSON body, validated with pydantic over the
official SDK's `anthropic.types.MessageCreateParams` with unknown fields forbidden at every level
(the SDK's TypedDicts ignore extra keys by default, so the simulator forbids them where the SDK
did not configure otherwise), plus the rules the type cannot state (non-empty text blocks,
tool_result ids answering the previous turn's tool_use, at most four cache breakpoints). A wrong
field is a 400 in Anthropic's error shape, so an adapter that sends one fails its test.

Answers: deterministic words like the OpenAI instance; a tool_use block when tool_choice forces
one, or when tools are offered and the last turn is not a tool result; JSON matching
`output_config.format`'s schema; usage with a simulated prompt cache (a prefix marked with
cache_control is written on first sight and read afterwards). Faults (errors, 429, hang, cut
streams) come from the instance's fault injector, in Anthropic's error shapes (529 overloaded).
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import typing
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

import orjson

from .faults import Verdict
from .http import Connection, Request
from .text import count_tokens, join_words, natural_length, text_seed, word_ids

if TYPE_CHECKING:
    from .server import Instance

PATH = b"/v1/messages"
_VERSION = re.compile(rb"^\d{4}-\d{2}-\d{2}$")
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}
_validator: Any = None


class WireError(Exception):
    def __init__(self, status: int, message: str, headers: bytes = b"") -> None:
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers


def error_body(status: int, message: str) -> bytes:
    kind = _ERROR_TYPES.get(status, "api_error")
    return orjson.dumps({"type": "error", "error": {"type": kind, "message": message}})


def _strict_validator() -> Any:
    """A TypeAdapter over the SDK's MessageCreateParams that refuses unknown fields."""
    global _validator
    if _validator is None:
        from anthropic.types import MessageCreateParams
        from pydantic import ConfigDict, TypeAdapter
        from typing_extensions import is_typeddict

        seen: set[Any] = set()

        def walk(tp: Any) -> None:
            if typing.get_origin(tp) is not None:
                for arg in typing.get_args(tp):
                    walk(arg)
            elif is_typeddict(tp) and tp not in seen:
                seen.add(tp)
                for hint in typing.get_type_hints(tp, include_extras=True).values():
                    walk(hint)

        walk(MessageCreateParams)
        for td in seen:
            if "__pydantic_config__" not in td.__dict__:  # keep the SDK's own choices
                td.__pydantic_config__ = ConfigDict(extra="forbid", arbitrary_types_allowed=True)
        _validator = TypeAdapter(MessageCreateParams)
    return _validator


def _materialise(value: Any) -> Any:
    """Consume the lazily validated iterables (validating their items) and refuse extra fields
    that the SDK's response models (also accepted as input blocks) would otherwise keep."""
    from pydantic import BaseModel

    if isinstance(value, BaseModel):
        if value.model_extra:
            raise ValueError(
                f"unknown field(s) {sorted(value.model_extra)} in a {type(value).__name__}"
            )
        return {k: _materialise(getattr(value, k)) for k in type(value).model_fields}
    if isinstance(value, dict):
        return {k: _materialise(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) or type(value).__name__ == "ValidatorIterator":
        return [_materialise(v) for v in value]
    return value


def check_request(inst: Instance, req: Request) -> dict[str, Any]:
    """The request body when headers and body have the published shape; WireError otherwise."""
    key = inst.spec.api_key
    if key is not None and req.headers.get(b"x-api-key") != key.encode():
        raise WireError(401, "invalid x-api-key")
    version = req.headers.get(b"anthropic-version")
    if version is None or not _VERSION.match(version):
        raise WireError(400, "anthropic-version: header is required (YYYY-MM-DD)")
    if not req.headers.get(b"content-type", b"").startswith(b"application/json"):
        raise WireError(400, "content-type must be application/json")
    try:
        body = orjson.loads(req.body)
    except orjson.JSONDecodeError:
        raise WireError(400, "the body is not valid JSON") from None
    if not isinstance(body, dict):
        raise WireError(400, "the body must be a JSON object")
    try:
        _materialise(_strict_validator().validate_python(body))
    except Exception as e:  # pydantic's ValidationError or an unknown field
        first = str(e).splitlines()[:6]
        raise WireError(400, "invalid request: " + " | ".join(first)) from None
    _check_rules(body)
    return body


def _check_rules(body: dict[str, Any]) -> None:
    """What the API enforces beyond the types."""
    messages = body["messages"]
    if not messages:
        raise WireError(400, "messages: at least one message is required")
    breakpoints = sum("cache_control" in t for t in body.get("tools") or [])
    system = body.get("system")
    if isinstance(system, list):
        breakpoints += sum("cache_control" in b for b in system)
    previous_tools: set[str] = set()
    for i, m in enumerate(messages):
        content = m["content"]
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if not blocks:
            raise WireError(400, f"messages.{i}: content must not be empty")
        uses: set[str] = set()
        for j, b in enumerate(blocks):
            breakpoints += "cache_control" in b
            if b["type"] == "text" and not b["text"]:
                raise WireError(
                    400, f"messages.{i}.content.{j}: text content blocks must be non-empty"
                )
            if b["type"] == "tool_use":
                uses.add(b["id"])
            if b["type"] == "tool_result" and b["tool_use_id"] not in previous_tools:
                raise WireError(
                    400,
                    f"messages.{i}.content.{j}: unexpected tool_use_id found in tool_result "
                    "blocks; each tool_result must answer a tool_use of the previous turn",
                )
        previous_tools = uses if m["role"] == "assistant" else set()
    last = messages[-1]
    if last["role"] == "assistant":
        content = last["content"]
        tail = content if isinstance(content, str) else (content[-1].get("text") or "x")
        if tail != tail.rstrip():
            raise WireError(400, "final assistant content cannot end with trailing whitespace")
    if breakpoints > 4:
        raise WireError(400, "A maximum of 4 blocks with cache_control may be provided")


class AnthropicWire:
    """The Messages API of one simulated instance."""

    def __init__(self, inst: Instance) -> None:
        self.inst = inst
        self.ids = 0
        self.cache: OrderedDict[bytes, None] = OrderedDict()  # cached prefixes (LRU)
        self.last_request: dict[str, Any] | None = None  # for tests: what the adapter sent

    async def handle(self, req: Request, conn: Connection) -> None:
        inst = self.inst
        if req.path != PATH or req.method != b"POST":
            conn.send(404, error_body(404, f"{req.path.decode()}: not found"))
            return
        inst.stats.count_request("messages")
        inst.stats.in_flight += 1
        try:
            body = check_request(inst, req)
            self.last_request = body
            await self._faults()
            await self._answer(body, conn)
        except WireError as e:
            inst.stats.count_status(e.status)
            conn.send(e.status, error_body(e.status, e.message), headers=e.headers)
        finally:
            inst.stats.in_flight -= 1

    async def _faults(self) -> None:
        faults = self.inst.faults
        verdict, status = faults.decide()
        if verdict is Verdict.HANG:
            await asyncio.Event().wait()
        if verdict is Verdict.RATE_LIMIT:
            retry = b"retry-after: %d\r\n" % faults.faults.retry_after_s
            raise WireError(429, "Number of request tokens has exceeded your rate limit.", retry)
        if verdict is Verdict.ERROR:
            raise WireError(status, "Overloaded" if status == 529 else "Internal server error")

    def _usage(self, body: dict[str, Any]) -> dict[str, int]:
        """Prompt tokens split into uncached, cache-written and cache-read parts."""
        parts: list[tuple[str, bool]] = []  # (text, marked) in cache order: tools, system, turns
        for t in body.get("tools") or []:
            parts.append((orjson.dumps(t).decode(), "cache_control" in t))
        system = body.get("system") or []
        if isinstance(system, str):
            system = [{"type": "text", "text": system}]
        for b in system:
            parts.append((b["text"], "cache_control" in b))
        for m in body["messages"]:
            content = m["content"]
            blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
            for b in blocks:
                parts.append((f"<|{m['role']}|>" + orjson.dumps(b).decode(), "cache_control" in b))
        total = sum(count_tokens(t) for t, _ in parts)
        marked = [i for i, (_, c) in enumerate(parts) if c]
        usage = {
            "input_tokens": total,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        }
        if marked:
            prefix = parts[: marked[-1] + 1]
            n = sum(count_tokens(t) for t, _ in prefix)
            key = hashlib.blake2b(
                (body["model"] + "".join(t for t, _ in prefix)).encode(), digest_size=16
            ).digest()
            hit = key in self.cache
            self.cache[key] = None
            self.cache.move_to_end(key)
            while len(self.cache) > 1024:
                self.cache.popitem(last=False)
            usage["input_tokens"] = total - n
            usage["cache_read_input_tokens" if hit else "cache_creation_input_tokens"] = n
        return usage

    def _content(
        self, body: dict[str, Any], usage: dict[str, int]
    ) -> tuple[list[dict[str, Any]], str]:
        """The answer's content blocks and stop reason."""
        prompt = orjson.dumps(body["messages"]).decode()
        seed = text_seed(prompt)
        tool = _chosen_tool(body)
        if tool is not None:
            self.ids += 1
            block = {
                "type": "tool_use",
                "id": f"toolu_sim{self.ids:06d}",
                "name": tool["name"],
                "input": schema_value(tool.get("input_schema") or {}),
            }
            return [block], "tool_use"
        fmt = (body.get("output_config") or {}).get("format")
        if fmt:
            return [
                {"type": "text", "text": orjson.dumps(schema_value(fmt["schema"])).decode()}
            ], "end_turn"
        p = self.inst.profile
        natural = natural_length(seed, p.output_mean, p.output_sigma, p.max_output)
        n = min(natural, body["max_tokens"])
        text = join_words(word_ids(seed, 0, n), True)
        return [{"type": "text", "text": text}], "max_tokens" if n < natural else "end_turn"

    async def _answer(self, body: dict[str, Any], conn: Connection) -> None:
        inst, p = self.inst, self.inst.profile
        usage = self._usage(body)
        prompt_tokens = sum(usage.values())
        if prompt_tokens > p.context_window:
            raise WireError(
                400, f"prompt is too long: {prompt_tokens} tokens > {p.context_window} maximum"
            )
        blocks, stop = self._content(body, usage)
        # One word per token, as the OpenAI instance counts (so output_tokens <= max_tokens).
        out_tokens = sum(
            len(b["text"].split())
            if b["type"] == "text"
            else count_tokens(orjson.dumps(b).decode())
            for b in blocks
        )
        self.ids += 1
        msg = {
            "id": f"msg_sim{self.ids:06d}",
            "type": "message",
            "role": "assistant",
            "model": body["model"],
            "content": blocks,
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": {**usage, "output_tokens": out_tokens},
        }
        f = inst.faults.faults
        await asyncio.sleep((p.ttft_base_ms * f.ttft_multiplier + f.slow_first_token_ms) / 1000)
        inst.stats.prompt_tokens += prompt_tokens
        inst.stats.completion_tokens += out_tokens
        inst.stats.count_status(200)
        if body.get("stream"):
            await self._stream(msg, conn)
        else:
            from anthropic.types import Message

            Message.model_validate(msg)  # the simulator's own answer has the published shape
            conn.send(200, orjson.dumps(msg))

    async def _stream(self, msg: dict[str, Any], conn: Connection) -> None:
        f = self.inst.faults.faults
        gap = f.slow_decode / self.inst.profile.decode_tps_alone
        conn.start_stream()
        start = {
            **msg,
            "content": [],
            "stop_reason": None,
            "usage": {**msg["usage"], "output_tokens": 1},
        }
        conn.write_chunk(_event("message_start", {"type": "message_start", "message": start}))
        conn.write_chunk(_event("ping", {"type": "ping"}))
        sent = 0
        for i, block in enumerate(msg["content"]):
            if block["type"] == "text":
                first = {"type": "text", "text": ""}
                pieces = [{"type": "text_delta", "text": w} for w in _split(block["text"])]
            else:
                first = {**block, "input": {}}
                args = orjson.dumps(block["input"]).decode()
                pieces = [
                    {"type": "input_json_delta", "partial_json": args[k : k + 8]}
                    for k in range(0, len(args), 8)
                ]
            conn.write_chunk(
                _event(
                    "content_block_start",
                    {"type": "content_block_start", "index": i, "content_block": first},
                )
            )
            for d in pieces:
                if f.cut_stream_after_chunks is not None and sent >= f.cut_stream_after_chunks:
                    self.inst.faults.count("cut_stream")
                    conn.close()
                    return
                conn.write_chunk(
                    _event(
                        "content_block_delta",
                        {"type": "content_block_delta", "index": i, "delta": d},
                    )
                )
                sent += 1
                await asyncio.sleep(gap)
            conn.write_chunk(
                _event("content_block_stop", {"type": "content_block_stop", "index": i})
            )
        delta = {"stop_reason": msg["stop_reason"], "stop_sequence": None}
        usage = {"output_tokens": msg["usage"]["output_tokens"]}
        conn.write_chunk(
            _event("message_delta", {"type": "message_delta", "delta": delta, "usage": usage})
        )
        conn.write_chunk(_event("message_stop", {"type": "message_stop"}))
        conn.end_stream()


def _event(name: str, data: dict[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def _split(text: str) -> list[str]:
    words = text.split(" ")
    return [w if i == 0 else " " + w for i, w in enumerate(words)] if text else []


def _chosen_tool(body: dict[str, Any]) -> dict[str, Any] | None:
    tools = body.get("tools") or []
    if not tools:
        return None
    choice = body.get("tool_choice") or {"type": "auto"}
    if choice["type"] == "none":
        return None
    if choice["type"] == "tool":
        named = [t for t in tools if t.get("name") == choice["name"]]
        if not named:
            raise WireError(400, f"tool_choice names an unknown tool '{choice['name']}'")
        return named[0]
    if choice["type"] == "any":
        return tools[0]
    last = body["messages"][-1]
    content = last["content"]
    answered = isinstance(content, list) and any(b["type"] == "tool_result" for b in content)
    return None if answered else tools[0]


def schema_value(schema: dict[str, Any]) -> Any:
    """A small value that validates against a JSON schema (the common keywords)."""
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    for key in ("anyOf", "oneOf", "allOf"):
        if schema.get(key):
            return schema_value(schema[key][0])
    kind = schema.get("type", "object")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object":
        props = schema.get("properties") or {}
        return {k: schema_value(v) for k, v in props.items()}
    if kind == "array":
        return [schema_value(schema.get("items") or {})] * max(1, schema.get("minItems", 1))
    if kind == "string":
        return "sim"
    if kind == "integer":
        return int(schema.get("minimum", 1))
    if kind == "number":
        return float(schema.get("minimum", 1.5))
    if kind == "boolean":
        return True
    return None
