"""A Responses `function_call_output` must answer a function call made before it (in the stored
response it continues, or earlier in its own input), as OpenAI requires. An orphan result was
answered 200 by an OpenAI member and a 400 of another kind by Anthropic, Gemini or Bedrock; it is
now one 400 naming `input`, before any upstream call, whichever member would have answered.

The official `openai` client -> gateway -> the project's simulator over loopback.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

from loadtests.simulator.testing import Fleet
from tests.support import GatewayServer, policy

FLEET: list[Any] = ["o"]
TOOLS: list[Any] = [
    {
        "type": "function",
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
]
CALL = {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{}"}


def output(call_id: str) -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": "sunny"}


ORPHANS: dict[str, list[Any]] = {
    "alone": [output("call_nope")],
    "before_its_call": [output("call_1"), CALL],
    "other_id": [CALL, output("call_1"), output("call_2")],
    "after_user_turn": [{"role": "user", "content": "hi"}, output("call_1")],
}


@pytest.fixture(scope="module")
def gw(fleet: Fleet) -> Iterator[GatewayServer]:
    with GatewayServer(policy(fleet)) as server:
        yield server


@pytest.fixture(scope="module")
def client(gw: GatewayServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0)


def chat_requests(fleet: Fleet) -> int:
    return int(fleet.stats("o")["by_endpoint"].get("chat", 0))


@pytest.mark.parametrize("case", sorted(ORPHANS))
@pytest.mark.parametrize("stream", [False, True])
def test_orphan_call_output_is_refused(
    client: openai.OpenAI, fleet: Fleet, case: str, stream: bool
) -> None:
    before = chat_requests(fleet)
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(
            model="chat", input=ORPHANS[case], tools=TOOLS, max_output_tokens=4, stream=stream
        )
    assert err.value.param == "input" and "No tool call found" in err.value.message
    assert chat_requests(fleet) == before


def test_output_answering_a_call_in_the_same_input(client: openai.OpenAI) -> None:
    resp = client.responses.create(
        model="chat", input=[CALL, output("call_1")], tools=TOOLS, max_output_tokens=4
    )
    assert resp.output_text


def test_output_answering_a_stored_call(client: openai.OpenAI) -> None:
    first = client.responses.create(
        model="chat", input="weather?", tools=TOOLS, tool_choice="required", max_output_tokens=30
    )
    call = next(o for o in first.output if o.type == "function_call")
    second = client.responses.create(
        model="chat",
        previous_response_id=first.id,
        input=[output(call.call_id)],
        tools=TOOLS,
        max_output_tokens=4,
    )
    assert second.output_text
    # Not the call of another stored response: a fresh chain has no such call.
    with pytest.raises(openai.BadRequestError):
        client.responses.create(
            model="chat", input=[output(call.call_id)], tools=TOOLS, max_output_tokens=4
        )
