"""Image data URLs in chat content parts read alike by the Anthropic, Gemini and Bedrock
mappings: the scheme and type in any case and `image/jpg` as JPEG are served by all three (the
Anthropic mapping refused them), and a data URL whose data is empty or not base64 is refused by
all three (the Anthropic mapping sent it on; all three sent empty data on), never answered 200.

The official `openai` client -> gateway -> each vendor's shaped simulator (each validates the
translated request against its provider's published request types) over loopback.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from loadtests.simulator.testing import Fleet
from tests.apis.vendors import ANTHROPIC, VENDORS, vendor_gateway
from tests.support import GatewayServer, validate

FLEET: list[Any] = [ANTHROPIC]
PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(24)).decode()
SERVED = {
    "png": f"data:image/png;base64,{PNG}",
    "jpg_alias": f"data:image/jpg;base64,{PNG}",
    "upper_case": f"DATA:IMAGE/PNG;BASE64,{PNG}",
}
REFUSED = {
    "empty_data": "data:image/png;base64,",
    "blank_data": "data:image/png;base64,   ",
    "not_base64": "data:image/png;base64,@@not-base64@@",
    "bad_padding": "data:image/png;base64,abc",
}


@pytest.fixture(scope="module")
def gw(fleet: Fleet) -> Iterator[GatewayServer]:
    with vendor_gateway(fleet) as server:
        yield server


@pytest.fixture(scope="module")
def client(gw: GatewayServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0)


def _messages(url: str) -> list[dict[str, Any]]:
    return [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is this?"},
                {"type": "image_url", "image_url": {"url": url}},
            ],
        }
    ]


@pytest.mark.parametrize("vendor", VENDORS)
@pytest.mark.parametrize("case", sorted(SERVED))
def test_image_data_urls_served_by_every_vendor(
    client: openai.OpenAI, vendor: str, case: str
) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model=vendor, messages=_messages(SERVED[case]), max_tokens=3
    )
    validate("CreateChatCompletionResponse", raw.http_response.json())
    assert raw.headers["x-gateway-provider"] == vendor


@pytest.mark.parametrize("vendor", VENDORS)
@pytest.mark.parametrize("case", sorted(REFUSED))
def test_bad_image_data_refused_by_every_vendor(
    client: openai.OpenAI, vendor: str, case: str
) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model=vendor, messages=_messages(REFUSED[case]), max_tokens=3
        )
    validate("ErrorResponse", err.value.response.json())
