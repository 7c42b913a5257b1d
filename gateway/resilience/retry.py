"""Retry decisions between attempts: how long to wait, and whether to try again at all.

The dispatcher owns the loop (it picks a *different* member for each attempt); this module only
answers two questions, so that the policy is in one place and testable without any I/O:

* :func:`backoff_s` - exponential backoff with full jitter (tenacity's ``wait_random_exponential``).
* :class:`Retrier` - attempt limit + failure taxonomy + retry budget + Retry-After, and whether a
  wait still fits in what is left of the request's deadline.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from pydantic import BaseModel, ConfigDict, Field, model_validator
from tenacity import wait_random_exponential

from gateway.resilience.budget import RetryBudget
from gateway.resilience.failures import FailureKind, is_retryable

if TYPE_CHECKING:
    from tenacity import RetryCallState

# As an attempt's own limits (policy Timeouts): a day at most.
MAX_DEADLINE_S = 86_400.0
# Less than this left of a deadline is not worth a new attempt (nor a wait before one).
MIN_ATTEMPT_S = 0.01


class RetrySettings(BaseModel):
    """Retry policy for one route (or the gateway default)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_attempts: int = Field(
        default=3, ge=1, le=10, description="Attempts in total, first included."
    )
    base_backoff_ms: float = Field(
        default=50.0, ge=0, description="Upper bound of the first jittered wait."
    )
    max_backoff_ms: float = Field(default=2000.0, ge=0, description="Cap of any jittered wait.")
    budget_ratio: float = Field(
        default=0.2, ge=0, description="Retries allowed per original request."
    )
    budget_min_per_s: float = Field(
        default=1.0, ge=0, description="Retries always allowed per second."
    )
    max_retry_after_ms: float = Field(
        default=5000.0,
        ge=0,
        description="A Retry-After longer than this is not waited for inside a request.",
    )

    deadline_s: float | None = Field(
        default=None,
        gt=0,
        le=MAX_DEADLINE_S,
        allow_inf_nan=False,
        description="Longest a request may wait for its answer to start: attempts, backoff "
        "waits, queue waits and hedges together (504 deadline_exceeded when it runs out). "
        "Clients may shorten it (x-gateway-timeout). Null: no limit but "
        "the attempts' own.",
    )

    @model_validator(mode="after")
    def _check_bounds(self) -> RetrySettings:
        if self.max_backoff_ms < self.base_backoff_ms:
            raise ValueError("max_backoff_ms must be >= base_backoff_ms")
        return self


@dataclass(slots=True)
class _Attempt:
    """The one field of tenacity's RetryCallState that its wait strategies read."""

    attempt_number: int


def backoff_s(attempt: int, base_s: float, max_s: float) -> float:
    """Full-jitter wait after failed attempt number ``attempt`` (1-based).

    Uniform in ``[0, min(max_s, base_s * 2**(attempt-1))]``: the window doubles per attempt,
    and the randomness spreads out retries of many clients that failed at the same moment.
    """
    if attempt < 1:
        raise ValueError("attempt is 1-based")
    if base_s <= 0 or max_s <= 0:
        return 0.0
    wait = wait_random_exponential(multiplier=base_s, max=max_s)
    return float(wait(cast("RetryCallState", _Attempt(attempt))))


class Retrier:
    """Per-route retry gate: one instance shared by all requests of the route."""

    def __init__(self, settings: RetrySettings, budget: RetryBudget | None = None) -> None:
        self.settings = settings
        self.budget = budget or RetryBudget(
            ratio=settings.budget_ratio, min_retries_per_s=settings.budget_min_per_s
        )

    def record_request(self) -> None:
        """Call once per incoming request (not per attempt): it funds the budget."""
        self.budget.record_request()

    def should_retry(self, attempt: int, kind: FailureKind, bytes_sent_to_client: bool) -> bool:
        """After failed attempt ``attempt`` (1-based): may another attempt be made?

        Spends one unit of the retry budget when the answer is yes.
        """
        if attempt >= self.settings.max_attempts:
            return False
        if not is_retryable(kind, bytes_sent_to_client):
            return False
        return self.budget.try_spend()

    def delay_s(
        self, attempt: int, retry_after_s: float | None = None, left_s: float | None = None
    ) -> float | None:
        """Seconds to wait before the next attempt, or None when waiting is not worth it.

        Pass ``retry_after_s`` only when the next attempt goes to the member that sent it (or
        when every candidate is cooling down): another member's rate limit does not apply. A
        Retry-After beyond ``max_retry_after_ms`` returns None: the caller should give up on
        that member (its breaker cool-down covers it) rather than hold the request. So does a
        wait that would not leave ``MIN_ATTEMPT_S`` of ``left_s`` (what is left of the
        request's deadline) for the attempt after it: the request ends now, not at its deadline.
        """
        s = self.settings
        wait = backoff_s(attempt, s.base_backoff_ms / 1000.0, s.max_backoff_ms / 1000.0)
        if retry_after_s is not None:
            if retry_after_s * 1000.0 > s.max_retry_after_ms:
                return None
            wait = max(wait, retry_after_s)
        if left_s is not None and wait + MIN_ATTEMPT_S > left_s:
            return None
        return wait
