"""Classify: tokens, request class and chain of pools on the call; too long a prompt refused."""

from __future__ import annotations

import pytest

from gateway.errors import GatewayError
from gateway.pipeline.stages.classify import Classify
from gateway.runtime import Snapshot
from tests.pipeline.conftest import FakeNext, chat_body, http_request, make_call, snapshot


def routed() -> Snapshot:
    return snapshot(
        classes=[
            {"name": "urgent", "priority": ["high"]},
            {"name": "long", "min_prompt_tokens": 40},
        ],
        pools={"big": {"members": ["p2"]}, "fast": {"members": ["p1"], "fallback": ["big"]}},
        alias={"routes": {"long": "big", "urgent": "fast"}, "context_window": 400},
    )


@pytest.mark.parametrize(
    ("text", "priority", "cls", "chain"),
    [
        ("hi", None, "default", ["main"]),
        ("word " * 60, None, "long", ["big"]),
        ("hi", "high", "urgent", ["fast", "big"]),
    ],
)
async def test_sets_the_decision_and_the_class(text, priority, cls, chain) -> None:
    headers = {"x-gateway-priority": priority} if priority else {}
    call = make_call(routed(), chat_body(text), http_request(headers=headers), classify=False)
    fake = FakeNext()
    assert await Classify()(call, fake) is fake.response
    assert fake.calls == [call]
    assert (call.decision.request_class, call.decision.chain) == (cls, chain)
    assert call.ctx.request_class == cls
    assert call.ctx.prompt_tokens == call.decision.prompt_tokens > 0
    assert call.decision.alias_name == "chat"


async def test_a_prompt_over_the_context_window_is_refused() -> None:
    call = make_call(routed(), chat_body("word " * 500), classify=False)
    fake = FakeNext()
    with pytest.raises(GatewayError) as raised:
        await Classify()(call, fake)
    assert raised.value.status == 400 and raised.value.code == "context_length_exceeded"
    assert fake.calls == []
