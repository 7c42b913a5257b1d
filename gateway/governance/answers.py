"""OpenAI-compatible rate-limit answers: 429 bodies and the x-ratelimit-* headers."""

from __future__ import annotations

import math

from gateway.errors import GatewayError


def duration(seconds: float) -> str:
    """OpenAI's reset format: `20ms`, `1.5s`, `6m0s`."""
    if seconds < 1:
        return f"{int(seconds * 1000)}ms"
    if seconds < 60:
        return f"{seconds:.1f}".rstrip("0").rstrip(".") + "s"
    m, s = divmod(int(seconds), 60)
    return f"{m}m{s}s"


def rate_limited(message: str, wait_s: float, headers: dict[str, str]) -> GatewayError:
    """429 rate_limit_exceeded with Retry-After (seconds) and retry-after-ms (what the SDKs read)."""
    return GatewayError(
        429,
        message,
        type="requests",
        code="rate_limit_exceeded",
        headers={
            **headers,
            "retry-after": str(max(1, math.ceil(wait_s))),
            "retry-after-ms": str(max(1, math.ceil(wait_s * 1000))),
        },
    )


def over_budget(message: str, until_s: float, headers: dict[str, str]) -> GatewayError:
    """429 insufficient_quota: retrying before the period ends cannot help, so the SDKs are told
    not to (`x-should-retry: false`)."""
    return GatewayError(
        429,
        message,
        type="insufficient_quota",
        code="insufficient_quota",
        headers={
            **headers,
            "retry-after": str(max(1, math.ceil(until_s))),
            "x-should-retry": "false",
        },
    )
