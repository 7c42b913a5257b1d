"""Failure taxonomy: what went wrong with an upstream attempt, and what that allows.

The dispatcher classifies every failed attempt into one :class:`FailureKind`; the retry
logic and the circuit breaker only ever look at that kind, never at raw exceptions.
"""

from __future__ import annotations

import email.utils
import math
import time
from datetime import UTC
from enum import StrEnum


class FailureKind(StrEnum):
    CONNECT_ERROR = "connect_error"
    CONNECT_TIMEOUT = "connect_timeout"
    FIRST_BYTE_TIMEOUT = "first_byte_timeout"
    IDLE_TIMEOUT = "idle_timeout"
    TOTAL_TIMEOUT = "total_timeout"
    RATE_LIMITED = "rate_limited"
    UPSTREAM_5XX = "upstream_5xx"
    UPSTREAM_4XX = "upstream_4xx"
    STREAM_BROKEN = "stream_broken"
    # The provider refused the member's own credentials or does not serve the mapped model
    # (401, 403, 404): the member is misconfigured, whatever the client sent.
    UPSTREAM_AUTH = "upstream_auth"
    # A 200 that is not a valid answer: not JSON of the endpoint's shape, a stream that is not
    # SSE or ends without its final event, or an answer over the size limits.
    BAD_RESPONSE = "bad_response"
    # An unexpected exception inside an attempt (a bug or a library error on an odd answer):
    # a failure of that attempt like any other, retried on another member, never a 500.
    ATTEMPT_ERROR = "attempt_error"
    # The member's provider type cannot serve the endpoint (an embeddings request to an
    # Anthropic member): nothing was sent, another member of the pool may serve it.
    UNSUPPORTED = "unsupported"


def failure_kind(kind: str) -> FailureKind:
    """The kind named by an attempt failure; a name this build does not know counts as a
    member failure (retried, fed to the breaker and the balancer), never as a crash."""
    try:
        return FailureKind(kind)
    except ValueError:
        return FailureKind.ATTEMPT_ERROR


# HTTP statuses that say the member is misconfigured, whatever the client sent: its key refused
# (401, 403), its account out of credit (402), the mapped model or path not there (404, 405, 410).
# They are `upstream_auth` failures (another member is tried, the breaker opens), never a client
# error relayed as it is: such a member answers every request at once, and a 4xx that counted for
# nothing would leave its cost looking idle and fast, drawing most of the pool's traffic.
MEMBER_CAUSED_4XX = frozenset({401, 402, 403, 404, 405, 410})


def member_caused(status: int) -> bool:
    """Whether a provider's 4xx status is the member's fault rather than the request's."""
    return status in MEMBER_CAUSED_4XX


# A client error is the caller's fault: another member would answer the same.
_NEVER_RETRYABLE = frozenset({FailureKind.UPSTREAM_4XX})

# Kinds that say nothing about the provider's health: a 4xx is the request's fault and a 429
# is handled by a timed cool-down (Retry-After) rather than by tripping the breaker.
_NOT_A_HEALTH_SIGNAL = frozenset(
    {FailureKind.UPSTREAM_4XX, FailureKind.RATE_LIMITED, FailureKind.UNSUPPORTED}
)


# Kinds that are certain on the first occurrence: a revoked key does not heal in seconds, so the
# breaker opens at once instead of after a run of failures.
_TRIP_AT_ONCE = frozenset({FailureKind.UPSTREAM_AUTH})


def trips_at_once(kind: FailureKind) -> bool:
    """Whether one failure of this kind is enough to open the member's breaker."""
    return kind in _TRIP_AT_ONCE


def is_retryable(kind: FailureKind, bytes_sent_to_client: bool) -> bool:
    """Whether another attempt may be made after a failure of this kind.

    Once any byte reached the client the response is committed (status line, headers, part
    of a stream): a retry would duplicate or splice output, so nothing is retryable then.
    """
    if bytes_sent_to_client:
        return False
    return kind not in _NEVER_RETRYABLE


def counts_against_breaker(kind: FailureKind) -> bool:
    """Whether a failure of this kind is evidence that the provider is unhealthy."""
    return kind not in _NOT_A_HEALTH_SIGNAL


#: The longest wait a provider's Retry-After may impose: a hostile or broken value (`1e12`,
#: a date years ahead) must not take a member out until the next restart.
MAX_RETRY_AFTER_S = 3600.0


def parse_retry_after(header: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or HTTP-date).

    Returns None when absent or unparseable (`inf`, `nan` included); never negative, never more
    than MAX_RETRY_AFTER_S. ``now`` is wall-clock epoch seconds (injectable for tests).
    """
    if header is None:
        return None
    value = header.strip()
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not math.isnan(seconds):
        return min(MAX_RETRY_AFTER_S, max(0.0, seconds)) if math.isfinite(seconds) else None
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    if when.tzinfo is None:  # "-0000" zone: RFC 5322 says UTC with unknown origin
        when = when.replace(tzinfo=UTC)
    current = time.time() if now is None else now
    return min(MAX_RETRY_AFTER_S, max(0.0, when.timestamp() - current))
