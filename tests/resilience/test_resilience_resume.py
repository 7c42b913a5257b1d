"""A stream that breaks mid-way is resumed on another member and spliced into one client stream.

The simulator's text is deterministic for a prompt and seed, and a continuation (the partial answer
sent back as a trailing assistant message) reproduces the rest of it, so the spliced stream must
read exactly like an unbroken answer.
"""

from __future__ import annotations

import time

import openai
import pytest

from loadtests.simulator.testing import Fleet
from tests.support import MSG, policy, poll, requests_at, validate

FLEET = ["a", "b"]


def resume_policy(fleet: Fleet) -> str:
    return policy(
        fleet, "a", "b", pool={"balancer": {"strategy": "round_robin"}}, alias={"resume": True}
    )


def unbroken(fleet: Fleet, **body) -> str:  # type: ignore[no-untyped-def]
    direct = openai.OpenAI(base_url=fleet.url("b"), api_key="x", max_retries=0)
    return direct.chat.completions.create(**body).choices[0].message.content or ""


# Cut after the first text (1) or later (7): a cut before any text is a plain failover.
@pytest.mark.parametrize("cut_after", [1, 7])
def test_broken_stream_is_resumed_into_one_coherent_stream(
    fleet: Fleet,
    gateway,
    cut_after: int,
) -> None:
    gw = gateway(resume_policy(fleet))
    body = {"model": "chat", "messages": MSG, "max_tokens": 24, "seed": 11}
    expected = unbroken(fleet, **body)
    fleet.set_faults("a", cut_stream_after_chunks=cut_after)
    before = requests_at(fleet, "a"), requests_at(fleet, "b")

    client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0)
    chunks = list(
        client.chat.completions.create(**body, stream=True, stream_options={"include_usage": True})
    )
    for chunk in chunks:
        validate("CreateChatCompletionStreamResponse", chunk.model_dump(exclude_unset=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == expected
    assert len({c.id for c in chunks}) == 1  # one stream, one id
    roles = [c.choices[0].delta.role for c in chunks if c.choices and c.choices[0].delta.role]
    assert roles == ["assistant"]
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes.count("stop") + finishes.count("length") == 1 and finishes[-1] is not None
    final = [c for c in chunks if c.choices][-1]
    assert final.model_extra and final.model_extra["gateway_resumed"] == {"from": "a", "on": "b"}
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == 24
    assert (requests_at(fleet, "a") - before[0], requests_at(fleet, "b") - before[1]) == (1, 1)
    poll(lambda: gw.seen)  # a stream is recorded once the server side has ended
    assert gw.seen[-1].resumed and gw.seen[-1].status == 200


def test_resume_is_exhausted_like_any_retry(fleet: Fleet, gateway) -> None:
    """Every member cuts: the client gets an error event after the last try, not a fake end."""
    gw = gateway(resume_policy(fleet))
    fleet.set_faults("a", cut_stream_after_chunks=2)
    fleet.set_faults("b", cut_stream_after_chunks=2)
    client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0)
    with pytest.raises(openai.APIError):
        for _ in client.chat.completions.create(
            model="chat", messages=MSG, max_tokens=24, stream=True
        ):
            pass
    deadline = time.monotonic() + 5  # a stream is recorded once the server side has ended
    while not gw.seen and time.monotonic() < deadline:
        time.sleep(0.02)
    assert gw.seen[-1].status == 502
