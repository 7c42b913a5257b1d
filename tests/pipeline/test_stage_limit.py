"""Limit: the tenant's limits (429 when reached) and the request as sent upstream."""

from __future__ import annotations

import pytest

from gateway.errors import GatewayError
from gateway.governance.service import GovernanceService, Principal
from gateway.infra.shared_state import SharedState
from gateway.pipeline.call import Call
from gateway.pipeline.stages.limit import Limit
from tests.pipeline.conftest import FakeNext, chat_body, make_call, runtime

LIMITED = {"tenants": {"team": {"limits": {"requests_per_minute": 2}}}}


def limit(**governance) -> tuple[Limit, Call]:
    rt = runtime(governance=governance)
    return Limit(GovernanceService(SharedState(None), rt)), make_call(rt.snapshot, tenant="team")


def as_team(call: Call, body: dict | None = None) -> Call:
    fresh = make_call(call.snap, body, tenant="team")
    fresh.principal = Principal("team", "")
    return fresh


async def test_429_once_the_tenant_limit_is_reached() -> None:
    stage, call = limit(**LIMITED)
    fake = FakeNext()
    for remaining in ("1", "0"):
        c = as_team(call)
        assert await stage(c, fake) is fake.response
        assert c.ctx.governance is not None
        assert c.ctx.extra_headers["x-ratelimit-remaining-requests"] == remaining
    refused = as_team(call)
    with pytest.raises(GatewayError) as raised:
        await stage(refused, fake)
    assert raised.value.status == 429 and raised.value.code == "rate_limit_exceeded"
    assert int(raised.value.headers["retry-after"]) >= 1
    assert len(fake.calls) == 2


async def test_other_tenants_are_not_limited() -> None:
    stage, call = limit(**LIMITED)
    fake = FakeNext()
    for _ in range(3):
        c = make_call(call.snap, tenant="other")
        c.principal = Principal("other", "")
        await stage(c, fake)
        assert c.ctx.extra_headers is None
    assert len(fake.calls) == 3


async def test_a_stream_asks_upstream_for_usage() -> None:
    stage, call = limit()
    c = as_team(call, chat_body(stream=True))
    fake = FakeNext()
    await stage(c, fake)
    assert fake.calls == [c]
    assert c.sent.body["stream_options"] == {"include_usage": True}
    assert "stream_options" not in c.acc.body
    unary = as_team(call)
    await stage(unary, fake)
    assert unary.sent is unary.acc
