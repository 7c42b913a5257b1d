"""What the client reads when the upstream side did not answer: a provider's 4xx re-wrapped in
the gateway's error shape (never its own words unsanitised), or the error of an exhausted
failover, by the kind of the last failure."""

from __future__ import annotations

import math
import re
from typing import Any

import orjson
from starlette.responses import Response

from gateway.context import Context
from gateway.errors import GatewayError
from gateway.pipeline.candidates import Candidates
from gateway.providers.upstream import UpstreamFailure
from gateway.redact import Redactor, sanitize_message, secret_like
from gateway.resilience.failures import MAX_RETRY_AFTER_S

CLIENT_ERRORS = frozenset({"upstream_4xx"})
_EXHAUSTED_STATUS = {
    "connect_timeout": (504, "upstream_timeout"),
    "first_byte_timeout": (504, "upstream_timeout"),
    "total_timeout": (504, "upstream_timeout"),
    "idle_timeout": (504, "upstream_timeout"),
    "rate_limited": (503, "upstream_rate_limited"),
    "connect_error": (502, "upstream_unavailable"),
    "upstream_5xx": (502, "upstream_error"),
    "stream_broken": (502, "upstream_error"),
    "upstream_auth": (502, "upstream_auth_failed"),
    "bad_response": (502, "upstream_bad_response"),
    "unsupported": (400, "unsupported_endpoint"),
}
# What the client reads when the last failure was of this kind (never an upstream's own words).
_EXHAUSTED_MESSAGE = {
    "upstream_auth": "The provider refused the gateway's credentials for this model or does not "
    "serve it. This is a gateway configuration problem, not a problem with your API key.",
    "bad_response": "The provider's answer was not a valid response for this endpoint.",
    "unsupported": "No provider of this model can serve this request (its endpoint or one of "
    "its features, e.g. n > 1 or logprobs, has no counterpart in the provider's API).",
}
# An upstream error field kept in the gateway's error: a short token, never free text.
_TOKEN = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
_PARAM = re.compile(r"^[A-Za-z0-9_.\[\]\-]{1,128}$")


class PassThrough(Exception):
    """A non-retryable provider answer (4xx) for the client, re-wrapped in the gateway's shape."""

    def __init__(self, response: Response) -> None:
        self.response = response


class Exhausted(GatewayError):
    """Every candidate failed or none was available: the Degrade stage may answer instead."""


def passthrough_error(
    f: UpstreamFailure,
    ctx: Context,
    redactor: Redactor | None = None,
    hosts: tuple[str, ...] = (),
) -> Response:
    """The provider's 4xx for the client, always in the gateway's own error shape.

    The message is sanitised (no secret, token, key, URL or internal host); type, param and
    code are kept only when they are short tokens. A context overflow the token estimate
    missed (the provider counts with its own tokenizer) is rewritten to OpenAI's
    `context_length_exceeded`, whatever shape the provider used (llama.cpp: type
    `exceed_context_size_error` with `n_ctx`; vLLM: a message naming the maximum context
    length), so clients can handle it the same way everywhere.
    """
    headers = {**f.headers, **ctx.headers()}
    headers.pop("content-type", None)
    err = _error_fields(f.body)
    status = f.status or 400
    if err is not None:
        said = " ".join(str(err.get(k) or "") for k in ("type", "code", "message")).lower()
        if "exceed_context_size" in said or re.search(r"context[ _](length|size|window)", said):
            limit = err.get("n_ctx")
            if not isinstance(limit, int):
                m = re.search(r"context[ _](?:length|size|window)\D{0,24}(\d+)", said)
                limit = int(m.group(1)) if m else None
            n = err.get("n_prompt_tokens")
            message = (
                f"This model's maximum context length is {limit} tokens."
                if limit
                else "The request exceeds this model's maximum context length."
            )
            if isinstance(n, int):
                message += f" However, your messages resulted in {n} tokens."
            message += " Please reduce the length of the messages or completion."
            body = GatewayError(
                400, message, param="messages", code="context_length_exceeded"
            ).to_bytes()
            return Response(body, 400, headers=headers, media_type="application/json")
    message = ""
    if err is not None and isinstance(err.get("message"), str):
        message = sanitize_message(err["message"], redactor, hosts)
    body = GatewayError(
        status,
        message or "The provider rejected the request.",
        type=_token(err, "type", redactor) or "invalid_request_error",
        param=_token(err, "param", redactor, _PARAM),
        code=_token(err, "code", redactor) if err is not None else "upstream_rejected",
    ).to_bytes()
    return Response(body, status_code=status, headers=headers, media_type="application/json")


def exhausted(last: UpstreamFailure | None, candidates: Candidates) -> Exhausted:
    if last is None:
        # Nothing was sent: every member is cooling down, open or drained.
        wait = candidates.retry_after_s()
        if wait is None:
            return Exhausted(
                503,
                "No provider is available for this model right now.",
                type="upstream_error",
                code="no_provider_available",
            )
        seconds = max(1, math.ceil(wait))
        return Exhausted(
            503,
            "Every provider for this model is cooling down (rate limited) or has its "
            f"circuit open; retry in about {seconds} s.",
            type="upstream_error",
            code="no_provider_available",
            headers={"retry-after": str(seconds)},
        )
    status, code = _EXHAUSTED_STATUS.get(last.kind, (502, "upstream_error"))
    why = _EXHAUSTED_MESSAGE.get(last.kind, "")
    if last.kind == "unsupported":  # no member's type can express this request
        return Exhausted(status, why, type="invalid_request_error", code=code)
    err = Exhausted(
        status,
        f"All providers failed for this request (last failure: {last.kind}). {why}".strip(),
        type="upstream_error",
        code=code,
    )
    if last.retry_after is not None and math.isfinite(last.retry_after):
        err.headers["retry-after"] = str(
            max(0, math.ceil(min(last.retry_after, MAX_RETRY_AFTER_S)))
        )
    return err


def _error_fields(body: bytes) -> dict[str, Any] | None:
    """The error object of an upstream error body in any common shape, else None.

    OpenAI `{"error": {...}}`, vLLM `{"object": "error", "message": ...}`, `{"error": "text"}`,
    FastAPI `{"detail": "text"}`.
    """
    try:
        parsed: Any = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(parsed, dict):
        return None
    err = parsed.get("error")
    if isinstance(err, dict):
        return err
    if isinstance(err, str):
        return {"message": err}
    if isinstance(parsed.get("message"), str):
        return parsed
    if isinstance(parsed.get("detail"), str):
        return {"message": parsed["detail"]}
    return None


def _token(
    err: dict[str, Any] | None,
    key: str,
    redactor: Redactor | None,
    pattern: re.Pattern[str] = _TOKEN,
) -> str | None:
    """A short token of the upstream error, or None: free text and anything holding (part of)
    a secret or shaped like a key never pass."""
    value = err.get(key) if err is not None else None
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or not pattern.match(value):
        return None
    return None if secret_like(value, redactor) else value
