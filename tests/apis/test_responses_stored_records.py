"""A stored response read back from Redis is data from across a border: a record that is not what
the gateway writes (corrupted, written by something else) continues no conversation and is no
response, a 400 `previous_response_not_found` / a 404 in OpenAI's shape, never a 500 or a 400
blaming the client's `messages`. Official `openai` client -> gateway -> the simulator; a real
Redis holds the records."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import orjson
import pytest
import redis

from gateway.apis.response_store import new_response_id
from loadtests.simulator.testing import run_fleet
from tests.support import GatewayServer

PREFIX = "gwtest:records:"


@pytest.fixture(scope="module")
def gw(redis_url: str) -> Iterator[GatewayServer]:
    with run_fleet([{"name": "a", "profile": "fast"}]) as fleet:
        text = f"""
providers:
  a: {{base_url: '{fleet.url("a")}', models: {{'*': sim}}, simulated: true}}
pools:
  p: {{members: [a]}}
models:
  chat: {{pool: p}}
"""
        with GatewayServer(text, redis_url=redis_url, prefix=PREFIX) as server:
            yield server


@pytest.fixture(scope="module")
def client(gw: GatewayServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0)


def _stored(client: openai.OpenAI, redis_url: str) -> tuple[redis.Redis, str, dict[str, Any]]:
    first = client.responses.create(model="chat", input="remember me")
    r = redis.Redis.from_url(redis_url)
    [key] = r.keys(f"{PREFIX}responses:*:{first.id}")
    return r, key.decode().rsplit(":", 1)[0], orjson.loads(r.get(key))


BAD_RECORDS = {
    "messages_number": lambda rec: {**rec, "messages": 5},
    "messages_text": lambda rec: {**rec, "messages": "hello"},
    "messages_of_numbers": lambda rec: {**rec, "messages": [1, 2]},
    "messages_object": lambda rec: {**rec, "messages": {"role": "user"}},
    "no_messages": lambda rec: {k: v for k, v in rec.items() if k != "messages"},
    "response_text": lambda rec: {**rec, "response": "x"},
    "response_of_another_id": lambda rec: rec,  # stored under a new id below
}


@pytest.mark.parametrize("name", list(BAD_RECORDS))
def test_a_record_not_of_the_gateways_shape_is_not_found(
    client: openai.OpenAI, redis_url: str, name: str
) -> None:
    r, base, record = _stored(client, redis_url)
    rid = new_response_id()
    r.set(f"{base}:{rid}", orjson.dumps(BAD_RECORDS[name](record)))
    if name not in ("response_text", "response_of_another_id"):
        with pytest.raises(openai.BadRequestError) as e:
            client.responses.create(model="chat", input="more", previous_response_id=rid)
        assert isinstance(e.value.body, dict)
        assert e.value.body["code"] == "previous_response_not_found"
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(rid)


def test_the_gateways_own_records_still_continue_and_are_found(
    client: openai.OpenAI, redis_url: str
) -> None:
    first = client.responses.create(model="chat", input="Once upon a time")
    more = client.responses.create(model="chat", input="go on", previous_response_id=first.id)
    assert more.output_text and client.responses.retrieve(first.id).id == first.id
