"""Chat's `tool_choice: {"type": "allowed_tools", ...}` on Anthropic, Gemini and Bedrock members:
served as the plain request it means (only the allowed tools offered, `tool_choice` its mode),
streamed or not, instead of a 400 (Anthropic's not even retried on another member).

The official `openai` client -> gateway -> each vendor's shaped simulator over loopback.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from loadtests.simulator.testing import Fleet
from tests.apis.vendors import ANTHROPIC, VENDORS, vendor_gateway
from tests.support import GatewayServer, validate

FLEET: list[Any] = [ANTHROPIC]


def _fn(name: str, prop: str) -> dict[str, Any]:
    schema = {"type": "object", "properties": {prop: {"type": "string"}}, "required": [prop]}
    return {"type": "function", "function": {"name": name, "parameters": schema}}


TOOLS = [_fn("get_weather", "city"), _fn("get_time", "tz"), _fn("get_news", "topic")]
USER = [{"role": "user", "content": "What is the weather in Paris?"}]


def allowed(mode: str, *names: str) -> dict[str, Any]:
    refs = [{"type": "function", "function": {"name": n}} for n in names]
    return {"type": "allowed_tools", "allowed_tools": {"mode": mode, "tools": refs}}


@pytest.fixture(scope="module")
def gw(fleet: Fleet) -> Iterator[GatewayServer]:
    with vendor_gateway(fleet) as server:
        yield server


@pytest.fixture(scope="module")
def client(gw: GatewayServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0)


@pytest.mark.parametrize("vendor", VENDORS)
@pytest.mark.parametrize("names", [("get_time",), ("get_news",), ("get_time", "get_news")])
def test_required_mode_calls_only_allowed_tools(
    client: openai.OpenAI, vendor: str, names: tuple[str, ...]
) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model=vendor,
        messages=USER,
        tools=TOOLS,
        tool_choice=allowed("required", *names),
        max_tokens=60,
    )
    validate("CreateChatCompletionResponse", raw.http_response.json())
    choice = raw.parse().choices[0]
    calls = choice.message.tool_calls or []
    assert choice.finish_reason == "tool_calls" and calls
    assert {c.function.name for c in calls} <= set(names)
    for c in calls:
        json.loads(c.function.arguments)


@pytest.mark.parametrize("vendor", VENDORS)
def test_required_mode_streamed(client: openai.OpenAI, vendor: str) -> None:
    stream = client.chat.completions.create(
        model=vendor,
        messages=USER,
        tools=TOOLS,
        tool_choice=allowed("required", "get_news"),
        max_tokens=60,
        stream=True,
    )
    names = [
        tc.function.name
        for chunk in stream
        for ch in chunk.choices
        for tc in ch.delta.tool_calls or []
        if tc.function and tc.function.name
    ]
    assert names and set(names) == {"get_news"}


@pytest.mark.parametrize("vendor", VENDORS)
def test_auto_mode_is_served(client: openai.OpenAI, vendor: str) -> None:
    resp = client.chat.completions.create(
        model=vendor, messages=USER, tools=TOOLS, tool_choice=allowed("auto", "get_time")
    )
    calls = resp.choices[0].message.tool_calls or []
    assert {c.function.name for c in calls} <= {"get_time"}
