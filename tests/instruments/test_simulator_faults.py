"""Provider simulator: every fault mode does what it says, and the admin endpoints control them."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from loadtests.simulator.testing import Fleet

BODY: dict[str, Any] = {
    "model": "m",
    "messages": [{"role": "user", "content": "hi"}],
    "max_tokens": 10,
}


FLEET: list[Any] = [
    {"name": "f", "profile": "fast"},
    {"name": "other", "profile": "fast"},
    {"name": "zero", "profile": "zero-latency"},
]
FLEET_ADMIN = True


@pytest.fixture
def url(fleet: Fleet) -> Iterator[str]:
    """The faulty instance's base URL; its faults are cleared after each test."""
    fleet.reset("f")
    yield fleet.url("f")
    fleet.clear_faults("f")


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=5) as c:
        yield c


def test_error_rate_with_statuses(fleet: Fleet, url: str, client: httpx.Client) -> None:
    fleet.set_faults("f", error_rate=1.0, error_status=[503])
    r = client.post(url + "/chat/completions", json=BODY)
    assert r.status_code == 503 and r.json()["error"]["type"] == "server_error"
    assert r.headers["x-sim-instance"] == "f"
    fleet.set_faults("f", error_rate=0.5, error_status=[500, 502])
    codes = Counter(
        client.post(url + "/chat/completions", json=BODY).status_code for _ in range(40)
    )
    assert set(codes) == {200, 500, 502}, codes
    assert fleet.stats("f")["faults_injected"]["error"] == 1 + codes[500] + codes[502]
    # The other instance is unaffected.
    assert client.post(fleet.url("other") + "/chat/completions", json=BODY).status_code == 200


def test_rate_limit_sends_429_with_retry_after(
    fleet: Fleet, url: str, client: httpx.Client
) -> None:
    fleet.set_faults("f", rate_limit=1.0, retry_after_s=7)
    r = client.post(url + "/chat/completions", json=BODY)
    assert r.status_code == 429 and r.headers["retry-after"] == "7"
    assert r.json()["error"]["code"] == "rate_limit_exceeded"
    fleet.set_faults("f", rate_limit=0.5)
    codes = Counter(
        client.post(url + "/embeddings", json={"input": "x"}).status_code for _ in range(30)
    )
    assert set(codes) == {200, 429}


def _ttft(client: httpx.Client, url: str) -> float:
    t0 = time.perf_counter()
    with client.stream("POST", url + "/chat/completions", json={**BODY, "stream": True}) as r:
        for line in r.iter_lines():
            if '"content":"' in line and '"content":""' not in line:
                return time.perf_counter() - t0
    raise AssertionError("no content")


def test_slow_first_token_and_multiplier(fleet: Fleet, url: str, client: httpx.Client) -> None:
    assert _ttft(client, url) < 0.1
    fleet.set_faults("f", slow_first_token_ms=300)
    assert _ttft(client, url) >= 0.3
    fleet.set_faults("f", ttft_multiplier=100)  # fast profile: ~1 ms base -> ~100 ms
    assert _ttft(client, url) >= 0.09


def test_hang_until_client_gives_up(fleet: Fleet, url: str, client: httpx.Client) -> None:
    fleet.set_faults("f", hang=True)
    t0 = time.perf_counter()
    with pytest.raises(httpx.ReadTimeout):
        client.post(url + "/chat/completions", json=BODY, timeout=httpx.Timeout(5, read=0.3))
    assert 0.25 < time.perf_counter() - t0 < 2
    time.sleep(0.05)
    s = fleet.stats("f")
    assert s["in_flight"] == 0 and s["faults_injected"]["hang"] == 1  # the server let go too
    assert client.get(fleet.root_url("f") + "/health").status_code == 200


def test_refuse_connections_and_recover(fleet: Fleet, url: str) -> None:
    with httpx.Client(timeout=2) as c:  # keeps a pooled keep-alive connection across the fault
        assert c.post(url + "/chat/completions", json=BODY).status_code == 200
        fleet.set_faults("f", refuse_connections=True)
        for _ in range(2):
            with pytest.raises(httpx.ConnectError):
                c.post(url + "/chat/completions", json=BODY)
        assert fleet.stats("f")["listening"] is False
        fleet.clear_faults("f")
        r = c.post(url + "/chat/completions", json=BODY)
        assert r.status_code == 200 and r.headers["x-sim-instance"] == "f"


def test_refuse_and_recover_through_fleet_admin_port(
    fleet: Fleet, url: str, client: httpx.Client
) -> None:
    admin = fleet.admin_url
    assert admin is not None
    listing = client.get(admin + "/instances").json()
    assert listing["f"]["url"] == url
    r = client.post(admin + "/instances/f/faults", json={"refuse_connections": True})
    assert r.status_code == 200 and r.json()["refuse_connections"] is True
    with pytest.raises(httpx.ConnectError):
        httpx.get(fleet.root_url("f") + "/health", timeout=1)
    assert client.delete(admin + "/instances/f/faults").status_code == 200
    assert httpx.get(fleet.root_url("f") + "/health", timeout=1).status_code == 200
    assert client.get(admin + "/instances/nope/stats").status_code == 404


def test_cut_stream_midway(fleet: Fleet, url: str, client: httpx.Client) -> None:
    fleet.set_faults("f", cut_stream_after_chunks=3)
    received: list[str] = []
    body = {**BODY, "stream": True}
    with (
        pytest.raises(httpx.RemoteProtocolError),
        client.stream("POST", url + "/chat/completions", json=body) as r,
    ):
        assert r.status_code == 200
        for line in r.iter_lines():
            received.append(line)
    data = [json.loads(x[6:]) for x in received if x.startswith("data: {")]
    contents = [
        d["choices"][0]["delta"]["content"] for d in data if d["choices"][0]["delta"].get("content")
    ]
    assert len(contents) == 3 and "data: [DONE]" not in received
    # Non-streaming bodies are cut too: the client sees an incomplete response.
    with pytest.raises(httpx.RemoteProtocolError):
        client.post(url + "/chat/completions", json=BODY)
    assert fleet.stats("f")["faults_injected"]["cut_stream"] == 2


def test_slow_decode(fleet: Fleet, url: str, client: httpx.Client) -> None:
    body = {**BODY, "max_tokens": 100}  # 2000 tok/s: ~50 ms
    t0 = time.perf_counter()
    client.post(url + "/chat/completions", json=body)
    normal = time.perf_counter() - t0
    fleet.set_faults("f", slow_decode=6)
    t0 = time.perf_counter()
    client.post(url + "/chat/completions", json=body)
    assert time.perf_counter() - t0 > max(0.2, 2 * normal)


def test_faults_apply_to_zero_latency_too(fleet: Fleet, client: httpx.Client) -> None:
    fleet.set_faults("zero", error_rate=1, error_status=[502])
    try:
        assert client.post(fleet.url("zero") + "/chat/completions", json=BODY).status_code == 502
    finally:
        fleet.clear_faults("zero")
    assert client.post(fleet.url("zero") + "/chat/completions", json=BODY).status_code == 200


def test_instance_admin_endpoints(fleet: Fleet, url: str, client: httpx.Client) -> None:
    root = fleet.root_url("f")
    assert client.post(root + "/admin/faults", json={"error_rate": 2}).status_code == 400
    assert client.post(root + "/admin/faults", json={"bogus": 1}).status_code == 400
    r = client.post(root + "/admin/faults", json={"unhealthy": True})
    assert r.status_code == 200 and client.get(root + "/admin/faults").json()["unhealthy"]
    assert client.get(root + "/health").status_code == 503
    assert client.delete(root + "/admin/faults").json()["unhealthy"] is False
    assert client.get(root + "/health").status_code == 200

    client.post(url + "/chat/completions", json=BODY)
    client.post(url + "/embeddings", json={"input": "x"})
    stats = client.get(root + "/admin/stats").json()
    assert stats["requests"] == 2 and stats["by_endpoint"] == {"chat": 1, "embeddings": 1}
    assert stats["in_flight"] == 0 and stats["queued"] == 0
    assert client.post(root + "/admin/reset").status_code == 200
    assert client.get(root + "/admin/stats").json()["requests"] == 0
    with pytest.raises(ValueError):
        fleet.set_faults("f", ttft_multiplier=0)


def test_cut_stream_then_continuation_rebuilds_the_answer(
    fleet: Fleet, url: str, client: httpx.Client
) -> None:
    """The resume path a gateway uses: keep what arrived, ask for the rest, join them."""
    body = {**BODY, "max_tokens": 12, "seed": 9}
    whole = client.post(url + "/chat/completions", json=body).json()
    full = whole["choices"][0]["message"]["content"]
    fleet.set_faults("f", cut_stream_after_chunks=5)
    parts: list[str] = []
    with (
        pytest.raises(httpx.RemoteProtocolError),
        client.stream("POST", url + "/chat/completions", json={**body, "stream": True}) as r,
    ):
        for line in r.iter_lines():
            if line.startswith("data: {"):
                parts.append(json.loads(line[6:])["choices"][0]["delta"].get("content") or "")
    fleet.clear_faults("f")
    partial = "".join(parts)
    messages = [*BODY["messages"], {"role": "assistant", "content": partial}]
    rest = client.post(
        url + "/chat/completions", json={**body, "messages": messages, "max_tokens": 7}
    ).json()
    assert partial + rest["choices"][0]["message"]["content"] == full


@pytest.mark.parametrize("kind", ["garbage_json", "html", "truncated_json"])
def test_broken_bodies_with_status_200(
    fleet: Fleet, url: str, client: httpx.Client, kind: str
) -> None:
    fleet.set_faults("f", broken_body=kind)
    r = client.post(url + "/chat/completions", json=BODY)
    assert r.status_code == 200
    assert not _parses(r.content)
    if kind == "html":
        assert r.headers["content-type"].startswith("text/html")
    s = client.post(url + "/chat/completions", json={**BODY, "stream": True})
    assert s.status_code == 200 and b"[DONE]" not in s.content
    fleet.set_faults("f", broken_body=kind, broken_rate=0.5)
    ok = Counter(
        _parses(client.post(url + "/chat/completions", json=BODY).content) for _ in range(30)
    )
    assert set(ok) == {True, False}


def _parses(body: bytes) -> bool:
    try:
        json.loads(body)
    except ValueError:  # invalid JSON, or not even UTF-8
        return False
    return True


def test_stream_ends_cleanly_without_done(fleet: Fleet, url: str, client: httpx.Client) -> None:
    fleet.set_faults("f", end_stream_after_chunks=2)
    r = client.post(url + "/chat/completions", json={**BODY, "stream": True})
    assert r.status_code == 200  # complete chunked framing: no transport error
    events = [b for b in r.text.split("\n\n") if b.strip()]
    assert len(events) == 3 and "[DONE]" not in r.text and 'finish_reason":"' not in r.text
    assert fleet.stats("f")["faults_injected"]["end_stream_early"] == 1


def test_stall_after_headers_or_chunks(fleet: Fleet, url: str, client: httpx.Client) -> None:
    fleet.set_faults("f", stall_after_chunks=1)
    timeout = httpx.Timeout(5, read=0.3)
    with client.stream("POST", url + "/chat/completions", json=BODY, timeout=timeout) as r:
        assert r.status_code == 200  # headers came at once
        with pytest.raises(httpx.ReadTimeout):
            r.read()
    got = b""
    with (
        client.stream(
            "POST", url + "/chat/completions", json={**BODY, "stream": True}, timeout=timeout
        ) as r,
        pytest.raises(httpx.ReadTimeout),
    ):
        for chunk in r.iter_bytes():
            got += chunk
    assert got.count(b"data: ") == 2  # the role chunk and one word, then silence


def test_trickle_and_latency_spikes(fleet: Fleet, url: str, client: httpx.Client) -> None:
    fleet.set_faults("f", trickle_bytes_per_s=400)
    t0 = time.perf_counter()
    r = client.post(url + "/chat/completions", json=BODY)
    took = time.perf_counter() - t0
    assert r.status_code == 200 and r.json()["choices"]
    assert took >= len(r.content) / 400 * 0.8
    fleet.set_faults("f", spike_rate=1.0, spike_ms=300)
    t0 = time.perf_counter()
    assert client.post(url + "/chat/completions", json=BODY).status_code == 200
    assert time.perf_counter() - t0 >= 0.3
    fleet.set_faults("f", spike_rate=0.3, spike_ms=200)
    for _ in range(20):
        client.post(url + "/chat/completions", json=BODY)
    assert 0 < fleet.stats("f")["faults_injected"]["spike"] < 21
