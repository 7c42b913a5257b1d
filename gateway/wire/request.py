"""Accept: parse the body once and check what the gateway reads or every provider rejects.

The fields checked (types, ranges, message and tool shapes: see request_checks.py) get a 400 in
OpenAI's shape, never an upstream call. Everything else in the body (vendor extensions, fields
not listed there) is kept in the raw dict and passes through untouched, except fields that only mean something to SDKs or to
other proxies (`api_base`, `api_key`, `extra_headers`, ...): a client must not steer where or how
the gateway talks to a provider. Nesting depth and `n` are bounded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import orjson

from gateway.errors import GatewayError, bad_request
from gateway.wire.request_checks import (
    MAX_EMBEDDING_INPUTS,
    MAX_STOP,
    below_min,
    check_fields,
    check_messages,
    check_prompt,
    invalid_type,
    missing,
)

Endpoint = Literal["chat", "completions", "embeddings"]
# Client-library and proxy settings sent in the body by mistake (or on purpose): never forwarded.
SDK_FIELDS = frozenset(
    {
        "api_base",
        "base_url",
        "api_key",
        "api_version",
        "organization",
        "extra_headers",
        "extra_query",
        "extra_body",
    }
)
DEFAULT_MAX_N = 8
DEFAULT_MAX_DEPTH = 64
PATHS: dict[str, str] = {
    "chat": "/chat/completions",
    "completions": "/completions",
    "embeddings": "/embeddings",
}


@dataclass(slots=True)
class ParsedRequest:
    endpoint: Endpoint
    body: dict[str, Any]
    model: str
    stream: bool
    max_tokens: int | None


_missing = missing


def nested(limit: int) -> GatewayError:
    return bad_request(
        f"The request body is nested more than {limit} levels deep.", code="invalid_json"
    )


def _opt_int(body: dict[str, Any], name: str) -> int | None:
    v = body.get(name)
    if v is None:
        return None
    if not isinstance(v, int) or isinstance(v, bool):
        raise invalid_type(name, "an integer", v)
    if v < 1:
        raise below_min(name, 1, v)
    return v


def _too_deep(raw: bytes, body: Any, limit: int) -> bool:
    # Cheap bound first: fewer brackets than the limit cannot nest deeper than it.
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return False
    stack: list[tuple[Any, int]] = [(body, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        children = node.values() if isinstance(node, dict) else node
        for child in children:
            if isinstance(child, (dict, list)):
                stack.append((child, depth + 1))
    return False


def is_depth_error(e: orjson.JSONDecodeError) -> bool:
    """orjson's own nesting limit (1024) was hit: the body is too deep, not malformed."""
    text = str(e).lower()
    return "depth limit" in text or "recursion" in text


def check_depth(raw: bytes, body: Any, limit: int = DEFAULT_MAX_DEPTH) -> None:
    """400 when `body` (parsed from `raw`) nests deeper than `limit`: for the other inbound
    APIs, whose raw body is parsed before its translation reaches `parse_request`."""
    if _too_deep(raw, body, limit):
        raise nested(limit)


def parse_request(
    raw: bytes,
    endpoint: Endpoint,
    *,
    max_n: int = DEFAULT_MAX_N,
    max_depth: int = DEFAULT_MAX_DEPTH,
    max_stop: int = MAX_STOP,
) -> ParsedRequest:
    """Parse and validate a request body; raise GatewayError(400) naming the offending parameter."""
    if not raw:
        raise bad_request("The request body is empty; expected a JSON object.", code="invalid_json")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        if is_depth_error(e):
            raise nested(max_depth) from None
        raise bad_request(f"The request body is not valid JSON: {e}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object.", code="invalid_json")
    if _too_deep(raw, body, max_depth):
        raise nested(max_depth)
    if not SDK_FIELDS.isdisjoint(body):
        for k in SDK_FIELDS.intersection(body):
            del body[k]
    model = body.get("model")
    if model is None:
        raise _missing("model")
    if not isinstance(model, str):
        raise invalid_type("model", "a string", model)
    if not model:
        raise _missing("model")
    if endpoint == "chat":
        if "messages" not in body:
            raise _missing("messages")
        check_messages(body["messages"])
    elif endpoint == "completions":
        prompt = body.get("prompt")
        if prompt is None:
            raise _missing("prompt")
        check_prompt(prompt, "prompt", allow_empty=True)
    else:
        inp = body.get("input")
        if inp is None:
            raise _missing("input")
        check_prompt(
            inp, "input", allow_empty=False, max_items=MAX_EMBEDDING_INPUTS, empty_strings=False
        )
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise invalid_type("stream", "a boolean", stream)
    if endpoint == "embeddings" and stream:
        raise bad_request("Embeddings cannot be streamed.", param="stream", code="invalid_value")
    check_fields(body, endpoint, stream, max_stop)
    # Both checked when both are sent: the one not used must not pass unchecked to a provider.
    max_completion = _opt_int(body, "max_completion_tokens")
    max_tokens = _opt_int(body, "max_tokens")
    if max_completion is not None:
        max_tokens = max_completion
    for name in ("n", "best_of"):
        n = _opt_int(body, name)
        if n is not None and n > max_n:
            raise bad_request(
                f"'{name}' must be at most {max_n} on this gateway.",
                param=name,
                code="invalid_value",
            )
    return ParsedRequest(endpoint, body, model, stream, max_tokens)
