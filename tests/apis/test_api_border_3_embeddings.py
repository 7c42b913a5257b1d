"""Embeddings input bounds as OpenAI's API has them: at most 2048 inputs (strings, token ids or
token arrays) and no empty string, refused with a 400 naming the field before any upstream call.

The official `openai` client -> gateway -> the project's simulator over loopback.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

from loadtests.simulator.testing import Fleet
from tests.support import GatewayServer, policy, validate

FLEET: list[Any] = ["e"]

REFUSED: dict[str, tuple[Any, str, str]] = {
    "empty_string": ("", "input", "empty_string"),
    "empty_string_in_list": (["a", ""], "input[1]", "empty_string"),
    "strings_2049": (["a"] * 2049, "input", "array_above_max_length"),
    "token_ids_2049": ([1] * 2049, "input", "array_above_max_length"),
    "token_arrays_2049": ([[1, 2]] * 2049, "input", "array_above_max_length"),
}
ACCEPTED: dict[str, Any] = {
    "strings_2048": ["a"] * 2048,
    "token_ids_2048": [7] * 2048,
    "token_arrays_2048": [[1, 2]] * 2048,
    "one_space": " ",
}


def embeddings_at(fleet: Fleet) -> int:
    """Embeddings requests the simulator received (the count the gateway cannot fake)."""
    return int(fleet.stats("e")["by_endpoint"].get("embeddings", 0))


@pytest.fixture(scope="module")
def gw(fleet: Fleet) -> Iterator[GatewayServer]:
    with GatewayServer(policy(fleet)) as server:
        yield server


@pytest.fixture(scope="module")
def client(gw: GatewayServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0)


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_out_of_bounds_input_is_refused_before_any_upstream_call(
    client: openai.OpenAI, fleet: Fleet, case: str
) -> None:
    value, param, code = REFUSED[case]
    before = embeddings_at(fleet)
    with pytest.raises(openai.BadRequestError) as err:
        client.embeddings.create(model="chat", input=value, encoding_format="float")
    assert err.value.code == code and err.value.param == param
    validate("ErrorResponse", err.value.response.json())
    assert embeddings_at(fleet) == before


@pytest.mark.parametrize("case", sorted(ACCEPTED))
def test_inputs_within_bounds_are_embedded(client: openai.OpenAI, case: str) -> None:
    value = ACCEPTED[case]
    # Two dimensions keep 2048 vectors small to relay.
    raw = client.embeddings.with_raw_response.create(
        model="chat", input=value, encoding_format="float", dimensions=2
    )
    body = raw.http_response.json()
    validate("CreateEmbeddingResponse", body)
    expected = len(value) if isinstance(value, list) and not isinstance(value[0], int) else 1
    assert [d["index"] for d in body["data"]] == list(range(expected))
