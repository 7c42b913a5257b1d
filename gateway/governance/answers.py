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


# A bucket refills whole in a minute: a longer wait (a debt, a share too small while Redis is
# down) is answered as a minute, and the retry is judged again.
MAX_WAIT_S = 60.0
# The longest budget period is a month.
MAX_PERIOD_S = 31 * 86400.0


def _bounded(seconds: float, most: float) -> float:
    return seconds if 0 <= seconds <= most else (0.0 if seconds < 0 else most)  # NaN: most


def retry_wait(seconds: float) -> float:
    """A rate limit's wait as it is answered: 0 to MAX_WAIT_S."""
    return _bounded(seconds, MAX_WAIT_S)


def rate_limited(message: str, wait_s: float, headers: dict[str, str]) -> GatewayError:
    """429 rate_limit_exceeded with Retry-After (seconds) and retry-after-ms (what the SDKs read),
    at most a minute."""
    wait_s = retry_wait(wait_s)
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
    until_s = _bounded(until_s, MAX_PERIOD_S)
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
