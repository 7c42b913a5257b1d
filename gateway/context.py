"""Per-request context: what the gateway decided, echoed in response headers and the log line."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

# Set in the ASGI scope by the HTTP protocol when the request body did not arrive in time.
READ_TIMEOUT_KEY = "gateway.read_timeout"
# Set in the ASGI scope by the HTTP protocol when the parser refused the request's body (a
# malformed chunk, trailer fields too large): (status, message, code) of the error to answer.
REFUSED_KEY = "gateway.refused"


class RequestSpans(Protocol):
    """What the request path tells a request's trace (gateway.observability.tracing.RequestTrace;
    a protocol so that this module imports nothing of the layers above it)."""

    recording: bool

    def attempt(self, pool: str, member: Any, number: int) -> None: ...

    def attempt_failed(self, failure: Any) -> None: ...

    def upstream_headers(self) -> dict[str, str]: ...


@dataclass(slots=True)
class Context:
    request_id: str
    start: float
    tenant: str = "default"
    key_id: str = ""  # managed mk_..., static sk_<sha256 prefix>; "" on an open gateway
    alias: str = ""
    endpoint: str = ""
    stream: bool = False
    request_class: str = ""
    prompt_tokens: int = 0
    pool: str = ""
    provider: str = ""
    attempts: int = 0
    cache: str = "bypass"
    similarity: float | None = None
    degraded: bool = False
    status: int = 0
    ttft_s: float | None = None
    end: float = 0.0
    resumed: bool = False
    hedged: bool = False  # a second attempt was sent while the first was still running
    failures: list[str] = field(default_factory=list)
    output_chunks: int = 0  # SSE events relayed to the client (streams)
    replay: bool = False  # a deferred request replayed by the gateway itself
    deferred_id: str | None = None  # set when a degradation rule queued this request
    # Kept by reference for the record step (usage, optional body logging); never copied.
    request_body: bytes | None = None
    response_body: bytes | None = None
    # (prompt, completion) tokens of a unary answer, read once (its usage member).
    usage: tuple[int | None, int | None] | None = None
    # Spans of this request; None when tracing is off (nothing is created on the hot path).
    trace: RequestSpans | None = None
    # Governance: the admitted request's ticket, the rate-limit headers, the request's cost.
    governance: Any = None
    extra_headers: dict[str, str] | None = None
    cost_usd: float | None = None

    def headers(self) -> dict[str, str]:
        h = {"x-request-id": self.request_id, "x-gateway-cache": self.cache}
        if self.similarity is not None:
            h["x-gateway-cache-similarity"] = f"{self.similarity:.4f}"
        if self.request_class:
            h["x-gateway-class"] = self.request_class
        if self.pool:
            h["x-gateway-pool"] = self.pool
            h["x-gateway-provider"] = self.provider
            h["x-gateway-attempts"] = str(self.attempts)
        if self.degraded:
            h["x-gateway-degraded"] = "true"
        if self.hedged:
            h["x-gateway-hedged"] = "true"
        if self.extra_headers:
            h.update(self.extra_headers)
        return h
