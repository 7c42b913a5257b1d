"""An answer's identity fields of the wrong type (`"created": "yesterday"`, `"id": 42`, a model,
object or fingerprint that is not a string, a negative time) are a broken answer,
like any other field of the wrong type: retried on another member while nothing was relayed,
never relayed to a client (which parses them into typed fields) nor cached; unary or streamed,
chat or completions. (A float time is floored to the integer the schema promises, not refused:
tests/wire/test_stream_border_4_created.py.)

Official client -> gateway -> scripted loopback upstreams: each pool is [bad, good], bad first.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from gateway.wire.answer_checks import InvalidAnswer, check_chunk, check_unary
from tests.support import GatewayServer, poll
from tests.wire.test_stream_border_upstream import Scripted, chat_chunk, scripted_policy, sse

MSG = [{"role": "user", "content": "hi"}]
BENT: dict[str, dict[str, Any]] = {
    "created_text": {"created": "yesterday"},
    "created_negative": {"created": -1},
    "created_bool": {"created": True},
    "id_number": {"id": 42},
    "id_object": {"id": {"x": 1}},
    "model_number": {"model": 7},
    "object_list": {"object": ["chat.completion"]},
    "fingerprint_object": {"system_fingerprint": {"fp": 1}},
}


def _unary(endpoint: str, **top: Any) -> dict[str, Any]:
    if endpoint == "completions":
        choice: dict[str, Any] = {"index": 0, "text": "fine", "logprobs": None}
        doc = {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m"}
    else:
        choice = {"index": 0, "message": {"role": "assistant", "content": "fine"}}
        doc = {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m"}
    return {**doc, "choices": [{**choice, "finish_reason": "stop"}], **top}


def _stream(bent: dict[str, Any], at: int) -> bytes:
    """A chat stream with the bent fields in its chunk number `at`."""
    deltas = [{"role": "assistant", "content": ""}, {"content": "fine"}, {}]
    chunks = [
        chat_chunk(d, "stop" if i == 2 else None, **(bent if i == at else {}))
        for i, d in enumerate(deltas)
    ]
    return sse(*chunks, b"[DONE]")


SCRIPTS: dict[str, list[Any]] = {
    "good": [
        sse(
            chat_chunk({"role": "assistant", "content": ""}),
            chat_chunk({"content": "fine"}),
            chat_chunk({}, "stop"),
            b"[DONE]",
        )
    ],
    "good_unary": [_unary("chat")],
    "good_text": [_unary("completions")],
}
GROUPS: dict[str, list[str]] = {}
for _name, _bent in BENT.items():
    for _at in (0, 1):  # the role chunk, the first chunk with text: nothing relayed before
        SCRIPTS[f"{_name}_s{_at}"] = [_stream(_bent, _at)]
        GROUPS[f"{_name}_s{_at}"] = [f"{_name}_s{_at}", "good"]
    SCRIPTS[f"{_name}_u"] = [_unary("chat", **_bent)]
    GROUPS[f"{_name}_u"] = [f"{_name}_u", "good_unary"]
    SCRIPTS[f"{_name}_t"] = [_unary("completions", **_bent)]
    GROUPS[f"{_name}_t"] = [f"{_name}_t", "good_text"]
    # Bent after text went out: the stream ends with an error event, the chunk is not relayed.
    SCRIPTS[f"{_name}_late"] = [_stream(_bent, 2)]
    GROUPS[f"{_name}_late"] = [f"{_name}_late"]


@pytest.fixture(scope="module")
def gw() -> Iterator[GatewayServer]:
    with Scripted(SCRIPTS) as up:
        text = scripted_policy(
            up,
            list(SCRIPTS),
            pools=GROUPS,
            extra="retry: {base_backoff_ms: 0, max_backoff_ms: 0, budget_ratio: 10, budget_min_per_s: 1000}\n",
        )
        with GatewayServer(text) as server:
            yield server


def _failed_over(gw: GatewayServer, n: int, bad: str) -> None:
    poll(lambda: len(gw.seen) > n)
    ctx = gw.seen[-1]
    assert ctx.failures == [f"{bad}:bad_response"], ctx.failures
    assert ctx.status == 200


@pytest.mark.parametrize("bent", list(BENT))
def test_a_chat_answer_of_bent_types_is_retried(gw: GatewayServer, bent: str) -> None:
    client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0, timeout=10)
    n = len(gw.seen)
    done = client.chat.completions.create(model=f"{bent}_u", messages=MSG)  # type: ignore[arg-type]
    ChatCompletion.model_validate(done.model_dump())  # strict types: str id, int created
    assert done.choices[0].message.content == "fine"
    _failed_over(gw, n, f"{bent}_u")


@pytest.mark.parametrize("bent", list(BENT))
def test_a_completions_answer_of_bent_types_is_retried(gw: GatewayServer, bent: str) -> None:
    client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0, timeout=10)
    n = len(gw.seen)
    done = client.completions.create(model=f"{bent}_t", prompt="hi")
    Completion.model_validate(done.model_dump())
    assert done.choices[0].text == "fine"
    _failed_over(gw, n, f"{bent}_t")


@pytest.mark.parametrize("at", [0, 1])
@pytest.mark.parametrize("bent", list(BENT))
def test_a_stream_of_bent_types_before_any_text_is_retried(
    gw: GatewayServer, bent: str, at: int
) -> None:
    client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0, timeout=10)
    n = len(gw.seen)
    chunks = list(client.chat.completions.create(model=f"{bent}_s{at}", messages=MSG, stream=True))  # type: ignore[arg-type]
    for c in chunks:
        ChatCompletionChunk.model_validate(c.model_dump())
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "fine"
    _failed_over(gw, n, f"{bent}_s{at}")


@pytest.mark.parametrize("bent", list(BENT))
def test_a_bent_chunk_after_text_is_not_relayed(gw: GatewayServer, bent: str) -> None:
    r = httpx.post(
        gw.base_url + "/chat/completions",
        json={"model": f"{bent}_late", "messages": MSG, "stream": True},
        timeout=10,
    )
    assert r.status_code == 200
    events = [json.loads(e[6:]) for e in r.text.split("\n\n") if e.startswith("data: {")]
    assert events[-1]["error"]["code"] == "bad_response"
    for ev in events[:-1]:
        ChatCompletionChunk.model_validate(ev)


@pytest.mark.parametrize("bent", list(BENT))
def test_the_checks_refuse_bent_types(bent: str) -> None:
    with pytest.raises(InvalidAnswer):
        check_unary("chat", json.dumps(_unary("chat", **BENT[bent])).encode())
    with pytest.raises(InvalidAnswer):
        check_chunk("chat", chat_chunk({"content": "x"}, **BENT[bent]))
    # Null and absent identity fields are left to the client, as before.
    check_unary("chat", json.dumps(_unary("chat", id=None, system_fingerprint=None)).encode())
