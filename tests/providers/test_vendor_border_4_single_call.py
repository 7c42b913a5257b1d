"""`parallel_tool_calls: false` holds on Gemini and Bedrock members: neither vendor's API has a
switch for it (Gemini's function calling modes are AUTO, ANY, NONE and VALIDATED; Converse's
toolChoice is auto, any or tool), so the gateway cuts the answer to its first tool call, unary
and streamed, with the finish reason `tool_calls` and the vendor's usage kept.

Official openai client -> gateway -> the Gemini- and Bedrock-shaped simulators, which call every
tool the user's turn names (several calls in one answer) unless told otherwise.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest

pytest.importorskip("google.genai", reason="the Gemini simulator checks requests with google-genai")

from loadtests.simulator.bedrock import run_bedrock  # noqa: E402
from loadtests.simulator.gemini import run_gemini  # noqa: E402
from tests.providers.test_bedrock_gateway import CREDS, ENV, MODEL, WEATHER  # noqa: E402
from tests.providers.test_bedrock_gateway import policy as bedrock_policy  # noqa: E402
from tests.providers.test_gemini import KEY  # noqa: E402
from tests.providers.test_gemini import _policy as gemini_policy  # noqa: E402
from tests.support import GatewayServer, environment  # noqa: E402

TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Local time in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
ASK: Any = [{"role": "user", "content": "Call get_weather and get_time for Paris."}]
VENDORS = ["gemini", "bedrock"]


@pytest.fixture(scope="module")
def clients() -> Iterator[dict[str, openai.OpenAI]]:
    with (
        environment(GEMINI_TEST_KEY=KEY, **ENV),
        run_gemini(KEY) as gm,
        run_bedrock(CREDS, models=(MODEL,)) as br,
        GatewayServer(gemini_policy(gm.url)) as g1,
        GatewayServer(bedrock_policy(br.url)) as g2,
    ):
        yield {
            name: openai.OpenAI(base_url=g.base_url, api_key="unused", max_retries=0)
            for name, g in (("gemini", g1), ("bedrock", g2))
        }


def _unary(client: openai.OpenAI, **kw: Any) -> Any:
    return client.chat.completions.create(model="chat", messages=ASK, tools=[WEATHER, TIME], **kw)


def _streamed(client: openai.OpenAI, **kw: Any) -> tuple[dict[int, dict[str, str]], list[Any]]:
    """The tool calls a stream assembles (by index) and its chunks."""
    chunks = list(
        client.chat.completions.create(
            model="chat",
            messages=ASK,
            tools=[WEATHER, TIME],
            stream=True,
            stream_options={"include_usage": True},
            **kw,
        )
    )
    calls: dict[int, dict[str, str]] = {}
    for c in chunks:
        for choice in c.choices:
            for tc in choice.delta.tool_calls or []:
                call = calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
                call["id"] += tc.id or ""
                call["name"] += (tc.function and tc.function.name) or ""
                call["arguments"] += (tc.function and tc.function.arguments) or ""
    return calls, chunks


@pytest.mark.parametrize("vendor", VENDORS)
def test_the_simulated_vendor_calls_several_tools_when_allowed(
    clients: dict[str, openai.OpenAI], vendor: str
) -> None:
    answer = _unary(clients[vendor])
    names = [tc.function.name for tc in answer.choices[0].message.tool_calls or []]
    assert names == ["get_weather", "get_time"]
    calls, _ = _streamed(clients[vendor])
    assert [calls[k]["name"] for k in sorted(calls)] == ["get_weather", "get_time"]


@pytest.mark.parametrize("vendor", VENDORS)
def test_parallel_tool_calls_false_leaves_one_call_in_a_unary_answer(
    clients: dict[str, openai.OpenAI], vendor: str
) -> None:
    several = _unary(clients[vendor])
    answer = _unary(clients[vendor], parallel_tool_calls=False)
    choice = answer.choices[0]
    assert [tc.function.name for tc in choice.message.tool_calls or []] == ["get_weather"]
    assert json.loads(choice.message.tool_calls[0].function.arguments)["city"]
    assert choice.finish_reason == "tool_calls"
    # The vendor generated (and bills) both calls: the usage is its own, unchanged.
    assert answer.usage is not None and several.usage is not None
    assert answer.usage.completion_tokens == several.usage.completion_tokens


@pytest.mark.parametrize("vendor", VENDORS)
def test_parallel_tool_calls_false_leaves_one_call_in_a_stream(
    clients: dict[str, openai.OpenAI], vendor: str
) -> None:
    calls, chunks = _streamed(clients[vendor], parallel_tool_calls=False)
    assert list(calls) == [0]
    assert calls[0]["name"] == "get_weather" and calls[0]["id"]
    assert isinstance(json.loads(calls[0]["arguments"]), dict)
    finishes = [c.finish_reason for ch in chunks for c in ch.choices if c.finish_reason]
    assert finishes == ["tool_calls"]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
