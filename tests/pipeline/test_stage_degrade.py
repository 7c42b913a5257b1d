"""Degrade: an exhausted or shed request gets the rule's answer; a replay's failure is raised."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from gateway.errors import GatewayError
from gateway.pipeline.candidates import Shed
from gateway.pipeline.client_errors import Exhausted
from gateway.pipeline.stages.degrade import Degrade
from gateway.resilience.degradation import Degradation
from tests.pipeline.conftest import FakeNext, error_of, make_call, snapshot

RULES = """
rules:
  - name: busy
    match: {aliases: [chat]}
    template: "Busy: {alias} for {tenant}."
"""


def exhausted() -> Exhausted:
    return Exhausted(503, "all failed", type="upstream_error", code="upstream_error")


def degrade(tmp_path: Path) -> Degrade:
    (tmp_path / "rules.yaml").write_text(RULES)
    degradation = Degradation(tmp_path, None)
    assert degradation.rules is not None and degradation.rules.reload()
    return Degrade(degradation)


@pytest.mark.parametrize("error", [exhausted(), Shed("main", 3)], ids=["exhausted", "shed"])
async def test_nothing_could_answer_gives_the_rule_answer(tmp_path: Path, error) -> None:
    stage, call = degrade(tmp_path), make_call(snapshot(), tenant="team")
    response = await stage(call, FakeNext(error=error))
    assert response.status_code == 200
    assert response.headers["x-gateway-degraded"] == "true"
    assert response.headers["x-gateway-rule"] == "busy"
    doc = orjson.loads(bytes(response.body))
    assert doc["choices"][0]["message"]["content"] == "Busy: chat for team."
    assert call.ctx.degraded and stage.degradation.degraded == 1


async def test_a_replay_is_not_degraded(tmp_path: Path) -> None:
    stage, call = degrade(tmp_path), make_call(snapshot())
    call.ctx.replay = True
    err = exhausted()
    with pytest.raises(Exhausted) as raised:
        await stage(call, FakeNext(error=err))
    assert raised.value is err and not call.ctx.degraded


async def test_other_errors_and_answers_pass_through(tmp_path: Path) -> None:
    stage = degrade(tmp_path)
    err = GatewayError(400, "bad")
    with pytest.raises(GatewayError) as raised:
        await stage(make_call(snapshot()), FakeNext(error=err))
    assert raised.value is err
    fake = FakeNext()
    assert await stage(make_call(snapshot()), fake) is fake.response
    assert stage.degradation.degraded == 0


async def test_without_rules_the_error_itself_is_the_answer() -> None:
    stage, call = Degrade(Degradation(None, None)), make_call(snapshot())
    response = await stage(call, FakeNext(error=exhausted()))
    assert response.status_code == 503 and error_of(response)["code"] == "upstream_error"
    assert not call.ctx.degraded
