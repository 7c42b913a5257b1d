"""A managed key stopped while its streams run (revoked, expired, or given a budget it has
already spent) stops them within a bounded time: the stream ends with an error event in the
API's shape (the official SDK raises it), is recorded once (one access-log line, one metrics
count, with the stop's status) and is charged what was relayed up to then. Streams of other keys
go on. Real gateway on loopback, the project's simulator (a slow decoder), real Redis, the
official openai client.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from typing import Any

import anthropic
import httpx
import openai
import pytest

from loadtests.simulator.testing import Fleet
from tests.support import AccessLines, GatewayServer, poll

MAX_TOKENS = 60  # about 3 s at the slow member's 20 tokens a second
STOP_BOUND_S = 3.0  # stopped within this after the change (checked at least every second)


def _policy(fleet: Fleet) -> str:
    return f"""
providers:
  slow: {{base_url: '{fleet.url("slow")}', models: {{'*': sim}},
          price: {{input_per_1m: 1000, output_per_1m: 1000}}}}
pools:
  main: {{members: [slow]}}
models:
  chat: {{pool: main}}
"""


@pytest.fixture
def gw(fleet: Fleet, gateway: Callable[..., GatewayServer], redis_url, redis_prefix, monkeypatch):
    monkeypatch.setenv("GATEWAY_REDIS_PREFIX", redis_prefix)
    monkeypatch.delenv("GATEWAY_API_KEYS", raising=False)
    return gateway(_policy(fleet), redis_url=redis_url)


class Reader(threading.Thread):
    """Reads one stream with the official client; records its events, end and error."""

    def __init__(self, gw: GatewayServer, key: str, request_id: str) -> None:
        super().__init__(daemon=True)
        self.client = openai.OpenAI(base_url=gw.base_url, api_key=key, max_retries=0)
        self.request_id = request_id
        self.content_events = 0
        self.error: Exception | None = None
        self.ended_at: float | None = None

    def run(self) -> None:
        try:
            stream = self.client.chat.completions.create(
                model="chat",
                messages=[{"role": "user", "content": f"tell me a long story {time.time()}"}],
                max_tokens=MAX_TOKENS,
                stream=True,
                extra_headers={"x-request-id": self.request_id},
            )
            for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    self.content_events += 1
        except Exception as e:  # noqa: BLE001 - what the SDK raised is what the test checks
            self.error = e
        finally:
            self.ended_at = time.monotonic()


def _stop_revoke(gw: GatewayServer, key_id: str) -> None:
    assert httpx.post(f"{gw.url}/admin/keys/{key_id}/revoke").status_code == 200


def _stop_expire(gw: GatewayServer, key_id: str) -> None:
    r = httpx.patch(f"{gw.url}/admin/keys/{key_id}", json={"expires_at": time.time() + 0.2})
    assert r.status_code == 200


def _stop_budget(gw: GatewayServer, key_id: str) -> None:
    # Spent already (the warm-up request): a budget below that is exhausted at once.
    r = httpx.patch(f"{gw.url}/admin/keys/{key_id}", json={"budget": {"daily_usd": 0.000001}})
    assert r.status_code == 200


STOPS: dict[str, tuple[Callable[[GatewayServer, str], None], int, str]] = {
    "revoke": (_stop_revoke, 401, "invalid_api_key"),
    "expire": (_stop_expire, 401, "invalid_api_key"),
    "budget": (_stop_budget, 429, "insufficient_quota"),
}


def _requests_with_status(gw: GatewayServer, status: int) -> float:
    text = httpx.get(gw.url + "/metrics").text
    pat = rf'^gateway_requests_total{{[^}}]*status="{status}"[^}}]*}} (\S+)$'
    return sum(float(v) for v in re.findall(pat, text, re.M))


def test_a_stopped_key_stops_its_running_streams(
    gw: GatewayServer, access_log: AccessLines
) -> None:
    """Three keys stopped three ways while their streams run, and a fourth left alone."""
    spec: dict[str, Any] = {"tenant": "t", "budget": {"daily_usd": 100}}
    keys = {how: httpx.post(gw.url + "/admin/keys", json=spec).json() for how in STOPS}
    other = httpx.post(gw.url + "/admin/keys", json=spec).json()
    spent_before = {}
    for how, key in keys.items():
        # Something spent by the key before its stream (what a lowered budget is compared with).
        warm = httpx.post(
            gw.base_url + "/chat/completions",
            json={
                "model": "chat",
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 2,
            },
            headers={"authorization": f"Bearer {key['key']}"},
            timeout=10,
        )
        assert warm.status_code == 200
        spent_before[how] = _spend(gw, key["id"])
    before = {s: _requests_with_status(gw, s) for s in (401, 429)}
    victims = {how: Reader(gw, key["key"], f"victim-{how}") for how, key in keys.items()}
    bystander = Reader(gw, other["key"], "bystander")
    for r in (*victims.values(), bystander):
        r.start()
    poll(lambda: all(v.content_events >= 5 for v in victims.values()), within_s=10)
    stopped_at = {}
    for how, key in keys.items():
        STOPS[how][0](gw, key["id"])
        stopped_at[how] = time.monotonic()
    for how, victim in victims.items():
        _, status, code = STOPS[how]
        victim.join(STOP_BOUND_S + 2)
        assert victim.ended_at is not None, f"{how}: the stream went on"
        assert victim.ended_at - stopped_at[how] < STOP_BOUND_S, how
        # The SDK raised the error event, in OpenAI's shape.
        assert isinstance(victim.error, openai.APIError), (how, repr(victim.error))
        assert (victim.error.code or "") == code, (how, victim.error.body)
        assert victim.content_events < MAX_TOKENS - 10, how
        # Recorded once, with the stop's status, and charged what was relayed.
        line = access_log.wait_for(f"victim-{how}", within_s=5)
        assert line["status"] == status, how
        assert [x["request_id"] for x in access_log.lines].count(f"victim-{how}") == 1
        spent = _spend(gw, keys[how]["id"])
        assert spent["requests"] == spent_before[how]["requests"] + 1, how
        charged = spent["output_tokens"] - spent_before[how]["output_tokens"]
        assert victim.content_events - 2 <= charged <= victim.content_events + 5, how
        assert spent["cost_usd"] > spent_before[how]["cost_usd"], how
    # One metrics count each: two 401s (revoked, expired), one 429 (budget).
    poll(lambda: _requests_with_status(gw, 401) == before[401] + 2, within_s=5)
    assert _requests_with_status(gw, 429) == before[429] + 1
    # The other key's stream was not touched.
    bystander.join(15)
    assert bystander.error is None and bystander.content_events >= MAX_TOKENS - 5


def _spend(gw: GatewayServer, key_id: str) -> dict[str, Any]:
    doc = httpx.get(gw.url + "/admin/spend", params={"key": key_id}).json()
    return doc["total"]


def test_a_revoked_keys_messages_stream_ends_in_anthropic_shape(
    gw: GatewayServer, access_log: AccessLines
) -> None:
    """The Messages API's stream of a revoked key ends with its own `event: error` (the
    Anthropic SDK raises it), recorded once with the stop's status."""
    key = httpx.post(gw.url + "/admin/keys", json={"tenant": "t"}).json()
    claude = anthropic.Anthropic(base_url=gw.url, api_key=key["key"], max_retries=0)
    events = 0
    raised: Exception | None = None
    stopped_at = 0.0
    try:
        with claude.messages.stream(
            model="chat",
            max_tokens=MAX_TOKENS,
            messages=[{"role": "user", "content": f"tell me a long story {time.time()}"}],
            extra_headers={"x-request-id": "victim-messages"},
        ) as stream:
            for _ in stream.text_stream:
                events += 1
                if events == 5:
                    _stop_revoke(gw, key["id"])
                    stopped_at = time.monotonic()
    except anthropic.APIError as e:
        raised = e
    assert stopped_at and time.monotonic() - stopped_at < STOP_BOUND_S
    assert raised is not None and events < MAX_TOKENS - 10
    # Anthropic's type for the stop, not `api_error` (its own failure, which clients retry).
    body: Any = getattr(raised, "body", None)
    assert body["error"]["type"] == "authentication_error", body
    line = access_log.wait_for("victim-messages", within_s=5)
    assert line["status"] == 401
    assert [x["request_id"] for x in access_log.lines].count("victim-messages") == 1
