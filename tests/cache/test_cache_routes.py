"""Both caches key on where the routing decision sends a request, through the HTTP API.

The same body can be sent to another pool, and so answered by another model: a class chosen by
the `x-gateway-priority` header routes to its own pool, and a policy reload can route the alias
elsewhere. A premium request was served the default pool's cached answer; now each route has its
own entries (exact and semantic), and a request routed as before still hits.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from tests.support import SEMANTIC_ONLY, TWO_TENANTS, policy

FLEET = ["a", "b"]


def routed(fleet: Any, alias: dict[str, Any] | None = None) -> str:
    return policy(
        {"a": fleet.url("a"), "b": fleet.url("b")},
        auth=TWO_TENANTS,
        pool={"members": ["a"]},
        pools={"premium": {"members": ["b"]}},
        alias={"routes": {"premium": "premium"}, **(alias or {})},
        classes=[{"name": "premium", "priority": ["high"]}],
    )


def ask(gw: Any, question: str = "Hello there, which model are you?", **headers: str):
    r = httpx.post(
        gw.base_url + "/chat/completions",
        json={
            "model": "chat",
            "messages": [{"role": "user", "content": question}],
            "temperature": 0,
            "max_tokens": 8,
        },
        headers={"authorization": "Bearer key-1", **headers},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    return r


def served_by(r: httpx.Response) -> str:
    return r.json()["id"].split("-")[1]  # the simulator's ids name the instance: chatcmpl-a-1


@pytest.fixture(autouse=True)
def fresh(fleet: Any) -> None:
    fleet.reset("a")
    fleet.reset("b")


def test_a_class_routed_elsewhere_has_its_own_exact_entries(fleet, gateway) -> None:
    gw = gateway(routed(fleet))
    default = ask(gw)
    assert default.headers["x-gateway-cache"] == "miss" and served_by(default) == "a"
    premium = ask(gw, **{"x-gateway-priority": "high"})
    assert premium.headers["x-gateway-cache"] == "miss" and served_by(premium) == "b"
    again = ask(gw, **{"x-gateway-priority": "high"})
    assert again.headers["x-gateway-cache"] == "hit-exact" and again.json() == premium.json()
    assert ask(gw).json() == default.json()
    # A priority that picks no other class is routed as before: the same entry.
    low = ask(gw, **{"x-gateway-priority": "low"})
    assert low.headers["x-gateway-cache"] == "hit-exact" and low.json() == default.json()


def test_a_reload_that_routes_the_alias_elsewhere_does_not_serve_the_old_answers(
    fleet, gateway, redis_url, redis_prefix, monkeypatch
) -> None:
    monkeypatch.setenv("GATEWAY_REDIS_PREFIX", redis_prefix)
    first = gateway(routed(fleet), redis_url=redis_url)
    before = ask(first)
    assert served_by(before) == "a"
    assert ask(first).headers["x-gateway-cache"] == "hit-exact"
    # Another gateway on the same Redis, whose policy sends the alias to the premium pool.
    moved = gateway(routed(fleet, {"pool": "premium"}), redis_url=redis_url)
    after = ask(moved)
    assert after.headers["x-gateway-cache"] == "miss" and served_by(after) == "b"
    # Same policy as the first: it shares the first gateway's entries.
    same = gateway(routed(fleet), redis_url=redis_url)
    assert ask(same).json() == before.json()


def test_a_class_routed_elsewhere_has_its_own_semantic_entries(fleet, gateway) -> None:
    pytest.importorskip("faiss", reason="the semantic extra is not installed")
    gw = gateway(routed(fleet, SEMANTIC_ONLY))
    question, paraphrase = "How do I reset my password?", "How can I reset my password?"
    default = ask(gw, question)
    assert served_by(default) == "a"
    deadline = time.monotonic() + 10
    while (hit := ask(gw, paraphrase)).headers["x-gateway-cache"] != "hit-semantic":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert hit.json() == default.json()
    premium = ask(gw, paraphrase, **{"x-gateway-priority": "high"})
    assert premium.headers["x-gateway-cache"] == "miss" and served_by(premium) == "b"
