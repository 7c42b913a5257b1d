"""Chat outputs that only OpenAI's chat API produces (logprobs, audio, web search), asked of
Anthropic, Gemini and Bedrock members: refused as `unsupported` (another member serves them,
alone a clear 400), never answered 200 without what was asked.

The official `openai` client -> gateway -> each vendor's shaped simulator over loopback.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

from loadtests.simulator.testing import Fleet
from tests.apis.vendors import ANTHROPIC, VENDORS, vendor_gateway
from tests.support import GatewayServer, validate

FLEET: list[Any] = [{"name": "oa", "profile": "fast"}, ANTHROPIC]
USER = [{"role": "user", "content": "Say hi"}]
# Each body asks for an output a text-and-tool-calls answer cannot carry.
CHAT_ONLY: dict[str, dict[str, Any]] = {
    "logprobs": {"logprobs": True},
    "top_logprobs": {"logprobs": True, "top_logprobs": 2},
    "audio_modalities": {
        "modalities": ["text", "audio"],
        "audio": {"voice": "alloy", "format": "wav"},
    },
    "audio_only_modality": {"modalities": ["audio"]},
    "web_search": {"web_search_options": {}},
    "legacy_functions": {
        "functions": [{"name": "f", "parameters": {"type": "object", "properties": {}}}],
        "function_call": {"name": "f"},
    },
}


@pytest.fixture(scope="module")
def gw(fleet: Fleet) -> Iterator[GatewayServer]:
    with vendor_gateway(
        fleet,
        head="retry: {max_attempts: 4, base_backoff_ms: 0, max_backoff_ms: 0}",
        providers="  oa: {base_url: '" + fleet.url("oa") + "'}",
        pools="  mixed: {members: [an, gm, br, oa], max_attempts: 4,"
        " balancer: {strategy: round_robin}}",
        models="  mixed: {pool: mixed}",
    ) as server:
        yield server


@pytest.fixture(scope="module")
def client(gw: GatewayServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0)


@pytest.mark.parametrize("vendor", VENDORS)
@pytest.mark.parametrize("case", sorted(CHAT_ONLY))
@pytest.mark.parametrize("stream", [False, True])
def test_vendor_alone_refuses_chat_only_output(
    client: openai.OpenAI, vendor: str, case: str, stream: bool
) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model=vendor, messages=USER, max_tokens=4, stream=stream, **CHAT_ONLY[case]
        )
    assert err.value.status_code == 400
    assert err.value.code == "unsupported_endpoint"


@pytest.mark.parametrize("vendor", VENDORS)
def test_vendor_still_answers_plain_text(client: openai.OpenAI, vendor: str) -> None:
    # The fields switched off (or empty) are no reason to refuse.
    raw = client.chat.completions.with_raw_response.create(
        model=vendor, messages=USER, max_tokens=4, logprobs=False, modalities=["text"]
    )
    validate("CreateChatCompletionResponse", raw.http_response.json())
    assert raw.headers["x-gateway-provider"] == vendor


def test_mixed_pool_serves_chat_only_output_from_an_openai_member(client: openai.OpenAI) -> None:
    # Round robin starts on every member in turn: each request must still get its logprobs.
    for _ in range(8):
        raw = client.chat.completions.with_raw_response.create(
            model="mixed", messages=USER, max_tokens=3, logprobs=True, top_logprobs=2
        )
        validate("CreateChatCompletionResponse", raw.http_response.json())
        assert raw.headers["x-gateway-provider"] == "oa"
        lp = raw.parse().choices[0].logprobs
        assert lp is not None and lp.content and len(lp.content[0].top_logprobs) == 2
