"""A Messages `tool_result` must answer a `tool_use` of the assistant turn just before it, as
Anthropic requires. An orphan result was a 200 from an OpenAI member (the result ignored) and a
400 of another kind from each vendor; it is now one 400 in Anthropic's shape naming the id, before
any upstream call. Also through count_tokens.

The official `anthropic` client -> gateway -> the project's simulator over loopback.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import pytest

from loadtests.simulator.testing import Fleet
from tests.support import GatewayServer, policy

FLEET: list[Any] = ["t"]
TOOLS: list[Any] = [
    {
        "name": "get_weather",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
]
ASK = {"role": "user", "content": "Weather in Paris?"}


def use(*ids: str) -> dict[str, Any]:
    blocks = [
        {"type": "tool_use", "id": i, "name": "get_weather", "input": {"city": "Paris"}}
        for i in ids
    ]
    return {"role": "assistant", "content": blocks}


def result(*ids: str, text: str = "") -> dict[str, Any]:
    blocks: list[Any] = [{"type": "text", "text": text}] if text else []
    blocks += [{"type": "tool_result", "tool_use_id": i, "content": "sunny"} for i in ids]
    return {"role": "user", "content": blocks}


ORPHANS: dict[str, list[Any]] = {
    "no_tool_use": [result("toolu_nope")],
    "other_id": [ASK, use("toolu_1"), result("toolu_2")],
    "one_of_two_unknown": [ASK, use("toolu_1"), result("toolu_1", "toolu_9")],
    "answers_an_older_turn": [
        ASK,
        use("toolu_1"),
        result("toolu_1"),
        {"role": "assistant", "content": "Sunny."},
        result("toolu_1", text="again"),
    ],
}
ANSWERED: dict[str, list[Any]] = {
    "one": [ASK, use("toolu_1"), result("toolu_1")],
    "two_parallel": [ASK, use("toolu_1", "toolu_2"), result("toolu_1", "toolu_2")],
    "with_text_first": [ASK, use("toolu_1"), result("toolu_1", text="here:")],
}


@pytest.fixture(scope="module")
def gw(fleet: Fleet) -> Iterator[GatewayServer]:
    with GatewayServer(policy(fleet)) as server:
        yield server


@pytest.fixture(scope="module")
def client(gw: GatewayServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gw.url, api_key="unused", max_retries=0)


def chat_requests(fleet: Fleet) -> int:
    return int(fleet.stats("t")["by_endpoint"].get("chat", 0))


@pytest.mark.parametrize("case", sorted(ORPHANS))
@pytest.mark.parametrize("stream", [False, True])
def test_orphan_tool_result_is_refused(
    client: anthropic.Anthropic, fleet: Fleet, case: str, stream: bool
) -> None:
    before = chat_requests(fleet)
    with pytest.raises(anthropic.BadRequestError) as err:
        client.messages.create(
            model="chat", max_tokens=4, tools=TOOLS, messages=ORPHANS[case], stream=stream
        )
    error = err.value.response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert "unexpected tool_use_id" in error["message"]
    assert chat_requests(fleet) == before


@pytest.mark.parametrize("case", sorted(ORPHANS))
def test_count_tokens_refuses_orphans_too(client: anthropic.Anthropic, case: str) -> None:
    with pytest.raises(anthropic.BadRequestError):
        client.messages.count_tokens(model="chat", tools=TOOLS, messages=ORPHANS[case])


@pytest.mark.parametrize("case", sorted(ANSWERED))
def test_answered_tool_uses_pass(client: anthropic.Anthropic, case: str) -> None:
    msg = client.messages.create(model="chat", max_tokens=4, tools=TOOLS, messages=ANSWERED[case])
    assert msg.type == "message"
