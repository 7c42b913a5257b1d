"""Prefix keys, rendezvous placement and the bounded-load spill."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest

from gateway.routing import (
    AffinitySettings,
    Member,
    affinity_order,
    block_hashes,
    leading_text,
    pick_affine,
    prefix_key,
)

SYSTEM = "You are a support agent for ACME. Answer politely and cite the manual. " * 3


def chat(*turns: tuple[str, str]) -> dict:
    return {"model": "m", "messages": [{"role": r, "content": c} for r, c in turns]}


def key_of(i: int) -> bytes:
    k = prefix_key(chat(("system", SYSTEM), ("user", f"conversation {i}: hello")))
    assert k is not None
    return k


def members(n: int) -> list[Member]:
    return [Member(f"m{i}") for i in range(n)]


def test_block_hashes_are_chained() -> None:
    a = "x" * 64 + "y" * 64 + "z" * 10
    b = "x" * 64 + "y" * 64 + "w" * 10
    ha, hb = block_hashes(a), block_hashes(b)
    assert len(ha) == 3 and len(ha[0]) == 8
    assert ha[:2] == hb[:2] and ha[2] != hb[2]
    # Same third block after a different first block: different chain.
    assert block_hashes("q" * 64 + "y" * 64 + "z" * 10)[2] != ha[2]
    assert len(block_hashes("x" * 10_000, 64, 16)) == 16


def test_every_turn_of_a_conversation_shares_the_key() -> None:
    turn1 = chat(("system", SYSTEM), ("user", "My router blinks red."))
    turn2 = chat(
        ("system", SYSTEM),
        ("user", "My router blinks red."),
        ("assistant", "Unplug it for 10 seconds."),
        ("user", "Still red."),
    )
    other = chat(("system", SYSTEM), ("user", "How do I reset my password?"))
    assert prefix_key(turn1) == prefix_key(turn2)
    assert prefix_key(turn1) != prefix_key(other)


def test_key_covers_only_the_capped_leading_part() -> None:
    s = AffinitySettings(block_chars=64, max_blocks=4)
    head = "h" * 300
    assert prefix_key({"prompt": head + "tail one"}, s) == prefix_key({"prompt": head + "two"}, s)
    assert len(leading_text({"prompt": "p" * 5000}, 256)) == 256
    assert prefix_key({"prompt": "a" * 100}, s) != prefix_key({"prompt": "b" * 100}, s)


def test_key_from_every_body_shape() -> None:
    parts = [{"type": "text", "text": "What is in this image?"}]
    image = [*parts, {"type": "image_url", "image_url": {"url": "https://x/cat.png"}}]
    assert prefix_key(chat(("user", "hi"))) is not None
    assert prefix_key({"messages": [{"role": "user", "content": parts}]}) != prefix_key(
        {"messages": [{"role": "user", "content": image}]}
    )
    assert prefix_key({"prompt": ["first", "second"]}) == prefix_key({"prompt": "first"})
    assert prefix_key({"prompt": [1, 2, 3]}) == prefix_key({"prompt": [[1, 2, 3]]})
    assert prefix_key({"prompt": ""}) is None
    assert prefix_key({"model": "m"}) is None
    assert prefix_key(chat(("user", "hi")), AffinitySettings(enabled=False)) is None


def test_same_key_same_member() -> None:
    ms = members(6)
    for i in range(50):
        k = key_of(i)
        first = pick_affine(k, ms)
        assert all(pick_affine(k, ms) is first for _ in range(5))


def test_keys_spread_evenly() -> None:
    ms = members(8)
    n = 8000
    counts = Counter(pick_affine(key_of(i), ms).name for i in range(n))  # type: ignore[union-attr]
    expected = n / len(ms)
    chi2 = sum((counts[m.name] - expected) ** 2 / expected for m in ms)
    assert chi2 < 24.3  # chi-square, 7 degrees of freedom, p = 0.001


def test_weights_shift_the_share() -> None:
    ms = [Member("big", weight=2.0), Member("a"), Member("b")]
    counts = Counter(affinity_order(key_of(i), ms)[0].name for i in range(6000))
    assert counts["big"] / 6000 == pytest.approx(0.5, abs=0.03)


def test_removing_a_member_moves_only_its_keys() -> None:
    ms = members(5)
    keys = [key_of(i) for i in range(3000)]
    before = [pick_affine(k, ms).name for k in keys]  # type: ignore[union-attr]
    gone = "m2"
    after = [pick_affine(k, [m for m in ms if m.name != gone]).name for k in keys]  # type: ignore[union-attr]
    moved = [(b, a) for b, a in zip(before, after, strict=True) if b != a]
    assert moved and all(b == gone for b, _ in moved)
    assert len(moved) == before.count(gone)
    # The orphaned keys spread over the remaining members.
    assert len({a for _, a in moved}) == 4


def test_bounded_load_spills_to_the_next_member_in_key_order() -> None:
    ms = members(4)
    k = key_of(1)
    order = affinity_order(k, ms)
    owner, runner_up = order[0], order[1]
    owner.inflight = 6  # others idle: cap ceil(1.25 * (6 + 1) / 4) = 3
    assert pick_affine(k, ms) is runner_up
    for m in ms:
        m.inflight = 2
    owner.inflight = 3  # total 9: cap ceil(1.25 * 10 / 4) = 4, within the bound: stay
    assert pick_affine(k, ms) is owner
    owner.inflight = 5  # over the bound: the same runner-up takes it
    assert pick_affine(k, ms) is runner_up


def test_one_hot_prefix_cannot_melt_a_member() -> None:
    ms = members(4)
    s = AffinitySettings(epsilon=0.25)
    k = key_of(7)
    for _ in range(200):  # a hot prefix, nothing completes
        m = pick_affine(k, ms, settings=s)
        assert m is not None
        m.begin()
    loads = [m.inflight for m in ms]
    mean = sum(loads) / len(loads)
    assert max(loads) <= math.ceil((1 + s.epsilon) * mean) + 1
    assert affinity_order(k, ms)[0].inflight == max(loads)  # the owner still leads


def test_small_numbers_still_stick() -> None:
    ms = members(4)
    k = key_of(3)
    first = pick_affine(k, ms)
    assert first is not None
    first.begin()
    assert pick_affine(k, ms) is first  # one request in flight does not break affinity


def test_eligibility_capacity_and_missing_key() -> None:
    ms = [Member("a", max_inflight=1), Member("b"), Member("c")]
    k = key_of(11)
    owner = affinity_order(k, ms)[0]
    assert pick_affine(k, ms, lambda m: m is not owner) is not owner
    owner.inflight = owner.max_inflight or 0
    if owner.max_inflight:
        assert pick_affine(k, ms) is not owner
    assert pick_affine(None, ms) is None
    assert pick_affine(k, []) is None
    assert pick_affine(k, ms, lambda m: False) is None
    assert pick_affine(k, ms, settings=AffinitySettings(enabled=False)) is None


def test_key_and_pick_are_cheap() -> None:
    import time

    body = chat(("system", SYSTEM * 10), ("user", "question " * 200))
    ms = members(8)
    rng = random.Random(0)
    for m in ms:
        m.inflight = rng.randrange(5)
    n = 2000
    t0 = time.perf_counter()
    for _ in range(n):
        pick_affine(prefix_key(body), ms)
    assert (time.perf_counter() - t0) / n < 500e-6  # measured ~30 us on a shared 2-core machine
