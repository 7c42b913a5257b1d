"""The access log: one JSON line per finished request on the `gateway.access` logger.

`GATEWAY_ACCESS_LOG=0` turns it off (the observer is then not even registered); when the logger
is disabled by logging configuration nothing is built either. Prompts and completions are not
logged unless `GATEWAY_LOG_BODIES=1` (non-streamed completions only: a stream is never buffered
for the log). Without a handler configured for `gateway.access`, lines go to stdout as bare JSON.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import orjson

from gateway.redact import MASK
from gateway.wire.request import SDK_FIELDS

if TYPE_CHECKING:
    from gateway.context import Context

ACCESS = "gateway.access"
_BODY_LIMIT = 64 * 1024  # a logged body is cut here: log lines must stay bounded
# Client-library settings a client may send in the body (`api_key`, `extra_headers` with its
# Authorization...): dropped before forwarding, and masked in a logged body.
_SDK_NAMES = tuple(f'"{name}"'.encode() for name in sorted(SDK_FIELDS))
_SDK_MEMBER = re.compile(
    r'("(?:' + "|".join(sorted(SDK_FIELDS)) + r')"\s*:\s*)'
    r'("(?:[^"\\]|\\.)*"?|\{[^{}]*\}?|\[[^\[\]]*\]?|[^,{}\s]+)'
)


def access_log_enabled(env: Mapping[str, str] = os.environ) -> bool:
    return env.get("GATEWAY_ACCESS_LOG", "1").lower() not in ("0", "false", "no", "off")


class _StdoutLines(logging.StreamHandler):  # type: ignore[type-arg]
    """The default handler: bare JSON lines on stdout. The observer writes its lines itself
    (one `os.write`, no logging machinery: about 5% of a request's CPU on a zero-latency
    upstream) while this handler is the logger's only one."""

    def __init__(self) -> None:
        super().__init__(sys.stdout)
        self.setFormatter(logging.Formatter("%(message)s"))


def setup_access_logger() -> logging.Logger:
    """Bare JSON lines on stdout unless logging was configured for `gateway.access` already."""
    logger = logging.getLogger(ACCESS)
    if not logger.handlers:
        logger.addHandler(_StdoutLines())
        logger.propagate = False
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.INFO)
    return logger


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def access_record(ctx: Context, bodies: bool = False) -> dict[str, Any]:
    """The fields of one access log line."""
    rec: dict[str, Any] = {
        "ts": round(time.time(), 3),
        "request_id": ctx.request_id,
        "status": ctx.status,
        "tenant": ctx.tenant,
        "key": ctx.key_id,
        "endpoint": ctx.endpoint,
        "alias": ctx.alias,
        "stream": ctx.stream,
        "class": ctx.request_class,
        "prompt_tokens": ctx.prompt_tokens,
        "pool": ctx.pool,
        "provider": ctx.provider,
        "attempts": ctx.attempts,
        "failures": ctx.failures,
        "cache": ctx.cache,
        "degraded": ctx.degraded,
        "resumed": ctx.resumed,
        "hedged": ctx.hedged,
        "total_ms": round((ctx.end - ctx.start) * 1000, 3),
        "ttft_ms": None if ctx.ttft_s is None else round(ctx.ttft_s * 1000, 3),
        "cost_usd": ctx.cost_usd,
    }
    if ctx.similarity is not None:
        rec["similarity"] = ctx.similarity
    if bodies:
        rec["request_body"] = _text(_without_credentials(ctx.request_body))
        rec["response_body"] = _text(ctx.response_body)
    return rec


def _without_credentials(body: bytes | None) -> bytes | None:
    """A client's request body with the values of its SDK settings masked (a key sent in the
    body is a secret: it must not reach the log). Parsed only when one may be there."""
    if not body or (b"\\u" not in body and not any(n in body for n in _SDK_NAMES)):
        return body
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        # Not JSON (refused with a 400): the settings' values masked where they can be read.
        text = body.decode("utf-8", "replace")
        return _SDK_MEMBER.sub(lambda m: m.group(1) + f'"{MASK}"', text).encode()
    if not isinstance(doc, dict) or SDK_FIELDS.isdisjoint(doc):
        return body
    return orjson.dumps({k: MASK if k in SDK_FIELDS else v for k, v in doc.items()})


def _text(body: bytes | None) -> str | None:
    if body is None:
        return None
    return body[:_BODY_LIMIT].decode("utf-8", "replace")


class AccessLog:
    """Record-step observer writing the access log line."""

    def __init__(self, logger: logging.Logger | None = None, bodies: bool = False) -> None:
        self.logger = logger or setup_access_logger()
        self.bodies = bodies

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> AccessLog | None:
        if not access_log_enabled(env):
            return None
        return cls(bodies=env.get("GATEWAY_LOG_BODIES", "0") == "1")

    def __call__(self, ctx: Context) -> None:
        logger = self.logger
        if not logger.isEnabledFor(logging.INFO):
            return
        handlers = logger.handlers
        if len(handlers) == 1 and type(handlers[0]) is _StdoutLines and not logger.filters:
            line = orjson.dumps(access_record(ctx, self.bodies), option=orjson.OPT_APPEND_NEWLINE)
            try:
                sys.stdout.flush()  # whatever else went to stdout stays in order
                _write_all(sys.stdout.fileno(), line)
            except (OSError, ValueError):  # stdout closed or not a file: the line is lost
                pass
            return
        logger.info(orjson.dumps(access_record(ctx, self.bodies)).decode())
