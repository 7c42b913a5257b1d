"""One simulated backend instance: routes, auth, faults, lifecycle (listen / refuse / stop)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import itertools
import time
from array import array
from dataclasses import dataclass, field
from typing import Any

import orjson

from .engine import Engine, Overloaded
from .faults import HEALTHY, PLAIN, FaultInjector, Faults, Shape, Verdict
from .generate import serve_job
from .http import App, Connection, Request, head, listen
from .jobs import BadRequest, Job, chat_job, check_context, completion_job, parse_json
from .profiles import InstanceSpec, Profile
from .responses import ChatFormat, CompletionFormat, error_body
from .static import StaticAnswers
from .text import count_tokens, embedding
from .wires import make_wire

CHAT, COMPLETIONS, EMBEDDINGS = b"/v1/chat/completions", b"/v1/completions", b"/v1/embeddings"
MODELS, HEALTH = b"/v1/models", b"/health"
ENDPOINT_NAMES = {
    CHAT: "chat",
    COMPLETIONS: "completions",
    EMBEDDINGS: "embeddings",
    MODELS: "models",
}


@dataclass
class Stats:
    """Counters shown at ``GET /admin/stats``."""

    requests: int = 0
    by_endpoint: dict[str, int] = field(default_factory=dict)
    by_status: dict[str, int] = field(default_factory=dict)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    in_flight: int = 0
    active_peak: int = 0
    disconnects: int = 0
    overloaded: int = 0

    def count_status(self, status: int) -> None:
        key = str(status)
        self.by_status[key] = self.by_status.get(key, 0) + 1

    def count_request(self, endpoint: str) -> None:
        self.requests += 1
        self.by_endpoint[endpoint] = self.by_endpoint.get(endpoint, 0) + 1


class Instance(App):
    """An OpenAI-compatible server backed by a simulated engine."""

    def __init__(self, spec: InstanceSpec, profile: Profile) -> None:
        self.spec, self.name, self.profile = spec, spec.name, profile
        self.host, self.port = spec.host, spec.port
        self.faults = FaultInjector(spec.seed, spec.faults)
        self.engine = Engine(profile, self.faults)
        self.stats = Stats()
        self.connections: set[Connection] = set()
        self._server: asyncio.Server | None = None
        self._ids = itertools.count(1)
        self.auth = f"Bearer {spec.api_key}".encode() if spec.api_key else None
        self.extra = b"x-sim-instance: " + self.name.encode() + b"\r\n"
        digest = hashlib.blake2b(profile.model_dump_json().encode(), digest_size=5).hexdigest()
        self.fingerprint = f"fp_{digest}"
        self.static = StaticAnswers(self) if profile.zero_latency else None
        self._health_ok = self.response(200, b'{"status":"ok"}')
        self._health_bad = self.response(503, b'{"status":"unhealthy"}')
        # Another provider's wire format in front of (or instead of) the OpenAI endpoints.
        self.wire = make_wire(spec.wire, self)

    # -- lifecycle ---------------------------------------------------------------------------
    @property
    def root_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> None:
        if not self.faults.faults.refuse_connections:
            await self._listen()
        elif self.port == 0:
            raise ValueError("an instance that starts refusing connections needs a fixed port")

    async def _listen(self) -> None:
        self._server = await listen(self, self.host, self.port, self.connections, self.extra)
        self.port = self._server.sockets[0].getsockname()[1]

    def _stop_listening(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for c in list(self.connections):
            c.close()

    async def stop(self) -> None:
        self._stop_listening()
        await asyncio.sleep(0)

    async def apply_faults(self, faults: Faults) -> None:
        """Switch faults; opening or closing the listening socket as ``refuse_connections`` says."""
        was_refusing = self.faults.faults.refuse_connections
        self.faults.set(faults)
        if faults.refuse_connections and not was_refusing:
            self.faults.count("refuse_connections")
            self._stop_listening()
        elif was_refusing and not faults.refuse_connections:
            await self._listen()

    def stats_dict(self) -> dict[str, Any]:
        s = self.stats
        return {
            "name": self.name,
            "profile": self.spec.profile,
            "url": self.root_url + "/v1",
            "requests": s.requests,
            "by_endpoint": s.by_endpoint,
            "by_status": s.by_status,
            "in_flight": s.in_flight,
            "active": self.engine.active,
            "queued": self.engine.queued,
            "active_peak": s.active_peak,
            "prompt_tokens": s.prompt_tokens,
            "completion_tokens": s.completion_tokens,
            "prefix_cache_hit_tokens": self.engine.cached_tokens_total,
            "prefilled_tokens": self.engine.prefilled_tokens_total,
            "prefix_cache_blocks": len(self.engine.cache),
            "disconnects": s.disconnects,
            "overloaded": s.overloaded,
            "faults_injected": dict(self.faults.injected),
            "faults": self.faults.faults.model_dump(),
            "listening": self._server is not None,
        }

    def reset(self) -> None:
        """Clear counters and the prefix cache (faults stay as they are)."""
        self.stats = Stats()
        self.engine.reset()
        self.faults.injected.clear()

    # -- routing -------------------------------------------------------------------------------
    def response(self, status: int, body: bytes, headers: bytes = b"") -> bytes:
        return head(status, self.extra + headers, b"application/json", len(body)) + body

    def handle_fast(self, req: Request) -> bytes | None:
        path = req.path
        if path == HEALTH:
            return self._health_bad if self.faults.faults.unhealthy else self._health_ok
        if path == MODELS and req.method == b"GET" and self._authorized(req):
            self.stats.count_request("models")
            return self.response(200, self._models_body())
        if self.wire is not None:
            return None
        if self.static is None or self.faults.faults is not HEALTHY or req.method != b"POST":
            return None
        if path in (CHAT, COMPLETIONS) and self._authorized(req):
            return self.static.answer(req, path == CHAT)
        return None

    def _authorized(self, req: Request) -> bool:
        return self.auth is None or req.headers.get(b"authorization") == self.auth

    def _models_body(self) -> bytes:
        data = [
            {"id": m, "object": "model", "created": 1700000000, "owned_by": "simulator"}
            for m in self.profile.models
        ]
        return orjson.dumps({"object": "list", "data": data})

    async def handle(self, req: Request, conn: Connection, native: bool = False) -> None:
        path = req.path
        if self.wire is not None and not native and not path.startswith(b"/admin/"):
            await self.wire.handle(req, conn)
            return
        if path.startswith(b"/admin/"):
            from .admin import control

            status, body = await control(self, req.method, path[7:].decode(), req.body, conn)
            if status:
                conn.send(status, body)
            return
        endpoint = ENDPOINT_NAMES.get(path)
        if endpoint is None:
            conn.send(404, error_body(f"unknown path {path.decode()}", "invalid_request_error"))
            return
        if req.method != (b"GET" if path == MODELS else b"POST"):
            conn.send(405, error_body("method not allowed", "invalid_request_error"))
            return
        if not self._authorized(req):
            conn.send(
                401,
                error_body(
                    "Incorrect API key provided", "invalid_request_error", None, "invalid_api_key"
                ),
            )
            return
        self.stats.count_request(endpoint)
        self.stats.in_flight += 1
        try:
            await self._inference(req, conn, path)
        except BadRequest as e:
            self.stats.count_status(400)
            conn.send(400, error_body(e.message, "invalid_request_error", e.param, e.code))
        finally:
            self.stats.in_flight -= 1

    async def _inference(self, req: Request, conn: Connection, path: bytes) -> None:
        if path == MODELS:
            conn.send(200, self._models_body())
            return
        body = parse_json(req.body)
        rid = f"{self.name}-{next(self._ids)}"
        job = None
        if path != EMBEDDINGS:
            job = (
                chat_job(body, self.profile, rid)
                if path == CHAT
                else completion_job(body, self.profile)
            )
            check_context(job, self.profile)
        if not await self._faults_let_through(conn):
            return
        shape = self.faults.shape()
        if shape.spike_s:
            await asyncio.sleep(shape.spike_s)
        if job is None:
            await self._embeddings(body, conn)
        else:
            await self._generate(job, path, rid, conn, shape)

    async def _faults_let_through(self, conn: Connection) -> bool:
        verdict, status = self.faults.decide()
        if verdict is Verdict.SERVE:
            return True
        if verdict is Verdict.HANG:
            await asyncio.Event().wait()  # until the client disconnects (the task is cancelled)
        self.stats.count_status(status)
        if verdict is Verdict.RATE_LIMIT:
            retry = b"retry-after: %d\r\n" % self.faults.faults.retry_after_s
            msg = "Rate limit reached for requests. Please retry after a short wait."
            conn.send(429, error_body(msg, "requests", None, "rate_limit_exceeded"), headers=retry)
        else:
            msg = f"simulated upstream error {status}"
            conn.send(status, error_body(msg, "server_error", None, None))
        return False

    async def _generate(
        self, job: Job, path: bytes, rid: str, conn: Connection, shape: Shape = PLAIN
    ) -> None:
        if self.profile.zero_latency and job.plan is None:
            job.n_out = min(job.n_out, self.profile.static_output_tokens)
        kind = ChatFormat if path == CHAT else CompletionFormat
        prefix = "chatcmpl-" if path == CHAT else "cmpl-"
        fmt = kind(prefix + rid, int(time.time()), job.model, self.fingerprint, job.include_usage)
        await serve_job(self, job, fmt, conn, shape)

    async def _embeddings(self, body: dict[str, Any], conn: Connection) -> None:
        texts, tokens = _embedding_inputs(body.get("input"))
        dim = body.get("dimensions") or self.profile.embedding_dim
        if not isinstance(dim, int) or isinstance(dim, bool) or not 1 <= dim <= 8192:
            raise BadRequest("dimensions must be an integer between 1 and 8192", "dimensions")
        b64 = body.get("encoding_format") == "base64"
        if not self.profile.zero_latency:
            try:
                await self.engine.acquire()
            except Overloaded:
                self.stats.overloaded += 1
                conn.send(self.profile.overload_status, error_body("overloaded", "server_error"))
                return
            try:
                p = self.profile
                await asyncio.sleep((p.ttft_base_ms + p.prefill_ms_per_token * tokens) / 1000)
            finally:
                self.engine.release()
        data = []
        for i, t in enumerate(texts):
            vec: Any = embedding(t, dim)
            if b64:
                vec = base64.b64encode(array("f", vec).tobytes()).decode()
            data.append({"object": "embedding", "index": i, "embedding": vec})
        model = body.get("model") if isinstance(body.get("model"), str) else self.profile.models[0]
        self.stats.prompt_tokens += tokens
        self.stats.count_status(200)
        out = {
            "object": "list",
            "data": data,
            "model": model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
        conn.send(200, orjson.dumps(out))


def _embedding_inputs(inp: Any) -> tuple[list[str], int]:
    """Texts to embed and their token count; token arrays are embedded by their digits."""
    if isinstance(inp, str):
        return [inp], count_tokens(inp)
    if isinstance(inp, list) and inp:
        if all(isinstance(x, str) for x in inp):
            return list(inp), sum(count_tokens(x) for x in inp)
        if all(isinstance(x, int) for x in inp):
            return [" ".join(map(str, inp))], len(inp)
        if all(isinstance(x, list) and all(isinstance(y, int) for y in x) for x in inp):
            return [" ".join(map(str, x)) for x in inp], sum(len(x) for x in inp)
    raise BadRequest("input must be a string, an array of strings or token arrays", "input")
