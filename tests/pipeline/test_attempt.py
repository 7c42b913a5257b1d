"""`Attempt`: settled exactly once, whichever way its scope ends."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.context import Context
from gateway.pipeline.attempt import Attempt
from gateway.providers.upstream import UpstreamFailure
from gateway.resilience.admission import Admission
from gateway.runtime import ProviderState
from tests.pipeline.conftest import snapshot


class Counted(Admission):
    def __init__(self) -> None:
        super().__init__()
        self.releases = 0

    def released(self) -> None:
        self.releases += 1
        super().released()


def setup() -> tuple[ProviderState, Context, Counted]:
    return snapshot().providers["p1"], Context("r", 0.0), Counted()


def state(m: ProviderState, admission: Counted) -> dict[str, Any]:
    b = m.breaker.snapshot()
    return {
        "inflight": m.member.inflight,
        "failures": m.member.failures,
        "breaker_ok": b["window_successes"],
        "breaker_failed": b["window_failures"],
        "released": admission.releases,
    }


async def test_success_settles_once() -> None:
    m, ctx, adm = setup()
    async with Attempt(m, ctx, adm) as attempt:
        assert m.member.inflight == 1 and m.requests == 1
        attempt.succeed(0.05)
    attempt.succeed(0.05)
    attempt.cancel()
    want = {"inflight": 0, "failures": 0, "breaker_ok": 1, "breaker_failed": 0, "released": 1}
    assert state(m, adm) == want
    assert attempt.settled and ctx.failures == []


async def test_upstream_failure_counts_against_the_breaker() -> None:
    m, ctx, adm = setup()
    f = UpstreamFailure("upstream_5xx", "boom", status=500)
    with pytest.raises(UpstreamFailure) as raised:
        async with Attempt(m, ctx, adm) as attempt:
            raise f
    assert raised.value is f
    attempt.fail(f)  # twice: nothing more
    want = {"inflight": 0, "failures": 1, "breaker_ok": 0, "breaker_failed": 1, "released": 1}
    assert state(m, adm) == want
    assert ctx.failures == ["p1:upstream_5xx"]


async def test_any_other_exception_becomes_an_attempt_error() -> None:
    m, ctx, adm = setup()
    with pytest.raises(UpstreamFailure) as raised:
        async with Attempt(m, ctx, adm):
            raise KeyError("bug")
    assert (raised.value.kind, raised.value.detail) == ("attempt_error", "KeyError")
    assert raised.value.__suppress_context__
    assert state(m, adm)["breaker_failed"] == 1 and m.member.inflight == 0
    assert ctx.failures == ["p1:attempt_error"]


async def test_cancellation_releases_without_a_failure() -> None:
    m, ctx, adm = setup()
    entered = asyncio.Event()

    async def scope() -> None:
        async with Attempt(m, ctx, adm):
            entered.set()
            await asyncio.sleep(10)

    task = asyncio.ensure_future(scope())
    await entered.wait()
    assert m.member.inflight == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    want = {"inflight": 0, "failures": 0, "breaker_ok": 0, "breaker_failed": 0, "released": 1}
    assert state(m, adm) == want
    assert ctx.failures == []


async def test_leaving_without_an_outcome_cancels() -> None:
    m, ctx, adm = setup()
    async with Attempt(m, ctx, adm) as attempt:
        pass
    assert attempt.settled and state(m, adm)["inflight"] == 0
    assert state(m, adm)["breaker_ok"] == 0


@pytest.mark.parametrize("end", ["cancel", "succeed"])
async def test_kept_attempt_stays_open_until_settled(end: str) -> None:
    m, ctx, adm = setup()
    async with Attempt(m, ctx, adm) as attempt:
        attempt.keep()
    assert not attempt.settled and m.member.inflight == 1 and adm.releases == 0
    if end == "cancel":
        attempt.cancel()
    else:
        attempt.succeed(0.1)
    attempt.cancel()
    attempt.succeed(0.1)
    assert attempt.settled and m.member.inflight == 0 and adm.releases == 1
    assert state(m, adm)["breaker_ok"] == (1 if end == "succeed" else 0)


async def test_a_4xx_does_not_count_against_the_breaker() -> None:
    m, ctx, adm = setup()
    with pytest.raises(UpstreamFailure):
        async with Attempt(m, ctx, adm):
            raise UpstreamFailure("upstream_4xx", status=400)
    want = {"inflight": 0, "failures": 0, "breaker_ok": 0, "breaker_failed": 0, "released": 1}
    assert state(m, adm) == want
    assert ctx.failures == ["p1:upstream_4xx"]
