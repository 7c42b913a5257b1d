"""Chat `stop` values an Anthropic member cannot pass on: Anthropic refuses empty and
whitespace-only stop sequences (a 400 the client got although the request is valid for OpenAI).
An empty one stops nothing and is left out; a whitespace one ("\\n") makes the Anthropic attempt
unsupported, so an OpenAI member serves it, and alone it is a clear 400.

The official `openai` client -> gateway -> the project's simulators (OpenAI and Anthropic shaped).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

from loadtests.simulator.testing import Fleet
from tests.support import GatewayServer

FLEET: list[Any] = [
    {"name": "oa", "profile": "fast"},
    {"name": "an", "profile": "fast", "wire": "anthropic", "api_key": "ak-stop-3"},
]
USER = [{"role": "user", "content": "Say hi"}]
WHITESPACE: dict[str, Any] = {
    "newline": "\n",
    "newline_list": ["\n"],
    "blank_among_others": ["END", "  "],
    "tab_newline": ["\t\n"],
}


@pytest.fixture(scope="module")
def gw(fleet: Fleet) -> Iterator[GatewayServer]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STOP3_AN_KEY", "ak-stop-3")
        policy = f"""
providers:
  oa: {{base_url: '{fleet.url("oa")}'}}
  an: {{type: anthropic, base_url: '{fleet.root_url("an")}', api_key_env: STOP3_AN_KEY, models: {{'*': claude-sim-1}}}}
pools:
  pan: {{members: [an]}}
  mixed: {{members: [an, oa], balancer: {{strategy: round_robin}}}}
models:
  an: {{pool: pan}}
  mixed: {{pool: mixed}}
"""
        with GatewayServer(policy) as server:
            yield server


@pytest.fixture(scope="module")
def client(gw: GatewayServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0)


@pytest.mark.parametrize("case", sorted(WHITESPACE))
def test_whitespace_stop_is_served_by_a_member_that_takes_it(
    client: openai.OpenAI, case: str
) -> None:
    for _ in range(4):  # round robin starts on each member in turn
        raw = client.chat.completions.with_raw_response.create(
            model="mixed", messages=USER, max_tokens=4, stop=WHITESPACE[case]
        )
        assert raw.headers["x-gateway-provider"] == "oa"


@pytest.mark.parametrize("case", sorted(WHITESPACE))
@pytest.mark.parametrize("stream", [False, True])
def test_whitespace_stop_alone_on_anthropic_is_a_clear_400(
    client: openai.OpenAI, case: str, stream: bool
) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model="an", messages=USER, max_tokens=4, stop=WHITESPACE[case], stream=stream
        )
    assert err.value.code == "unsupported_endpoint"


@pytest.mark.parametrize("stop", ["", ["", "END"], ["STOP", "x y"]])
def test_empty_or_inner_whitespace_stops_are_served_by_anthropic(
    client: openai.OpenAI, stop: Any
) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model="an", messages=USER, max_tokens=4, stop=stop
    )
    assert raw.headers["x-gateway-provider"] == "an"
    assert raw.parse().choices[0].message.content
