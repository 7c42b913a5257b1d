"""The exact cache's borders, through the HTTP API with the simulator and a real Redis.

`Cache-Control: max-age=N` (N > 0) serves an entry only when it is younger than N seconds (an
entry of unknown age, written before entries recorded it, is a miss for such a request); N is
bounded. An answer larger than the alias's `max_entry_bytes` is not stored, and the refusal is
counted in `gateway_semantic_stores_total{outcome="refused",reason="exact_too_big"}`.
"""

from __future__ import annotations

import time

import httpx
import openai
import pytest
import redis

from gateway.policy.loader import check_policy_file
from tests.support import SEMANTIC_ONLY, TWO_TENANTS, policy, requests_at

MSG = [{"role": "user", "content": "How old may a cached answer be?"}]


@pytest.fixture
def gw(fleet, gateway, redis_url, redis_prefix, monkeypatch):
    monkeypatch.setenv("GATEWAY_REDIS_PREFIX", redis_prefix)
    fleet.reset("a")
    alias = {"cache": {"exact": {"max_entry_bytes": 2048}}}
    return gateway(
        policy({"p": fleet.url("a")}, auth=TWO_TENANTS, alias=alias), redis_url=redis_url
    )


def post(gw, headers: dict[str, str | bytes] | None = None, **kw) -> httpx.Response:
    body = {"model": "chat", "messages": MSG, "temperature": 0, "max_tokens": 8, **kw}
    return httpx.post(
        gw.base_url + "/chat/completions",
        json=body,
        headers={"authorization": "Bearer key-1", **(headers or {})},
        timeout=30,
    )


def metric(gw, line_start: str) -> float:
    text = httpx.get(gw.url + "/metrics", timeout=10).text
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines() if ln.startswith(line_start))


def test_max_age_serves_only_entries_young_enough(gw, fleet) -> None:
    first = post(gw)
    assert first.headers["x-gateway-cache"] == "miss"
    young = post(gw, {"cache-control": "max-age=60"})
    assert (
        young.headers["x-gateway-cache"] == "hit-exact" and young.json()["id"] == first.json()["id"]
    )
    time.sleep(1.2)
    old = post(gw, {"cache-control": "private, Max-Age=1"})
    assert old.headers["x-gateway-cache"] == "miss"
    assert requests_at(fleet, "a") == 2
    # The fresh answer replaced the entry: young enough now.
    again = post(gw, {"cache-control": "max-age=1"})
    assert again.headers["x-gateway-cache"] == "hit-exact"
    assert again.json()["id"] == old.json()["id"]
    # Bounded: a huge N is 2^31 (a hit), several max-ages take the strictest, bad values are
    # ignored; none of them is a 500.
    for value, served in [
        ("max-age=" + "9" * 5000, "hit-exact"),
        ('max-age="120"', "hit-exact"),
        ("max-age=abc", "hit-exact"),
        ("max-age=-5", "hit-exact"),
        ("max-age=\u0661\u0662", "hit-exact"),  # digits of another script, as UTF-8 bytes
    ]:
        r = post(gw, {"cache-control": value.encode()})
        assert r.status_code == 200 and r.headers["x-gateway-cache"] == served, value
    time.sleep(1.2)
    r = post(gw, {"cache-control": "max-age=3600, max-age=1"})
    assert r.headers["x-gateway-cache"] == "miss"
    assert requests_at(fleet, "a") == 3


def test_an_entry_of_unknown_age_is_a_miss_only_under_max_age(gw, fleet, redis_url) -> None:
    first = post(gw)
    client = redis.Redis.from_url(redis_url)
    try:
        keys = list(client.scan_iter(match=gw.prefix + "exact:*"))
        assert len(keys) == 1
        client.set(keys[0], first.content)  # the answer alone, as older gateways stored it
    finally:
        client.close()
    assert post(gw).headers["x-gateway-cache"] == "hit-exact"
    assert post(gw, {"cache-control": "max-age=3600"}).headers["x-gateway-cache"] == "miss"
    assert requests_at(fleet, "a") == 2


def test_answers_over_max_entry_bytes_are_not_stored_and_are_counted(gw, fleet) -> None:
    refused = 'gateway_semantic_stores_total{outcome="refused",reason="exact_too_big"}'
    assert metric(gw, refused) == 0
    small = post(gw)
    assert len(small.content) < 2048
    assert post(gw).headers["x-gateway-cache"] == "hit-exact"
    big = post(gw, max_tokens=600)
    assert big.status_code == 200 and len(big.content) > 2048
    assert post(gw, max_tokens=600).headers["x-gateway-cache"] == "miss"
    # A streamed answer is assembled and refused the same way; the official client reads it.
    oai = openai.OpenAI(base_url=gw.base_url, api_key="key-1", max_retries=0)
    body = {"model": "chat", "messages": MSG, "temperature": 0, "max_tokens": 700}
    text = "".join(
        c.choices[0].delta.content or ""
        for c in oai.chat.completions.create(**body, stream=True)
        if c.choices
    )
    assert len(text) > 2048
    deadline = time.monotonic() + 5
    while metric(gw, refused) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert metric(gw, refused) == 3
    assert post(gw, max_tokens=700).headers["x-gateway-cache"] == "miss"
    assert requests_at(fleet, "a") == 5


@pytest.mark.parametrize("value", [0, 10**12, "big"])
def test_max_entry_bytes_is_bounded_in_the_policy(tmp_path, value) -> None:
    path = tmp_path / "policy.yaml"
    alias = {"cache": {"exact": {"max_entry_bytes": value}}}
    path.write_text(policy({"p": "http://127.0.0.1:9"}, alias=alias))
    report = check_policy_file(path)
    assert report.policy is None
    assert any("max_entry_bytes" in e for e in report.errors), report.errors


def test_semantic_entries_of_unknown_age_are_not_served_under_max_age(
    fleet, gateway, redis_url, redis_prefix, monkeypatch
) -> None:
    pytest.importorskip("faiss", reason="the semantic extra is not installed")
    monkeypatch.setenv("GATEWAY_REDIS_PREFIX", redis_prefix)
    fleet.reset("a")
    gw = gateway(
        policy({"p": fleet.url("a")}, auth=TWO_TENANTS, alias=SEMANTIC_ONLY), redis_url=redis_url
    )
    question = [{"role": "user", "content": "How do I reset my router password?"}]
    assert post(gw, messages=question).headers["x-gateway-cache"] == "miss"
    deadline = time.monotonic() + 5
    while post(gw, messages=question).headers["x-gateway-cache"] != "hit-semantic":
        assert time.monotonic() < deadline, "the answer was never stored"
        time.sleep(0.1)
    served = post(gw, {"cache-control": "max-age=3600"}, messages=question)
    assert served.status_code == 200 and served.headers["x-gateway-cache"] == "miss"
