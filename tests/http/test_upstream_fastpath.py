"""The lean ASGI entry (`gateway.http.server.FastRoutes`) that `gateway serve` uses in front of the app:
inference routes straight to the pipeline, the rest through FastAPI, client disconnects honoured."""

from __future__ import annotations

import time
from typing import Any

import httpx
import openai
import pytest

from loadtests.simulator.testing import Fleet
from tests.support import validate, validate_sse

FLEET: list[Any] = [
    {"name": "a", "profile": "fast"},
    {
        "name": "slow",
        "profile": "fast",
        "overrides": {"decode_tps_alone": 10, "decode_tps_full": 10},
    },
]


def policy(url: str) -> str:
    return f"""
providers:
  a: {{base_url: '{url}'}}
pools:
  p: {{members: [a]}}
models:
  chat: {{pool: p}}
"""


@pytest.fixture
def served(gateway):  # type: ignore[no-untyped-def]
    """The lean entry behind uvicorn's own HTTP protocol (not the gateway's httptools one)."""
    return lambda policy_yaml: gateway(policy_yaml, http="auto")


def test_chat_unary_and_stream(served, fleet: Fleet) -> None:
    gw = served(policy(fleet.url("a")))
    client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model="chat", messages=[{"role": "user", "content": "hi"}], max_tokens=5
    )
    assert raw.headers["x-gateway-provider"] == "a"
    validate("CreateChatCompletionResponse", raw.http_response.json())
    with httpx.stream(
        "POST",
        gw.base_url + "/chat/completions",
        json={"model": "chat", "messages": [{"role": "user", "content": "hi"}], "stream": True},
    ) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        data = r.read()
    validate_sse(data)
    assert data.rstrip().endswith(b"data: [DONE]")


def test_errors_keep_their_shape(served, fleet: Fleet) -> None:
    gw = served(policy(fleet.url("a")))
    r = httpx.post(gw.base_url + "/chat/completions", content=b"{not json")
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    r = httpx.post(gw.base_url + "/chat/completions", json={"model": "nope", "messages": []})
    assert r.status_code in (400, 404) and "error" in r.json()
    r = httpx.get(gw.url + "/v1/nothing-here")
    assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_url"
    r = httpx.get(gw.base_url + "/chat/completions")
    assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed"
    assert httpx.get(gw.url + "/health").json() == {"status": "ok"}


def test_client_disconnect_mid_stream_releases_the_member(served, fleet: Fleet) -> None:
    gw = served(policy(fleet.url("slow")))
    member = gw.app.state.runtime.snapshot.providers["a"].member
    fleet.set_faults("slow", slow_decode=1000.0)  # after the first chunk, ~100 s per token
    try:
        with httpx.stream(
            "POST",
            gw.base_url + "/chat/completions",
            json={
                "model": "chat",
                "messages": [{"role": "user", "content": "tell me a long story"}],
                "max_tokens": 50,
                "stream": True,
            },
            timeout=10,
        ) as r:
            assert r.status_code == 200
            chunks = r.iter_raw()  # held: a dropped iterator would close the connection here
            assert next(chunks).startswith(b"data: ")
            assert member.inflight == 1
        # The gateway must stop as soon as the client left (not at the 30 s idle timeout).
        deadline = time.monotonic() + 5
        while member.inflight and time.monotonic() < deadline:
            time.sleep(0.02)
        assert member.inflight == 0
    finally:
        fleet.set_faults("slow")
    # The gateway keeps serving afterwards.
    r = httpx.post(
        gw.base_url + "/chat/completions",
        json={"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        timeout=10,
    )
    assert r.status_code == 200
