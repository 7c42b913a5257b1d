"""A provider's refusal (`message.refusal`, content null) reaches clients of every API, streamed or
not; and a stream that breaks after its end marker stays a success."""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import httpx
import openai
import pytest

from tests.hostile import HostileUpstream
from tests.support import GatewayServer

REFUSAL = "I can't help with that."
MSG = [{"role": "user", "content": "something it refuses"}]


@pytest.fixture(scope="module")
def gw() -> Iterator[GatewayServer]:
    with HostileUpstream() as h:
        policy = f"""
providers:
  r: {{base_url: '{h.url("refusal")}'}}
  d: {{base_url: '{h.url("resetafterdone")}'}}
pools:
  pr: {{members: [r]}}
  pd: {{members: [d], max_attempts: 1}}
models:
  refuser: {{pool: pr}}
  dropper: {{pool: pd}}
"""
        with GatewayServer(policy) as g:
            yield g


def test_responses_carry_the_refusal(gw: GatewayServer) -> None:
    client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0)
    r = client.responses.create(model="refuser", input="something it refuses")
    parts = [c for item in r.output if item.type == "message" for c in item.content]
    assert [(p.type, getattr(p, "refusal", None)) for p in parts] == [("refusal", REFUSAL)]
    events = list(client.responses.create(model="refuser", input="x", stream=True))
    kinds = [e.type for e in events]
    assert "response.refusal.delta" in kinds and kinds[-1] == "response.completed"
    done = next(e for e in events if e.type == "response.refusal.done")
    assert done.refusal == REFUSAL
    seqs = [e.sequence_number for e in events]
    assert seqs == list(range(len(seqs)))
    final = events[-1].response.output
    assert final[0].content[0].type == "refusal" and final[0].content[0].refusal == REFUSAL


def test_messages_carry_the_refusal_streamed_or_not(gw: GatewayServer) -> None:
    client = anthropic.Anthropic(base_url=gw.url, api_key="x", max_retries=0)
    m = client.messages.create(model="refuser", max_tokens=20, messages=MSG)
    assert [b.text for b in m.content if b.type == "text"] == [REFUSAL]
    with client.messages.stream(model="refuser", max_tokens=20, messages=MSG) as s:
        text = "".join(s.text_stream)
    assert text == REFUSAL


def test_a_stream_dropped_after_its_end_marker_is_a_success(gw: GatewayServer) -> None:
    body = {"model": "dropper", "messages": MSG, "stream": True}
    r = httpx.post(gw.base_url + "/chat/completions", json=body, timeout=10)
    assert r.status_code == 200
    assert r.text.rstrip().endswith("data: [DONE]") and '"error"' not in r.text
    assert '"whole"' in r.text
