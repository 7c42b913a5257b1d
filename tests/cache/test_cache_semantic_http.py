"""Semantic cache through the gateway: real model, real FAISS, real Redis, real HTTP."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.support import SEMANTIC_ONLY, TWO_TENANTS, policy

pytest.importorskip("faiss", reason="the semantic extra is not installed")

SYSTEM = {"role": "system", "content": "You are a helpful travel assistant."}


def semantic(fleet) -> str:  # type: ignore[no-untyped-def]
    return policy({"p": fleet.url("a")}, auth=TWO_TENANTS, alias=SEMANTIC_ONLY)


def ask(gw, question: str, key: str = "key-1", earlier: list[dict] | None = None) -> httpx.Response:
    messages = [SYSTEM, *(earlier or []), {"role": "user", "content": question}]
    body = {"model": "chat", "messages": messages, "temperature": 0, "max_tokens": 8}
    r = httpx.post(
        gw.base_url + "/chat/completions",
        json=body,
        headers={"authorization": f"Bearer {key}"},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    return r


def eventually_hit(gw, question: str, missed: list | None = None, **kw) -> httpx.Response:
    """Entries are stored in the background: poll briefly for the hit. The answers of the asks
    that missed (stored too) go to `missed`."""
    deadline = time.monotonic() + 5
    while True:
        r = ask(gw, question, **kw)
        if r.headers["x-gateway-cache"] == "hit-semantic" or time.monotonic() > deadline:
            return r
        if missed is not None:
            missed.append(r.json())
        time.sleep(0.1)


@pytest.fixture
def gw(fleet, gateway, redis_url, redis_prefix, monkeypatch):
    monkeypatch.setenv("GATEWAY_REDIS_PREFIX", redis_prefix)
    return gateway(semantic(fleet), redis_url=redis_url)


def test_paraphrase_hits_near_miss_does_not(gw) -> None:
    first = ask(gw, "How do I reset my password?")
    assert first.headers["x-gateway-cache"] == "miss"
    missed: list = []  # asked before the first answer was stored: their answers are stored too
    hit = eventually_hit(gw, "I forgot my password, how can I reset it?", missed)
    assert hit.headers["x-gateway-cache"] == "hit-semantic"
    assert float(hit.headers["x-gateway-cache-similarity"]) >= 0.8
    assert hit.json() in [first.json(), *missed]
    ask(gw, "How many bags can I check on a flight to Paris?")
    eventually_hit(gw, "How many bags can I check on a flight to Paris")  # warm the entry
    assert (
        ask(gw, "How many bags can I check on a flight to Rome?").headers["x-gateway-cache"]
        != "hit-semantic"
    )
    assert (
        ask(gw, "How many bags can I not check on a flight to Paris?").headers["x-gateway-cache"]
        != "hit-semantic"
    )


def test_names_exchanged_and_operators_moved_are_other_questions(gw) -> None:
    """The verifier's exchange and operator rules through the gateway: the trees alone serve
    `++x` for `x++` (the words they read are the same)."""
    for cached, other in [
        ("Is x++ atomic in Java?", "Is ++x atomic in Java?"),
        ("Can I move my photos from Google Drive to Dropbox?",
         "Can I move my photos from Dropbox to Google Drive?"),
    ]:  # fmt: skip
        assert_stored_and_other_refused(gw, cached, other)


def test_other_quantifier_tense_person_and_unit_case_are_other_questions(gw) -> None:
    """The rules added after the probes of 2026-12-07, through the gateway: the trees alone
    serve each of these (0.70-1.0); "MBps" / "Mbps" is even the same vector (the model is
    uncased)."""
    for cached, other in [
        ("Are all snakes cold-blooded?", "Are most snakes cold-blooded?"),
        ("Did it snow in Denver on Tuesday?", "Will it snow in Denver on Tuesday?"),
        ("Can I lend money to my brother?", "Can my brother lend money to me?"),
        ("Is 50 Mbps enough for video calls?", "Is 50 MBps enough for video calls?"),
    ]:
        assert_stored_and_other_refused(gw, cached, other)


def assert_stored_and_other_refused(gw, cached: str, other: str) -> None:
    """`cached` is stored (asked again it is a semantic hit), `other` is not served from it."""
    ask(gw, cached)
    stored = eventually_hit(gw, cached)
    assert stored.headers["x-gateway-cache"] == "hit-semantic"
    assert ask(gw, other).headers["x-gateway-cache"] != "hit-semantic", other


def test_other_conversation_and_other_tenant_do_not_hit(gw) -> None:
    earlier = [
        {"role": "user", "content": "I am flying to Tokyo."},
        {"role": "assistant", "content": "Nice!"},
    ]
    ask(gw, "What currency should I bring?", earlier=earlier)
    assert (
        eventually_hit(gw, "Which currency should I bring?", earlier=earlier).headers[
            "x-gateway-cache"
        ]
        == "hit-semantic"
    )
    other = [
        {"role": "user", "content": "I am flying to London."},
        {"role": "assistant", "content": "Nice!"},
    ]
    assert (
        ask(gw, "Which currency should I bring?", earlier=other).headers["x-gateway-cache"]
        == "miss"
    )
    assert (
        ask(gw, "Which currency should I bring?", key="key-2", earlier=earlier).headers[
            "x-gateway-cache"
        ]
        == "miss"
    )


def test_shared_between_gateways_and_across_restart(
    fleet, gateway, redis_url, redis_prefix, monkeypatch
) -> None:
    monkeypatch.setenv("GATEWAY_REDIS_PREFIX", redis_prefix)
    one = gateway(semantic(fleet), redis_url=redis_url)
    two = gateway(semantic(fleet), redis_url=redis_url)
    ask(one, "What is the best time of year to visit Iceland?")
    r = eventually_hit(two, "When is the best time of the year to visit Iceland?")
    assert r.headers["x-gateway-cache"] == "hit-semantic"
    one.__exit__(None, None, None)
    two.__exit__(None, None, None)
    three = gateway(semantic(fleet), redis_url=redis_url)
    assert (
        eventually_hit(three, "When is the best time of year to visit Iceland?").headers[
            "x-gateway-cache"
        ]
        == "hit-semantic"
    )
