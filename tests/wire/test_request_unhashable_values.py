"""A client value of the wrong JSON type where the gateway looks a name up (a message's role as an
array or an object) is a 400 naming the field, in each API's own error shape: never a 500.

Found by mutating every field of a valid request to each JSON type; the checks on their own, then
a real gateway on loopback over HTTP.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gateway.errors import GatewayError
from gateway.wire.request_checks import check_messages
from tests.support import GatewayServer

ODD = [[], ["user"], {}, {"role": "user"}, [None]]


@pytest.mark.parametrize("role", ODD)
@pytest.mark.parametrize("at", [0, 1])
def test_a_role_of_another_type_is_an_invalid_type(role: Any, at: int) -> None:
    messages: list[Any] = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    messages[at] = {"role": role, "content": "x"}
    with pytest.raises(GatewayError) as e:
        check_messages(messages)
    assert e.value.status == 400 and e.value.param == f"messages[{at}].role"


@pytest.fixture(scope="module")
def gw() -> Iterator[GatewayServer]:
    text = """
providers:
  a: {base_url: 'http://127.0.0.1:9/v1'}
pools:
  p: {members: [a]}
models:
  chat: {pool: p}
"""
    with GatewayServer(text) as server:
        yield server


@pytest.mark.parametrize("role", ODD)
def test_every_api_answers_a_role_of_another_type_with_a_400(gw: GatewayServer, role: Any) -> None:
    msg = [{"role": role, "content": "hi"}]
    r = httpx.post(gw.base_url + "/chat/completions", json={"model": "chat", "messages": msg})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "messages[0].role"
    body = {"model": "chat", "max_tokens": 5, "messages": msg}
    r = httpx.post(gw.url + "/v1/messages", json=body)
    assert r.status_code == 400 and r.json()["type"] == "error", r.text
    r = httpx.post(gw.url + "/v1/responses", json={"model": "chat", "input": msg})
    assert r.status_code == 400 and r.json()["error"]["param"] == "input[0].role", r.text
