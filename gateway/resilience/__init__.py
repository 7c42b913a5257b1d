"""Resilience building blocks: failure taxonomy, circuit breakers, retry budget and backoff.

Each module is usable on its own and free of any web framework; the request pipeline composes
them in one place. Replica sharing of breaker events lives in :mod:`gateway.resilience.shared_breakers`
(it needs Redis, so it is not imported here).
"""

from gateway.resilience.breaker import (
    BreakerEvent,
    BreakerRegistry,
    BreakerSettings,
    BreakerState,
    CircuitBreaker,
)
from gateway.resilience.budget import RetryBudget
from gateway.resilience.failures import (
    FailureKind,
    counts_against_breaker,
    is_retryable,
    parse_retry_after,
)
from gateway.resilience.retry import Retrier, RetrySettings, backoff_s

__all__ = [
    "BreakerEvent",
    "BreakerRegistry",
    "BreakerSettings",
    "BreakerState",
    "CircuitBreaker",
    "FailureKind",
    "Retrier",
    "RetryBudget",
    "RetrySettings",
    "backoff_s",
    "counts_against_breaker",
    "is_retryable",
    "parse_retry_after",
]
