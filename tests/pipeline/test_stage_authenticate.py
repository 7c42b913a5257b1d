"""Authenticate: the tenant and key of the caller from the policy's keys; 401 otherwise."""

from __future__ import annotations

import pytest

from gateway.apis.messages import MessagesAPI
from gateway.errors import GatewayError
from gateway.governance.service import GovernanceService
from gateway.governance.static_keys import hash_key
from gateway.infra.shared_state import SharedState
from gateway.pipeline.call import Call
from gateway.pipeline.stages.authenticate import Authenticate
from gateway.runtime import Runtime
from tests.pipeline.conftest import FakeNext, incoming, runtime

KEYED = {"auth": {"keys": [{"tenant": "team-a", "key_sha256": hash_key("secret-a")}]}}


def stage(rt: Runtime) -> Authenticate:
    return Authenticate(GovernanceService(SharedState(None), rt))


async def test_a_policy_key_names_the_tenant() -> None:
    rt = runtime(**KEYED)
    call, fake = incoming(rt.snapshot, headers={"authorization": "Bearer secret-a"}), FakeNext()
    assert await stage(rt)(call, fake) is fake.response
    assert fake.calls == [call]
    key_id = "sk_" + hash_key("secret-a")[:12]
    assert (call.ctx.tenant, call.ctx.key_id) == ("team-a", key_id)
    assert (call.principal.tenant, call.principal.key_id) == ("team-a", key_id)


@pytest.mark.parametrize(
    "headers",
    [{"authorization": "Bearer wrong"}, {}, {"authorization": "Bearer sk-gw-unknown"}],
    ids=["bad", "missing", "unknown-managed"],
)
async def test_a_bad_key_is_401(headers: dict[str, str]) -> None:
    rt = runtime(**KEYED)
    call, fake = incoming(rt.snapshot, headers=headers), FakeNext()
    with pytest.raises(GatewayError) as raised:
        await stage(rt)(call, fake)
    assert (raised.value.status, raised.value.code) == (401, "invalid_api_key")
    assert fake.calls == [] and call.ctx.tenant == "default"


async def test_an_open_gateway_has_one_tenant() -> None:
    rt = runtime()
    call = incoming(rt.snapshot, headers={"authorization": "Bearer anything"})
    await stage(rt)(call, FakeNext())
    assert (call.ctx.tenant, call.ctx.key_id) == ("default", "")


async def test_require_key_refuses_an_open_gateway_without_key() -> None:
    rt = runtime(governance={"require_key": True})
    with pytest.raises(GatewayError) as raised:
        await stage(rt)(incoming(rt.snapshot), FakeNext())
    assert raised.value.status == 401


async def test_an_inbound_api_names_its_own_header() -> None:
    rt = runtime(**KEYED)
    call = incoming(rt.snapshot, headers={"x-api-key": "secret-a"})
    call = Call(call.ctx, rt.snapshot, "chat", call.request, MessagesAPI().begin())
    await stage(rt)(call, FakeNext())
    assert call.ctx.tenant == "team-a"
