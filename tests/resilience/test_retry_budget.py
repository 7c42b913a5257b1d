"""Retry budget, backoff bounds, failure taxonomy and Retry-After parsing."""

from __future__ import annotations

import email.utils
import random

import pytest

from gateway.resilience.budget import RetryBudget
from gateway.resilience.failures import FailureKind, is_retryable, parse_retry_after
from gateway.resilience.retry import Retrier, RetrySettings, backoff_s
from tests.support import FakeClock


def test_budget_caps_retries_during_an_outage() -> None:
    clock = FakeClock(500.0)
    budget = RetryBudget(ratio=0.2, min_retries_per_s=1.0, window_s=10, clock=clock)
    retries = 0
    for _ in range(1000):  # 1000 requests over 10 s, all failing, each wanting 2 retries
        clock.t += 0.01
        budget.record_request()
        for _ in range(2):
            retries += budget.try_spend()
    # 20% of requests + 1/s floor over the window, not 2000.
    assert 200 <= retries <= 0.2 * 1000 + 10
    print(f"outage: {retries} retries allowed for 1000 failing requests")


def test_budget_allows_retries_at_low_failure_rates() -> None:
    clock = FakeClock(500.0)
    budget = RetryBudget(ratio=0.2, min_retries_per_s=1.0, window_s=10, clock=clock)
    refused = 0
    for i in range(2000):  # 5% of requests fail once
        clock.t += 0.01
        budget.record_request()
        if i % 20 == 0:
            refused += not budget.try_spend()
    assert refused == 0


def test_budget_floor_allows_retries_when_quiet() -> None:
    clock = FakeClock(500.0)
    budget = RetryBudget(ratio=0.2, min_retries_per_s=0.5, window_s=10, clock=clock)
    assert [budget.try_spend() for _ in range(6)] == [True] * 5 + [False]
    clock.t += 10.5  # the spent retries leave the window
    assert budget.try_spend()


def test_backoff_bounds_full_jitter() -> None:
    random.seed(7)
    for attempt in range(1, 10):
        cap = min(2.0, 0.05 * 2 ** (attempt - 1))
        samples = [backoff_s(attempt, 0.05, 2.0) for _ in range(300)]
        assert all(0 <= s <= cap for s in samples)
        assert max(samples) > 0.8 * cap  # the whole window is used (full jitter)
        assert min(samples) < 0.2 * cap
    assert backoff_s(50, 0.05, 2.0) <= 2.0
    assert backoff_s(1, 0, 1) == 0.0
    with pytest.raises(ValueError):
        backoff_s(0, 1, 1)


def test_retrier_decisions() -> None:
    r = Retrier(RetrySettings(max_attempts=3, base_backoff_ms=10, max_backoff_ms=100))
    r.record_request()
    assert r.should_retry(1, FailureKind.CONNECT_ERROR, bytes_sent_to_client=False)
    assert not r.should_retry(1, FailureKind.UPSTREAM_4XX, bytes_sent_to_client=False)
    assert not r.should_retry(1, FailureKind.STREAM_BROKEN, bytes_sent_to_client=True)
    assert not r.should_retry(3, FailureKind.UPSTREAM_5XX, bytes_sent_to_client=False)
    assert 0 <= (r.delay_s(1) or 0) <= 0.01
    assert r.delay_s(1, retry_after_s=1.5) == 1.5  # Retry-After wins over a shorter backoff
    assert r.delay_s(1, retry_after_s=60) is None  # too long to hold a request for
    with pytest.raises(ValueError):
        RetrySettings(base_backoff_ms=100, max_backoff_ms=10)


def test_retryable_taxonomy() -> None:
    for kind in FailureKind:
        assert not is_retryable(kind, bytes_sent_to_client=True)
        assert is_retryable(kind, False) == (kind is not FailureKind.UPSTREAM_4XX)


def test_parse_retry_after() -> None:
    assert parse_retry_after("7") == 7.0
    assert parse_retry_after(" 1.5 ") == 1.5
    assert parse_retry_after("-3") == 0.0
    assert parse_retry_after(None) is None
    assert parse_retry_after("") is None
    assert parse_retry_after("soon") is None
    assert parse_retry_after("inf") is None
    now = 1_700_000_000.0
    date = email.utils.formatdate(now + 30, usegmt=True)
    assert parse_retry_after(date, now=now) == pytest.approx(30, abs=1)
    assert parse_retry_after(email.utils.formatdate(now - 30, usegmt=True), now=now) == 0.0
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412480.0) == 0.0
