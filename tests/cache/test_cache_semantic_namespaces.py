"""The semantic cache keys on everything that changes the answer, through the HTTP API.

One question is cached under a base request; the same text and a paraphrase must then hit under
the base request and miss under a request that differs in exactly one of: the
`x-gateway-cache-namespace` header, the tenant (API key), the model alias, the earlier turns, or
an answer-changing parameter. Refreshes and refused stores are visible in /metrics.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support import SEMANTIC_ONLY, TWO_TENANTS, GatewayServer, policy

pytest.importorskip("faiss", reason="the semantic extra is not installed")

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
QUESTION = "What is the best time of year to visit Iceland?"
PARAPHRASE = "When is the best time of the year to visit Iceland?"


def two_aliases(url: str, extra: str = "") -> str:
    """`chat` and `chat-b` on one provider, both with only the semantic cache."""
    return policy(
        {"p": url},
        auth=TWO_TENANTS,
        alias=SEMANTIC_ONLY,
        models={"chat-b": {"pool": "main", **SEMANTIC_ONLY}},
        extra=extra,
    )


@pytest.fixture(scope="module")
def gw(fleet: Any) -> Iterator[GatewayServer]:
    """One gateway (in-memory semantic cache) for the module: the model loads once."""
    with GatewayServer(two_aliases(fleet.url("a"))) as server:
        yield server


def ask(
    gw: GatewayServer,
    question: str,
    *,
    key: str = "key-1",
    model: str = "chat",
    earlier: list[dict] | None = None,
    namespace: str | None = None,
    extra: dict | None = None,
    cache_control: str | None = None,
    name: str | None = None,
    ttl: str | None = None,
) -> httpx.Response:
    asked: dict[str, Any] = {"role": "user", "content": question}
    if name is not None:
        asked["name"] = name
    body = {
        "model": model,
        "messages": [SYSTEM, *(earlier or []), asked],
        "temperature": 0,
        "max_tokens": 8,
        **(extra or {}),
    }
    headers = {"authorization": f"Bearer {key}"}
    if namespace is not None:
        headers["x-gateway-cache-namespace"] = namespace
    if cache_control is not None:
        headers["cache-control"] = cache_control
    if ttl is not None:
        headers["x-gateway-cache-ttl"] = ttl
    r = httpx.post(gw.base_url + "/chat/completions", json=body, headers=headers, timeout=30)
    assert r.status_code == 200, r.text
    return r


def cached_then_hit(gw: GatewayServer, **base: Any) -> dict:
    """Cache QUESTION under `base` (must be a miss), wait until the paraphrase is served from it.

    Returns the cached answer (the simulator's answers carry unique ids, so bodies tell which
    entry served a hit).
    """
    first = ask(gw, QUESTION, **base)
    assert first.headers["x-gateway-cache"] == "miss"
    seen = [first.json()]
    deadline = time.monotonic() + 5
    while True:
        r = ask(gw, PARAPHRASE, **base)
        if r.headers["x-gateway-cache"] == "hit-semantic":
            assert r.json() in seen
            return first.json()
        # Asked before the first answer was stored: its own answer is stored too.
        seen.append(r.json())
        assert time.monotonic() < deadline, "the stored entry never became a hit"
        time.sleep(0.05)


VARIANTS: dict[str, tuple[dict, dict]] = {
    "namespace header": ({"namespace": "team-a"}, {"namespace": "team-b"}),
    "no namespace header vs one": ({}, {"namespace": "team-b"}),
    "tenant": ({}, {"key": "key-2"}),
    "alias": ({}, {"model": "chat-b"}),
    "earlier turns": (
        {
            "earlier": [
                {"role": "user", "content": "I live in Norway."},
                {"role": "assistant", "content": "Noted."},
            ]
        },
        {
            "earlier": [
                {"role": "user", "content": "I live in Peru."},
                {"role": "assistant", "content": "Noted."},
            ]
        },
    ),  # fmt: skip
    "response_format": ({}, {"extra": {"response_format": {"type": "json_object"}}}),
    "tools": (
        {},
        {"extra": {"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}},
    ),
    "max_tokens": ({}, {"extra": {"max_tokens": 9}}),
    # "What is my name?" asked by alice is not bob's question
    "name on the asked turn": ({"name": "alice"}, {"name": "bob"}),
}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_semantic_cache_isolates(gw: GatewayServer, name: str) -> None:
    base, other = VARIANTS[name]
    # A fresh namespace per case so the cases do not see each other's entries.
    salt = {"role": "user", "content": f"case {name} {uuid.uuid4().hex}"}
    base = {**base, "earlier": [salt, *base.get("earlier", [])]}
    other = {**base, **other, "earlier": [salt, *other.get("earlier", base["earlier"][1:])]}
    answer = cached_then_hit(gw, **base)
    # The same text under the other request misses; its own answer is cached and served to its
    # paraphrase, never the base's answer.
    assert cached_then_hit(gw, **other) != answer
    r = ask(gw, QUESTION, **base)
    assert r.headers["x-gateway-cache"] == "hit-semantic" and r.json() == answer


CONTEXT = (
    "I bought the AX3000 router last month from a local store. It has dual band wifi, four "
    "ethernet ports and a USB port, and the box says it comes with a mobile app. Question:"
)


def test_a_shared_context_does_not_make_different_questions_the_same(gw: GatewayServer) -> None:
    ns = {"namespace": f"context-{uuid.uuid4().hex}"}
    first = ask(gw, f"{CONTEXT} How long is the warranty?", **ns)
    assert first.headers["x-gateway-cache"] == "miss"
    seen = [first.json()]
    deadline = time.monotonic() + 5
    while True:  # the paraphrase of the question, after the same context, is served
        r = ask(gw, f"{CONTEXT} What is the warranty period?", **ns)
        if r.headers["x-gateway-cache"] == "hit-semantic":
            assert r.json() in seen
            break
        seen.append(r.json())  # asked before the first answer was stored: stored too
        assert time.monotonic() < deadline, "the stored entry never became a hit"
        time.sleep(0.05)
    # Other questions after the same long context share most words with it: never served.
    for other in ("Does it support WPA3?", "Is there a guest network?", "How do I set it up?"):
        r = ask(gw, f"{CONTEXT} {other}", **ns)
        assert r.headers["x-gateway-cache"] == "miss", other
    # With a second entry the namespace's questions are grouped by the context they share: the
    # rewording is now found by that context and judged by its own clause, unembedded whole.
    found = _metric(gw, "gateway_semantic_context_hits_total")
    deadline = time.monotonic() + 5
    while _metric(gw, "gateway_semantic_context_hits_total") == found:
        r = ask(gw, f"{CONTEXT} What is the warranty period?", **ns)
        assert r.headers["x-gateway-cache"] == "hit-semantic" and r.json() in seen
        assert time.monotonic() < deadline, "never found by its context"
        time.sleep(0.05)


def _metric(gw: GatewayServer, line_start: str) -> float:
    text = httpx.get(gw.url + "/metrics", timeout=10).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith(line_start):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_a_ttl_of_zero_stores_nothing(gw: GatewayServer) -> None:
    """`x-gateway-cache-ttl: 0` asks that this answer not be kept: it was an entry of one second."""
    ns = {"namespace": f"ttl0-{uuid.uuid4().hex}"}
    stored = _metric(gw, 'gateway_semantic_stores_total{outcome="stored"')
    assert ask(gw, QUESTION, ttl="0", **ns).headers["x-gateway-cache"] == "miss"
    time.sleep(0.3)  # a store would have happened by now (it was 1 s long before)
    assert _metric(gw, 'gateway_semantic_stores_total{outcome="stored"') == stored
    cached_then_hit(gw, **ns)  # a miss (nothing was stored), then stored as usual


def test_refresh_replaces_the_entry_and_stores_are_counted(gw: GatewayServer) -> None:
    ns = {"namespace": f"refresh-{uuid.uuid4().hex}"}
    stored_before = _metric(gw, 'gateway_semantic_stores_total{outcome="stored"')
    cached_then_hit(gw, **ns)
    # A refresh goes upstream and its store has happened when the response arrives.
    r = ask(gw, PARAPHRASE, cache_control="no-cache", **ns)
    assert r.headers["x-gateway-cache"] == "miss"
    stored_after = _metric(gw, 'gateway_semantic_stores_total{outcome="stored"')
    assert stored_after >= stored_before + 2
    hit = ask(gw, PARAPHRASE, **ns)
    assert hit.headers["x-gateway-cache"] == "hit-semantic"
    assert float(hit.headers["x-gateway-cache-similarity"]) > 0.999  # the refreshed entry
    size = _metric(gw, 'gateway_semantic_cache_size{what="bytes"}')
    assert 0 < size <= _metric(gw, 'gateway_semantic_cache_size{what="max_bytes"}')
    metrics = httpx.get(gw.url + "/metrics", timeout=10).text
    for reason in ("evicted", "expired"):  # entries removed unasked are counted too
        assert f'gateway_semantic_removed_total{{reason="{reason}"}}' in metrics
    # The embedding's texts: the model's and the memo's (the refresh reused its lookup's vector).
    assert _metric(gw, 'gateway_semantic_embedding_texts_total{how="model"}') >= 2
    assert _metric(gw, 'gateway_semantic_embedding_texts_total{how="memo"}') >= 1
    assert 'gateway_semantic_embedding_texts_total{how="warmed"}' in metrics


def test_refresh_burst_waits_instead_of_dropping_and_refusals_are_counted(fleet: Any) -> None:
    """A tiny embedding queue: a burst of plain misses loses stores (counted), a burst of
    refreshes does not (each response waits for its store)."""
    import concurrent.futures

    tight = two_aliases(
        fleet.url("a"), "semantic_cache: {queue_max: 2, batch_max: 1, vector_memo: 0}\n"
    )
    with GatewayServer(tight) as small:

        def burst(cache_control: str | None) -> None:
            texts = [f"Burst question {uuid.uuid4().hex[:6]} number {i}?" for i in range(48)]
            with concurrent.futures.ThreadPoolExecutor(24) as pool:
                list(pool.map(lambda t: ask(small, t, cache_control=cache_control), texts))

        burst(None)
        refused = _metric(small, 'gateway_semantic_stores_total{outcome="refused"')
        assert refused > 0  # lookups and stores competed for 2 queue slots: counted, not silent
        stored = _metric(small, 'gateway_semantic_stores_total{outcome="stored"')
        burst("no-cache")
        assert _metric(small, 'gateway_semantic_stores_total{outcome="stored"') == stored + 48
        assert _metric(small, 'gateway_semantic_stores_total{outcome="refused"') == refused


def test_late_lookup_races_the_upstream_call(fleet: Any) -> None:
    """With a lookup budget far below a lookup's time, the upstream call starts at once; the
    lookup still answers a paraphrase first (the slow upstream call is cancelled), and a new
    question is answered by the upstream."""
    slow = two_aliases(fleet.url("slow"), "semantic_cache: {lookup_budget_ms: 0.001}\n")
    with GatewayServer(slow) as gw:
        first = ask(gw, QUESTION)
        assert first.headers["x-gateway-cache"] == "miss"
        deadline = time.monotonic() + 10
        while _metric(gw, 'gateway_semantic_stores_total{outcome="stored"') < 1:
            assert time.monotonic() < deadline, "the answer was never stored"
            time.sleep(0.02)
        r = ask(gw, PARAPHRASE)
        assert r.headers["x-gateway-cache"] == "hit-semantic" and r.json() == first.json()
        assert _metric(gw, 'gateway_semantic_lookups_total{guard="",outcome="late_hit_raced"}') >= 1
        other = ask(gw, "How do I bake sourdough bread at home?")
        assert other.headers["x-gateway-cache"] == "miss" and other.json() != first.json()
