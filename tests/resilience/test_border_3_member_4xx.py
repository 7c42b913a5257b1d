"""A member that answers a 4xx to every request because of its own configuration (its key
refused: 401/403; its account out of credit: 402; the mapped model or path not there: 404, 405,
410) is a failing member: another member answers, its breaker opens, and it stops drawing the
pool's traffic. Its quick refusals never make it look idle and fast to power-of-two-choices (a
402 relayed as a client error once drew almost every request). A client-caused 4xx (400 for a
bad request) is relayed and never counts against the member. Real simulators on loopback (an
OpenAI-wire and an Anthropic-wire member), the official OpenAI client."""

from __future__ import annotations

from collections.abc import Callable

import openai
import pytest

from gateway.providers import bedrock_mapping, gemini_mapping
from gateway.resilience.failures import MEMBER_CAUSED_4XX
from loadtests.simulator.testing import Fleet
from tests.support import GatewayServer, poll

FLEET = ["bad", "good", "an"]
pytestmark = pytest.mark.usefixtures("healthy_fleet", "fresh_counts")  # faults cleared after
MSG = [{"role": "user", "content": "hi"}]
REQUESTS = 24


@pytest.fixture
def fresh_counts(fleet: Fleet) -> None:
    for name in fleet.names:
        fleet.reset(name)


def policy(fleet: Fleet, anthropic: bool) -> str:
    bad = (
        f"{{type: anthropic, base_url: '{fleet.root_url('an')}'}}"
        if anthropic
        else f"{{base_url: '{fleet.url('bad')}'}}"
    )
    return f"""
providers:
  bad: {bad}
  good: {{base_url: '{fleet.url("good")}'}}
pools:
  main: {{members: [bad, good]}}
models:
  chat: {{pool: main, cache: {{exact: {{enabled: false}}}}}}
retry: {{base_backoff_ms: 0, max_backoff_ms: 0}}
"""


def sent_to(fleet: Fleet, name: str) -> int:
    return int(sum(fleet.stats(name)["by_endpoint"].values()))


@pytest.mark.parametrize("anthropic", [False, True], ids=["openai", "anthropic"])
@pytest.mark.parametrize("status", sorted(MEMBER_CAUSED_4XX))
def test_a_member_refusing_everything_is_taken_out(
    fleet: Fleet, gateway: Callable[..., GatewayServer], status: int, anthropic: bool
) -> None:
    bad = "an" if anthropic else "bad"
    fleet.set_faults(bad, error_rate=1.0, error_status=[status])
    gw = gateway(policy(fleet, anthropic))
    client = openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0)
    for i in range(REQUESTS):
        if i % 2:
            stream = client.chat.completions.create(
                model="chat", messages=MSG, max_tokens=4, stream=True
            )
            assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        else:
            answer = client.chat.completions.create(model="chat", messages=MSG, max_tokens=4)
            assert answer.choices[0].message.content
    # Each client request was answered by the good member; the bad one was tried about once
    # (its breaker opens at the first such refusal), not on most requests.
    assert sent_to(fleet, "good") == REQUESTS
    assert sent_to(fleet, bad) <= 3
    assert gw.breaker("bad")["state"] == "open"
    poll(lambda: len(gw.seen) >= REQUESTS)
    assert all(ctx.status == 200 for ctx in gw.seen)


def test_a_client_caused_400_is_relayed_and_does_not_count_against_the_member(
    fleet: Fleet, gateway: Callable[..., GatewayServer]
) -> None:
    fleet.set_faults("bad", error_rate=1.0, error_status=[400])
    fleet.set_faults("good", error_rate=1.0, error_status=[400])
    gw = gateway(policy(fleet, anthropic=False))
    client = openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0)
    for _ in range(10):
        with pytest.raises(openai.BadRequestError):
            client.chat.completions.create(model="chat", messages=MSG, max_tokens=4)
    # Relayed at once (never retried elsewhere), no member penalised.
    assert sent_to(fleet, "bad") + sent_to(fleet, "good") == 10
    for name in ("bad", "good"):
        assert gw.breaker(name)["state"] == "closed"
    members = {m.name: m for m in gw.runtime.snapshot.pools["main"].members}
    assert all(m.failures == 0 and m.failure_share() == 0 for m in members.values())


@pytest.mark.parametrize("status", sorted(MEMBER_CAUSED_4XX))
def test_every_wire_classifies_member_caused_statuses_alike(status: int) -> None:
    body = b'{"error": {"message": "no", "type": "x"}}'
    assert gemini_mapping.map_error(status, body).kind == "upstream_auth"
    assert bedrock_mapping.map_error(status, {}, body).kind == "upstream_auth"
    assert gemini_mapping.map_error(400, body).kind == "upstream_4xx"
    assert bedrock_mapping.map_error(400, {}, body).kind == "upstream_4xx"
