"""The chaos benchmark's answer check: the simulator's text is predicted word for word, and
every way a 200 can be broken is told apart from a success."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from loadtests.chaos_answers import classify, expected_text
from loadtests.simulator.testing import Fleet

FLEET: list[Any] = [{"name": "s", "profile": "low-latency"}]


BODY = {"model": "m", "messages": [{"role": "user", "content": "tell me"}], "max_tokens": 6}


def ask(fleet: Fleet, stream: bool) -> httpx.Response:
    return httpx.post(fleet.url("s") + "/chat/completions", json={**BODY, "stream": stream})


@pytest.mark.parametrize("stream", [False, True])
def test_the_simulators_answer_is_predicted(fleet: Fleet, stream: bool) -> None:
    r = ask(fleet, stream)
    assert classify(200, False, r.content, stream, expected_text(BODY)) == "succeeded"
    other = {**BODY, "messages": [{"role": "user", "content": "something else"}]}
    assert classify(200, False, r.content, stream, expected_text(other)) == "broken"


@pytest.mark.parametrize(
    ("faults", "stream"),
    [
        ({"broken_body": "garbage_json"}, False),
        ({"broken_body": "html"}, False),
        ({"broken_body": "truncated_json"}, False),
        ({"broken_body": "html"}, True),
        ({"broken_body": "truncated_json"}, True),
        ({"end_stream_after_chunks": 2}, True),
    ],
)
def test_broken_200s_are_caught(fleet: Fleet, faults: dict, stream: bool) -> None:
    fleet.set_faults("s", **faults)
    try:
        r = ask(fleet, stream)
    finally:
        fleet.clear_faults("s")
    assert r.status_code == 200
    assert classify(200, False, r.content, stream, expected_text(BODY)) == "broken"


def test_honest_errors_degraded_and_shed() -> None:
    error_event = b'data: {"error": {"message": "x", "code": "idle_timeout"}}\n\n'
    assert classify(200, False, error_event, True, "a") == "failed"
    assert classify(502, False, b"{}", False, "a") == "failed"
    assert classify(200, True, b"{}", False, "a") == "degraded"
    assert classify(429, False, b"{}", False, "a") == "shed"
