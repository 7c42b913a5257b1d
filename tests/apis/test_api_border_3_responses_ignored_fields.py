"""Responses fields the gateway accepts without forwarding (`truncation`, `service_tier`,
`reasoning`, `prompt_cache_key`, `stream_options`) are checked as OpenAI checks them: a value
OpenAI refuses is a 400 naming the field (it was a 200), one it takes still passes.

The official `openai` client -> gateway -> the project's simulator over loopback.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

from loadtests.simulator.testing import Fleet
from tests.support import GatewayServer, policy

FLEET: list[Any] = ["i"]
REFUSED: dict[str, tuple[dict[str, Any], str, str]] = {
    "truncation_unknown": ({"truncation": "bogus"}, "truncation", "invalid_value"),
    "truncation_number": ({"truncation": 5}, "truncation", "invalid_type"),
    "service_tier_unknown": ({"service_tier": "turbo"}, "service_tier", "invalid_value"),
    "service_tier_list": ({"service_tier": ["auto"]}, "service_tier", "invalid_type"),
    "reasoning_string": ({"reasoning": "high"}, "reasoning", "invalid_type"),
    "prompt_cache_key_number": ({"prompt_cache_key": 7}, "prompt_cache_key", "invalid_type"),
    "stream_options_list": (
        {"stream": True, "stream_options": []},
        "stream_options",
        "invalid_type",
    ),
}
ACCEPTED: dict[str, dict[str, Any]] = {
    "truncation_auto": {"truncation": "auto"},
    "truncation_disabled": {"truncation": "disabled"},
    "service_tier_flex": {"service_tier": "flex"},
    "reasoning_effort": {"reasoning": {"effort": "low"}},
    "prompt_cache_key": {"prompt_cache_key": "k-1"},
    "nulls": {"truncation": None, "service_tier": None, "reasoning": None},
}


@pytest.fixture(scope="module")
def gw(fleet: Fleet) -> Iterator[GatewayServer]:
    with GatewayServer(policy(fleet)) as server:
        yield server


@pytest.fixture(scope="module")
def client(gw: GatewayServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0)


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_values_openai_refuses_are_a_400(client: openai.OpenAI, case: str) -> None:
    fields, param, code = REFUSED[case]
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model="chat", input="Hi", max_output_tokens=4, extra_body=fields)
    assert err.value.param == param and err.value.code == code


@pytest.mark.parametrize("case", sorted(ACCEPTED))
def test_values_openai_takes_pass(client: openai.OpenAI, case: str) -> None:
    resp = client.responses.create(
        model="chat", input="Hi", max_output_tokens=4, extra_body=ACCEPTED[case]
    )
    assert resp.output_text
