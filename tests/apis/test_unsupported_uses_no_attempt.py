"""A member that cannot express a request (`unsupported`: nothing is sent) uses none of the
pool's or the request's attempts: three Anthropic-type members ahead of the one OpenAI member
had used them all up, and a logprobs request got a 400 the OpenAI member would have answered.
The official `openai` client -> a real gateway -> the project's simulators, default limits."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

from loadtests.simulator.testing import Fleet
from tests.support import GatewayServer

FLEET: list[Any] = [
    {"name": "oa", "profile": "fast"},
    *({"name": f"an{i}", "profile": "fast", "wire": "anthropic", "api_key": "k"} for i in range(3)),
]


@pytest.fixture(scope="module")
def gw(fleet: Fleet) -> Iterator[GatewayServer]:
    vendors = "\n".join(
        f"  an{i}: {{type: anthropic, base_url: '{fleet.root_url(f'an{i}')}', "
        f"api_key_env: UNSENT_KEY, models: {{'*': claude-sim-1}}}}"
        for i in range(3)
    )
    policy = f"""
providers:
  oa: {{base_url: '{fleet.url("oa")}'}}
{vendors}
pools:
  mixed: {{members: [an0, an1, an2, oa], balancer: {{strategy: round_robin}}}}
models:
  chat: {{pool: mixed, cache: {{exact: {{enabled: false}}}}}}
"""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("UNSENT_KEY", "k")
        with GatewayServer(policy) as server:
            yield server


@pytest.mark.parametrize("stream", [False, True])
def test_the_member_that_can_answer_is_reached_whatever_the_order(
    gw: GatewayServer, stream: bool
) -> None:
    client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0)
    for i in range(4):  # round robin: each member first once
        raw = client.chat.completions.with_raw_response.create(
            model="chat",
            messages=[{"role": "user", "content": f"hi {i}"}],
            logprobs=True,
            max_tokens=4,
            stream=stream,
        )
        assert raw.headers["x-gateway-provider"] == "oa"
        if stream:
            assert list(raw.parse())
        else:
            assert raw.parse().choices[0].message.content
