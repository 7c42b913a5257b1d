"""The Messages and Responses APIs over provider types: an `openai` and an `anthropic` member
(provider-shaped simulators that check each request), alone and mixed in one pool that keeps
answering every API, streams included, while one of them is down."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from gateway.resilience.breaker import BreakerState
from loadtests.simulator.bedrock import BedrockCredentials, run_bedrock
from loadtests.simulator.testing import Fleet
from tests.support import GatewayServer

AN_KEY, AZ_KEY = "ak-sim-inbound", "az-sim-inbound"
BR = BedrockCredentials("AKIDINBOUNDTEST", "inbound-secret-access-key", None, "eu-west-1")
BR_MODEL = "anthropic.claude-3-5-haiku-20241022-v1:0"
TOOL_AN = {
    "name": "get_weather",
    "description": "Weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
TOOL_OA = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather in a city",
    "parameters": TOOL_AN["input_schema"],
    "strict": False,
}
SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string"}, "score": {"type": "integer"}},
    "required": ["answer", "score"],
    "additionalProperties": False,
}


FLEET: list[Any] = [
    {"name": "oa", "profile": "fast"},
    {"name": "an", "profile": "fast", "wire": "anthropic", "api_key": AN_KEY},
    {
        "name": "az",
        "profile": "fast",
        "wire": "azure",
        "api_key": AZ_KEY,
        "overrides": {"models": ["gpt4o-dep"]},
    },
]


@pytest.fixture(scope="module")
def bedrock() -> Iterator[str]:
    with run_bedrock(BR, models=(BR_MODEL,)) as sim:
        yield sim.url


def _policy(fleet: Fleet, bedrock: str) -> str:
    return f"""
providers:
  oa: {{base_url: '{fleet.url("oa")}', breaker: {{consecutive_failures: 3, cooldown_s: 30}}}}
  an:
    type: anthropic
    base_url: '{fleet.root_url("an")}'
    api_key_env: SIM_ANTHROPIC_KEY_INBOUND
    models: {{'*': claude-sim-1}}
    breaker: {{consecutive_failures: 3, cooldown_s: 30}}
  az:
    type: azure
    base_url: '{fleet.root_url("az")}'
    api_key_env: SIM_AZURE_KEY_INBOUND
    models: {{'*': gpt4o-dep}}
  br:
    type: bedrock
    base_url: '{bedrock}'
    models: {{'*': '{BR_MODEL}'}}
    bedrock: {{region: eu-west-1, access_key_id_env: BR_INBOUND_KEY_ID,
               secret_access_key_env: BR_INBOUND_SECRET}}
pools:
  openai: {{members: [oa]}}
  anthropic: {{members: [an]}}
  azure: {{members: [az]}}
  bedrock: {{members: [br]}}
  mixed: {{members: [oa, an], balancer: {{strategy: round_robin}}, max_attempts: 2}}
models:
  gpt: {{pool: openai}}
  claude: {{pool: anthropic}}
  azure: {{pool: azure}}
  bedrock: {{pool: bedrock}}
  mixed: {{pool: mixed}}
"""


@pytest.fixture(scope="module")
def gw(fleet: Fleet, bedrock: str) -> Iterator[GatewayServer]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SIM_ANTHROPIC_KEY_INBOUND", AN_KEY)
        mp.setenv("SIM_AZURE_KEY_INBOUND", AZ_KEY)
        mp.setenv("BR_INBOUND_KEY_ID", BR.access_key_id)
        mp.setenv("BR_INBOUND_SECRET", BR.secret_access_key)
        with GatewayServer(_policy(fleet, bedrock)) as server:
            yield server


@pytest.fixture(scope="module")
def claude(gw: GatewayServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gw.url, api_key="x", max_retries=0)


@pytest.fixture(scope="module")
def oa(gw: GatewayServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0)


def _streamed_text(oa: openai.OpenAI, **kw: object) -> str:
    """A Responses stream through the SDK; it ends completed, or incomplete at the length cap."""
    with oa.responses.stream(**kw) as stream:  # type: ignore[arg-type]
        last = [ev for ev in stream][-1]
    assert last.type in ("response.completed", "response.incomplete")
    return last.response.output_text


def _requests(fleet: Fleet, name: str) -> int:
    return sum(int(v) for v in fleet.stats(name)["by_endpoint"].values())


@pytest.mark.parametrize("model", ["gpt", "claude", "azure", "bedrock"])
def test_every_api_on_each_provider_type(
    claude: anthropic.Anthropic, oa: openai.OpenAI, model: str
) -> None:
    """Plain, streamed, tools and JSON-schema output through Messages and Responses."""
    msg = claude.messages.create(
        model=model,
        max_tokens=12,
        system="Be terse.",
        messages=[{"role": "user", "content": "Name a river."}],
    )
    assert msg.model == model and msg.content[0].text and msg.usage.output_tokens > 0
    with claude.messages.stream(
        model=model, max_tokens=12, messages=[{"role": "user", "content": "Name a river."}]
    ) as stream:
        final = stream.get_final_message()
    assert final.content[0].text and final.stop_reason in ("end_turn", "max_tokens")
    tool = claude.messages.create(
        model=model,
        max_tokens=60,
        tools=[TOOL_AN],
        tool_choice={"type": "tool", "name": "get_weather"},
        messages=[{"role": "user", "content": "Weather in Paris?"}],
    )
    use = tool.content[-1]
    assert tool.stop_reason == "tool_use" and use.type == "tool_use" and "city" in use.input
    done = claude.messages.create(
        model=model,
        max_tokens=12,
        tools=[TOOL_AN],
        messages=[
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": tool.content},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny"}],
            },
        ],
    )
    assert done.content[0].type == "text"
    as_json = claude.messages.create(
        model=model,
        max_tokens=80,
        output_config={"format": {"type": "json_schema", "schema": SCHEMA}},
        messages=[{"role": "user", "content": "Rate this river."}],
    )
    assert set(json.loads(as_json.content[0].text)) == {"answer", "score"}

    resp = oa.responses.create(
        model=model, instructions="Be terse.", input="Name a river.", max_output_tokens=40
    )
    assert resp.model == model and resp.output_text
    assert _streamed_text(oa, model=model, input="Name a river.", max_output_tokens=40)
    call = oa.responses.create(
        model=model, input="Weather in Paris?", tools=[TOOL_OA], tool_choice="required"
    )
    fc = call.output[0]
    assert fc.type == "function_call" and "city" in json.loads(fc.arguments)
    after = oa.responses.create(
        model=model,
        previous_response_id=call.id,
        tools=[TOOL_OA],
        input=[{"type": "function_call_output", "call_id": fc.call_id, "output": "sunny"}],
    )
    assert after.output_text
    structured = oa.responses.create(
        model=model,
        input="Rate this river.",
        text={
            "format": {"type": "json_schema", "name": "rating", "schema": SCHEMA, "strict": True}
        },
    )
    assert set(json.loads(structured.output_text)) == {"answer", "score"}


def _metric(gw: GatewayServer, name: str, **labels: str) -> float:
    total = 0.0
    for line in httpx.get(gw.url + "/metrics").text.splitlines():
        if line.startswith((name + "{", name + "_total{")) and all(
            f'{k}="{v}"' in line for k, v in labels.items()
        ):
            total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.mark.parametrize("down", ["oa", "an"])
def test_mixed_pool_answers_every_api_while_one_type_is_down(
    fleet: Fleet, gw: GatewayServer, claude: anthropic.Anthropic, oa: openai.OpenAI, down: str
) -> None:
    up = "an" if down == "oa" else "oa"
    fleet.set_faults(down, error_rate=1.0, error_status=[529 if down == "an" else 500])
    try:
        before = _requests(fleet, up)
        for i in range(4):
            msg = claude.messages.create(
                model="mixed", max_tokens=6, messages=[{"role": "user", "content": f"hi {i}"}]
            )
            assert msg.content[0].text
            with claude.messages.stream(
                model="mixed", max_tokens=6, messages=[{"role": "user", "content": f"yo {i}"}]
            ) as stream:
                assert stream.get_final_message().content[0].text
            plain = oa.responses.create(model="mixed", input=f"hey {i}", max_output_tokens=20)
            assert plain.output_text
            assert _streamed_text(oa, model="mixed", input=f"so {i}", max_output_tokens=20)
        assert _requests(fleet, up) - before == 16  # every request answered by the member up
        assert _metric(gw, "gateway_breaker_state", provider=down, state="open") == 1
    finally:
        fleet.clear_faults(down)
        gw.app.state.runtime.snapshot.providers[down].breaker.force(BreakerState.CLOSED)
