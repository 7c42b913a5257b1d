"""A Gemini-shaped simulator: generateContent and streamGenerateContent (`alt=sse`).

    with run_gemini(api_key="k") as sim:
        sim.url   # http://127.0.0.1:PORT, the provider's base_url

Each request is checked as the Gemini API does: the `x-goog-api-key` key (400 API_KEY_INVALID
otherwise, as Google answers), the body validated part by part against the official
`google-genai` SDK's request types (`Content`, `Tool`, `ToolConfig`, `GenerationConfig`,
`SafetySetting`: pydantic models that forbid unknown fields), unknown top-level fields, roles
other than user/model, a functionResponse without an earlier functionCall of that name (400
INVALID_ARGUMENT); a prompt over `context_window` tokens (400 "exceeds the maximum number of
tokens"). Answers: deterministic text, a function call fitting the declared schema when the mode
is ANY, one call per declared function the last user turn names (by name) in AUTO mode (Gemini
calls functions in parallel and has no switch against it), JSON valid against `responseJsonSchema` for a JSON mime type, `candidateCount`
candidates; streams are SSE events of partial GenerateContentResponses, the last one with the
finishReason and usageMetadata.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from .bedrock import value_for
from .text import count_tokens, join_words, text_seed, word_ids

_TOP_LEVEL = {
    "contents": "Content",
    "systemInstruction": "Content",
    "tools": "Tool",
    "toolConfig": "ToolConfig",
    "generationConfig": "GenerationConfig",
    "safetySettings": "SafetySetting",
}
_LISTS = {"contents", "tools", "safetySettings"}


class ApiError(Exception):
    def __init__(self, code: int, status: str, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.code, self.status, self.message, self.reason = code, status, message, reason

    def body(self) -> bytes:
        err: dict[str, Any] = {"code": self.code, "message": self.message, "status": self.status}
        if self.reason:
            err["details"] = [
                {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": self.reason}
            ]
        return orjson.dumps({"error": err})


def _invalid(message: str) -> ApiError:
    return ApiError(400, "INVALID_ARGUMENT", message)


def validate_request(body: Any) -> None:
    """ApiError(400) unless `body` is a generateContent request the SDK's types accept."""
    from google.genai import types
    from pydantic import ValidationError

    if not isinstance(body, dict):
        raise _invalid("Invalid JSON payload received: not an object.")
    unknown = set(body) - set(_TOP_LEVEL) - {"cachedContent", "labels"}
    if unknown:
        raise _invalid(f'Invalid JSON payload received. Unknown name "{sorted(unknown)[0]}".')
    if not body.get("contents"):
        raise _invalid("* GenerateContentRequest.contents: contents is not specified")
    for key, type_name in _TOP_LEVEL.items():
        if key not in body:
            continue
        model = getattr(types, type_name)
        items = body[key]
        if key in _LISTS and not isinstance(items, list):
            raise _invalid(f"{key} must be a list")
        for i, item in enumerate(items if key in _LISTS else [items]):
            try:
                # JSON mode: bytes fields (inlineData.data) are base64 text, as on the wire.
                model.model_validate_json(orjson.dumps(item))
            except ValidationError as e:
                first = e.errors()[0]
                where = ".".join(str(x) for x in first["loc"])
                raise _invalid(f"Invalid value at '{key}[{i}].{where}': {first['msg']}") from None
    called: set[str] = set()
    for i, content in enumerate(body["contents"]):
        if content.get("role") not in ("user", "model"):
            raise _invalid(f"contents[{i}].role: please use a valid role: user, model.")
        for part in content.get("parts") or []:
            if "functionCall" in part:
                called.add(part["functionCall"].get("name"))
            if "functionResponse" in part and part["functionResponse"].get("name") not in called:
                raise _invalid("function response parts must follow a function call of that name")


@dataclass
class GeminiStats:
    requests: int = 0
    by_status: dict[str, int] = field(default_factory=dict)
    last_body: dict[str, Any] | None = None

    def count(self, status: int) -> None:
        self.by_status[str(status)] = self.by_status.get(str(status), 0) + 1


class GeminiSimulator:
    def __init__(self, api_key: str, context_window: int = 8192, default_max_tokens: int = 16):
        self.api_key = api_key
        self.context_window = context_window
        self.default_max_tokens = default_max_tokens
        self.stats = GeminiStats()
        self.fault: ApiError | None = None
        self.app = web.Application(client_max_size=20 * 1024 * 1024)
        self.app.router.add_post("/{version}/models/{target}", self._handle)

    def set_fault(self, code: int, status: str, message: str = "simulated fault") -> None:
        self.fault = ApiError(code, status, message)

    def clear_faults(self) -> None:
        self.fault = None

    def _error(self, e: ApiError) -> web.Response:
        self.stats.count(e.code)
        return web.Response(status=e.code, body=e.body(), content_type="application/json")

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.stats.requests += 1
        model, _, method = request.match_info["target"].partition(":")
        try:
            if request.match_info["version"] not in ("v1beta", "v1") or method not in (
                "generateContent",
                "streamGenerateContent",
            ):
                raise ApiError(404, "NOT_FOUND", "Method not found.")
            if request.headers.get("x-goog-api-key") != self.api_key:
                raise ApiError(
                    400,
                    "INVALID_ARGUMENT",
                    "API key not valid. Please pass a valid API key.",
                    reason="API_KEY_INVALID",
                )
            if self.fault is not None:
                raise self.fault
            stream = method == "streamGenerateContent"
            if stream and request.query.get("alt") != "sse":
                raise _invalid("this simulator streams only with alt=sse")
            try:
                body = orjson.loads(await request.read())
            except orjson.JSONDecodeError:
                raise _invalid("Invalid JSON payload received.") from None
            validate_request(body)
            self.stats.last_body = body
            answer = self._answer(body, model)
        except ApiError as e:
            return self._error(e)
        self.stats.count(200)
        if not stream:
            return web.Response(body=orjson.dumps(answer), content_type="application/json")
        return await self._stream(request, answer)

    def _answer(self, body: dict[str, Any], model: str) -> dict[str, Any]:
        texts = []
        for c in [body.get("systemInstruction") or {"parts": []}, *body["contents"]]:
            for p in c.get("parts") or []:
                texts.append(p.get("text") or orjson.dumps(p).decode()[:200])
        prompt = "\n".join(texts)
        prompt_tokens = count_tokens(prompt)
        if prompt_tokens > self.context_window:
            raise _invalid(
                f"The input token count ({prompt_tokens}) exceeds the maximum number of tokens "
                f"allowed ({self.context_window})."
            )
        gen = body.get("generationConfig") or {}
        mode = (body.get("toolConfig") or {}).get("functionCallingConfig") or {}
        decls = [d for t in body.get("tools") or [] for d in t.get("functionDeclarations") or []]
        last = body["contents"][-1]
        answered = any("functionResponse" in p for p in last.get("parts") or [])
        candidates = []
        total_out = 0
        for index in range(int(gen.get("candidateCount") or 1)):
            seed = text_seed(prompt, index)
            named = _named(decls, last) if mode.get("mode", "AUTO") == "AUTO" else []
            if named and not answered:
                # Gemini calls functions in parallel: one call per function the turn names.
                parts = [
                    {"functionCall": {"name": d["name"], "args": value_for(_schema(d), seed)}}
                    for d in named
                ]
                reason, out = "STOP", count_tokens(orjson.dumps(parts).decode())
            elif decls and mode.get("mode") == "ANY" and not answered:
                allowed = mode.get("allowedFunctionNames") or [decls[0]["name"]]
                decl = next(d for d in decls if d["name"] == allowed[0])
                schema = decl.get("parametersJsonSchema") or decl.get("parameters") or {}
                args = value_for(schema, seed)
                parts = [{"functionCall": {"name": decl["name"], "args": args}}]
                reason, out = "STOP", count_tokens(orjson.dumps(args).decode())
            elif gen.get("responseMimeType") == "application/json":
                text = orjson.dumps(
                    value_for(gen.get("responseJsonSchema") or {"type": "object"}, seed)
                ).decode()
                parts, reason, out = [{"text": text}], "STOP", count_tokens(text)
            else:
                limit = gen.get("maxOutputTokens") or self.default_max_tokens
                n = min(limit, self.default_max_tokens)
                text = join_words(word_ids(seed, 0, n), True)
                reason = "MAX_TOKENS" if limit < self.default_max_tokens else "STOP"
                for s in gen.get("stopSequences") or []:
                    if s in text:
                        text, reason = text[: text.find(s)], "STOP"
                parts, out = [{"text": text}], len(text.split())
            total_out += out
            candidates.append(
                {
                    "content": {"role": "model", "parts": parts},
                    "finishReason": reason,
                    "index": index,
                }
            )
        return {
            "candidates": candidates,
            "usageMetadata": {
                "promptTokenCount": prompt_tokens,
                "candidatesTokenCount": total_out,
                "totalTokenCount": prompt_tokens + total_out,
            },
            "modelVersion": model,
            "responseId": f"sim{text_seed(prompt) % 10**12}",
        }

    async def _stream(self, request: web.Request, answer: dict[str, Any]) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        for cand in answer["candidates"]:
            parts = cand["content"]["parts"]
            pieces: list[dict[str, Any]] = []
            for p in parts:
                if "text" in p:
                    words = p["text"].split(" ")
                    pieces += [{"text": w if i == 0 else " " + w} for i, w in enumerate(words)]
                else:
                    pieces.append(p)
            for j, piece in enumerate(pieces):
                chunk: dict[str, Any] = {
                    "candidates": [
                        {"content": {"role": "model", "parts": [piece]}, "index": cand["index"]}
                    ],
                    "modelVersion": answer["modelVersion"],
                }
                if j == len(pieces) - 1:
                    chunk["candidates"][0]["finishReason"] = cand["finishReason"]
                    if cand is answer["candidates"][-1]:
                        chunk["usageMetadata"] = answer["usageMetadata"]
                await resp.write(b"data: " + orjson.dumps(chunk) + b"\r\n\r\n")
        await resp.write_eof()
        return resp


def _named(decls: list[dict[str, Any]], turn: dict[str, Any]) -> list[dict[str, Any]]:
    """The declared functions a user turn's text names (AUTO mode: the model calls them)."""
    if turn.get("role", "user") != "user":
        return []
    said = " ".join(p["text"] for p in turn.get("parts") or [] if isinstance(p.get("text"), str))
    return [d for d in decls if d["name"].lower() in said.lower()]


def _schema(decl: dict[str, Any]) -> Any:
    return decl.get("parametersJsonSchema") or decl.get("parameters") or {}


class RunningGemini:
    def __init__(self, sim: GeminiSimulator, port: int, stop: Any) -> None:
        self.sim, self.port, self._stop = sim, port, stop

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def stats(self) -> GeminiStats:
        return self.sim.stats

    def set_fault(self, code: int, status: str, message: str = "simulated fault") -> None:
        self.sim.set_fault(code, status, message)

    def clear_faults(self) -> None:
        self.sim.clear_faults()


@contextlib.contextmanager
def run_gemini(api_key: str, **kw: Any) -> Iterator[RunningGemini]:
    """Serve a GeminiSimulator on 127.0.0.1 (ephemeral port) in a daemon thread."""
    sim = GeminiSimulator(api_key, **kw)
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    box: dict[str, Any] = {}

    async def start() -> None:
        runner = web.AppRunner(sim.app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        box["runner"], box["port"] = runner, site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    def serve() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(start())
        ready.set()
        loop.run_forever()
        loop.run_until_complete(box["runner"].cleanup())
        loop.close()

    thread = threading.Thread(target=serve, daemon=True, name="gemini-sim")
    thread.start()
    if not ready.wait(10):
        raise RuntimeError("gemini simulator did not start")
    try:
        yield RunningGemini(sim, box["port"], None)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
