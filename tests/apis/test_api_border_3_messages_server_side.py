"""Messages requests that hand tools to Anthropic's own platform (`mcp_servers`, the MCP
connector; `container`, a code execution container with its skills) are refused with a 400 in
Anthropic's shape naming the field, like server tools, and nothing is sent upstream: a chat
provider would answer without those tools.

The official `anthropic` client -> gateway -> the project's simulator over loopback.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import pytest

from loadtests.simulator.testing import Fleet
from tests.support import GatewayServer, policy

FLEET: list[Any] = ["m"]
MCP = [{"type": "url", "url": "https://mcp.example.com/sse", "name": "example"}]
SERVER_SIDE: dict[str, dict[str, Any]] = {
    "mcp_servers": {"mcp_servers": MCP},
    "container_id": {"container": "container_011CPR5CNjB747bTd36fQLFk"},
    "container_skills": {
        "container": {"skills": [{"type": "anthropic", "skill_id": "pptx", "version": "latest"}]}
    },
}
USER = [{"role": "user", "content": "Use the tools"}]


@pytest.fixture(scope="module")
def gw(fleet: Fleet) -> Iterator[GatewayServer]:
    with GatewayServer(policy(fleet)) as server:
        yield server


@pytest.fixture(scope="module")
def client(gw: GatewayServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gw.url, api_key="unused", max_retries=0)


def chat_requests(fleet: Fleet) -> int:
    return int(fleet.stats("m")["by_endpoint"].get("chat", 0))


@pytest.mark.parametrize("case", sorted(SERVER_SIDE))
@pytest.mark.parametrize("stream", [False, True])
def test_platform_tools_are_refused_naming_the_field(
    client: anthropic.Anthropic, fleet: Fleet, case: str, stream: bool
) -> None:
    before = chat_requests(fleet)
    with pytest.raises(anthropic.BadRequestError) as err:
        client.messages.create(
            model="chat", max_tokens=8, messages=USER, stream=stream, extra_body=SERVER_SIDE[case]
        )
    body = err.value.response.json()
    field = next(iter(SERVER_SIDE[case]))
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert body["error"]["message"].startswith(f"{field}:")
    assert chat_requests(fleet) == before


@pytest.mark.parametrize("case", sorted(SERVER_SIDE))
def test_count_tokens_refuses_them_too(client: anthropic.Anthropic, case: str) -> None:
    with pytest.raises(anthropic.BadRequestError):
        client.messages.count_tokens(model="chat", messages=USER, extra_body=SERVER_SIDE[case])


@pytest.mark.parametrize("empty", [{"mcp_servers": []}, {"container": None}])
def test_empty_values_are_no_reason_to_refuse(client: anthropic.Anthropic, empty: Any) -> None:
    msg = client.messages.create(model="chat", max_tokens=4, messages=USER, extra_body=empty)
    assert msg.type == "message" and msg.content[0].type == "text"
