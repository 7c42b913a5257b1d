"""The lean ASGI entry (`gateway.http.server.FastRoutes`) that `gateway serve` uses in front of the app:
inference routes straight to the pipeline, the rest through FastAPI, client disconnects honoured."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import openai
import pytest
import uvicorn

from gateway.http.server import FastRoutes
from loadtests.simulator.testing import Fleet, run_fleet
from tests.support import GatewayServer, validate, validate_sse


@pytest.fixture(scope="module")
def sims() -> Iterator[Fleet]:
    with run_fleet(
        [
            {"name": "a", "profile": "fast"},
            {
                "name": "slow",
                "profile": "fast",
                "overrides": {"decode_tps_alone": 10, "decode_tps_full": 10},
            },
        ]
    ) as f:
        yield f


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
def served() -> Iterator[object]:
    started: list[GatewayServer] = []

    def start(policy_yaml: str) -> GatewayServer:
        gw = GatewayServer(policy_yaml)
        gw.config = uvicorn.Config(
            FastRoutes(gw.app), host="127.0.0.1", port=gw.port, log_level="warning"
        )
        gw.server = uvicorn.Server(gw.config)
        gw.thread.__init__(target=gw.server.run, daemon=True)  # type: ignore[misc]
        gw.__enter__()
        started.append(gw)
        return gw

    yield start
    for gw in started:
        gw.__exit__(None, None, None)


def test_chat_unary_and_stream(served, sims: Fleet) -> None:
    gw = served(policy(sims.url("a")))
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


def test_errors_keep_their_shape(served, sims: Fleet) -> None:
    gw = served(policy(sims.url("a")))
    r = httpx.post(gw.base_url + "/chat/completions", content=b"{not json")
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    r = httpx.post(gw.base_url + "/chat/completions", json={"model": "nope", "messages": []})
    assert r.status_code in (400, 404) and "error" in r.json()
    r = httpx.get(gw.url + "/v1/nothing-here")
    assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_url"
    r = httpx.get(gw.base_url + "/chat/completions")
    assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed"
    assert httpx.get(gw.url + "/health").json() == {"status": "ok"}


def test_client_disconnect_mid_stream_releases_the_member(served, sims: Fleet) -> None:
    gw = served(policy(sims.url("slow")))
    member = gw.app.state.runtime.snapshot.providers["a"].member
    sims.set_faults("slow", slow_decode=1000.0)  # after the first chunk, ~100 s per token
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
        sims.set_faults("slow")
    # The gateway keeps serving afterwards.
    r = httpx.post(
        gw.base_url + "/chat/completions",
        json={"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        timeout=10,
    )
    assert r.status_code == 200
