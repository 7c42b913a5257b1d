"""Single-flight: one leader per key, its answer or failure reaches every waiter, bounded waits."""

from __future__ import annotations

import asyncio

import pytest

from gateway.cache.singleflight import LeaderGone, SingleFlight, wait


async def test_the_first_leads_the_others_get_its_answer() -> None:
    flights = SingleFlight()
    assert flights.join("k") is None  # the leader
    waiters = [flights.join("k") for _ in range(3)]
    assert all(w is not None for w in waiters)
    assert len(flights) == 1
    flights.resolve("k", b"answer")
    assert [await wait(w, 1.0) for w in waiters if w is not None] == [b"answer"] * 3
    assert len(flights) == 0
    assert flights.join("k") is None  # a later request leads again


async def test_a_leader_gone_lets_the_waiters_go_on_their_own() -> None:
    flights = SingleFlight()
    assert flights.join("k") is None
    fut = flights.join("k")
    assert fut is not None
    flights.fail("k", LeaderGone())
    assert await wait(fut, 1.0) is None


async def test_a_leader_failure_reaches_the_waiters() -> None:
    flights = SingleFlight()
    assert flights.join("k") is None
    fut = flights.join("k")
    assert fut is not None
    flights.fail("k", RuntimeError("upstream"))
    with pytest.raises(RuntimeError):
        await wait(fut, 1.0)


async def test_waits_are_bounded_and_a_timed_out_waiter_does_not_cancel_the_flight() -> None:
    flights = SingleFlight()
    assert flights.join("k") is None
    fut = flights.join("k")
    assert fut is not None
    assert await wait(fut, 0.01) is None
    assert not fut.cancelled()  # shielded: others may still wait on it
    flights.resolve("k", b"late")
    assert await asyncio.wait_for(fut, 1.0) == b"late"


async def test_failing_without_waiters_leaves_no_unretrieved_exception() -> None:
    flights = SingleFlight()
    assert flights.join("k") is None
    flights.fail("k", RuntimeError("nobody waits"))
    assert len(flights) == 0
