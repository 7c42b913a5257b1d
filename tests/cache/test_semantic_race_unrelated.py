"""A question that shares no content word with any question cached in its context goes upstream
at once, racing its lookup (`semantic_cache.race_unrelated`, on by default), where its upstream
has answered in more than twice a lookup's time: a miss does not wait for its embedding, and the
lookup still serves a paraphrase before the upstream answers. Against an upstream faster than a
lookup nothing is raced, so no hit is lost.

Real gateway, real embedder and verifier, the project's simulators through the HTTP API: `slow`
(~400 ms for 8 tokens; made slower or unreachable where shown), `zero` (no delay at all).
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import httpx
import pytest

from tests.cache.test_cache_semantic_namespaces import SYSTEM, _metric, ask, two_aliases
from tests.conftest import DEFAULT_FLEET
from tests.support import SEMANTIC_ONLY, GatewayServer, poll

pytest.importorskip("faiss", reason="the semantic extra is not installed")

FLEET: list[Any] = [*DEFAULT_FLEET, {"name": "zero", "profile": "zero-latency"}]
EARLY = 'gateway_semantic_lookups_total{guard="",outcome="early"}'
RACED = 'gateway_semantic_lookups_total{guard="",outcome="late_hit_raced"}'
STORED = 'gateway_semantic_stores_total{outcome="stored"'


def stored(gw: GatewayServer, question: str, ns: str) -> dict[str, Any]:
    """Ask `question` (a miss) and wait until its answer is in the semantic cache."""
    before = _metric(gw, STORED)
    first = ask(gw, question, namespace=ns)
    assert first.headers["x-gateway-cache"] == "miss"
    deadline = time.monotonic() + 10
    while _metric(gw, STORED) < before + 1:
        assert time.monotonic() < deadline, "the answer was never stored"
        time.sleep(0.02)
    return first.json()


def timed(gw: GatewayServer, ns: str, related: str) -> None:
    """A question sharing words with the cached one (waited for, a miss): the gateway has now
    timed a lookup that embeds and an answer of the upstream."""
    r = ask(gw, related, namespace=ns)
    assert r.headers["x-gateway-cache"] == "miss"
    assert _metric(gw, EARLY) == 0


def served_first(
    fleet: Any, member: str, gw: GatewayServer, question: str, ns: str, answer: dict[str, Any]
) -> None:
    """`question` is served `answer` from the cache while `member` takes 5 s to its first
    token; the hit is not billed (a raced call is cancelled)."""
    before = sum(c.cache == "hit-semantic" for c in gw.seen)
    fleet.set_faults(member, slow_first_token_ms=5000)
    try:
        r = ask(gw, question, namespace=ns)
    finally:
        fleet.clear_faults(member)
    assert r.headers["x-gateway-cache"] == "hit-semantic" and r.json() == answer
    hits = poll(lambda: [c for c in gw.seen if c.cache == "hit-semantic"][before:] or None)
    assert hits[-1].status == 200 and not hits[-1].cost_usd


def upstream_timed(gw: GatewayServer, times: int = 10) -> None:
    """Questions in new contexts (no lookup, each timed upstream): the gateway's average of its
    upstream's answers no longer rests on the first, which opened the connection (12 ms
    against 4 for the next ones on a loaded machine: a zero-latency upstream then looked
    slower than two lookups, and was raced)."""
    for i in range(times):
        r = ask(gw, f"Warm-up question number {i}?", namespace=f"race-{uuid.uuid4().hex}")
        assert r.headers["x-gateway-cache"] == "miss"


def served_after_waiting(gw: GatewayServer) -> None:
    """ "What is your age?" (no word shared with "How old are you?") waits for its lookup, which
    serves it: nothing raced."""
    upstream_timed(gw)
    ns = f"race-{uuid.uuid4().hex}"
    answer = stored(gw, "How old are you?", ns)
    timed(gw, ns, "How old is the Eiffel Tower?")
    r = ask(gw, "What is your age?", namespace=ns)
    assert r.headers["x-gateway-cache"] == "hit-semantic" and r.json() == answer
    assert _metric(gw, EARLY) == 0


def test_an_unrelated_question_goes_upstream_at_once(fleet: Any) -> None:
    with GatewayServer(two_aliases(fleet.url("slow"))) as gw:
        ns = f"race-{uuid.uuid4().hex}"
        answer = stored(gw, "What is the best time of year to visit Iceland?", ns)
        timed(gw, ns, "What is the cheapest time of year to fly to Iceland?")
        other = ask(gw, "Which planets have rings?", namespace=ns)
        assert other.headers["x-gateway-cache"] == "miss" and other.json() != answer
        assert _metric(gw, EARLY) == 1
        # A question sharing words waits for its lookup (and is served).
        r = ask(gw, "When is the best time of the year to visit Iceland?", namespace=ns)
        assert r.headers["x-gateway-cache"] == "hit-semantic" and r.json() == answer
        # A new context (no entry at all): a miss without embedding, not a race.
        ask(gw, "Which planets have rings?", namespace=f"race-{uuid.uuid4().hex}")
        # Streams are timed apart (to their first chunk): the first unrelated one is not raced.
        s = stream(gw, "Which moons have oceans?", ns)
        assert s.headers["x-gateway-cache"] == "miss" and "[DONE]" in s.text
        assert _metric(gw, EARLY) == 1


def stream(gw: GatewayServer, question: str, ns: str) -> httpx.Response:
    body = {
        "model": "chat",
        "messages": [SYSTEM, {"role": "user", "content": question}],
        "temperature": 0,
        "max_tokens": 8,
        "stream": True,
    }
    headers = {"authorization": "Bearer key-1", "x-gateway-cache-namespace": ns}
    r = httpx.post(gw.base_url + "/chat/completions", json=body, headers=headers, timeout=30)
    assert r.status_code == 200, r.text
    return r


def _streamed_text(r: httpx.Response) -> str:
    return "".join(
        (json.loads(line[6:])["choices"] or [{}])[0].get("delta", {}).get("content") or ""
        for line in r.text.splitlines()
        if line.startswith("data: {")
    )


def test_an_unrelated_streamed_question_is_raced_to_its_first_chunk(fleet: Any) -> None:
    """Streams are timed apart, to their first chunk (300 ms here). Once timed, an unrelated
    streamed miss goes upstream at once, and an unrelated streamed paraphrase is still served
    from the cache (replayed as a stream) before the upstream's first chunk, whose call is
    cancelled."""
    with GatewayServer(two_aliases(fleet.url("slow"))) as gw:
        fleet.set_faults("slow", slow_first_token_ms=300)
        try:
            ns = f"race-{uuid.uuid4().hex}"
            answer = stored(gw, "How old are you?", ns)
            timed(gw, ns, "How old is the Eiffel Tower?")
            # A streamed question sharing a word: waited for, a miss; the stream is timed.
            assert stream(gw, "How old is the Colosseum?", ns).headers["x-gateway-cache"] == "miss"
            assert _metric(gw, EARLY) == 0
            r = stream(gw, "Which moons have oceans?", ns)
            assert r.headers["x-gateway-cache"] == "miss" and "[DONE]" in r.text
            assert _metric(gw, EARLY) == 1
            fleet.set_faults("slow", slow_first_token_ms=5000)
            start = time.monotonic()
            r = stream(gw, "What is your age?", ns)
            took = time.monotonic() - start
        finally:
            fleet.clear_faults("slow")
        assert r.headers["x-gateway-cache"] == "hit-semantic", r.headers
        assert _streamed_text(r) == answer["choices"][0]["message"]["content"]
        assert "[DONE]" in r.text and took < 4, took
        assert (_metric(gw, EARLY), _metric(gw, RACED)) == (2, 1)
        ctx = poll(lambda: next((c for c in gw.seen if c.cache == "hit-semantic"), None))
        assert ctx.status == 200 and not ctx.cost_usd  # a hit: the cancelled call is not billed


def test_an_unrelated_paraphrase_still_wins_against_a_slow_upstream(fleet: Any) -> None:
    """ "What is your age?" shares no word with "How old are you?": raced from the start, and the
    lookup (a few ms) answers before the slow upstream (5 s to its first token), whose call is
    cancelled."""
    with GatewayServer(two_aliases(fleet.url("slow"))) as gw:
        ns = f"race-{uuid.uuid4().hex}"
        answer = stored(gw, "How old are you?", ns)
        timed(gw, ns, "How old is the Eiffel Tower?")
        served_first(fleet, "slow", gw, "What is your age?", ns, answer)
        assert (_metric(gw, EARLY), _metric(gw, RACED)) == (1, 1)


def test_nothing_is_raced_against_an_upstream_faster_than_a_lookup(fleet: Any) -> None:
    """The zero-latency upstream answers before any lookup could: racing would lose the hit,
    so the unrelated paraphrase waits for its lookup and is served."""
    with GatewayServer(two_aliases(fleet.url("zero"))) as gw:
        served_after_waiting(gw)


def test_race_unrelated_off_waits_for_every_lookup(fleet: Any) -> None:
    policy = two_aliases(fleet.url("slow"), "semantic_cache: {race_unrelated: false}\n")
    with GatewayServer(policy) as gw:
        served_after_waiting(gw)


def test_an_outage_does_not_lose_a_raced_paraphrase(fleet: Any) -> None:
    """The upstream, timed slow, then fails at once (connection refused, one attempt): the raced
    lookup is waited for and its paraphrase served, as it would have been had the request
    waited for it."""
    from tests.support import SEMANTIC_ONLY, TWO_TENANTS, policy

    text = policy({"c": fleet.url("c")}, auth=TWO_TENANTS, alias=SEMANTIC_ONLY,
                  pool={"max_attempts": 1}, retry={"max_attempts": 1})  # fmt: skip
    try:
        with GatewayServer(text) as gw:
            ns = f"race-{uuid.uuid4().hex}"
            fleet.set_faults("c", slow_first_token_ms=300)
            answer = stored(gw, "How old are you?", ns)
            timed(gw, ns, "How old is the Eiffel Tower?")
            fleet.set_faults("c", refuse_connections=True)
            r = ask(gw, "What is your age?", namespace=ns)
            assert r.headers["x-gateway-cache"] == "hit-semantic" and r.json() == answer
            assert (_metric(gw, EARLY), _metric(gw, RACED)) == (1, 1)
            # An unrelated question is not a paraphrase: the outage's error, in OpenAI's shape.
            body = {"model": "chat", "messages": [{"role": "user", "content": "Which planets "
                    "have rings?"}], "temperature": 0, "max_tokens": 8}  # fmt: skip
            headers = {"authorization": "Bearer key-1", "x-gateway-cache-namespace": ns}
            bad = httpx.post(gw.base_url + "/chat/completions", json=body, headers=headers)
            assert bad.status_code >= 500 and "error" in bad.json(), bad.text
    finally:
        fleet.clear_faults("c")


def test_an_alias_racing_every_lookup_still_serves_its_hits(fleet: Any) -> None:
    """`cache.semantic.race_all`: every lookup of the alias races its upstream call (a question
    sharing words with the cache too), where the upstream is slower than a lookup; a paraphrase
    still wins (the call cancelled), a miss never waits. The other alias keeps the word gate."""
    from tests.support import TWO_TENANTS, policy

    racing = {"cache": {"exact": {"enabled": False},
                        "semantic": {"enabled": True, "race_all": True}}}  # fmt: skip
    text = policy({"p": fleet.url("slow")}, auth=TWO_TENANTS, alias=racing,
                  models={"chat-b": {"pool": "main", **SEMANTIC_ONLY}})  # fmt: skip
    with GatewayServer(text) as gw:
        fleet.set_faults("slow", slow_first_token_ms=300)
        try:
            ns = f"race-{uuid.uuid4().hex}"
            answer = stored(gw, "How old are you?", ns)
            timed(gw, ns, "How old is the Eiffel Tower?")  # timed before any race: waited for
            # Shares "old" with the cache: raced all the same, and a miss.
            r = ask(gw, "How old is the Colosseum?", namespace=ns)
            assert r.headers["x-gateway-cache"] == "miss"
            assert (_metric(gw, EARLY), _metric(gw, RACED)) == (1, 0)
            fleet.set_faults("slow", slow_first_token_ms=5000)
            r = ask(gw, "How old are you, please?", namespace=ns)
            assert r.headers["x-gateway-cache"] == "hit-semantic" and r.json() == answer
            assert (_metric(gw, EARLY), _metric(gw, RACED)) == (2, 1)
            # Another alias without race_all: a question sharing words waits for its lookup.
            b_ns = f"race-{uuid.uuid4().hex}"
            fleet.set_faults("slow", slow_first_token_ms=300)
            b = ask(gw, "How old are you?", namespace=b_ns, model="chat-b")
            assert b.headers["x-gateway-cache"] == "miss"
            ask(gw, "How old is the Colosseum?", namespace=b_ns, model="chat-b")
            assert _metric(gw, EARLY) == 2
        finally:
            fleet.clear_faults("slow")
