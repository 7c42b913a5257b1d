"""Member choice through the real gateway and simulated providers: PeakEWMA + power of two choices
steers away from slow and failing members; prefix affinity keeps a system prompt on one member,
spreads different prompts, and spills a hot prefix under the bounded-load cap."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import httpx

from loadtests.simulator.testing import Fleet
from tests.support import GatewayServer

SLOWISH = {"decode_tps_alone": 100, "decode_tps_full": 50}  # ~10 ms per token


FLEET: list[Any] = [
    {"name": "quick", "profile": "fast"},
    {"name": "sluggish", "profile": "fast", "speed": 0.05},  # 20x slower
    {"name": "failing", "profile": "fast"},
    *({"name": f"f{i}", "profile": "fast", "overrides": SLOWISH} for i in range(3)),
]


def policy(fleet: Fleet, members: list[str], extra_pool: str = "", extra_provider: str = "") -> str:
    providers = "\n".join(
        f"  {n}: {{base_url: '{fleet.url(n)}', models: {{'*': sim}}{extra_provider}}}"
        for n in members
    )
    return f"""
providers:
{providers}
pools:
  main:
    members: [{", ".join(members)}]
    balancer: {{strategy: p2c_peak_ewma}}
{extra_pool}
models:
  chat: {{pool: main}}
"""


def send_many(base_url: str, bodies: list[dict], threads: int) -> list[tuple[int, str | None]]:
    """Send `bodies` from `threads` client threads; (status, provider) per request, in order."""
    results: list[tuple[int, str | None]] = [(0, None)] * len(bodies)
    start = threading.Barrier(threads)

    def worker(k: int) -> None:
        with httpx.Client(base_url=base_url, timeout=30) as client:
            start.wait()
            for i in range(k, len(bodies), threads):
                r = client.post("/chat/completions", json=bodies[i])
                results[i] = (r.status_code, r.headers.get("x-gateway-provider"))

    workers = [threading.Thread(target=worker, args=(k,)) for k in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
    return results


def chat(user: str, system: str | None = None, max_tokens: int = 10) -> dict:
    msgs = [{"role": "system", "content": system}] if system else []
    msgs.append({"role": "user", "content": user})
    return {"model": "chat", "messages": msgs, "max_tokens": max_tokens}


def test_slow_member_gets_less_traffic(fleet) -> None:
    with GatewayServer(policy(fleet, ["quick", "sluggish"])) as gw:
        results = send_many(gw.base_url, [chat(f"question {i}") for i in range(90)], threads=6)
    assert all(status == 200 for status, _ in results)
    share = Counter(p for _, p in results)
    # ~10 ms vs ~200 ms per request: after its first answers the slow one is rarely worth it
    # (3 of 90 in a quiet run). The bound leaves room for one pause of this test process: a
    # 0.7 s stall seen once in CI made the quick member's answers look slow, and PeakEWMA rightly
    # kept away from it for the rest of the run (20 of 90); an even split would be 45.
    assert share["sluggish"] <= 24 and share["quick"] >= 66, share


def test_fast_failing_member_is_penalised(fleet) -> None:
    # The breaker never trips here: only the member's falling success share steers traffic.
    lenient = ", breaker: {consecutive_failures: 0, min_requests: 100000}"
    fleet.reset("failing")
    fleet.set_faults("failing", error_rate=1.0, error_status=[500])
    try:
        with GatewayServer(policy(fleet, ["quick", "failing"], extra_provider=lenient)) as gw:
            results = send_many(gw.base_url, [chat(f"q {i}", max_tokens=4) for i in range(60)], 4)
        attempts = fleet.stats("failing")["requests"]
    finally:
        fleet.clear_faults("failing")
    assert all(r == (200, "quick") for r in results), Counter(results)
    # Failing everything makes it cost 20x a healthy member: it is hardly tried again.
    assert 1 <= attempts <= 6, attempts


AFFINITY = "    affinity: {enabled: true, epsilon: 0.25}"


def system_prompt(i: int) -> str:
    return f"You are assistant number {i} of the ACME help desk. Follow handbook {i}. " * 8


def test_affinity_keeps_a_system_prompt_on_one_member(fleet) -> None:
    members = ["f0", "f1", "f2"]
    before = sum(fleet.stats(m)["prefix_cache_hit_tokens"] for m in members)
    bodies = [chat(f"question {q}", system_prompt(s), 2) for s in range(9) for q in range(3)]
    with GatewayServer(policy(fleet, members, AFFINITY)) as gw:
        results = send_many(gw.base_url, bodies, threads=1)  # one at a time: no load to balance
    assert all(status == 200 for status, _ in results)
    owners = [{p for _, p in results[3 * s : 3 * s + 3]} for s in range(9)]
    assert all(len(o) == 1 for o in owners), owners  # every prompt sticks to one member
    assert len(set.union(*owners)) >= 2, owners  # different prompts spread over members
    # The 2nd and 3rd request of each prompt reuse the KV cache of the member that owns it.
    assert sum(fleet.stats(m)["prefix_cache_hit_tokens"] for m in members) - before > 9 * 2 * 100


def test_hot_prefix_spills_under_bounded_load(fleet) -> None:
    members = ["f0", "f1", "f2"]
    hot = system_prompt(99)
    bodies = [chat(f"question {q}", hot, 40) for q in range(12)]  # ~400 ms each, all at once
    with GatewayServer(policy(fleet, members, AFFINITY)) as gw:
        results = send_many(gw.base_url, bodies, threads=12)
    assert all(status == 200 for status, _ in results)
    load = Counter(p for _, p in results)
    # After placement at most ceil(1.25 * (total + 1) / 3) in flight: 12 requests -> at most 5.
    assert len(load) >= 2 and max(load.values()) <= 5, load
