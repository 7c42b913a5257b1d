"""A stream event holding cut JSON is never relayed: the attempt fails before the client sees it
(resumed on another member, or retried while nothing was sent)."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from gateway.wire.answer_checks import InvalidAnswer, ResponseLimits, StreamCheck
from loadtests.chaos_answers import classify, expected_text
from loadtests.simulator.testing import Fleet
from tests.support import GatewayServer, poll

FLEET = ["bad", "good"]
pytestmark = pytest.mark.usefixtures("healthy_fleet")  # faults are cleared after each test


def test_check_refuses_an_event_with_cut_json() -> None:
    check = StreamCheck(ResponseLimits())
    ok = b'data: {"id":"x","choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
    assert check.event(ok) == ok
    assert check.event(b": keep-alive\n\n") == b": keep-alive\n\n"
    with pytest.raises(InvalidAnswer):
        check.event(b'data: {"id":"x","choices":[{"index":0,"delta":{"cont\n\n')


def test_cut_json_event_is_not_relayed_and_the_stream_is_resumed(
    fleet: Fleet,
    gateway: Callable[..., GatewayServer],
) -> None:
    fleet.set_faults("bad", broken_body="truncated_json")
    gw = gateway(f"""
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
    # A stream is recorded once it has ended on the gateway's side, a moment after the last byte.
    poll(lambda: gw.seen)
    assert gw.seen[-1].failures == ["bad:bad_response"]
