"""Responses requests for logprobs (`top_logprobs` > 0, `include` of
`message.output_text.logprobs`) were answered 200 with `logprobs: []` (read as "no tokens"); the
gateway returns no logprobs, so they are now a 400 naming the field, before any upstream call.
Ill-typed values are a 400 too; `top_logprobs: 0` and other `include` values still pass.

The official `openai` client -> gateway -> the project's simulator over loopback.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

from loadtests.simulator.testing import Fleet
from tests.support import GatewayServer, policy

FLEET: list[Any] = ["r"]
LOGPROBS = "message.output_text.logprobs"
REFUSED: dict[str, tuple[dict[str, Any], str]] = {
    "top_logprobs": ({"top_logprobs": 3}, "top_logprobs"),
    "include_logprobs": ({"include": [LOGPROBS]}, "include"),
    "both": ({"include": [LOGPROBS], "top_logprobs": 2}, "top_logprobs"),
    "top_logprobs_too_many": ({"top_logprobs": 21}, "top_logprobs"),
    "top_logprobs_string": ({"top_logprobs": "3"}, "top_logprobs"),
    "top_logprobs_bool": ({"top_logprobs": True}, "top_logprobs"),
    "include_not_a_list": ({"include": LOGPROBS}, "include"),
}
ACCEPTED: dict[str, dict[str, Any]] = {
    "top_logprobs_zero": {"top_logprobs": 0},
    "other_include": {"include": ["reasoning.encrypted_content"]},
    "null": {"top_logprobs": None, "include": None},
}


@pytest.fixture(scope="module")
def gw(fleet: Fleet) -> Iterator[GatewayServer]:
    with GatewayServer(policy(fleet)) as server:
        yield server


@pytest.fixture(scope="module")
def client(gw: GatewayServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0)


def chat_requests(fleet: Fleet) -> int:
    return int(fleet.stats("r")["by_endpoint"].get("chat", 0))


@pytest.mark.parametrize("case", sorted(REFUSED))
@pytest.mark.parametrize("stream", [False, True])
def test_logprobs_requests_are_refused(
    client: openai.OpenAI, fleet: Fleet, case: str, stream: bool
) -> None:
    fields, param = REFUSED[case]
    before = chat_requests(fleet)
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(
            model="chat", input="Hi", max_output_tokens=4, stream=stream, extra_body=fields
        )
    assert err.value.param == param
    assert chat_requests(fleet) == before


@pytest.mark.parametrize("case", sorted(ACCEPTED))
def test_other_values_pass(client: openai.OpenAI, case: str) -> None:
    resp = client.responses.create(
        model="chat", input="Hi", max_output_tokens=4, extra_body=ACCEPTED[case]
    )
    assert resp.output[0].type == "message" and resp.output_text
