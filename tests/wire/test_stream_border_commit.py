"""A stream is committed to a member only by its first event with part of the answer (text, a
refusal, reasoning, a tool call, a finish, usage): events before it (a role-only chunk, an empty
delta, a filter annotation, a keep-alive, an Anthropic `message_start`) leave the gateway free to
fail over. A member that sends one of them and then stalls, ends or errs is retried on another
member, and the client gets one whole answer from it, with nothing of the first relayed.

Official client -> gateway -> scripted loopback upstreams: each pool is [bad, good], bad first.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from gateway.wire.answer_checks import InvalidAnswer, commits
from tests.support import GatewayServer, poll
from tests.wire.test_stream_border_upstream import (
    STALL,
    Scripted,
    chat_chunk,
    scripted_policy,
    sse,
)

MSG = [{"role": "user", "content": "hi"}]
ROLE = chat_chunk({"role": "assistant"})
GOOD = [
    sse(chat_chunk({"role": "assistant", "content": ""})),
    sse(chat_chunk({"content": "fine"}), chat_chunk({}, "stop"), b"[DONE]"),
]

# What a member may send before any of the answer, then fail: each is a bad member.
BEFORE: dict[str, list[Any]] = {
    "role_stall": [sse(ROLE), STALL],
    "role_empty_content_stall": [sse(chat_chunk({"role": "assistant", "content": ""})), STALL],
    "role_then_empty_deltas_stall": [
        sse(ROLE),
        0.05,
        sse(chat_chunk({"content": ""}), chat_chunk({"content": None, "refusal": None})),
        STALL,
    ],
    "filter_annotation_stall": [
        sse(
            b'{"id":"","object":"","created":0,"model":"","choices":[],'
            b'"prompt_filter_results":[{"prompt_index":0}]}'
        ),
        sse(ROLE),
        STALL,
    ],
    "role_keepalive_stall": [sse(ROLE), b": keep-alive\n\n", 0.05, b": ping\n\n", STALL],
    "role_then_end": [sse(ROLE)],
    "role_then_error": [sse(ROLE), sse(b'{"error":{"message":"overloaded"}}')],
    "role_then_not_json": [sse(ROLE), b"data: <html>\n\n"],
}
ANTHROPIC_START = (
    b'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_1",'
    b'"type":"message","role":"assistant","model":"claude","content":[],'
    b'"usage":{"input_tokens":3,"output_tokens":0}}}\n\n'
)
ANTHROPIC = {
    "anth_start_stall": [ANTHROPIC_START, b'event: ping\ndata: {"type":"ping"}\n\n', STALL]
}

SCRIPTS: dict[str, list[Any]] = {**BEFORE, **ANTHROPIC, "good": GOOD}
GROUPS = {name: [name, "good"] for name in [*BEFORE, *ANTHROPIC]}
# A slow first token after the role chunk, within the limits: no failover.
SCRIPTS["slow"] = [
    sse(ROLE),
    0.15,
    sse(chat_chunk({"content": "late"}), chat_chunk({}, "stop")),
    sse(b"[DONE]"),
]
GROUPS["slow"] = ["slow", "good"]
# The continuation of a resumed stream is committed the same way: a role chunk and a stall on
# the member it resumes on is failed over too.
SCRIPTS["breaks"] = [sse(ROLE, chat_chunk({"content": "par"})), STALL]
SCRIPTS["resume_stall"] = [sse(ROLE), STALL]
GROUPS["resumed"] = ["breaks", "resume_stall", "good"]


@pytest.fixture(scope="module")
def up() -> Iterator[Scripted]:
    with Scripted(SCRIPTS) as server:
        yield server


@pytest.fixture(scope="module")
def gw(up: Scripted) -> Iterator[GatewayServer]:
    text = scripted_policy(
        up,
        list(SCRIPTS),
        pools=GROUPS,
        provider=", timeouts: {first_byte_s: 0.4, idle_s: 0.4}",
        alias=", resume: true",
        extra="retry: {base_backoff_ms: 0, max_backoff_ms: 0, budget_ratio: 10, budget_min_per_s: 1000}\n",
    )
    for m in ANTHROPIC:  # the Anthropic members speak Anthropic's wire (base URL: its root)
        text = text.replace(
            f"  {m}: {{base_url: 'http://127.0.0.1:{up.port}/{m}/v1'",
            f"  {m}: {{type: anthropic, base_url: 'http://127.0.0.1:{up.port}/{m}'",
        )
    with GatewayServer(text) as server:
        yield server


@pytest.mark.parametrize("bad", [*BEFORE, *ANTHROPIC])
def test_a_member_that_fails_before_any_answer_is_failed_over(
    gw: GatewayServer, up: Scripted, bad: str
) -> None:
    client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0, timeout=10)
    n = len(gw.seen)
    chunks = list(client.chat.completions.create(model=bad, messages=MSG, stream=True))  # type: ignore[arg-type]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "fine"
    # One role chunk reached the client: the good member's, none of the bad one's.
    roles = [c for c in chunks if c.choices and c.choices[0].delta.role]
    assert len(roles) == 1
    poll(lambda: len(gw.seen) > n)
    ctx = gw.seen[-1]
    assert ctx.provider == "good" and len(ctx.failures) == 1, ctx.failures
    assert ctx.failures[0].startswith(bad + ":")
    assert not ctx.resumed


def test_a_slow_first_token_after_the_role_chunk_is_waited_for(gw: GatewayServer) -> None:
    r = httpx.post(
        gw.base_url + "/chat/completions",
        json={"model": "slow", "messages": MSG, "stream": True},
        timeout=10,
    )
    assert r.status_code == 200 and "late" in r.text
    poll(lambda: gw.seen and gw.seen[-1].provider == "slow")
    assert gw.seen[-1].failures == []


def test_a_resumed_stream_fails_over_a_continuation_that_stalls_after_its_role(
    gw: GatewayServer,
) -> None:
    client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0, timeout=10)
    orders = []
    for _ in range(6):  # the balancer rotates: some requests go breaks -> resume_stall -> good
        n = len(gw.seen)
        stream = client.chat.completions.create(model="resumed", messages=MSG, stream=True)  # type: ignore[arg-type]
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        poll(lambda n=n: len(gw.seen) > n)
        ctx = gw.seen[-1]
        assert text == ("parfine" if ctx.resumed else "fine")
        assert ctx.provider == "good"
        orders.append([f.split(":")[0] for f in ctx.failures])
        if orders[-1] == ["breaks", "resume_stall"]:
            break
    assert ["breaks", "resume_stall"] in orders, orders


@pytest.mark.parametrize(
    ("event", "expected"),
    [
        (b"data: " + ROLE + b"\n\n", False),
        (b": ping\n\n", False),
        (b"id: 3\nretry: 10\n\n", False),
        (
            b"data: " + chat_chunk({"role": "assistant", "content": "", "refusal": None}) + b"\n\n",
            False,
        ),
        (b"data: " + chat_chunk({"content": "x"}) + b"\n\n", True),
        (b"data: " + chat_chunk({"refusal": "no"}) + b"\n\n", True),
        (b"data: " + chat_chunk({"reasoning_content": "hm"}) + b"\n\n", True),
        (b"data: " + chat_chunk({"tool_calls": [{"index": 0, "id": "c"}]}) + b"\n\n", True),
        (b"data: " + chat_chunk({}, "stop") + b"\n\n", True),
        (b'data: {"choices":[],"usage":{"prompt_tokens":1}}\n\n', True),
        (b'data: {"choices":[{"index":0,"text":"t"}]}\n\n', True),
        (b'data: {"choices":[{"index":0,"text":""}]}\n\n', False),
        (b"data: [DONE]\n\n", True),
    ],
)
def test_commits_reads_what_an_event_carries(event: bytes, expected: bool) -> None:
    assert commits(event) is expected


@pytest.mark.parametrize(
    "event",
    [
        b"data: nope\n\n",
        b"data: [1]\n\n",
        b'data: {"error":{"message":"x"}}\n\n',
        b"event: error\ndata: {}\n\n",
    ],
)
def test_commits_refuses_what_no_client_can_use(event: bytes) -> None:
    with pytest.raises(InvalidAnswer):
        commits(event)
