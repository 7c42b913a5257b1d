"""A Bedrock-shaped simulator: the Converse and ConverseStream API of bedrock-runtime.

    with run_bedrock(credentials=BedrockCredentials("AKIDEXAMPLE", "secret")) as sim:
        sim.url            # http://127.0.0.1:PORT, the provider's base_url
        sim.set_fault(503, "ServiceUnavailableException")

It checks what it receives the way Bedrock does, so an adapter that gets the protocol wrong
fails its tests:

- the SigV4 signature is recomputed with botocore's signer from the same credentials (403
  `UnrecognizedClientException` for an unknown key id or session token, 403
  `InvalidSignatureException` on a mismatch, a wrong region or service, or a stale date);
- the body is validated against botocore's own service model for the operation (unknown or
  missing fields, wrong types, enums, base64 blobs) plus the conversation rules Converse
  enforces (starts with a user turn, roles alternate, tool blocks need a toolConfig, a
  toolResult answers an earlier toolUse): 400 `ValidationException`;
- a prompt over `context_window` tokens: 400 `ValidationException` "Input is too long ...";
  an unknown model id: 400 `ValidationException` "The provided model identifier is invalid.".

Answers are deterministic text from the simulator's vocabulary; a forced tool choice (`any` or
`tool`) answers with a toolUse whose input fits the tool's schema, `auto` with one toolUse per
tool the last user turn names (parallel calls); `outputConfig.textFormat`
answers with JSON valid against the schema. A system prompt ending in a `cachePoint` is
remembered: the next request with the same prefix reports it as `cacheReadInputTokens`.
ConverseStream answers use the binary AWS event stream framing (prelude, headers, payload and
both CRC32s), as Bedrock sends it, `p` padding included.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import contextlib
import hmac
import re
import struct
import threading
import time
import uuid
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson
from aiohttp import web

from .text import count_tokens, join_words, text_seed, word_ids

SERVICE = "bedrock"
OPERATIONS = {"converse": "Converse", "converse-stream": "ConverseStream"}
_AUTH = re.compile(
    r"^AWS4-HMAC-SHA256 Credential=(?P<cred>[^,\s]+),\s*SignedHeaders=(?P<signed>[^,\s]+),"
    r"\s*Signature=(?P<sig>[0-9a-f]{64})$"
)
_MAX_SKEW_S = 300  # Bedrock refuses a signature dated more than 5 minutes away


@dataclass(frozen=True, slots=True)
class BedrockCredentials:
    access_key_id: str
    secret_access_key: str
    session_token: str | None = None
    region: str = "us-east-1"


@dataclass
class BedrockStats:
    requests: int = 0
    by_status: dict[str, int] = field(default_factory=dict)
    last_body: dict[str, Any] | None = None  # the last valid request body (for tests)
    last_headers: dict[str, str] = field(default_factory=dict)

    def count(self, status: int) -> None:
        self.by_status[str(status)] = self.by_status.get(str(status), 0) + 1


class ApiError(Exception):
    def __init__(self, status: int, name: str, message: str) -> None:
        super().__init__(message)
        self.status, self.name, self.message = status, name, message


# ------------------------------------------------------------------ event stream framing


def _header(name: str, value: str) -> bytes:
    n, v = name.encode(), value.encode()
    return struct.pack(">B", len(n)) + n + b"\x07" + struct.pack(">H", len(v)) + v  # 7: string


def encode_message(headers: dict[str, str], payload: bytes) -> bytes:
    """One AWS event stream message: prelude + its CRC32, headers, payload, message CRC32."""
    head = b"".join(_header(k, v) for k, v in headers.items())
    total = 12 + len(head) + len(payload) + 4
    prelude = struct.pack(">II", total, len(head))
    prelude += struct.pack(">I", zlib.crc32(prelude) & 0xFFFFFFFF)
    body = prelude + head + payload
    return body + struct.pack(">I", zlib.crc32(body) & 0xFFFFFFFF)


def event_message(event_type: str, payload: dict[str, Any]) -> bytes:
    # Bedrock pads events with a "p" field of varying length (so sizes leak no content).
    padded = {**payload, "p": "abcdefghijklmnopqrstuvwxyz"[: 1 + len(event_type) % 26]}
    return encode_message(
        {
            ":event-type": event_type,
            ":content-type": "application/json",
            ":message-type": "event",
        },
        orjson.dumps(padded),
    )


def exception_message(name: str, message: str) -> bytes:
    return encode_message(
        {
            ":exception-type": name,
            ":content-type": "application/json",
            ":message-type": "exception",
        },
        orjson.dumps({"message": message}),
    )


# ------------------------------------------------------------------ request checks


class _Model:
    """botocore's service model of bedrock-runtime, loaded once (it is a large JSON file)."""

    _lock = threading.Lock()
    _model: Any = None

    @classmethod
    def get(cls) -> Any:
        with cls._lock:
            if cls._model is None:
                import botocore.session

                cls._model = botocore.session.get_session().get_service_model("bedrock-runtime")
            return cls._model


def _to_params(value: Any, shape: Any, path: str, errors: list[str]) -> Any:
    """JSON wire value -> botocore parameters (member names), checking what ParamValidator
    does not: enum values and base64 blobs."""
    kind = shape.type_name
    if kind == "structure" and isinstance(value, dict):
        by_wire = {m.serialization.get("name", n): n for n, m in shape.members.items()}
        out = {}
        for key, item in value.items():
            name = by_wire.get(key)
            if name is None:
                out[key] = item  # ParamValidator reports it as an unknown parameter
            else:
                out[name] = _to_params(item, shape.members[name], f"{path}.{key}", errors)
        return out
    if kind == "list" and isinstance(value, list):
        return [_to_params(v, shape.member, f"{path}[{i}]", errors) for i, v in enumerate(value)]
    if kind == "map" and isinstance(value, dict):
        return {k: _to_params(v, shape.value, f"{path}.{k}", errors) for k, v in value.items()}
    if kind == "string" and isinstance(value, str) and shape.enum and value not in shape.enum:
        errors.append(f"{path}: '{value}' is not one of {', '.join(shape.enum)}")
    if kind == "blob" and isinstance(value, str):
        try:
            base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            errors.append(f"{path}: not valid base64")
    if kind == "float" and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def validate_body(operation: str, model_id: str, body: Any) -> None:
    """Raise ApiError(400 ValidationException) unless `body` is a valid request of `operation`."""
    from botocore.validate import ParamValidator

    if not isinstance(body, dict):
        raise ApiError(400, "ValidationException", "Malformed input request: not a JSON object")
    shape = _Model.get().operation_model(operation).input_shape
    errors: list[str] = []
    params = _to_params(body, shape, "", errors)
    if "modelId" in body:
        errors.append("modelId belongs in the URL path, not the body")
    params["modelId"] = model_id
    report = ParamValidator().validate(params, shape)
    if report.has_errors():
        errors.append(report.generate_report())
    if errors:
        raise ApiError(400, "ValidationException", "; ".join(errors))
    _check_conversation(body)


def _check_conversation(body: dict[str, Any]) -> None:
    """The rules the service model cannot say, as Bedrock words them."""
    messages = body["messages"]
    if not messages or messages[0]["role"] != "user":
        raise ApiError(400, "ValidationException", "A conversation must start with a user message.")
    seen_tool_ids: set[str] = set()
    has_tool_blocks = False
    for i, msg in enumerate(messages):
        if i and messages[i - 1]["role"] == msg["role"]:
            raise ApiError(
                400,
                "ValidationException",
                "A conversation must alternate between user and assistant roles.",
            )
        if not msg["content"]:
            raise ApiError(400, "ValidationException", f"messages.{i}.content is empty")
        for block in msg["content"]:
            if len(block) != 1:
                raise ApiError(400, "ValidationException", "A content block has one member.")
            if "text" in block and not block["text"].strip():
                raise ApiError(
                    400,
                    "ValidationException",
                    "The text field in the ContentBlock object is blank.",
                )
            if "toolUse" in block:
                if msg["role"] != "assistant":
                    raise ApiError(400, "ValidationException", "toolUse outside an assistant turn")
                seen_tool_ids.add(block["toolUse"]["toolUseId"])
                has_tool_blocks = True
            if "toolResult" in block:
                if msg["role"] != "user":
                    raise ApiError(400, "ValidationException", "toolResult outside a user turn")
                if block["toolResult"]["toolUseId"] not in seen_tool_ids:
                    raise ApiError(
                        400,
                        "ValidationException",
                        "The toolUseId of a toolResult matches no earlier toolUse.",
                    )
                has_tool_blocks = True
            if "image" in block and msg["role"] != "user":
                raise ApiError(400, "ValidationException", "Images are allowed in user turns only.")
    if has_tool_blocks and "toolConfig" not in body:
        raise ApiError(
            400,
            "ValidationException",
            "The toolConfig field must be defined when using toolUse and toolResult content "
            "blocks.",
        )
    tool_config = body.get("toolConfig") or {}
    names = {t["toolSpec"]["name"] for t in tool_config.get("tools", []) if "toolSpec" in t}
    forced = (tool_config.get("toolChoice") or {}).get("tool")
    if forced and forced["name"] not in names:
        raise ApiError(400, "ValidationException", "toolChoice names a tool that is not defined.")
    fmt = ((body.get("outputConfig") or {}).get("textFormat") or {}).get("structure") or {}
    schema = (fmt.get("jsonSchema") or {}).get("schema")
    if schema is not None:
        try:
            orjson.loads(schema)
        except orjson.JSONDecodeError:
            raise ApiError(400, "ValidationException", "jsonSchema.schema is not JSON") from None


def verify_signature(
    creds: BedrockCredentials,
    method: str,
    host: str,
    raw_path: str,
    headers: dict[str, str],
    body: bytes,
    now: float | None = None,
) -> None:
    """Recompute the SigV4 signature with botocore; ApiError(403) unless it matches."""
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    lower = {k.lower(): v for k, v in headers.items()}
    m = _AUTH.match(lower.get("authorization", ""))
    if m is None:
        raise ApiError(403, "MissingAuthenticationTokenException", "Missing Authentication Token")
    key_id, _, scope = m.group("cred").partition("/")
    date, region, service, terminator = ([*scope.split("/"), "", "", "", ""])[:4]
    token = lower.get("x-amz-security-token")
    if key_id != creds.access_key_id or token != creds.session_token:
        raise ApiError(
            403,
            "UnrecognizedClientException",
            "The security token included in the request is invalid.",
        )
    signed = m.group("signed").split(";")
    amz_date = lower.get("x-amz-date", "")
    if (
        region != creds.region
        or service != SERVICE
        or terminator != "aws4_request"
        or not amz_date.startswith(date)
        or "host" not in signed
        or "x-amz-date" not in signed
        or (token is not None and "x-amz-security-token" not in signed)
        or any(h not in lower for h in signed)
    ):
        raise ApiError(403, "InvalidSignatureException", "The request signature is malformed.")
    try:
        when = datetime.strptime(amz_date, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC).timestamp()
    except ValueError:
        raise ApiError(403, "InvalidSignatureException", "X-Amz-Date is not valid.") from None
    if abs((time.time() if now is None else now) - when) > _MAX_SKEW_S:
        raise ApiError(403, "InvalidSignatureException", "Signature expired.")
    request = AWSRequest(
        method=method,
        url=f"http://{host}{raw_path}",
        headers={h: lower[h] for h in signed},
        data=body,
    )
    request.context["timestamp"] = amz_date
    signer = SigV4Auth(
        Credentials(creds.access_key_id, creds.secret_access_key, creds.session_token),
        SERVICE,
        creds.region,
    )
    canonical = signer.canonical_request(request)
    expected = signer.signature(signer.string_to_sign(request, canonical), request)
    if not hmac.compare_digest(expected, m.group("sig")):
        raise ApiError(
            403,
            "InvalidSignatureException",
            "The request signature we calculated does not match the signature you provided.",
        )


# ------------------------------------------------------------------ answers


def value_for(schema: Any, seed: int, depth: int = 0) -> Any:
    """A deterministic value valid against a (simple) JSON schema."""
    if not isinstance(schema, dict) or depth > 8:
        return None
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][seed % len(schema["enum"])]
    for key in ("anyOf", "oneOf"):
        if schema.get(key):
            return value_for(schema[key][0], seed, depth + 1)
    kind = schema.get("type", "object" if "properties" in schema else "string")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object":
        props = schema.get("properties") or {}
        return {
            name: value_for(sub, seed + i + 1, depth + 1)
            for i, (name, sub) in enumerate(props.items())
        }
    if kind == "array":
        count = max(int(schema.get("minItems", 1)), 1)
        return [value_for(schema.get("items") or {}, seed + i, depth + 1) for i in range(count)]
    if kind == "integer":
        return int(schema.get("minimum", 0)) + seed % 7
    if kind == "number":
        return float(schema.get("minimum", 0)) + (seed % 100) / 10
    if kind == "boolean":
        return seed % 2 == 0
    if kind == "null":
        return None
    return join_words(word_ids(seed, 0, 2), True)


def _prompt_text(body: dict[str, Any]) -> tuple[str, str]:
    """(cacheable system prefix, whole rendered prompt) standing for what a model reads."""
    system_parts: list[str] = []
    prefix = ""
    for block in body.get("system") or []:
        if "text" in block:
            system_parts.append(block["text"])
        elif "cachePoint" in block:
            prefix = "".join(system_parts)
    rendered = ["<|system|>" + "".join(system_parts) + "\n"] if system_parts else []
    for msg in body["messages"]:
        texts = []
        for block in msg["content"]:
            if "text" in block:
                texts.append(block["text"])
            elif "toolUse" in block:
                texts.append(orjson.dumps(block["toolUse"]).decode())
            elif "toolResult" in block:
                texts.append(orjson.dumps(block["toolResult"]).decode())
            elif "image" in block:
                texts.append("<image>")
        rendered.append(f"<|{msg['role']}|>{''.join(texts)}\n")
    return prefix, "".join(rendered)


def _user_text(blocks: list[dict[str, Any]]) -> str:
    return " ".join(b["text"] for b in blocks if isinstance(b.get("text"), str))


@dataclass(slots=True)
class Answer:
    blocks: list[dict[str, Any]]
    stop_reason: str
    usage: dict[str, int]


class BedrockSimulator:
    """The aiohttp application and its state (faults, stats, prompt cache)."""

    def __init__(
        self,
        credentials: BedrockCredentials,
        models: tuple[str, ...] | None = None,
        context_window: int = 8192,
        default_max_tokens: int = 16,
    ) -> None:
        self.credentials = credentials
        self.models = models  # None: any model id
        self.context_window = context_window
        self.default_max_tokens = default_max_tokens
        self.stats = BedrockStats()
        self.fault: tuple[int, str, str] | None = None  # status, exception, message
        self.stream_exception: tuple[int, str] | None = None  # after N events, exception name
        self.stream_cut_after: int | None = None  # close the connection after N events
        self.event_delay_s = 0.0  # pause between stream events (a model decoding)
        self._cached_prefixes: set[str] = set()
        self.app = web.Application(client_max_size=20 * 1024 * 1024)
        self.app.router.add_post("/model/{model_id}/{operation}", self._handle)

    def set_fault(self, status: int, name: str, message: str = "simulated fault") -> None:
        self.fault = (status, name, message)

    def clear_faults(self) -> None:
        self.fault = None
        self.stream_exception = None
        self.stream_cut_after = None
        self.event_delay_s = 0.0

    def _error(self, e: ApiError) -> web.Response:
        self.stats.count(e.status)
        return web.Response(
            status=e.status,
            body=orjson.dumps({"message": e.message}),
            headers={
                "content-type": "application/json",
                "x-amzn-RequestId": str(uuid.uuid4()),
                "x-amzn-ErrorType": f"{e.name}:http://internal.amazon.com/coral/com.amazon.bedrock/",
            },
        )

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.stats.requests += 1
        operation = OPERATIONS.get(request.match_info["operation"])
        model_id = request.match_info["model_id"]
        body = await request.read()
        try:
            if operation is None:
                raise ApiError(404, "UnknownOperationException", "Unknown operation")
            verify_signature(
                self.credentials,
                request.method,
                request.headers.get("host", ""),
                request.raw_path,
                dict(request.headers),
                body,
            )
            if self.fault is not None:
                raise ApiError(*self.fault)
            if request.headers.get("content-type", "").split(";")[0] != "application/json":
                raise ApiError(400, "ValidationException", "Content-Type must be application/json")
            try:
                doc = orjson.loads(body)
            except orjson.JSONDecodeError:
                raise ApiError(400, "ValidationException", "Malformed input request") from None
            validate_body(operation, model_id, doc)
            if self.models is not None and model_id not in self.models:
                raise ApiError(
                    400, "ValidationException", "The provided model identifier is invalid."
                )
            self.stats.last_body = doc
            self.stats.last_headers = dict(request.headers)
            answer = self._answer(doc)
        except ApiError as e:
            return self._error(e)
        self.stats.count(200)
        if operation == "Converse":
            return web.Response(
                body=orjson.dumps(
                    {
                        "output": {"message": {"role": "assistant", "content": answer.blocks}},
                        "stopReason": answer.stop_reason,
                        "usage": answer.usage,
                        "metrics": {"latencyMs": 3},
                    }
                ),
                headers={"content-type": "application/json", "x-amzn-RequestId": str(uuid.uuid4())},
            )
        return await self._stream(request, answer)

    def _answer(self, body: dict[str, Any]) -> Answer:
        prefix, prompt = _prompt_text(body)
        prompt_tokens = count_tokens(prompt)
        # A trailing assistant turn is continued (a stream resumed elsewhere): the answer to the
        # conversation without it is a fixed word sequence, emitted after the words present.
        tail = body["messages"][-1]
        already = 0
        if tail["role"] == "assistant" and all("text" in b for b in tail["content"]):
            already = len("".join(b["text"] for b in tail["content"]).split())
            prompt = _prompt_text({**body, "messages": body["messages"][:-1]})[1]
        if prompt_tokens > self.context_window:
            raise ApiError(400, "ValidationException", "Input is too long for requested model.")
        cached = 0
        if prefix:
            if prefix in self._cached_prefixes:
                cached = count_tokens(prefix)
            self._cached_prefixes.add(prefix)
        inference = body.get("inferenceConfig") or {}
        max_tokens = inference.get("maxTokens") or self.default_max_tokens
        seed = text_seed(prompt)
        tools = body.get("toolConfig") or {}
        choice = tools.get("toolChoice") or {}
        last = body["messages"][-1]["content"]
        answered_tool = any("toolResult" in b for b in last)
        specs = [t["toolSpec"] for t in tools.get("tools", []) if "toolSpec" in t]
        fmt = ((body.get("outputConfig") or {}).get("textFormat") or {}).get("structure")
        blocks: list[dict[str, Any]]
        named = [s for s in specs if s["name"].lower() in _user_text(last).lower()]
        if named and not choice.keys() - {"auto"} and not answered_tool:
            # Under `auto` the model calls every tool the turn names, in one answer (Converse
            # has no switch against parallel calls).
            blocks = [
                {
                    "toolUse": {
                        "toolUseId": f"tooluse_{seed % 10**12:012d}_{k}",
                        "name": s["name"],
                        "input": value_for(s["inputSchema"].get("json") or {}, seed + k),
                    }
                }
                for k, s in enumerate(named)
            ]
            stop, out_tokens = "tool_use", count_tokens(orjson.dumps(blocks).decode())
        elif specs and ("any" in choice or "tool" in choice) and not answered_tool:
            name = choice["tool"]["name"] if "tool" in choice else specs[0]["name"]
            spec = next(s for s in specs if s["name"] == name)
            args = value_for(spec["inputSchema"].get("json") or {}, seed)
            blocks = [
                {
                    "toolUse": {
                        "toolUseId": f"tooluse_{seed % 10**12:012d}",
                        "name": name,
                        "input": args,
                    }
                }
            ]
            stop, out_tokens = "tool_use", count_tokens(orjson.dumps(args).decode())
        elif fmt is not None:
            schema = orjson.loads(fmt["jsonSchema"]["schema"])
            text = orjson.dumps(value_for(schema, seed)).decode()
            blocks, stop, out_tokens = [{"text": text}], "end_turn", count_tokens(text)
        else:
            n = max(0, min(max_tokens, self.default_max_tokens - already))
            text = join_words(word_ids(seed, already, n), not already)
            stop = "max_tokens" if already + n < self.default_max_tokens else "end_turn"
            for s in inference.get("stopSequences") or []:
                cut = text.find(s)
                if cut >= 0:
                    text, stop = text[:cut], "stop_sequence"
            blocks, out_tokens = [{"text": text}], len(text.split())
        usage = {
            "inputTokens": prompt_tokens - cached,
            "outputTokens": out_tokens,
            "totalTokens": prompt_tokens + out_tokens,
        }
        if cached:
            usage["cacheReadInputTokens"] = cached
            usage["cacheWriteInputTokens"] = 0
        return Answer(blocks, stop, usage)

    def _events(self, answer: Answer) -> Iterator[bytes]:
        yield event_message("messageStart", {"role": "assistant"})
        for i, block in enumerate(answer.blocks):
            if "toolUse" in block:
                use = block["toolUse"]
                start = {"toolUse": {"toolUseId": use["toolUseId"], "name": use["name"]}}
                yield event_message("contentBlockStart", {"contentBlockIndex": i, "start": start})
                raw = orjson.dumps(use["input"]).decode()
                for j in range(0, len(raw), 12):
                    delta = {"toolUse": {"input": raw[j : j + 12]}}
                    yield event_message(
                        "contentBlockDelta", {"contentBlockIndex": i, "delta": delta}
                    )
            else:
                words = block["text"].split(" ")
                for j, w in enumerate(words):
                    piece = w if j == 0 else " " + w
                    yield event_message(
                        "contentBlockDelta", {"contentBlockIndex": i, "delta": {"text": piece}}
                    )
            yield event_message("contentBlockStop", {"contentBlockIndex": i})
        yield event_message("messageStop", {"stopReason": answer.stop_reason})
        yield event_message("metadata", {"usage": answer.usage, "metrics": {"latencyMs": 3}})

    async def _stream(self, request: web.Request, answer: Answer) -> web.StreamResponse:
        resp = web.StreamResponse(
            headers={
                "content-type": "application/vnd.amazon.eventstream",
                "x-amzn-RequestId": str(uuid.uuid4()),
            }
        )
        await resp.prepare(request)
        fail = self.stream_exception
        for i, message in enumerate(self._events(answer)):
            if self.stream_cut_after is not None and i >= self.stream_cut_after:
                if request.transport is not None:
                    request.transport.close()  # cut mid-stream, no end of the chunked body
                return resp
            if fail is not None and i >= fail[0]:
                await resp.write(exception_message(fail[1], "simulated stream exception"))
                break
            await resp.write(message)
            if self.event_delay_s:
                await asyncio.sleep(self.event_delay_s)
        await resp.write_eof()
        return resp


# ------------------------------------------------------------------ running it


class RunningBedrock:
    """Handle on a simulator served from a background thread."""

    def __init__(self, sim: BedrockSimulator, port: int, stop: Any) -> None:
        self.sim = sim
        self.port = port
        self._stop = stop

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def stats(self) -> BedrockStats:
        return self.sim.stats

    def set_fault(self, status: int, name: str, message: str = "simulated fault") -> None:
        self.sim.set_fault(status, name, message)

    def clear_faults(self) -> None:
        self.sim.clear_faults()

    def close(self) -> None:
        self._stop()


@contextlib.contextmanager
def run_bedrock(
    credentials: BedrockCredentials, port: int = 0, **kw: Any
) -> Iterator[RunningBedrock]:
    """Serve a BedrockSimulator on 127.0.0.1 in a daemon thread with its own event loop."""
    sim = BedrockSimulator(credentials, **kw)
    _Model.get()  # load the service model before the first request (it takes ~0.1 s)
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    box: dict[str, Any] = {}

    async def start() -> None:
        runner = web.AppRunner(sim.app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", port)
        await site.start()
        box["runner"] = runner
        box["port"] = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    def serve() -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(start())
        except BaseException as e:  # surfaced to the caller below
            box["error"] = e
            ready.set()
            return
        ready.set()
        loop.run_forever()
        loop.run_until_complete(box["runner"].cleanup())
        loop.close()

    thread = threading.Thread(target=serve, daemon=True, name="bedrock-sim")
    thread.start()
    ready.wait(10)
    if "error" in box or "port" not in box:
        raise RuntimeError(f"bedrock simulator did not start: {box.get('error')!r}")

    def stop() -> None:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)

    handle = RunningBedrock(sim, box["port"], stop)
    try:
        yield handle
    finally:
        handle.close()


def main(argv: list[str] | None = None) -> None:
    """python -m loadtests.simulator.bedrock --port 9101 (credentials: AKIDEXAMPLE / secret)."""
    p = argparse.ArgumentParser(prog="python -m loadtests.simulator.bedrock", description=__doc__)
    p.add_argument("--port", type=int, default=9101)
    p.add_argument("--access-key-id", default="AKIDEXAMPLE")
    p.add_argument("--secret-access-key", default="bedrock-sim-secret")
    p.add_argument("--session-token", default=None)
    p.add_argument("--region", default="us-east-1")
    args = p.parse_args(argv)
    creds = BedrockCredentials(
        args.access_key_id, args.secret_access_key, args.session_token, args.region
    )
    sim = BedrockSimulator(creds)
    print(f"bedrock sim http://127.0.0.1:{args.port} region={args.region}", flush=True)
    web.run_app(sim.app, host="127.0.0.1", port=args.port, print=None, access_log=None)


if __name__ == "__main__":
    main()
