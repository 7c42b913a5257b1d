"""A semantic entry whose stored answer is not a valid answer is dropped, not found again.

Through the HTTP API with the simulator and a real Redis: one gateway caches a question, the
record's answer in Redis is then replaced by HTML (its vector and header kept, so it loads), and
a second gateway started on that Redis is asked a paraphrase. The entry is not served (a miss,
the upstream answers), is counted as a lookup rejected for `invalid_entry` (not as a hit), and is
removed from the index and from Redis, so the fresh answer serves the next similar question.
"""

from __future__ import annotations

import struct
import time

import httpx
import pytest
import redis

from tests.support import SEMANTIC_ONLY, TWO_TENANTS, policy, poll, requests_at

pytest.importorskip("faiss", reason="the semantic extra is not installed")

QUESTION = "How do I reset my password?"
PARAPHRASE = "How can I reset my password?"


def ask(gw, question: str) -> httpx.Response:
    body = {
        "model": "chat",
        "messages": [{"role": "user", "content": question}],
        "temperature": 0,
        "max_tokens": 8,
    }
    r = httpx.post(
        gw.base_url + "/chat/completions",
        json=body,
        headers={"authorization": "Bearer key-1"},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    return r


def metric(gw, line_start: str) -> float:
    text = httpx.get(gw.url + "/metrics", timeout=10).text
    return sum(float(x.rsplit(" ", 1)[1]) for x in text.splitlines() if x.startswith(line_start))


def test_an_invalid_stored_answer_is_rejected_counted_and_dropped(
    fleet, gateway, redis_url, redis_prefix
) -> None:
    fleet.reset("a")
    text = policy({"p": fleet.url("a")}, auth=TWO_TENANTS, alias=SEMANTIC_ONLY)
    first = gateway(text, redis_url=redis_url, prefix=redis_prefix)
    assert ask(first, QUESTION).headers["x-gateway-cache"] == "miss"
    r = redis.Redis.from_url(redis_url)
    pattern = f"{redis_prefix}sem:*"
    keys = poll(lambda: list(r.scan_iter(match=pattern)), within_s=10)
    assert len(keys) == 1
    blob = r.get(keys[0])
    assert blob is not None
    hlen = struct.unpack_from("<3sI", blob)[1]
    dim = 384
    r.set(keys[0], blob[: 7 + hlen + 4 * dim] + b"<html>not an answer</html>", ex=300)

    second = gateway(text, redis_url=redis_url, prefix=redis_prefix)
    rejected = 'gateway_semantic_lookups_total{guard="invalid_entry",outcome="rejected"}'
    hits = 'gateway_semantic_lookups_total{guard="",outcome="hit"}'
    before = requests_at(fleet, "a")
    miss = ask(second, PARAPHRASE)
    assert miss.headers["x-gateway-cache"] == "miss"
    assert miss.json()["choices"][0]["message"]["content"]
    assert requests_at(fleet, "a") == before + 1
    assert metric(second, rejected) == 1 and metric(second, hits) == 0
    # Gone from Redis; the fresh answer (stored under the paraphrase) serves the next one.
    poll(lambda: not r.exists(keys[0]), within_s=5)
    deadline = time.monotonic() + 10
    while (hit := ask(second, QUESTION)).headers["x-gateway-cache"] != "hit-semantic":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert hit.json() == miss.json()
    assert metric(second, rejected) == 1
    r.close()


def _poison(r: redis.Redis, prefix: str) -> bytes:
    """Replace the answer of the one stored record by HTML (header and vector kept)."""
    keys = poll(lambda: list(r.scan_iter(match=f"{prefix}sem:*")), within_s=10)
    assert len(keys) == 1
    blob = r.get(keys[0])
    assert blob is not None
    hlen = struct.unpack_from("<3sI", blob)[1]
    r.set(keys[0], blob[: 7 + hlen + 4 * 384] + b"<html>not an answer</html>", ex=300)
    return keys[0]


def test_an_invalid_entry_found_by_a_late_lookup_leaves_the_upstream_call_running(
    fleet, gateway, redis_url, redis_prefix
) -> None:
    """With a lookup budget, the upstream call starts before the lookup ends; a lookup that then
    finds an entry cancelled that call before checking the entry: an invalid one left the
    request without an answer. The entry is now checked first, and the call goes on."""
    fleet.reset("slow")
    text = policy(
        {"p": fleet.url("slow")},
        auth=TWO_TENANTS,
        alias=SEMANTIC_ONLY,
        extra="semantic_cache: {lookup_budget_ms: 0.001}\n",
    )
    first = gateway(text, redis_url=redis_url, prefix=redis_prefix)
    assert ask(first, QUESTION).headers["x-gateway-cache"] == "miss"
    r = redis.Redis.from_url(redis_url)
    key = _poison(r, redis_prefix)
    second = gateway(text, redis_url=redis_url, prefix=redis_prefix)
    before = requests_at(fleet, "slow")
    answer = ask(second, PARAPHRASE)
    assert answer.headers["x-gateway-cache"] == "miss"
    assert "x-gateway-cache-similarity" not in answer.headers
    assert answer.json()["choices"][0]["message"]["content"]
    assert requests_at(fleet, "slow") == before + 1
    rejected = 'gateway_semantic_lookups_total{guard="invalid_entry",outcome="rejected"}'
    assert metric(second, rejected) == 1
    assert metric(second, 'gateway_semantic_lookups_total{guard="",outcome="late_hit_raced"}') == 0
    assert [c.status for c in second.seen] == [200]
    poll(lambda: not r.exists(key), within_s=5)
    r.close()
