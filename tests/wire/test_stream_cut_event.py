"""A stream event holding cut JSON is never relayed: the attempt fails before the client sees it
(resumed on another member, or retried while nothing was sent)."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from gateway.wire.answer_checks import InvalidAnswer, ResponseLimits, StreamCheck
from loadtests.chaos_answers import classify, expected_text
from loadtests.simulator.testing import Fleet
from tests.resilience.test_resilience_helpers import (  # noqa: F401 - fixtures
    Gateway,
    fleet_of,
    healthy_fleet,
    start_gateway,
)

fleet = fleet_of("bad", "good")


def test_check_refuses_an_event_with_cut_json() -> None:
    check = StreamCheck(ResponseLimits())
    ok = b'data: {"id":"x","choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
    assert check.event(ok) == ok
    assert check.event(b": keep-alive\n\n") == b": keep-alive\n\n"
    with pytest.raises(InvalidAnswer):
        check.event(b'data: {"id":"x","choices":[{"index":0,"delta":{"cont\n\n')


def test_cut_json_event_is_not_relayed_and_the_stream_is_resumed(
    fleet: Fleet,
    start_gateway: Callable[..., Gateway],  # noqa: F811
) -> None:
    fleet.set_faults("bad", broken_body="truncated_json")
    gw = start_gateway(f"""
providers:
  bad: {{base_url: '{fleet.url("bad")}'}}
  good: {{base_url: '{fleet.url("good")}'}}
pools:
  main: {{members: [bad, good], balancer: {{strategy: round_robin}}}}
models:
  chat: {{pool: main, resume: true}}
retry: {{base_backoff_ms: 0, max_backoff_ms: 0}}
""")
    body = {
        "model": "chat",
        "messages": [{"role": "user", "content": "tell me"}],
        "max_tokens": 8,
        "stream": True,
    }
    r = httpx.post(gw.base_url + "/chat/completions", json=body, timeout=10)
    assert r.status_code == 200
    assert classify(200, False, r.content, True, expected_text(body, "fast")) == "succeeded"
    assert gw.seen[-1].failures == ["bad:bad_response"]
