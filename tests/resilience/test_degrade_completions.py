"""A legacy completions request nothing can answer gets the degradation rule's answer as a text
completion (streamed or not), readable by the official OpenAI client, never a chat completion;
a queueing rule is not applied to it (a replay runs as a chat request): it gets the honest error
(real simulator on loopback as the failing upstream)."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

import openai
import pytest

from loadtests.simulator.testing import Fleet
from tests.support import GatewayServer, poll

FLEET = ["down"]
pytestmark = pytest.mark.usefixtures("healthy_fleet")  # faults are cleared after each test

RULES = """
rules:
  - name: later
    match: {keywords: [queue me]}
    queue: true
    template: "queued as {request_id}"
  - name: unsafe
    match: {keywords: [dosage]}
    status: 503
    retry_after_s: 42
    template: "not now"
default:
  name: default
  template: "No model for {alias} right now, sorry."
"""


@pytest.fixture
def gw(fleet: Fleet, gateway: Callable[..., GatewayServer]) -> GatewayServer:
    fleet.set_faults("down", error_rate=1.0, error_status=[503])
    rules = Path(tempfile.mkdtemp(prefix="rules-"))
    (rules / "rules.yaml").write_text(RULES)
    return gateway(
        f"""
providers:
  down: {{base_url: '{fleet.url("down")}'}}
pools:
  main: {{members: [down]}}
models:
  chat: {{pool: main}}
retry: {{base_backoff_ms: 0, max_backoff_ms: 0}}
degradation: {{rules: '{rules}'}}
"""
    )


def client(gw: GatewayServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0)


@pytest.mark.parametrize("prompt", ["hello there", ["hello there"]])
def test_a_degraded_completion_is_a_text_completion(gw: GatewayServer, prompt: object) -> None:
    raw = client(gw).completions.with_raw_response.create(
        model="chat",
        prompt=prompt,  # type: ignore[arg-type]
        max_tokens=5,
    )
    assert raw.headers["x-gateway-degraded"] == "true"
    assert raw.headers["x-gateway-rule"] == "default"
    done = raw.parse()
    assert done.object == "text_completion"
    assert done.choices[0].text == "No model for chat right now, sorry."
    assert done.choices[0].finish_reason == "stop"
    assert done.model == "chat"


@pytest.mark.parametrize("include_usage", [False, True])
def test_a_degraded_completion_stream_is_text_completion_chunks(
    gw: GatewayServer, include_usage: bool
) -> None:
    extra = {"stream_options": {"include_usage": True}} if include_usage else {}
    chunks = list(
        client(gw).completions.create(
            model="chat", prompt="hello there", max_tokens=5, stream=True, **extra
        )
    )
    assert all(c.object == "text_completion" for c in chunks)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == "No model for chat right now, sorry."
    finished = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finished[-1] == "stop"
    assert (chunks[-1].usage is not None) == include_usage


def test_an_error_rule_answers_the_completions_client_in_openai_shape(gw: GatewayServer) -> None:
    with pytest.raises(openai.InternalServerError) as raised:
        client(gw).completions.create(model="chat", prompt="what dosage?", max_tokens=5)
    assert raised.value.status_code == 503
    assert raised.value.response.headers["retry-after"] == "42"
    assert raised.value.response.json()["error"]["message"] == "not now"


def test_a_queueing_rule_does_not_queue_a_completions_request(gw: GatewayServer) -> None:
    queue = gw.pipeline.degradation
    before = queue.queued
    with pytest.raises(openai.InternalServerError) as raised:
        client(gw).completions.create(model="chat", prompt="please queue me", max_tokens=5)
    assert raised.value.status_code == 502
    assert "x-gateway-deferred" not in raised.value.response.headers
    assert queue.queued == before
    poll(lambda: gw.seen)
    assert gw.seen[-1].status == 502 and not gw.seen[-1].degraded
    # ... while the same words in a chat request are queued
    r = client(gw).chat.completions.with_raw_response.create(
        model="chat", messages=[{"role": "user", "content": "please queue me"}], max_tokens=5
    )
    assert r.headers["x-gateway-deferred"].startswith("dfr_")
    assert queue.queued == before + 1
