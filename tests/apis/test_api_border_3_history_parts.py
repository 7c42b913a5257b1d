"""An assistant turn in the history holding `refusal` content parts (as the OpenAI SDK sends a
refused answer back) reaches Anthropic, Gemini and Bedrock members as the text it is, streamed
or not, instead of a 400 that depended on which member the request landed on.

The official `openai` client -> gateway -> each vendor's shaped simulator (each validates the
translated request against its provider's published request types) over loopback.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

from loadtests.simulator.testing import Fleet
from tests.apis.vendors import ANTHROPIC, VENDORS, vendor_gateway
from tests.support import GatewayServer, validate

FLEET: list[Any] = [ANTHROPIC]
REFUSAL = {"type": "refusal", "refusal": "I can't help with that."}
HISTORIES: dict[str, list[dict[str, Any]]] = {
    "refusal_only": [
        {"role": "user", "content": "Do the bad thing"},
        {"role": "assistant", "content": [REFUSAL]},
        {"role": "user", "content": "Then say hi"},
    ],
    "text_and_refusal": [
        {"role": "user", "content": "Two things"},
        {"role": "assistant", "content": [{"type": "text", "text": "First: ok."}, REFUSAL]},
        {"role": "user", "content": "Fine, say hi"},
    ],
}


@pytest.fixture(scope="module")
def gw(fleet: Fleet) -> Iterator[GatewayServer]:
    with vendor_gateway(fleet) as server:
        yield server


@pytest.fixture(scope="module")
def client(gw: GatewayServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0)


@pytest.mark.parametrize("vendor", VENDORS)
@pytest.mark.parametrize("history", sorted(HISTORIES))
def test_refusal_parts_in_history_are_sent_as_text(
    client: openai.OpenAI, vendor: str, history: str
) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model=vendor, messages=HISTORIES[history], max_tokens=4
    )
    validate("CreateChatCompletionResponse", raw.http_response.json())
    assert raw.headers["x-gateway-provider"] == vendor
    assert raw.parse().choices[0].message.content


@pytest.mark.parametrize("vendor", VENDORS)
def test_refusal_parts_in_history_streamed(client: openai.OpenAI, vendor: str) -> None:
    stream = client.chat.completions.create(
        model=vendor, messages=HISTORIES["refusal_only"], max_tokens=4, stream=True
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text
