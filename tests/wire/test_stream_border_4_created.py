"""An upstream's `created` sent as a float (`1733500000.0`, `1733500000.25`: some
OpenAI-compatible servers do) is accepted and reaches the client as the integer the OpenAI
schema promises (floored), in unary answers and in every stream chunk; a boolean, a string, a
negative time or one past year 9999 is still a broken answer (502 `bad_response`).

Scripted upstream (official-shaped bodies and chunks) -> gateway -> official openai client or
raw HTTP.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.support import GatewayServer, completion_body
from tests.wire.test_stream_border_upstream import Scripted, chat_chunk, scripted_policy, sse

GOOD = {"frac": 1733500000.25, "whole": 1733500000.0, "exp": 1.7335e9}
BAD: dict[str, Any] = {
    "negative": -1.5,
    "absurd": 253402300800.0,  # 10000-01-01
    "string": "1733500000",
    "bool": True,
}


def _stream(created: Any) -> list[Any]:
    return [
        sse(chat_chunk({"role": "assistant", "content": ""}, created=created)),
        0.001,
        sse(chat_chunk({"content": "hi"}, created=created)),
        sse(chat_chunk({}, "stop", created=created), b"[DONE]"),
    ]


def _text(created: Any) -> dict[str, Any]:
    choice = {"index": 0, "text": "hi", "logprobs": None, "finish_reason": "stop"}
    return {"id": "c", "object": "text_completion", "created": created, "model": "m",
            "choices": [choice]}  # fmt: skip


SCRIPTS: dict[str, list[Any]] = {}
for _name, _value in {**GOOD, **BAD}.items():
    SCRIPTS[f"unary-{_name}"] = [{**completion_body("hi"), "created": _value}]
    SCRIPTS[f"stream-{_name}"] = _stream(_value)
    SCRIPTS[f"text-{_name}"] = [_text(_value)]


@pytest.fixture(scope="module")
def gw() -> Iterator[GatewayServer]:
    with Scripted(SCRIPTS) as up, GatewayServer(scripted_policy(up, list(SCRIPTS))) as server:
        yield server


@pytest.fixture(scope="module")
def client(gw: GatewayServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0)


MSG: Any = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("name", list(GOOD))
def test_a_float_created_reaches_the_client_as_an_integer(
    gw: GatewayServer, client: openai.OpenAI, name: str
) -> None:
    want = int(GOOD[name] // 1)
    answer = client.chat.completions.with_raw_response.create(model=f"unary-{name}", messages=MSG)
    assert json.loads(answer.http_response.content)["created"] == want
    assert type(answer.parse().created) is int
    chunks = list(client.chat.completions.create(model=f"stream-{name}", messages=MSG, stream=True))
    assert [c.created for c in chunks] == [want] * 3
    assert all(type(c.created) is int for c in chunks)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "hi"
    text = client.completions.with_raw_response.create(model=f"text-{name}", prompt="hi")
    assert json.loads(text.http_response.content)["created"] == want


@pytest.mark.parametrize("name", list(BAD))
def test_a_created_that_is_no_timestamp_is_a_bad_answer(gw: GatewayServer, name: str) -> None:
    for mode, path, body in (
        ("unary", "/chat/completions", {"messages": MSG}),
        ("stream", "/chat/completions", {"messages": MSG, "stream": True}),
        ("text", "/completions", {"prompt": "hi"}),
    ):
        r = httpx.post(gw.base_url + path, json={"model": f"{mode}-{name}", **body}, timeout=10)
        assert r.status_code == 502, (mode, r.text)
        assert r.json()["error"]["code"] == "upstream_bad_response", (mode, r.text)
