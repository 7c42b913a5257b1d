"""Messages requests Anthropic refuses are refused here too, with a 400 in Anthropic's shape
naming the field and nothing sent upstream (they were answered 200, or blamed another field): a
custom tool without an object `input_schema`, `metadata` keys other than `user_id`, a turn with
empty content other than a final assistant prefill. What Anthropic takes still passes.

The official `anthropic` client -> gateway -> the project's simulator over loopback.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import pytest

from loadtests.simulator.testing import Fleet
from tests.support import GatewayServer, policy

FLEET: list[Any] = ["q"]
USER = {"role": "user", "content": "Hi"}
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}}
REFUSED: dict[str, tuple[dict[str, Any], str]] = {
    "tool_without_schema": ({"tools": [{"name": "t"}]}, "tools.0.input_schema:"),
    "tool_schema_not_object": (
        {"tools": [{"name": "t", "input_schema": {"type": "string"}}]},
        "tools.0.input_schema:",
    ),
    "second_tool_schema_list": (
        {"tools": [{"name": "a", "input_schema": SCHEMA}, {"name": "b", "input_schema": []}]},
        "tools.1.input_schema:",
    ),
    "metadata_extra_key": ({"metadata": {"user_id": "u", "team": "x"}}, "metadata.team:"),
    "empty_user_turn": (
        {"messages": [{"role": "user", "content": []}, USER]},
        "messages.0.content:",
    ),
    "empty_only_turn": ({"messages": [{"role": "user", "content": []}]}, "messages.0.content:"),
    "empty_middle_assistant": (
        {"messages": [USER, {"role": "assistant", "content": []}, USER]},
        "messages.1.content:",
    ),
}
ACCEPTED: dict[str, dict[str, Any]] = {
    "tool_with_schema": {"tools": [{"name": "get_city", "input_schema": SCHEMA}]},
    "metadata_user_id": {"metadata": {"user_id": "u-1"}},
    "empty_metadata": {"metadata": {}},
    "empty_final_assistant": {"messages": [USER, {"role": "assistant", "content": []}]},
}


@pytest.fixture(scope="module")
def gw(fleet: Fleet) -> Iterator[GatewayServer]:
    with GatewayServer(policy(fleet)) as server:
        yield server


@pytest.fixture(scope="module")
def client(gw: GatewayServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gw.url, api_key="unused", max_retries=0)


def chat_requests(fleet: Fleet) -> int:
    return int(fleet.stats("q")["by_endpoint"].get("chat", 0))


def _create(client: anthropic.Anthropic, fields: dict[str, Any], **kw: Any) -> Any:
    body = {"messages": [USER], **fields}
    return client.messages.create(
        model="chat", max_tokens=4, messages=body.pop("messages"), extra_body=body, **kw
    )


@pytest.mark.parametrize("case", sorted(REFUSED))
@pytest.mark.parametrize("stream", [False, True])
def test_refused_as_anthropic_refuses(
    client: anthropic.Anthropic, fleet: Fleet, case: str, stream: bool
) -> None:
    fields, starts = REFUSED[case]
    before = chat_requests(fleet)
    with pytest.raises(anthropic.BadRequestError) as err:
        _create(client, fields, stream=stream)
    error = err.value.response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"].startswith(starts)
    assert chat_requests(fleet) == before


@pytest.mark.parametrize("case", sorted(ACCEPTED))
def test_accepted_as_anthropic_accepts(client: anthropic.Anthropic, case: str) -> None:
    msg = _create(client, ACCEPTED[case])
    assert msg.type == "message"
