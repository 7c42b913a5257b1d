"""Accept: parse the body once and check only what the gateway itself needs.

Everything else in the body (tools, response_format, logprobs, seed, vendor extensions) is kept in
the raw dict and passes through untouched, except fields that only mean something to SDKs or to
other proxies (`api_base`, `api_key`, `extra_headers`, ...): a client must not steer where or how
the gateway talks to a provider. Nesting depth and `n` are bounded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import orjson

from gateway.errors import GatewayError, bad_request

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
class Accepted:
    endpoint: Endpoint
    body: dict[str, Any]
    model: str
    stream: bool
    max_tokens: int | None


def _type_error(param: str, expected: str) -> GatewayError:
    return bad_request(
        f"Invalid type for '{param}': expected {expected}.", param=param, code="invalid_type"
    )


def _missing(param: str) -> GatewayError:
    return bad_request(
        f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter"
    )


def _check_messages(messages: Any) -> None:
    if not isinstance(messages, list):
        raise _type_error("messages", "an array of message objects")
    if not messages:
        raise bad_request(
            "'messages' must contain at least one message.", param="messages", code="empty_array"
        )
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise _type_error(f"messages[{i}]", "an object")
        role = m.get("role")
        if not isinstance(role, str):
            raise (
                _missing(f"messages[{i}].role")
                if role is None
                else _type_error(f"messages[{i}].role", "a string")
            )


def _nested(limit: int) -> GatewayError:
    return bad_request(
        f"The request body is nested more than {limit} levels deep.", code="invalid_json"
    )


def _opt_int(body: dict[str, Any], name: str) -> int | None:
    v = body.get(name)
    if v is None:
        return None
    if not isinstance(v, int) or isinstance(v, bool):
        raise _type_error(name, "an integer")
    if v < 1:
        raise bad_request(f"'{name}' must be at least 1.", param=name, code="invalid_value")
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


def accept(
    raw: bytes,
    endpoint: Endpoint,
    *,
    max_n: int = DEFAULT_MAX_N,
    max_depth: int = DEFAULT_MAX_DEPTH,
) -> Accepted:
    """Parse and validate a request body; raise GatewayError(400) naming the offending parameter."""
    if not raw:
        raise bad_request("The request body is empty; expected a JSON object.", code="invalid_json")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        if "recursion" in str(e).lower():
            raise _nested(max_depth) from None
        raise bad_request(f"The request body is not valid JSON: {e}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object.", code="invalid_json")
    if _too_deep(raw, body, max_depth):
        raise _nested(max_depth)
    if not SDK_FIELDS.isdisjoint(body):
        for k in SDK_FIELDS.intersection(body):
            del body[k]
    model = body.get("model")
    if model is None:
        raise _missing("model")
    if not isinstance(model, str) or not model:
        raise _type_error("model", "a non-empty string")
    if endpoint == "chat":
        if "messages" not in body:
            raise _missing("messages")
        _check_messages(body["messages"])
    elif endpoint == "completions":
        prompt = body.get("prompt")
        if prompt is None:
            raise _missing("prompt")
        if not isinstance(prompt, (str, list)):
            raise _type_error("prompt", "a string or an array")
    else:
        inp = body.get("input")
        if inp is None:
            raise _missing("input")
        if not isinstance(inp, (str, list)):
            raise _type_error("input", "a string or an array")
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise _type_error("stream", "a boolean")
    if endpoint == "embeddings" and stream:
        raise bad_request("Embeddings cannot be streamed.", param="stream", code="invalid_value")
    so = body.get("stream_options")
    if so is not None and not isinstance(so, dict):
        raise _type_error("stream_options", "an object")
    max_tokens = _opt_int(body, "max_completion_tokens") or _opt_int(body, "max_tokens")
    for name in ("n", "best_of"):
        n = _opt_int(body, name)
        if n is not None and n > max_n:
            raise bad_request(
                f"'{name}' must be at most {max_n} on this gateway.",
                param=name,
                code="invalid_value",
            )
    return Accepted(endpoint, body, model, stream, max_tokens)
